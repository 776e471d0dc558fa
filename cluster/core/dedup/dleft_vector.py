"""The vectorised paths of ``DLeftWindowFilter``: batch check+insert, merge, and live entries.

Both batch and merge reduce to one step, ``upsert``: look a set of distinct true fingerprints up
in their d candidate buckets at once (one ``take`` of the (d, n) bucket rows), free the stale
cells of their own fingerprint (the scalar path's lazy expiry), and place the absent ones: each
takes the first empty cell of its least loaded candidate bucket (leftmost on a tie), as the
scalar path does. When ids of one round chose the same bucket, the first in batch order takes it
and the others go again with freshly read loads. An id whose d buckets are full goes through the
scalar ``_place_full`` (expire, else stash).

The answers equal a loop of ``seen_or_add``: an id is a duplicate exactly when its true
fingerprint is live, and two ids of one batch with the same true fingerprint are caught before
the lookup (the later is the duplicate). So does the live content (every live fingerprint with
its epoch, stash included: ``__eq__``); where a cell lands may differ from the loop's, because
the loop's loads change id by id and the batch's round by round, which changes no answer.

Cost (profiled, batches of 1000 at the design shape): the murmur3 hashing is the largest single
part; everything else is a fixed number of whole-batch numpy passes, each with a long inner loop
(a (d, n, c) broadcast against a length-c axis, or a reduction along it, ran 7-25x slower
in numpy than the same work laid out flat, which is why the compares and counts below are
shaped the way they are).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Protocol

import numpy as np

from cluster.core.dedup.dleft import DLeftHash
from cluster.core.hashing import SEED, _murmur_digest


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
_BYTE_ONES = np.uint64(0x0101010101010101)


def fingerprints(f: DLeftWindowFilter, op_ids: Sequence[bytes]) -> np.ndarray:
    """``x_of`` of many ids: the first murmur3 word of each, mod the fingerprint space."""
    words = np.frombuffer(b"".join(map(_murmur_digest, op_ids, repeat(SEED))), dtype="<u8")
    return words[0::2] % np.uint64(f.hash.N)


def seen_or_add_many(f: DLeftWindowFilter, op_ids: Sequence[bytes]) -> list[bool]:
    f.tick()  # the clock is read once for the batch
    n = len(op_ids)
    if n < SMALL_BATCH:
        x_of, add = f.x_of, f.add_x
        return [add(x_of(op)) for op in op_ids]
    x = fingerprints(f, op_ids)
    s = np.sort(x)
    if not bool((s[1:] == s[:-1]).any()):  # the usual batch: no fingerprint twice
        return upsert(f, x, None).tolist()
    order = np.argsort(x, kind="stable")
    xs = x[order]
    again = np.empty(n, dtype=bool)
    again[order] = np.concatenate(([False], xs[1:] == xs[:-1]))
    dup = again.copy()
    first = np.flatnonzero(~again)
    dup[first] = upsert(f, x[first], None)
    return dup.tolist()


def _own_cells(f: DLeftWindowFilter, cells: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Flat indices into ``cells`` (d, n, c) of the non-empty cells holding remainder ``v[k]``.

    Such a cell is ``lo | tag`` with tag in 1..P, i.e. lo < cell <= lo + P: one wrapping
    subtract of lo + 1 and one compare with P find them (an empty cell wraps high). The
    subtrahend is repeated to the flat (d, n * c) layout so both passes run long inner loops.
    """
    d, n, c = cells.shape
    dt = cells.dtype.type
    lo1 = (v.astype(cells.dtype) << dt(f.e)) + dt(1)
    w = cells.reshape(d, n * c) - np.repeat(lo1, c)
    return np.flatnonzero(w < dt(f.P))


def upsert(f: DLeftWindowFilter, xs: np.ndarray, eps: np.ndarray | None) -> np.ndarray:
    """Record distinct true fingerprints ``xs`` (at ``eps``, else now); True where live before.

    With ``eps`` (a merge), an id already live takes the later of its two epochs.
    """
    c, P, n = f.c, f.P, len(xs)
    rows, v = f.hash.rows_np(xs)
    cells = f.cells.reshape(-1, c).take(rows, axis=0)  # (d, n, c), a copy
    flat = cells.reshape(-1)
    hits = _own_cells(f, cells, v)  # few: ids seen before, inside the window or past it
    present = np.zeros(n, dtype=bool)
    if hits.size:
        age = (f._ctag + P - (flat[hits] & flat.dtype.type(P)).astype(np.int64)) % P
        live = age <= f.E
        row = hits // c  # (subtable, id) as i * n + k
        where = rows.reshape(-1)[row] * c + hits % c  # the cell in f.cells
        if not live.all():  # lazy expiry of the id's own stale cell, as the scalar path does
            f.cells[where[~live]] = 0
            flat[hits[~live]] = 0
        k = row[live] % n
        present[k] = True
        if eps is not None and k.size:
            _keep_later(f, where[live], age[live], eps[k])
    if f.stash:
        _check_stash(f, xs, present, eps)
    absent = np.flatnonzero(~present)
    if absent.size:
        if absent.size < n:
            rows, v, cells = rows[:, absent], v[absent], cells[:, absent]
        tags = (np.full(absent.size, f._ctag, dtype=np.int64) if eps is None
                else 1 + eps[absent].astype(np.int64) % P)
        dt = f.cells.dtype
        values = (v.astype(dt) << dt.type(f.e)) | tags.astype(dt)
        _place(f, rows, cells, values, xs[absent], None if eps is None else eps[absent])
    return present


def _keep_later(f: DLeftWindowFilter, where: np.ndarray, age: np.ndarray,
                eps: np.ndarray) -> None:
    """A merge: live cells ``where`` (now ``age`` epochs old) take epochs ``eps`` if later."""
    later = eps > f.epoch - age
    dt = f.cells.dtype.type
    w = where[later]
    f.cells[w] = (f.cells[w] & ~dt(f.P)) | (1 + eps[later] % f.P).astype(f.cells.dtype)


def _check_stash(f: DLeftWindowFilter, xs: np.ndarray, present: np.ndarray,
                 eps: np.ndarray | None) -> None:
    """Mark ids live in the stash present (the stash is small: one ``isin``, then a loop over
    its hits only); a merge keeps the later epoch there too."""
    keys = np.fromiter(f.stash, dtype=np.uint64, count=len(f.stash))
    for k in np.flatnonzero(np.isin(xs, keys) & ~present).tolist():
        x = int(xs[k])
        if f._stash_live(x):
            present[k] = True
            if eps is not None:
                f.stash[x] = max(f.stash[x], int(eps[k]))


def _loads(nz: np.ndarray) -> np.ndarray:
    """Occupied cells per bucket, (d, m), from the (d, m, c) non-empty flags."""
    if nz.shape[2] == 8:  # the default bucket: its 8 flags are the 8 bytes of one uint64
        words = nz.view(np.uint64)[..., 0]
        return (words * _BYTE_ONES) >> np.uint64(56)  # the byte sum lands in the top byte
    return np.count_nonzero(nz, axis=2)


def _place(f: DLeftWindowFilter, rows: np.ndarray, cells: np.ndarray, values: np.ndarray,
           xs: np.ndarray, eps: np.ndarray | None) -> None:
    """Absent ids (candidate rows (d, m), their cells, the values to write) into the first empty
    cell of their least loaded bucket, leftmost on a tie, in rounds (see the module doc)."""
    d, c = f.d, f.c
    pend = np.arange(len(values))  # the ids of this round, indices into rows/values/xs
    while True:
        m = pend.size
        nz = cells != 0
        key = _loads(nz).astype(np.intp) * d + np.arange(d)[:, None]
        best = key.min(axis=0)  # least load, then the leftmost subtable
        pick = (best % d) * m + np.arange(m)  # the chosen (subtable, id) as i * m + k
        full = best // d >= c
        ok = np.flatnonzero(~full)
        if ok.size < m:
            pick = pick[ok]
        # take, not [], for these gathers: several times faster on a fresh index array
        target = rows.reshape(-1).take(pick)
        slot = nz.reshape(d * m, c).take(pick, axis=0).argmin(axis=1)  # the first empty cell
        order = np.argsort(target, kind="stable")
        st = target[order]
        same = st[1:] == st[:-1]
        if bool(same.any()):  # ids chose the same bucket: the first in batch order takes it
            lose = np.sort(order[1:][same])  # back in batch order for the next round
            first = np.ones(ok.size, dtype=bool)
            first[lose] = False
            f.cells[target[first] * c + slot[first]] = values[pend[ok[first]]]
            again = ok[lose]
        else:
            f.cells[target * c + slot] = values.take(pend.take(ok))
            again = ok[:0]
        # written first, so the scalar step sees those cells taken
        for k in np.flatnonzero(full).tolist():  # rare: expire those buckets, else stash
            j = int(pend[k])
            buckets = (rows[:, k] - np.arange(d) * f.B).tolist()
            f._place_full(int(xs[j]), buckets, int(values[j] >> f.e),
                          None if eps is None else int(eps[j]))
        if not again.size:
            return
        pend, rows = pend[again], rows[:, again]
        cells = f.cells.reshape(-1, c).take(rows, axis=0)  # fresh loads for the next round


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
    xs = fingerprints(f, op_ids)
    rows, v = f.hash.rows_np(xs)
    cells = f.cells.reshape(-1, f.c).take(rows, axis=0)
    hits = _own_cells(f, cells, v)
    P = f.P
    tag = (cells.reshape(-1)[hits] & f.cells.dtype.type(P)).astype(np.int64)
    out = np.zeros(len(xs), dtype=bool)
    out[(hits // f.c)[(f._ctag + P - tag) % P <= f.E] % len(xs)] = True
    if f.stash:
        _check_stash(f, xs, out, None)
    return out
