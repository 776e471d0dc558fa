"""The d-left counting Bloom filter (Bonomi et al., ESA 2006; seed document 004) with TTL deletion.

d subtables of B buckets of ``c`` cells; a cell holds an id's remainder
(``cluster.core.dedup.dleft``) and a 4-bit counter, 0 meaning empty. Every sighting of an id is
counted: the counter of the cell already holding its true fingerprint goes up (searched in all d
candidate buckets first, so a fingerprint never has two cells), else the id takes a cell in its
least loaded candidate bucket (leftmost on a tie). Each counted sighting is queued with its
time; once the window has passed over it the sighting is deleted: its counter goes down, and the
cell is freed at 0. So an id is remembered until one window after its last counted sighting, and
forgotten then.

The seed's pitfalls, and what happens here:

- Counter overflow: a counter at 15 is full. A sighting that finds it full is neither counted
  nor queued (``saturated`` in ``stats``), so a counter always equals the sightings queued for it
  and every deletion has a count to take; the id is still remembered for a window after its
  15th counted sighting, which is no earlier than a window after its first.
- Deleting what was never inserted: only queued sightings are deleted, and each finds its cell;
  a deletion that finds no cell (a damaged snapshot) decrements nothing (``missing_deletes``).
- False deletions: a cell names one true fingerprint (the permutations are bijections), so a
  deletion can only lower the count of ids sharing that fingerprint, which the count includes.

A full set of d buckets sends the id to an exact stash (fingerprint -> count). The queue is exact
state per sighting (time and fingerprint, 16 bytes) on top of the cells; ``nbytes`` counts both.
"""

from __future__ import annotations

import sys
import time
from array import array
from typing import Any

import numpy as np

from cluster.core.dedup._base import Clock, OneByOne, check_version, design_items, frame
from cluster.core.dedup.counting import _from_le, _le
from cluster.core.dedup.dleft import DTYPES, DLeftHash, buckets_for, cell_bits_for
from cluster.core.hashing import SEED, _murmur

COUNTER_BITS = 4
FULL = (1 << COUNTER_BITS) - 1
_COMPACT_AFTER = 4096
_LOAD = 0.75  # the paper's design point: 6 of 8 cells in use on average


def counting_shape(items: int, target_fpp: float, d: int = 4,
                   cells: int = 8) -> tuple[int, int]:
    """(buckets, remainder bits): the narrowest cell whose remainder meets ``target_fpp``."""
    buckets = buckets_for(items, d, cells, _LOAD)
    for width in (16, 32, 64):
        rbits = min(60, width - COUNTER_BITS)
        if items / (buckets * 2.0**rbits) <= target_fpp:
            return buckets, rbits
    raise ValueError(f"target_fpp {target_fpp} is below what 64-bit cells can reach")


class DLeftCountingDedup(OneByOne):
    """d-left cells of (remainder, 4-bit counter) plus a queue deleting sightings after the TTL."""

    name: str = "dleft-counting"

    def __init__(self, d: int, buckets: int, cells: int, rbits: int, window: float,
                 clock: Clock = time.time) -> None:
        if not window > 0 or cells < 1:
            raise ValueError(f"need window > 0 and cells >= 1; got {window}, {cells}")
        self.d, self.B, self.c, self.r = d, buckets, cells, rbits
        self.hash = DLeftHash(d, buckets, rbits)
        self._window = float(window)
        self._clock = clock
        self.cells = np.zeros(d * buckets * cells, dtype=DTYPES[cell_bits_for(rbits,
                                                                               COUNTER_BITS)])
        self._mv = memoryview(self.cells)  # type: ignore[arg-type]  # ndarray exports a buffer
        self._times: array[float] = array("d")
        self._xs: array[int] = array("Q")
        self._head = 0
        self.stash: dict[int, int] = {}
        self.saturated = self.missing_deletes = self.overflows = 0

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float,
                   clock: Clock = time.time) -> DLeftCountingDedup:
        buckets, rbits = counting_shape(design_items(window, rate), target_fpp)
        return cls(4, buckets, 8, rbits, window, clock)

    # -- cells ----------------------------------------------------------------------------------

    def _find(self, x: int) -> int:
        """Index of the cell holding ``x``, or -1."""
        buckets, v = self.hash.place(x)
        mv, c, B = self._mv, self.c, self.B
        for i, b in enumerate(buckets):
            base = (i * B + b) * c
            for j, val in enumerate(mv[base : base + c].tolist()):
                if val and val >> COUNTER_BITS == v:
                    return base + j
        return -1

    def count_of(self, x: int) -> int:
        q = self._find(x)
        return self._mv[q] & FULL if q >= 0 else self.stash.get(x, 0)

    def _count(self, x: int) -> tuple[bool, bool]:
        """One sighting of ``x``: (was it present, was it counted)."""
        q = self._find(x)
        if q >= 0:
            if self._mv[q] & FULL == FULL:
                self.saturated += 1
                return True, False
            self._mv[q] += 1
            return True, True
        held = self.stash.get(x)
        if held is not None:
            if held == FULL:
                self.saturated += 1
                return True, False
            self.stash[x] = held + 1
            return True, True
        self._place(x)
        return False, True

    def _place(self, x: int) -> None:
        buckets, v = self.hash.place(x)
        mv, c = self._mv, self.c
        best, best_load = -1, c
        for i, b in enumerate(buckets):
            base = (i * self.B + b) * c
            load = c - mv[base : base + c].tolist().count(0)
            if load < best_load:
                best, best_load = base, load
        if best < 0:
            self.overflows += 1
            self.stash[x] = 1
        else:
            mv[best + mv[best : best + c].tolist().index(0)] = (v << COUNTER_BITS) | 1

    def _delete(self, x: int) -> None:
        q = self._find(x)
        if q >= 0:
            # a full counter is never lowered by more than the sightings queued for it
            self._mv[q] = 0 if self._mv[q] & FULL == 1 else self._mv[q] - 1
        elif x in self.stash:
            self.stash[x] -= 1
            if not self.stash[x]:
                del self.stash[x]
        else:
            self.missing_deletes += 1

    # -- time -----------------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        cutoff = now - self._window
        times, xs = self._times, self._xs
        head, end = self._head, len(times)
        while head < end and times[head] < cutoff:
            self._delete(xs[head])
            head += 1
        if head > _COMPACT_AFTER and 2 * head > end:
            del times[:head], xs[:head]
            head = 0
        self._head = head

    # -- the dedup interface --------------------------------------------------------------------

    def seen_or_add(self, op_id: bytes) -> bool:
        now = self._clock()
        if self._head < len(self._times) and self._times[self._head] < now - self._window:
            self._expire(now)
        x = _murmur(op_id, SEED)[0] % self.hash.N
        present, counted = self._count(x)
        if counted:
            self._times.append(now)
            self._xs.append(x)
        return present

    def __contains__(self, op_id: bytes) -> bool:
        self._expire(self._clock())  # time passing, not recording
        x = _murmur(op_id, SEED)[0] % self.hash.N
        return self._find(x) >= 0 or x in self.stash

    def live(self) -> int:
        """Distinct true fingerprints held."""
        return int(np.count_nonzero(self.cells)) + len(self.stash)

    def nbytes(self) -> int:
        queue = sys.getsizeof(self._times) + sys.getsizeof(self._xs)
        stash = sys.getsizeof(self.stash) + 64 * len(self.stash) if self.stash else 0
        return int(self.cells.nbytes) + queue + stash

    @property
    def window(self) -> float:
        return self._window

    def estimated_fpp(self) -> float:
        """A new id is a false positive exactly when its true fingerprint is held."""
        return self.live() / self.hash.N

    def stats(self) -> dict[str, float]:
        return {"items": float(self.live()), "sightings": float(len(self._times) - self._head),
                "fpp": self.estimated_fpp(), "buckets": float(self.B),
                "remainder_bits": float(self.r), "saturated": float(self.saturated),
                "missing_deletes": float(self.missing_deletes),
                "overflows": float(self.overflows), "stash": float(len(self.stash))}

    def to_bytes(self) -> bytes:
        h = self._head
        le = self.cells.astype(self.cells.dtype.newbyteorder("<"), copy=False)
        return frame(self.name, 1, [
            self.d, self.B, self.c, self.r, self._window, le.tobytes(), _le(self._times[h:]),
            _le(self._xs[h:]), sorted(self.stash.items()),
            [self.saturated, self.missing_deletes, self.overflows],
        ])

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> DLeftCountingDedup:
        check_version(cls.name, version, 1)
        d, buckets, cells, rbits, window, body, times, xs, stash, counts = payload
        f = cls(d, buckets, cells, rbits, window, clock)
        dt = f.cells.dtype.newbyteorder("<")
        f.cells[:] = np.frombuffer(body, dtype=dt, count=len(f.cells))
        f._times, f._xs = _from_le("d", times), _from_le("Q", xs)
        f.stash = {int(x): int(n) for x, n in stash}
        f.saturated, f.missing_deletes, f.overflows = counts
        return f
