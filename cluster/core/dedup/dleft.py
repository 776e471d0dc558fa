"""d-left geometry shared by the two d-left strategies (Bonomi et al., "An Improved Construction
for Counting Bloom Filters", ESA 2006, Section 3; seed document 004).

An id hashes once to its *true fingerprint* ``x`` in ``[0, B * 2**r)``. Subtable ``i`` applies
its own permutation ``P_i`` to ``x`` and splits the result into a bucket (``0..B-1``) and an
``r``-bit remainder, the value a cell stores. Because ``P_i`` is a bijection:

- a cell (subtable, bucket, remainder) names exactly one ``x``: two ids share a cell only when
  they share ``x`` (so a deletion can only decrement the counter of ids with the same ``x``: no
  false deletions, the paper's point), and a false positive is exactly an ``x`` collision, so
  FPP = live ids / (B * 2**r) whatever d and the bucket size;
- ``x`` is recovered from a cell (``unplace``), which lets a merge re-place a peer's cell in
  another subtable of our table.

The permutation is one Feistel step on the pair (bucket part ``u`` in ``Z_B``, remainder ``v``):
``P_i(u, v) = ((u + F_i(v)) mod B, v)`` with ``F_i(v) = v * k_i mod 2**32`` (odd ``k_i`` per
subtable, injective on remainders below 2**32). It
is invertible for any B (bucket counts need not be powers of two, which keeps the sizing
fine-grained), and two ids that differ in ``v`` get independent-looking bucket offsets in every
subtable, which is what the d choices need. It costs one multiply per subtable, and the
remainder is computed once: the scalar hot path is Python, and a heavier mix cost more there
than all the cell reads together.
"""

from __future__ import annotations

import math

import numpy as np

from cluster.core.hashing import MASK64

_GOLDEN = 0x9E3779B97F4A7C15
MASK32 = 0xFFFFFFFF


def _splitmix(z: int) -> int:
    z = (z + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class DLeftHash:
    """The d permutations of ``[0, B * 2**r)``: ``x -> (bucket, remainder)`` per subtable."""

    def __init__(self, d: int, buckets: int, rbits: int) -> None:
        if d < 1 or buckets < 1 or not 1 <= rbits <= 60:
            raise ValueError(f"need d >= 1, buckets >= 1, 1 <= rbits <= 60; got "
                             f"{d}, {buckets}, {rbits}")
        self.d, self.B, self.r = d, buckets, rbits
        self.N = buckets << rbits  # the true-fingerprint space
        self.rmask = (1 << rbits) - 1
        # odd 32-bit keys, one per subtable, fixed: every process derives the same
        self.keys = [(_splitmix(i) & MASK32) | 1 for i in range(d)]
        self._np_keys = [np.uint64(k) for k in self.keys]
        self._key_col = np.array(self.keys, dtype=np.uint64)[:, None]  # (d, 1), for rows_np
        self._row_base = (np.arange(d, dtype=np.uint64) * np.uint64(buckets))[:, None]

    def x_of(self, h1: int) -> int:
        return h1 % self.N

    def place(self, x: int) -> tuple[list[int], int]:
        """The bucket of ``x`` in every subtable (subtable 0 first), and its remainder."""
        u, v, B = x >> self.r, x & self.rmask, self.B
        return [(u + (v * k & MASK32)) % B for k in self.keys], v

    def unplace(self, i: int, bucket: int, rem: int) -> int:
        """The ``x`` whose place in subtable ``i`` is (bucket, rem): ``place`` inverted."""
        u = (bucket - (rem * self.keys[i] & MASK32)) % self.B
        return (u << self.r) | rem

    # -- numpy forms: a uint64 product may wrap, which leaves its low 32 bits (all F uses) exact --

    def x_of_np(self, h1: np.ndarray) -> np.ndarray:
        return h1 % np.uint64(self.N)

    def place_np(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Buckets of shape (d, n) and remainders of shape (n,)."""
        B, m32 = np.uint64(self.B), np.uint64(MASK32)
        u, v = x >> np.uint64(self.r), x & np.uint64(self.rmask)
        buckets = np.empty((self.d, len(x)), dtype=np.uint64)
        for i, k in enumerate(self._np_keys):
            buckets[i] = (u + ((v * k) & m32)) % B
        return buckets, v

    def rows_np(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``place_np`` as rows of the (d * B, c) cell grid: ``i * B + bucket`` of shape (d, n),
        intp (ready to index with), in one broadcast pass over the d subtables."""
        u, v = x >> np.uint64(self.r), x & np.uint64(self.rmask)
        rows = v * self._key_col  # (d, n); only the low 32 bits are used, so a wrap is harmless
        rows &= np.uint64(MASK32)
        rows += u
        rows %= np.uint64(self.B)
        rows += self._row_base
        return rows.astype(np.intp), v

    def unplace_np(self, i: int, bucket: np.ndarray, rem: np.ndarray) -> np.ndarray:
        B = np.uint64(self.B)
        # (a - b) mod B without a uint64 wrap: a + (B - b mod B)
        u = (bucket + (B - ((rem * self._np_keys[i]) & np.uint64(MASK32)) % B)) % B
        return (u << np.uint64(self.r)) | rem


def cell_bits_for(rbits: int, tag_bits: int) -> int:
    """The narrowest numpy width holding a remainder and a tag."""
    for w in (16, 32, 64):
        if rbits + tag_bits <= w:
            return w
    raise ValueError(f"a {rbits}-bit remainder plus {tag_bits} tag bits exceed 64 bits")


def buckets_for(items: float, d: int, cells: int, load: float) -> int:
    """Buckets per subtable so that ``items`` fill ``load`` of the d * B * cells cells."""
    return max(1, math.ceil(items / (d * cells * load)))


DTYPES = {16: np.uint16, 32: np.uint32, 64: np.uint64}
