"""Stable Bloom filter (Deng & Rafiei, "Approximately Detecting Duplicates for Streaming Data
using Stable Bloom Filters", SIGMOD 2006).

m cells of d bits (here d = 8: one numpy uint8 per cell, Max = 255). Each id probes K cells (all
non-zero: a duplicate), then P cells are decremented by one and the id's K cells set to Max, so
old ids fade as new ones arrive and the fraction of zeros settles at a stable point.

Parameters (the standard choice):

- K = ceil(log2(1/FPS)), the Bloom filter optimum, as in BoomFilters (Treat) ``OptimalK``; it
  also minimises m here, because m is proportional to K / -ln(1 - FPS^(1/K)) as for a Bloom filter.
- P from the paper's stable-point false-positive rate (its Theorem 2 / equation for FPS)::

      FPS = (1 - (1 / (1 + 1/(P (1/K - 1/m))))^Max)^K   solved for P

- m (our choice, the paper leaves it to the application): ids decay by *insertions*, not by time.
  A cell of an id is decremented with probability P/m per later insertion, so after
  t = rate * window insertions it has taken Binomial(t, P/m) ~ Poisson(tP/m) hits; m is the
  smallest with K * P(Poisson(tP/m) >= Max) <= target, a union bound that ignores the re-setting
  of cells by other ids, so it is conservative. The window is thus probabilistic (an id is
  forgotten early with probability <= target) and holds only at the design rate.

The P decrements are P consecutive cells from a random start (wrapping), as BoomFilters does:
each cell is still hit with probability P/m per insertion, and it is two numpy passes over a
slice instead of P random writes.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from cluster.core.dedup._base import (
    OneByOne,
    check_version,
    design_items,
    frame,
    next_prime,
    poisson_sf,
)
from cluster.core.hashing import hash_pair, positions

MAX = 255


def stable_p(m: int, k: int, fps: float, cell_max: int = MAX) -> int:
    """Cells to decrement per insertion for a stable-point false-positive rate ``fps``."""
    sub = (1.0 - fps ** (1.0 / k)) ** (1.0 / cell_max)
    denom = (1.0 / sub - 1.0) * (1.0 / k - 1.0 / m)
    return max(1, round(1.0 / denom))


def _max_hits_rate(k: int, target: float, cell_max: int) -> float:
    """Largest Poisson mean whose tail at ``cell_max`` keeps K cells all alive w.p. 1 - target."""
    lo, hi = 0.0, float(cell_max)
    for _ in range(60):
        mid = (lo + hi) / 2
        if k * poisson_sf(mid, cell_max) <= target:
            lo = mid
        else:
            hi = mid
    return lo


class StableBloomDedup(OneByOne):
    """K probes, P consecutive decrements, K cells set to Max; forgets by insertions."""

    name: str = "stable-bloom"

    def __init__(self, m: int, k: int, p: int, window: float = 0.0, seed: int = 0x5B1F) -> None:
        if m < 1 or k < 1 or not 1 <= p <= m:
            raise ValueError(f"need m >= 1, k >= 1, 1 <= p <= m; got m={m}, k={k}, p={p}")
        self.m, self.k, self.p = m, k, p
        self._window = window
        self._cells = np.zeros(m, dtype=np.uint8)
        self._mv = self._cells.data
        self._rng = random.Random(seed)
        self._nonzero = np.empty(p, dtype=np.bool_)  # scratch, so a decrement allocates nothing
        self._nonzero_u8 = self._nonzero.view(np.uint8)
        self.inserts = 0

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float) -> StableBloomDedup:
        t = design_items(window, rate)
        k = max(1, math.ceil(math.log2(1.0 / target_fpp)))
        lam = _max_hits_rate(k, target_fpp, MAX)
        m = max(k + 1, math.ceil(t * stable_p(1 << 62, k, target_fpp) / lam))
        for _ in range(3):  # P grows slightly as m shrinks; settle the pair
            p = min(m, stable_p(m, k, target_fpp))
            m = next_prime(max(m, math.ceil(t * p / lam)))
        return cls(m, k, p, window)

    def _positions(self, op_id: bytes) -> list[int]:
        h1, h2 = hash_pair(op_id)
        return positions(h1, h2, self.k, self.m)

    def _decrement(self) -> None:
        start = self._rng.randrange(self.m)
        end = start + self.p
        self._saturating_decrement(self._cells[start:end])
        if end > self.m:
            self._saturating_decrement(self._cells[: end - self.m])

    def _saturating_decrement(self, seg: np.ndarray) -> None:
        # subtract (cell != 0): 0 stays 0; quicker in numpy than maximum-then-subtract
        n = len(seg)
        np.not_equal(seg, 0, out=self._nonzero[:n])
        np.subtract(seg, self._nonzero_u8[:n], out=seg)

    def seen_or_add(self, op_id: bytes) -> bool:
        pos = self._positions(op_id)
        mv = self._mv
        dup = all(mv[q] for q in pos)
        self._decrement()
        for q in pos:
            mv[q] = MAX
        self.inserts += 1
        return dup

    def __contains__(self, op_id: bytes) -> bool:
        mv = self._mv
        return all(mv[q] for q in self._positions(op_id))

    def nbytes(self) -> int:
        return int(self._cells.nbytes)

    @property
    def window(self) -> float:
        return self._window

    def zero_fraction(self) -> float:
        return 1.0 - int(np.count_nonzero(self._cells)) / self.m

    def estimated_fpp(self) -> float:
        """(1 - fraction of zero cells)^K: all K probed cells non-zero."""
        return (1.0 - self.zero_fraction()) ** self.k

    def stats(self) -> dict[str, float]:
        return {"zero_fraction": self.zero_fraction(), "fpp": self.estimated_fpp(),
                "m": float(self.m), "k": float(self.k), "p": float(self.p),
                "items": float(self.inserts)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, [self.m, self.k, self.p, self._window, self.inserts,
                                    self._cells.tobytes()])

    @classmethod
    def from_payload(cls, version: int, payload: Any) -> StableBloomDedup:
        check_version(cls.name, version, 1)
        m, k, p, window, inserts, cells = payload
        d = cls(m, k, p, window)
        d._cells[:] = np.frombuffer(cells, dtype=np.uint8, count=m)
        d.inserts = inserts
        return d
