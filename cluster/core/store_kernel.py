"""The choice between ``ShardStore``'s Python hot methods and their compiled twins.

``cluster/core/_store.pyx`` compiles ``merge_items``, ``apply_hidden``, ``unhide``, the last
two's batch forms (``apply_hidden_items``, ``unhide_items``) and the staged copies' merges
(``stage_items``, ``merge_visible_items``: a write quorum above 2) over the same pages and digests
(``pip install`` builds it where a C compiler is; ``setup.py``), and four functions of a page:
``FIND`` (a key's number), ``INDEXED`` (a leaf's keys for the digests), ``SPLIT`` and ``JOIN``
(a page as a snapshot's records a leaf, and back). The
Python methods stay the reference: ``tests/test_store_kernel.py`` runs both on the same
programs. ``install`` binds the compiled ones in place of the Python ones when the module is
built, its hashes agree with ``cluster.core.digests`` on this platform, and ``IDC_STORE_KERNEL``
is not ``0``. ``KERNEL`` says which runs (``"c"`` or ``"python"``), ``REASON`` why not C.
"""

from __future__ import annotations

from typing import Any

import mmh3

from cluster.core.compiled import optional
from cluster.core.digests import SEED, key_hash, pair_hash
from cluster.core.pages import Page

ENV = "IDC_STORE_KERNEL"
METHODS = ("merge_items", "apply_hidden", "apply_hidden_items", "unhide", "unhide_items",
           "stage_items", "merge_visible_items")

# the Python methods, by name, once ``install`` has replaced them (the reference's twin tests)
PYTHON: dict[str, Any] = {}


def _load() -> tuple[Any, str]:
    """The compiled module, or None and why not."""
    mod, why = optional("cluster.core._store", ENV)
    if mod is None:
        return None, why
    if hasattr(mod, "_fields_agree") and not mod._fields_agree():
        return None, "it reads a page's fields where this Python does not keep them"
    names = ("", "k", "likes/post-7", "ü-€-𝄞", "x" * 31, "x" * 32, "x" * 255, "x" * 256,
             "x" * 600)
    counts = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1)
    for a in names:
        if mod.key_hash("t", a) != key_hash("t", a) or mod.key_hash(a, "k") != key_hash(a, "k"):
            return None, "its MurmurHash3 x86 32 differs from mmh3's on this platform"
        for p in counts:
            if mod.pair_hash(a, "n1@1", p, 1) != pair_hash(a, "n1@1", p, 1) \
                    or mod.pair_hash("k", a, 0, p) != pair_hash("k", a, 0, p):
                return None, "its pair hash differs from msgpack + mmh3 on this platform"
    return mod, ""


_KERNEL_MODULE, REASON = _load()
KERNEL = "c" if _KERNEL_MODULE is not None else "python"
# the key's hash (its digest leaf): compiled when the kernel is, else ``digests.key_hash``
KEY_HASH = _KERNEL_MODULE.key_hash if _KERNEL_MODULE is not None else key_hash


def _find(page: Page, name: bytes, h: int) -> int:
    return page.find(name)


# a key's number in its page (``Page.find``; the compiled one scans the page's key hashes)
FIND = getattr(_KERNEL_MODULE, "find", _find)
# the digests' index of a leaf's keys (``Page.indexed``: the compiled one reads no other name)
INDEXED = getattr(_KERNEL_MODULE, "indexed", Page.indexed)


def _join(parts: list[tuple[bytes, bytes, bytes]], table: str, number: int | None = None
          ) -> Page:
    prefix = table.encode() + b"/"
    return Page.join(parts, lambda name: mmh3.hash(prefix + name, SEED, signed=False), number)


# a page of ``table`` from its leaves' snapshot records (``Page.join``)
JOIN = getattr(_KERNEL_MODULE, "join", _join)
# a page's snapshot records, a leaf each (``Page.split``): compiled when the kernel is
SPLIT = getattr(_KERNEL_MODULE, "split", Page.split)


def install(cls: type) -> None:
    """Bind the compiled methods on ``cls`` (``ShardStore``) when they are usable; the Python
    ones are kept in ``PYTHON`` either way."""
    for name in METHODS:
        PYTHON[name] = cls.__dict__[name]
        if _KERNEL_MODULE is not None and hasattr(_KERNEL_MODULE, name):  # a module built
            setattr(cls, name, getattr(_KERNEL_MODULE, name))  # before a method: Python's
