"""The optional compiled kernels; everything else is in pyproject.toml.

- ``cluster/core/fbf/_kernel.pyx``: the FBF's check+insert. Without it the FBF runs its numpy
  path, which gives the same bits and answers (``IDC_FBF_KERNEL=0`` forces that path).
- ``cluster/core/_store.pyx``: the shard store's hot methods. Without it the store runs its
  Python methods, the reference (``IDC_STORE_KERNEL=0`` forces them).
- ``cluster/core/_batch.pyx``: the per-op loops of a batch on the write path (the edge's check,
  the leader's items and their hold and release, a replica's op ids). Without it they run as
  the Python reference, ``cluster.core.batch_kernel`` (``IDC_BATCH_KERNEL=0`` forces that).
- ``cluster/wal/_writer.pyx``: the log writer thread's loop without the GIL. Without it the
  thread runs its Python loop, with the same outcomes (``IDC_WAL_KERNEL=0`` forces that).

All are optional: without Cython, without a C compiler, or when a compile fails, the install
still succeeds (with a warning) and the Python paths run.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = ("cluster.core.fbf._kernel, cluster.core._store, cluster.core._batch, "
           "cluster.wal._writer")


def _warn(why: object) -> None:
    print(f"WARNING: a compiled kernel ({KERNELS}) is not built, its Python path will run: {why}",
          file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: a kernel only makes its path faster."""

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
    exts = [Extension(name, [source], include_dirs=["cluster/core/fbf"],
                      depends=["cluster/core/fbf/_murmur3.h"], optional=True)
            for name, source in (("cluster.core.fbf._kernel", "cluster/core/fbf/_kernel.pyx"),
                                 ("cluster.core._store", "cluster/core/_store.pyx"),
                                 ("cluster.core._batch", "cluster/core/_batch.pyx"),
                                 ("cluster.wal._writer", "cluster/wal/_writer.pyx"))]
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    try:
        return list(cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True))
    except Exception as exc:
        _warn(exc)
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
