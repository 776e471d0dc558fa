"""The FBF's hot operations (Algorithms 1-2 on the bit-sliced words), and which code runs them.

Two implementations of one interface (``HotPath``), giving the same bits and the same answers for
any sequence of operations (``tests/test_fbf_kernel.py``), so snapshots and the filters replicas
exchange do not depend on which ran:

- ``cluster.core.fbf._kernel.Kernel``: compiled from ``_kernel.pyx`` by ``pip install`` when a C
  compiler is there (optional: ``setup.py``); its own MurmurHash3, checked against mmh3 here at
  import.
- ``NumpyPath``: one id walked in Python, a batch in numpy.

``KERNEL`` names the one new filters use: ``"c"``, or ``"numpy"`` when the kernel is not built, its
hash disagrees with mmh3's, or ``IDC_FBF_KERNEL=0`` is set (read once, at import);
``KERNEL_REASON`` says why. A filter with a hash function of its own always runs ``NumpyPath``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from cluster.core.compiled import optional
from cluster.core.fbf import layout
from cluster.core.hashing import (
    MASK64,
    SEED,
    HashFn,
    _murmur,
    hash_pair,
    hash_pairs_np,
    positions_np,
)

ENV = "IDC_FBF_KERNEL"


class HotPath(Protocol):
    """One filter's hot operations over its words, for its k and filter count."""

    def add(self, item: bytes) -> bool: ...

    def shift(self) -> None: ...

    def probe(self, item: bytes) -> int: ...

    def contains(self, item: bytes) -> bool: ...

    def add_many(self, items: Sequence[bytes]) -> np.ndarray: ...

    def contains_many(self, items: Sequence[bytes], simple: bool = False) -> np.ndarray: ...


class NumpyPath:
    """The interpreted path: one id walked in Python, a batch in numpy."""

    def __init__(self, words: np.ndarray, k: int, nfilters: int, hash_fn: HashFn) -> None:
        self._words = words
        self._mv = memoryview(words)  # type: ignore[arg-type]  # ndarray exports a buffer
        self.m = len(words)
        self.k = k
        self._hash = hash_fn
        self._fast_hash = hash_fn is hash_pair
        self._live = (1 << nfilters) - 1
        self._oldest = nfilters - 1
        self._pairmask = ((1 << (nfilters - 1)) - 1) & ~1  # pair (j, j+1) for j in 1..N
        self._krange = range(k)
        self._pos = [0] * k  # scratch for add(), so the hot path allocates nothing

    def shift(self) -> None:
        """A refresh in place (``layout.shift``)."""
        layout.shift(self._words, self._oldest + 1)

    def _pair(self, item: bytes) -> tuple[int, int]:
        if self._fast_hash:
            h1, h2 = _murmur(item, SEED)
            return h1, h2 | 1
        return self._hash(item)

    def probe(self, item: bytes) -> int:
        """The AND of the item's k words: bit j set when the item is in filter j."""
        x, y = self._pair(item)
        m, mv = self.m, self._mv
        w = self._live
        for i in self._krange:  # cluster.core.hashing.positions, walked inline
            w &= mv[x % m]
            x = (x + y) & MASK64
            y = (y + i) & MASK64
        return w

    def _member(self, w: int) -> bool:
        # Algorithm 2 on the AND mask: the future alone, any adjacent (present, past...) pair,
        # or the oldest past alone
        return bool(w & 1 or w & (w >> 1) & self._pairmask or w >> self._oldest)

    def contains(self, item: bytes) -> bool:
        return self._member(self.probe(item))

    def add(self, item: bytes) -> bool:
        # probe plus the insert, kept inline: this is the hot path
        if self._fast_hash:
            h1, h2 = _murmur(item, SEED)
            h2 |= 1
        else:
            h1, h2 = self._hash(item)
        m, mv, pos = self.m, self._mv, self._pos
        x, y = h1, h2
        w = self._live
        for i in self._krange:
            p = pos[i] = x % m
            w &= mv[p]
            x = (x + y) & MASK64
            y = (y + i) & MASK64
        if w & 1 or w & (w >> 1) & self._pairmask or w >> self._oldest:
            return False
        for p in pos:
            mv[p] |= 3
        return True

    def _masks_many(self, items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h1, h2 = hash_pairs_np(items, self._hash)
        pos = positions_np(h1, h2, self.k, self.m).view(np.intp)  # < m: the same values
        return pos, np.bitwise_and.reduce(self._words[pos], axis=0), h1

    def _members_np(self, w: np.ndarray) -> np.ndarray:
        dt = self._words.dtype.type
        pairs = w & (w >> dt(1)) & dt(self._pairmask)
        return ((w & dt(1)) | pairs | (w >> dt(self._oldest))) != 0

    def add_many(self, items: Sequence[bytes]) -> np.ndarray:
        pos, w, h1 = self._masks_many(items)
        new = ~self._members_np(w)
        # equal ids have equal hashes; only when some hash repeats are the ids compared (a sort
        # is 20x cheaper here than np.unique)
        s = np.sort(h1)
        if bool((s[1:] == s[:-1]).any()):
            first: dict[bytes, int] = {}
            for i, it in enumerate(items):
                j = first.setdefault(it, i)
                if j != i:
                    new[i] = False
        idx = pos.ravel() if new.all() else pos[:, new].ravel()
        self._words[idx] |= self._words.dtype.type(3)
        return new

    def contains_many(self, items: Sequence[bytes], simple: bool = False) -> np.ndarray:
        _, w, _ = self._masks_many(items)
        return w != 0 if simple else self._members_np(w)


def _load() -> tuple[Any, str]:
    """The kernel's class, or None and why not."""
    mod, why = optional("cluster.core.fbf._kernel", ENV)
    if mod is None:
        return None, why
    check = mod.Kernel(np.zeros(8, np.uint8), 3, 3, SEED)
    for item in (b"", b"x", b"client-7:42", bytes(range(15)), bytes(range(16)), bytes(range(47))):
        if check.hash_pair(item) != hash_pair(item):
            return None, "its MurmurHash3 differs from mmh3's on this platform"
    return mod.Kernel, ""


_KERNEL_CLASS, KERNEL_REASON = _load()
KERNEL = "c" if _KERNEL_CLASS is not None else "numpy"


def available() -> bool:
    """True when the compiled kernel is built, checked, and not switched off."""
    return _KERNEL_CLASS is not None


def make(words: np.ndarray, k: int, nfilters: int, hash_fn: HashFn, kernel: bool) -> HotPath:
    """The hot path over ``words``: the kernel when asked for and usable, else ``NumpyPath``."""
    if kernel and _KERNEL_CLASS is not None and hash_fn is hash_pair:
        return _KERNEL_CLASS(words, k, nfilters, SEED)
    return NumpyPath(words, k, nfilters, hash_fn)
