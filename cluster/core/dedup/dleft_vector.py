"""The vectorised paths of ``DLeftWindowFilter``: batch check+insert, merge, and live entries.

Both batch and merge reduce to one step, ``upsert``: look a set of distinct true fingerprints up
in their d candidate buckets at once (a (d, n, c) gather), free the stale cells of their own
fingerprint (the scalar path's lazy expiry), and place the absent ones in rounds: each takes its
least loaded candidate bucket (leftmost on a tie); ids that chose the same bucket take its empty
cells in batch order, and those left over try again with the new loads. An id whose d buckets
are full goes through the scalar ``_place_full`` (expire, else stash).

The answers equal a loop of ``seen_or_add``: an id is a duplicate exactly when its true
fingerprint is live, and two ids of one batch with the same true fingerprint are caught before
the lookup (the later is the duplicate). Where a cell lands may differ from the loop's, which
changes no answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from cluster.core.dedup.dleft import DLeftHash
from cluster.core.hashing import hash_pairs_np


class DLeftWindowFilter(Protocol):
    """The table these paths work on (``cluster.core.dedup.dleft_window``), its internals
    included: they are that class's batch methods, kept in their own module for size. Declared
    here so this module does not import the one that calls it."""

    d: int
    B: int
    c: int
    e: int
    E: int
    P: int
    hash: DLeftHash
    cells: np.ndarray
    stash: dict[int, int]
    _ctag: int
    _clock: Callable[[], float]

    @property
    def epoch(self) -> int: ...

    def tick(self) -> None: ...

    def x_of(self, op_id: bytes) -> int: ...

    def add_x(self, x: int) -> bool: ...

    def _advance(self, ep: int) -> None: ...

    def _epoch_at(self, now: float) -> int: ...

    def _stash_live(self, x: int) -> bool: ...

    def _place_full(self, x: int, buckets: list[int], v: int, epoch: int | None = None
                    ) -> Any: ...

# below this many ids a loop of the scalar path is cheaper than numpy's fixed cost per call
SMALL_BATCH = 24
_MERGE_CHUNK = 1 << 16


def seen_or_add_many(f: DLeftWindowFilter, op_ids: Sequence[bytes]) -> list[bool]:
    f.tick()  # the clock is read once for the batch
    n = len(op_ids)
    if n < SMALL_BATCH:
        x_of, add = f.x_of, f.add_x
        return [add(x_of(op)) for op in op_ids]
    x = f.hash.x_of_np(hash_pairs_np(op_ids)[0])
    order = np.argsort(x, kind="stable")
    xs = x[order]
    repeat = np.empty(n, dtype=bool)
    repeat[order] = np.concatenate(([False], xs[1:] == xs[:-1]))
    dup = repeat.copy()
    first = np.flatnonzero(~repeat)
    dup[first] = upsert(f, x[first], None)
    return dup.tolist()


def upsert(f: DLeftWindowFilter, xs: np.ndarray, eps: np.ndarray | None) -> np.ndarray:
    """Record distinct true fingerprints ``xs`` (at ``eps``, else now); True where live before.

    With ``eps`` (a merge), an id already live takes the later of its two epochs.
    """
    d, c, e, P, E = f.d, f.c, f.e, f.P, f.E
    dt = f.cells.dtype
    buckets, v = f.hash.place_np(xs)
    g = (np.arange(d, dtype=np.intp)[:, None] * f.B + buckets.astype(np.intp))
    grid = f.cells.reshape(-1, c)
    cells = grid[g]  # (d, n, c), a copy
    # cells of the id's own remainder are few (its own, or an empty cell when v == 0): find
    # them with one full-size compare and judge them one by one
    si, sn, sc = np.nonzero((cells >> dt.type(e)) == v.astype(dt)[None, :, None])
    tag = (cells[si, sn, sc] & dt.type(P)).astype(np.int64)
    age = (f._ctag + P - tag) % P
    live = (tag != 0) & (age <= E)
    stale = (tag != 0) & ~live
    if stale.any():  # lazy expiry of the id's own stale cell, as the scalar path does
        grid[g[si[stale], sn[stale]], sc[stale]] = 0
        cells[si[stale], sn[stale], sc[stale]] = 0
    present = np.zeros(len(xs), dtype=bool)
    present[sn[live]] = True
    if f.stash:
        for k in np.flatnonzero(~present).tolist():
            if f._stash_live(int(xs[k])):
                present[k] = True
                if eps is not None:
                    f.stash[int(xs[k])] = max(f.stash[int(xs[k])], int(eps[k]))
    if eps is not None and live.any():
        i, k, s = si[live], sn[live], sc[live]
        later = eps[k] > f.epoch - age[live]
        tags = (1 + eps[k[later]] % P).astype(dt)
        where = (g[i[later], k[later]], s[later])
        grid[where] = (grid[where] & ~dt.type(P)) | tags
    absent = np.flatnonzero(~present)
    if absent.size:
        _place(f, xs[absent], g[:, absent], v[absent],
               None if eps is None else eps[absent], cells[:, absent])
    return present


def _place(f: DLeftWindowFilter, xs: np.ndarray, g: np.ndarray, v: np.ndarray,
           eps: np.ndarray | None, cells: np.ndarray) -> None:
    """Absent ids into their least loaded candidate buckets, in rounds (see the module doc)."""
    c, dt = f.c, f.cells.dtype
    grid = f.cells.reshape(-1, c)
    tag = (np.full(len(xs), f._ctag, dtype=np.int64) if eps is None
           else 1 + eps.astype(np.int64) % f.P)
    value = (v.astype(dt) << dt.type(f.e)) | tag.astype(dt)
    pending = np.arange(len(xs))
    while pending.size:
        gp = g[:, pending]
        if cells.shape[1] != pending.size:
            cells = grid[gp]
        loads = np.count_nonzero(cells, axis=2)
        choice = loads.argmin(axis=0)
        cols = np.arange(pending.size)
        minload = loads[choice, cols]
        full = minload >= c
        for k in np.flatnonzero(full).tolist():  # rare: expire those buckets, else stash
            j = int(pending[k])
            buckets = (gp[:, k] - np.arange(f.d) * f.B).tolist()
            f._place_full(int(xs[j]), buckets, int(v[j]), None if eps is None else int(eps[j]))
        ok = np.flatnonzero(~full)
        gb = gp[choice[ok], ok]
        order = np.argsort(gb, kind="stable")
        sorted_gb = gb[order]
        starts = np.concatenate(([True], sorted_gb[1:] != sorted_gb[:-1]))
        idx = np.arange(ok.size)
        rank = np.empty(ok.size, dtype=np.int64)
        rank[order] = idx - np.maximum.accumulate(np.where(starts, idx, 0))
        put = rank < c - minload[ok]
        empty = cells[choice[ok], ok] == 0  # (len(ok), c)
        slot = (empty & (np.cumsum(empty, axis=1) == (rank + 1)[:, None])).argmax(axis=1)
        grid[gb[put], slot[put]] = value[pending[ok[put]]]
        pending = pending[ok[~put]]
        cells = cells[:, :0]  # re-read the buckets next round


def merge_into(f: DLeftWindowFilter, other: DLeftWindowFilter) -> None:
    ep = max(f.epoch, other.epoch, f._epoch_at(f._clock()))
    if ep > f.epoch:
        f._advance(ep)
    xs, eps = live_entries(other)
    keep = ep - eps <= f.E
    xs, eps = xs[keep], eps[keep]
    for lo in range(0, len(xs), _MERGE_CHUNK):
        upsert(f, xs[lo : lo + _MERGE_CHUNK], eps[lo : lo + _MERGE_CHUNK])


def live_entries(f: DLeftWindowFilter) -> tuple[np.ndarray, np.ndarray]:
    """(true fingerprints, absolute epochs) of every live id, sorted by fingerprint, one each."""
    P = f.P
    grid = f.cells.reshape(f.d, f.B, f.c)
    tags = (grid & grid.dtype.type(P)).astype(np.int64)
    age = (f._ctag + P - tags) % P
    i, b, s = np.nonzero((tags != 0) & (age <= f.E))
    rem = (grid[i, b, s] >> grid.dtype.type(f.e)).astype(np.uint64)
    xs = np.empty(len(i), dtype=np.uint64)
    for t in range(f.d):
        sel = i == t
        xs[sel] = f.hash.unplace_np(t, b[sel].astype(np.uint64), rem[sel])
    eps = f.epoch - age[i, b, s]
    if f.stash:
        st = [(x, w) for x, w in f.stash.items() if f.epoch - w <= f.E]
        xs = np.concatenate((xs, np.array([x for x, _ in st], dtype=np.uint64)))
        eps = np.concatenate((eps, np.array([w for _, w in st], dtype=np.int64)))
    order = np.lexsort((eps, xs))  # by x, then epoch: the last of each x is its latest
    xs, eps = xs[order], eps[order]
    last = np.concatenate((xs[1:] != xs[:-1], [True])) if len(xs) else np.zeros(0, dtype=bool)
    return xs[last], eps[last]


def contains_many(f: DLeftWindowFilter, op_ids: Sequence[bytes]) -> np.ndarray:
    """Vectorised ``in``: True where the id is live; records nothing."""
    f.tick()
    xs = f.hash.x_of_np(hash_pairs_np(op_ids)[0])
    buckets, v = f.hash.place_np(xs)
    g = np.arange(f.d, dtype=np.intp)[:, None] * f.B + buckets.astype(np.intp)
    cells = f.cells.reshape(-1, f.c)[g]
    dt = f.cells.dtype.type
    si, sn, sc = np.nonzero((cells >> dt(f.e)) == v.astype(f.cells.dtype)[None, :, None])
    tag = (cells[si, sn, sc] & dt(f.P)).astype(np.int64)
    live = (tag != 0) & ((f._ctag + f.P - tag) % f.P <= f.E)
    out = np.zeros(len(xs), dtype=bool)
    out[sn[live]] = True
    if f.stash:
        for k in np.flatnonzero(~out).tolist():
            out[k] = f._stash_live(int(xs[k]))
    return out
