"""Counting Bloom filter with TTL deletion (Fan et al., "Summary Cache", 2000; seed document 004).

m 4-bit counters (two per byte of a numpy uint8 array), k positions per id by double hashing,
sized like a Bloom filter for rate * window ids at the target. Each new id is also appended to a
time-ordered queue; once its TTL (the window) has passed it is deleted: its k counters are
decremented. The window is therefore exact: an id is remembered for ``window`` seconds.

The price: the queue is exact state per id (insertion time and the two 64-bit hashes, 24 bytes
per live id in three ``array.array`` ring buffers), on top of 4 bits per counter; ``nbytes``
counts both. Counter overflow: a counter at 15 is saturated and sticky, never incremented nor
decremented again (its true count is unknown, and decrementing it could create a false negative,
the pitfall seed 004 describes); overflows are counted in ``stats``. A decrement that finds 0
would be a deletion of an id never inserted; it cannot happen here (only queued ids are deleted)
and is counted as ``underflows`` if it ever does.
"""

from __future__ import annotations

import sys
import time
from array import array
from typing import Any

import numpy as np

from cluster.core.bloom import bloom_fpp
from cluster.core.dedup._base import (
    Clock,
    OneByOne,
    bloom_shape,
    check_version,
    design_items,
    frame,
    next_prime,
)
from cluster.core.hashing import hash_pair, positions

_SATURATED = 15
_COMPACT_AFTER = 4096


def _le(a: array[Any]) -> bytes:
    if sys.byteorder == "little":
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def _from_le(typecode: str, data: bytes) -> array[Any]:
    a = array(typecode)
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


class CountingBloomDedup(OneByOne):
    """4-bit counters plus a time-ordered queue of (time, h1, h2) that deletes expired ids."""

    name: str = "counting-bloom"

    def __init__(self, m: int, k: int, window: float, clock: Clock = time.time) -> None:
        if m < 1 or k < 1 or not window > 0:
            raise ValueError(f"need m >= 1, k >= 1, window > 0; got m={m}, k={k}, window={window}")
        self.m, self.k = m, k
        self._window = float(window)
        self._clock = clock
        self._counters = np.zeros((m + 1) // 2, dtype=np.uint8)
        self._mv = self._counters.data
        self._times: array[float] = array("d")
        self._h1: array[int] = array("Q")
        self._h2: array[int] = array("Q")
        self._head = 0
        self.overflows = 0
        self.underflows = 0

    @classmethod
    def for_window(
        cls, window: float, rate: float, target_fpp: float, clock: Clock = time.time
    ) -> CountingBloomDedup:
        m, k = bloom_shape(design_items(window, rate), target_fpp)
        return cls(next_prime(m), k, window, clock)

    def _positions(self, h1: int, h2: int) -> list[int]:
        return positions(h1, h2, self.k, self.m)

    def _expire(self, now: float) -> None:
        cutoff = now - self._window
        times, h1s, h2s, mv = self._times, self._h1, self._h2, self._mv
        head, end = self._head, len(times)
        while head < end and times[head] < cutoff:
            for q in self._positions(h1s[head], h2s[head]):
                shift = (q & 1) << 2
                c = (mv[q >> 1] >> shift) & 15
                if c == _SATURATED:
                    continue
                if c == 0:
                    self.underflows += 1
                else:
                    mv[q >> 1] -= 1 << shift
            head += 1
        if head > _COMPACT_AFTER and 2 * head > end:
            del times[:head], h1s[:head], h2s[:head]
            head = 0
        self._head = head

    def seen_or_add(self, op_id: bytes) -> bool:
        now = self._clock()
        times = self._times
        if self._head < len(times) and times[self._head] < now - self._window:
            self._expire(now)
        h1, h2 = hash_pair(op_id)
        pos = self._positions(h1, h2)
        mv = self._mv
        if all(mv[q >> 1] >> ((q & 1) << 2) & 15 for q in pos):
            return True
        for q in pos:
            shift = (q & 1) << 2
            if (mv[q >> 1] >> shift) & 15 == _SATURATED:
                self.overflows += 1
            else:
                mv[q >> 1] += 1 << shift
        times.append(now)
        self._h1.append(h1)
        self._h2.append(h2)
        return False

    def __contains__(self, op_id: bytes) -> bool:
        # expiring is time passing, not recording: the FBF's check rotates its filters alike
        times = self._times
        if self._head < len(times) and times[self._head] < self._clock() - self._window:
            self._expire(self._clock())
        mv = self._mv
        return all(mv[q >> 1] >> ((q & 1) << 2) & 15 for q in self._positions(*hash_pair(op_id)))

    def counter(self, q: int) -> int:
        return (self._mv[q >> 1] >> ((q & 1) << 2)) & 15

    def live(self) -> int:
        return len(self._times) - self._head

    def nbytes(self) -> int:
        """4 bits per counter plus the queue's three buffers (over-allocation included)."""
        queue = sum(sys.getsizeof(a) for a in (self._times, self._h1, self._h2))
        return int(self._counters.nbytes) + queue

    @property
    def window(self) -> float:
        return self._window

    def estimated_fpp(self) -> float:
        """Equation (1) with the live (not yet expired) ids."""
        return bloom_fpp(self.live() / self.m, self.k)

    def stats(self) -> dict[str, float]:
        return {"items": float(self.live()), "fpp": self.estimated_fpp(), "m": float(self.m),
                "k": float(self.k), "overflows": float(self.overflows),
                "underflows": float(self.underflows)}

    def to_bytes(self) -> bytes:
        h = self._head
        return frame(self.name, 1, [
            self.m, self.k, self._window, self.overflows, self._counters.tobytes(),
            _le(self._times[h:]), _le(self._h1[h:]), _le(self._h2[h:]),
        ])

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> CountingBloomDedup:
        check_version(cls.name, version, 1)
        m, k, window, overflows, counters, times, h1, h2 = payload
        d = cls(m, k, window, clock)
        d._counters[:] = np.frombuffer(counters, dtype=np.uint8, count=(m + 1) // 2)
        d._times, d._h1, d._h2 = _from_le("d", times), _from_le("Q", h1), _from_le("Q", h2)
        d.overflows = overflows
        return d
