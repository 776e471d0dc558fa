"""The Flower filter (Kifi engineering blog, "Flower Filter - A simple time-decaying approximate
membership filter"; seed document 001): one array, probabilistic decay by overwriting.

In the blog's letters: an array of ``s`` entries of ``b``-bit fingerprints. Each id hashes to
``n`` positions and writes its fingerprint at all of them, every time it is seen; it answers
"seen" while at least one of its n positions still holds its fingerprint. Later ids overwrite
entries, so an id survives t later insertions with probability about 1 - (1 - e^(-nt/s))^n
(the blog's phi), and an absent id matches one entry with probability about 2^-b.

Two choices the blog leaves open:

- Fingerprint 0 marks an empty entry (ids map to 1..2^b-1), so a fresh array holds no phantom
  ids, the blog's "uninitialised values" problem raised in its comments.
- Sizing from (window, rate, target): with t = rate * window, the smallest ``s * b`` such that an
  id is forgotten within t insertions with probability <= target, (1 - e^(-nt/s))^n <= target,
  and an absent id matches with probability 1 - (1 - 1/(2^b - 1))^n <= target; b is one of the
  numpy widths 8, 16, 32 (the blog's {b = 8, n < 4}, {b = 16, 4 <= n <= 32} appear as the target
  loosens). Decay counts insertions, not seconds: the window holds at the design rate only, with
  probability 1 - target, and a higher rate shortens it.
"""

from __future__ import annotations

import math
from typing import Any

import mmh3
import numpy as np

from cluster.core.dedup._base import OneByOne, check_version, design_items, frame, next_prime
from cluster.core.hashing import hash_pair, positions

_FP_SEED = 0xF10E
_WIDTHS = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def flower_shape(t: int, target: float, max_n: int = 64) -> tuple[int, int, int]:
    """(s, n, b) of least memory remembering ``t`` insertions, matching absent ids at ``target``."""
    best: tuple[int, int, int] | None = None
    for b in _WIDTHS:
        per_entry = 1.0 / ((1 << b) - 1)
        for n in range(1, max_n + 1):
            if -math.expm1(n * math.log1p(-per_entry)) > target:
                break
            x = -math.log1p(-(target ** (1.0 / n)))  # the largest n*t/s that is allowed
            s = next_prime(max(n, math.ceil(n * t / x)))
            if best is None or s * b < best[0] * best[2]:
                best = (s, n, b)
    if best is None:
        raise ValueError(f"target {target} is below what 32-bit fingerprints can reach")
    return best


class FlowerDedup(OneByOne):
    """s entries of b-bit fingerprints, n positions per id; ids fade as others overwrite them."""

    name: str = "flower"

    def __init__(self, s: int, n: int, b: int, window: float = 0.0) -> None:
        if b not in _WIDTHS or s < 1 or not 1 <= n <= s:
            raise ValueError(f"need b in {sorted(_WIDTHS)}, 1 <= n <= s; got s={s}, n={n}, b={b}")
        self.s, self.n, self.b = s, n, b
        self._window = window
        self._fp_mask = (1 << b) - 1
        self._arr = np.zeros(s, dtype=_WIDTHS[b])
        self._mv = self._arr.data
        self.inserts = 0

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float) -> FlowerDedup:
        s, n, b = flower_shape(design_items(window, rate), target_fpp)
        return cls(s, n, b, window)

    def _locate(self, op_id: bytes) -> tuple[list[int], int]:
        h1, h2 = hash_pair(op_id)
        fp = mmh3.hash(op_id, _FP_SEED, False) & self._fp_mask
        return positions(h1, h2, self.n, self.s), fp or 1

    def seen_or_add(self, op_id: bytes) -> bool:
        pos, fp = self._locate(op_id)
        mv = self._mv
        seen = any(mv[q] == fp for q in pos)
        for q in pos:
            mv[q] = fp  # every sighting rewrites all n entries, as in the blog
        self.inserts += 1
        return seen

    def __contains__(self, op_id: bytes) -> bool:
        pos, fp = self._locate(op_id)
        mv = self._mv
        return any(mv[q] == fp for q in pos)

    def nbytes(self) -> int:
        return int(self._arr.nbytes)

    @property
    def window(self) -> float:
        return self._window

    def occupancy(self) -> float:
        return int(np.count_nonzero(self._arr)) / self.s

    def estimated_fpp(self) -> float:
        """An absent id matches an occupied entry with probability 1/(2^b - 1), at any of n."""
        per_entry = self.occupancy() / self._fp_mask
        return -math.expm1(self.n * math.log1p(-per_entry))

    def stats(self) -> dict[str, float]:
        return {"occupancy": self.occupancy(), "fpp": self.estimated_fpp(), "s": float(self.s),
                "n": float(self.n), "b": float(self.b), "items": float(self.inserts)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, [self.s, self.n, self.b, self._window, self.inserts,
                                    self._arr.astype(self._arr.dtype.newbyteorder("<")).tobytes()])

    @classmethod
    def from_payload(cls, version: int, payload: Any) -> FlowerDedup:
        check_version(cls.name, version, 1)
        s, n, b, window, inserts, body = payload
        d = cls(s, n, b, window)
        d._arr[:] = np.frombuffer(body, dtype=np.dtype(_WIDTHS[b]).newbyteorder("<"), count=s)
        d.inserts = inserts
        return d
