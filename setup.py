"""The optional compiled FBF kernel (``cluster/core/fbf/_kernel.pyx``); everything else is in
pyproject.toml.

The kernel is optional: without Cython, without a C compiler, or when the compile fails, the
install still succeeds (with a warning) and the FBF runs its numpy path, which gives the same bits
and answers. ``IDC_FBF_KERNEL=0`` forces that path at run time (``cluster.core.fbf.hotpath``).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNEL = "cluster.core.fbf._kernel"


def _warn(why: object) -> None:
    print(f"WARNING: the FBF kernel ({KERNEL}) is not built, the numpy path will run: {why}",
          file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the kernel only makes the FBF faster."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, or a platform distutils cannot drive
            _warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(exc)


def _extensions() -> list[Extension]:
    ext = Extension(KERNEL, ["cluster/core/fbf/_kernel.pyx"], include_dirs=["cluster/core/fbf"],
                    depends=["cluster/core/fbf/_murmur3.h"], optional=True)
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    try:
        return list(cythonize([ext], compiler_directives={"language_level": "3"}, quiet=True))
    except Exception as exc:
        _warn(exc)
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
