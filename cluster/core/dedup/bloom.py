"""One plain Bloom filter (the paper's approach 3) and the recycling variant cleared when full.

``BloomDedup`` never forgets, so its false-positive rate climbs for ever as ids pile up (the
paper's Section I argument). ``RecyclingBloomDedup`` is the authors' baseline: the same filter,
cleared once it has taken its design capacity, which bounds the FPP but forgets everything at
once: a retry arriving just after a clear is applied twice, so it guarantees no window at all.
"""

from __future__ import annotations

import math
from typing import Any

from cluster.core.bloom import BloomFilter
from cluster.core.dedup._base import OneByOne, bloom_shape, check_version, design_items, frame


def _fill_fpp(f: BloomFilter) -> float:
    """fill^k: the chance an absent id finds all k bits set, read from the bits themselves.

    Equation (1) from ``f.count`` undercounts once the filter is past capacity, because ids that
    were false positives never counted as inserted (at 3x capacity it says 0.34 for 0.44).
    """
    return float(f.fill() ** f.k)


class BloomDedup(OneByOne):
    """Sized for rate * window ids at the target FPP, never cleared."""

    name: str = "bloom"

    def __init__(self, m: int, k: int) -> None:
        self._f = BloomFilter(m, k)

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float) -> BloomDedup:
        return cls(*bloom_shape(design_items(window, rate), target_fpp))

    def seen_or_add(self, op_id: bytes) -> bool:
        return not self._f.add(op_id)

    def __contains__(self, op_id: bytes) -> bool:
        return op_id in self._f

    def nbytes(self) -> int:
        return self._f.nbytes()

    @property
    def window(self) -> float:
        return math.inf

    def estimated_fpp(self) -> float:
        return _fill_fpp(self._f)

    def stats(self) -> dict[str, float]:
        f = self._f
        return {"items": float(f.count), "fill": f.fill(), "fpp": _fill_fpp(f),
                "m": float(f.m), "k": float(f.k)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, self._f.to_bytes())

    @classmethod
    def from_payload(cls, version: int, payload: Any) -> BloomDedup:
        check_version(cls.name, version, 1)
        d = cls.__new__(cls)
        d._f = BloomFilter.from_bytes(payload)
        return d


class RecyclingBloomDedup(BloomDedup):
    """A Bloom filter cleared when it has taken ``capacity`` new ids (the authors' baseline)."""

    name: str = "recycling-bloom"

    def __init__(self, m: int, k: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        super().__init__(m, k)
        self.capacity = capacity
        self.clears = 0

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float) -> RecyclingBloomDedup:
        n = design_items(window, rate)
        return cls(*bloom_shape(n, target_fpp), capacity=n)

    def seen_or_add(self, op_id: bytes) -> bool:
        f = self._f
        if not f.add(op_id):
            return True
        if f.count > self.capacity:
            # start over with the id that overflowed it: everything before it is forgotten
            f.clear()
            f.add(op_id)
            self.clears += 1
        return False

    @property
    def window(self) -> float:
        return 0.0  # an id added just before a clear is forgotten at once

    def stats(self) -> dict[str, float]:
        f = self._f
        return {"items": float(f.count), "fill": f.fill(), "fpp": _fill_fpp(f),
                "clears": float(self.clears), "capacity": float(self.capacity)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, [self.capacity, self.clears, self._f.to_bytes()])

    @classmethod
    def from_payload(cls, version: int, payload: Any) -> RecyclingBloomDedup:
        check_version(cls.name, version, 1)
        capacity, clears, body = payload
        d = cls(1, 1, capacity)
        d._f = BloomFilter.from_bytes(body)
        d.clears = clears
        return d
