"""A d-left table of (fingerprint, epoch) cells that remembers every op id for exactly a window.

The d-left counting Bloom filter of Bonomi et al. (ESA 2006, seed document 004) with its counter
replaced by the epoch the id was written in: d subtables of B buckets of ``c`` cells; an id goes
to the least loaded of its d candidate buckets (the leftmost on a tie), as the remainder of its
true fingerprint (``cluster.core.dedup.dleft``) plus an ``e``-bit epoch tag. An epoch is
``window / E`` seconds, aligned to the clock (``floor(time / epoch)``), so replicas agree on
them.

Forgetting, exact to one epoch: an id written in epoch ``w`` is a member while the current epoch
is at most ``w + E``, so it is remembered for at least ``window`` and forgotten by
``window + window/E``. Tags are ``1 + epoch mod P`` with ``P = 2**e - 1`` (0 marks an empty cell),
and an age ``(now - tag) mod P`` is exact while the true age stays below P. Two mechanisms keep
it there:

- lazily, on bucket access: a lookup ignores an expired cell, an insert clears expired cells of
  its fingerprint, and an insert that finds its d buckets full clears their expired cells;
- a sweep: every epoch, 1/S of the table drops its expired cells (vectorised), so each bucket is
  swept every S epochs and no cell outlives E + S < P epochs. Expired cells not yet swept count
  as occupied when choosing the least loaded bucket: at most S of the E + 1 live epochs' worth.

A full set of d buckets sends the id to a small exact stash (true fingerprint -> epoch), so an
overflow costs memory, never a forgotten id; ``stats`` counts them.

FPP: a false positive is a true-fingerprint collision, so FPP = live ids / (B * 2**r), the fill
over the fingerprint space (``estimated_fpp``). Sizing picks the cell width, then the most epoch
bits that still leave enough remainder bits for ``target_fpp`` at the design fill.

Pure: no I/O; the clock is passed in. Not thread-safe (one event loop owns it).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from cluster.core.dedup._base import Clock, FilterBacked, check_version, design_items, frame
from cluster.core.dedup.dleft import DTYPES, MASK32, DLeftHash, buckets_for, cell_bits_for
from cluster.core.hashing import SEED, _murmur

_SWEEP_CHUNKS = 4  # S: each bucket swept every 4 epochs; expired-but-unswept cells stay few
_MAX_TAG_BITS = 8


def epochs_for(tag_bits: int) -> tuple[int, int]:
    """(E, S) for ``tag_bits``: E epochs per window, sweep every S epochs, E + S <= P - 1."""
    period = (1 << tag_bits) - 1
    sweep = min(_SWEEP_CHUNKS, max(1, (period - 1) // 3))
    return period - 1 - sweep, sweep


def window_shape(items: int, target_fpp: float, d: int = 4, cells: int = 8,
                 load: float = 0.85) -> tuple[int, int, int]:
    """(buckets, remainder bits, tag bits) of least memory meeting ``target_fpp``.

    The narrowest cell first; within it the most tag bits (sharper forgetting) whose remainder
    still gives live / (B * 2**r) <= target with ``items * (E+1)/E`` live at ``load`` fill.
    """
    for width in (16, 32, 64):
        for tag_bits in range(min(_MAX_TAG_BITS, width - 4), 3, -1):
            rbits = width - tag_bits
            epochs, _ = epochs_for(tag_bits)
            peak = items * (epochs + 1) / epochs
            buckets = buckets_for(peak, d, cells, load)
            if rbits <= 60 and peak / (buckets * 2.0**rbits) <= target_fpp:
                return buckets, rbits, tag_bits
    raise ValueError(f"target_fpp {target_fpp} is below what 64-bit cells can reach")


class DLeftWindowFilter:
    """d subtables x B buckets x c cells of ``remainder << e | epoch tag``, plus a stash."""

    def __init__(self, d: int, buckets: int, cells: int, rbits: int, tag_bits: int,
                 window: float, clock: Clock = time.time) -> None:
        if not (window > 0 and math.isfinite(window)) or cells < 1 or not 2 <= tag_bits <= 16:
            raise ValueError(f"need window > 0, cells >= 1, 2 <= tag_bits <= 16; got "
                             f"{window}, {cells}, {tag_bits}")
        self.d, self.B, self.c, self.r, self.e = d, buckets, cells, rbits, tag_bits
        self.width = cell_bits_for(rbits, tag_bits)
        self.hash = DLeftHash(d, buckets, rbits)
        self._subtables = [(i * buckets * cells, k) for i, k in enumerate(self.hash.keys)]
        self.P = (1 << tag_bits) - 1
        self.E, self.S = epochs_for(tag_bits)
        self._window = float(window)
        self.epoch_len = self._window / self.E
        self._clock = clock
        self.cells = np.zeros(d * buckets * cells, dtype=DTYPES[self.width])
        self._mv = memoryview(self.cells)  # type: ignore[arg-type]  # ndarray exports a buffer
        self._chunk = -(-(d * buckets) // self.S)  # buckets swept per epoch
        self._ptr = 0  # the next chunk the sweep visits
        self.stash: dict[int, int] = {}  # true fingerprint -> epoch, for full bucket sets
        self.overflows = 0
        self._set_epoch(self._epoch_at(clock()))

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float,
                   clock: Clock = time.time, *, d: int = 4, cells: int = 8,
                   load: float = 0.85) -> DLeftWindowFilter:
        buckets, rbits, tag_bits = window_shape(design_items(window, rate), target_fpp, d,
                                                cells, load)
        return cls(d, buckets, cells, rbits, tag_bits, window, clock)

    @property
    def window(self) -> float:
        return self._window

    @property
    def epoch(self) -> int:
        return self._cur

    def _epoch_at(self, now: float) -> int:
        return math.floor(now / self.epoch_len)

    def _set_epoch(self, ep: int) -> None:
        self._cur = ep
        self._ctag = 1 + ep % self.P

    def shape(self) -> tuple[int, int, int, int, int, float]:
        return self.d, self.B, self.c, self.r, self.e, self._window

    # -- time ------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Bring the epoch up to the clock, sweeping what that expires. Never goes back: a clock
        that steps back stamps ids with the later epoch, so they are remembered longer."""
        ep = self._epoch_at(self._clock())
        if ep > self._cur:
            self._advance(ep)

    def _advance(self, ep: int) -> None:
        jump = ep - self._cur
        total = self.d * self.B
        if jump > self.E:  # everything written so far is older than the window
            self.cells.fill(0)
        elif jump >= self.S:
            self._sweep(0, total, jump)
        else:
            # ages are exact at the current epoch (every bucket swept within S epochs): judge
            # each cell at now + jump, chunk by chunk, one chunk per epoch passed
            for _ in range(jump):
                lo = self._ptr * self._chunk
                self._sweep(lo, min(total, lo + self._chunk), jump)
                self._ptr = (self._ptr + 1) % self.S
        if self.stash:
            self.stash = {x: w for x, w in self.stash.items() if ep - w <= self.E}
        self._set_epoch(ep)

    def _sweep(self, lo: int, hi: int, shift: int) -> None:
        view = self.cells[lo * self.c : hi * self.c]
        dt, P, keep = view.dtype.type, self.P, self.E - shift  # ages up to ``keep`` stay
        # z = ctag + P - tag lies in [ctag, ctag + P] < 2P, so age = z mod P is z or z - P:
        # age > keep  <=>  keep < z < P  or  z > P + keep. Compares on the cells' own dtype
        # (no modulo, no table lookup through an index array: 2x faster than either). An
        # empty cell (tag 0, and a cell is 0 exactly when its tag is) may test expired:
        # clearing it changes nothing.
        z = view & dt(P)
        np.subtract(dt(self._ctag + P), z, out=z)
        view[(z > dt(keep)) & ((z < dt(P)) | (z > dt(P + keep)))] = 0

    # -- scalar paths ---------------------------------------------------------------------------

    def x_of(self, op_id: bytes) -> int:
        return _murmur(op_id, SEED)[0] % self.hash.N

    def seen_or_add(self, op_id: bytes) -> bool:
        """True if the id is a live member; otherwise record it now and return False."""
        ep = self._epoch_at(self._clock())
        if ep > self._cur:
            self._advance(ep)
        return self.add_x(_murmur(op_id, SEED)[0] % self.hash.N)

    def add_x(self, x: int) -> bool:
        """``seen_or_add`` for a true fingerprint, at the current epoch."""
        mv, c, P, E, ctag, B = self._mv, self.c, self.P, self.E, self._ctag, self.B
        u, v = x >> self.r, x & self.hash.rmask
        lo = v << self.e
        hi = lo + P  # a cell of remainder v holds lo | tag, tag in 1..P
        found = False
        best_load, best_base, best_cells = c, -1, None
        for off, k in self._subtables:  # DLeftHash.place, inlined: this is the hot path
            base = off + (u + (v * k & MASK32)) % B * c
            cells = mv[base : base + c].tolist()
            for val in cells:
                if lo < val <= hi:
                    if (ctag - (val & P)) % P <= E:
                        found = True
                    else:  # lazy expiry: the id's own stale cell is freed on access
                        j = cells.index(val)
                        cells[j] = mv[base + j] = 0
            load = c - cells.count(0)
            if load < best_load:
                best_load, best_base, best_cells = load, base, cells
        if found or (self.stash and self._stash_live(x)):
            return True
        if best_cells is not None:
            mv[best_base + best_cells.index(0)] = lo | ctag
        else:
            self._place_full(x, self.hash.place(x)[0], v)
        return False

    def _stash_live(self, x: int) -> bool:
        w = self.stash.get(x)
        return w is not None and self._cur - w <= self.E

    def _place_full(self, x: int, buckets: list[int], v: int, epoch: int | None = None) -> None:
        """All d buckets hold no empty cell: clear their expired cells, else use the stash."""
        c, P, E, ctag = self.c, self.P, self.E, self._ctag
        ep = self._cur if epoch is None else epoch
        for i, b in enumerate(buckets):
            base = (i * self.B + b) * c
            view = self.cells[base : base + c]
            age = (ctag + P - (view & view.dtype.type(P)).astype(np.int64)) % P
            view[age > E] = 0
        loads = [int(np.count_nonzero(self.cells[(i * self.B + b) * c :][:c]))
                 for i, b in enumerate(buckets)]
        best = min(range(self.d), key=loads.__getitem__)
        if loads[best] < c:
            base = (best * self.B + buckets[best]) * c
            j = self._mv[base : base + c].tolist().index(0)
            self._mv[base + j] = (v << self.e) | (1 + ep % P)
        else:
            self.overflows += 1
            self.stash[x] = max(ep, self.stash.get(x, ep))

    def __contains__(self, op_id: bytes) -> bool:
        self.tick()  # time passing, not recording: the FBF's check rotates alike
        return self.contains_x(self.x_of(op_id))

    def contains_x(self, x: int) -> bool:
        buckets, v = self.hash.place(x)
        mv, c, P, E, ctag, B = self._mv, self.c, self.P, self.E, self._ctag, self.B
        lo = v << self.e
        hi = lo + P
        for i, b in enumerate(buckets):
            base = (i * B + b) * c
            for val in mv[base : base + c].tolist():
                if lo < val <= hi and (ctag - (val & P)) % P <= E:
                    return True
        return bool(self.stash) and self._stash_live(x)

    # -- batch and merge (vectorised in cluster.core.dedup.dleft_vector) ---------------------

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        from cluster.core.dedup.dleft_vector import seen_or_add_many

        return seen_or_add_many(self, op_ids)

    def contains_many(self, op_ids: Sequence[bytes]) -> np.ndarray:
        from cluster.core.dedup.dleft_vector import contains_many

        return contains_many(self, op_ids)

    def merge(self, other: DLeftWindowFilter) -> None:
        """Take in every live id of ``other``, keeping the later epoch of an id both hold.

        As sets of (true fingerprint, epoch) judged at the later of the two current epochs,
        merge is commutative, associative and idempotent; where a cell lands may differ.
        """
        from cluster.core.dedup.dleft_vector import merge_into

        if other.shape() != self.shape():
            raise ValueError(f"cannot merge d-left windows of shapes {other.shape()} and "
                             f"{self.shape()}")
        merge_into(self, other)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every live id as (true fingerprints, epochs), stash included; ordered by x."""
        from cluster.core.dedup.dleft_vector import live_entries

        return live_entries(self)

    # -- measures ---------------------------------------------------------------------------

    def live(self) -> int:
        tags = self.cells & self.cells.dtype.type(self.P)
        age = (self._ctag + self.P - tags.astype(np.int64)) % self.P
        alive = int(np.count_nonzero((tags != 0) & (age <= self.E)))
        return alive + sum(1 for w in self.stash.values() if self._cur - w <= self.E)

    def occupancy(self) -> float:
        """Share of cells in use (expired cells not yet swept included)."""
        return int(np.count_nonzero(self.cells)) / len(self.cells)

    def estimated_fpp(self) -> float:
        """A new id is a false positive exactly when its true fingerprint is a live one's."""
        return self.live() / self.hash.N

    def nbytes(self) -> int:
        stash = sys.getsizeof(self.stash) + 64 * len(self.stash) if self.stash else 0
        return int(self.cells.nbytes) + stash

    # -- state ------------------------------------------------------------------------------

    def payload(self) -> list[Any]:
        le = self.cells.astype(self.cells.dtype.newbyteorder("<"), copy=False)
        return [self.d, self.B, self.c, self.r, self.e, self._window, self._cur, self._ptr,
                self.overflows, le.tobytes(), sorted(self.stash.items())]

    def to_bytes(self) -> bytes:
        return msgpack.packb(self.payload())

    @classmethod
    def from_payload(cls, payload: Any, clock: Clock = time.time) -> DLeftWindowFilter:
        d, buckets, cells, rbits, tag_bits, window, cur, ptr, overflows, body, stash = payload
        f = cls(d, buckets, cells, rbits, tag_bits, window, clock)
        dt = np.dtype(DTYPES[f.width]).newbyteorder("<")
        f.cells[:] = np.frombuffer(body, dtype=dt, count=len(f.cells))
        f._set_epoch(cur)
        f._ptr, f.overflows = ptr, overflows
        f.stash = {int(x): int(w) for x, w in stash}
        return f

    @classmethod
    def from_bytes(cls, data: bytes, clock: Clock = time.time) -> DLeftWindowFilter:
        return cls.from_payload(msgpack.unpackb(data), clock)

    def copy(self) -> DLeftWindowFilter:
        return self.from_payload(self.payload(), self._clock)

    def __eq__(self, other: object) -> bool:
        """Equal shape, epoch and live content (where a cell sits does not matter)."""
        if not isinstance(other, DLeftWindowFilter):
            return NotImplemented
        if self.shape() != other.shape() or self._cur != other._cur:
            return False
        (xa, ea), (xb, eb) = self.entries(), other.entries()
        return bool(np.array_equal(xa, xb) and np.array_equal(ea, eb))

    __hash__ = None  # type: ignore[assignment]  # mutable


class DLeftWindowDedup(FilterBacked[DLeftWindowFilter]):
    """``DLeftWindowFilter`` as a dedup strategy (``--dedup dleft-window``)."""

    name: str = "dleft-window"

    @classmethod
    def for_window(cls, window: float, rate: float, target_fpp: float,
                   clock: Clock = time.time) -> DLeftWindowDedup:
        return cls(DLeftWindowFilter.for_window(window, rate, target_fpp, clock))

    def seen_or_add(self, op_id: bytes) -> bool:
        return self._f.seen_or_add(op_id)

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        return self._f.seen_or_add_many(op_ids)

    def stats(self) -> dict[str, float]:
        f = self._f
        return {"fpp": f.estimated_fpp(), "items": float(f.live()), "occupancy": f.occupancy(),
                "epoch_s": f.epoch_len, "buckets": float(f.B), "d": float(f.d),
                "remainder_bits": float(f.r), "stash": float(len(f.stash)),
                "overflows": float(f.overflows)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, self._f.payload())

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> DLeftWindowDedup:
        check_version(cls.name, version, 1)
        return cls(DLeftWindowFilter.from_payload(payload, clock))
