"""The two d-left strategies: the permutation, exact forgetting, FPP, merge laws, pitfalls."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.dedup import DLeftCountingDedup, load_dedup, make_dedup
from cluster.core.dedup.dleft import DLeftHash
from cluster.core.dedup.dleft_counting import FULL
from cluster.core.dedup.dleft_vector import SMALL_BATCH
from cluster.core.dedup.dleft_window import DLeftWindowFilter, window_shape
from cluster.core.hashing import SEED, _murmur


class FakeClock:
    def __init__(self, t: float = 10_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ids(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}:{i}".encode() for i in range(n)]


# -- the permutation ------------------------------------------------------------------------


def test_each_subtable_is_a_bijection_and_unplace_inverts_it() -> None:
    h = DLeftHash(4, 7, 5)
    for i in range(4):
        places = set()
        for x in range(h.N):
            buckets, rem = h.place(x)
            places.add((buckets[i], rem))
            assert h.unplace(i, buckets[i], rem) == x
        assert len(places) == h.N  # no two fingerprints share a cell: no false deletions


def test_numpy_placement_equals_the_scalar_one() -> None:
    h = DLeftHash(4, 37_067, 25)
    xs = np.random.default_rng(7).integers(0, h.N, 2000, dtype=np.uint64)
    buckets, rems = h.place_np(xs)
    for j in range(0, 2000, 97):
        assert ([int(b) for b in buckets[:, j]], int(rems[j])) == h.place(int(xs[j]))
    for i in range(4):
        assert np.array_equal(h.unplace_np(i, buckets[i], rems), xs)
    # the d choices of an id look independent (d-left needs that to balance)
    corr = np.corrcoef(buckets.astype(float))
    assert np.abs(corr[np.triu_indices(4, 1)]).max() < 0.1


# -- dleft-window: forgetting ---------------------------------------------------------------


def window_filter(clock: FakeClock, rate: float = 1000.0, fpp: float = 1e-6) -> DLeftWindowFilter:
    return DLeftWindowFilter.for_window(1.0, rate, fpp, clock)


def test_sizing_meets_the_issue_targets() -> None:
    f = DLeftWindowFilter.for_window(10.0, 100_000.0, 1e-6, FakeClock())
    assert f.nbytes() / 1_000_000 <= 5.0
    assert f.E >= 100  # forgetting sharp to 1% of the window
    peak = 1_000_000 * (f.E + 1) / f.E
    assert peak / f.hash.N <= 1e-6
    buckets, rbits, tag_bits = window_shape(1000, 1e-2)
    assert rbits + tag_bits == 16  # a loose target fits 16-bit cells


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.3), st.integers(0, 25)), min_size=1, max_size=120))
def test_window_remembers_exactly_the_window(steps: list[tuple[float, int]]) -> None:
    clock = FakeClock()
    f = window_filter(clock)
    added: dict[int, float] = {}
    for dt, i in steps:
        clock.t += dt
        age = clock.t - added[i] if i in added else math.inf
        dup = f.seen_or_add(f"p:{i}".encode())
        if age <= f.window:
            assert dup, f"forgot an id {age:.4f}s old inside the {f.window}s window"
        elif age > f.window + f.epoch_len:
            assert not dup, f"remembered an id {age:.4f}s old, past window + one epoch"
        if not dup:
            added[i] = clock.t


def test_forgetting_edge_is_one_epoch_wide() -> None:
    clock = FakeClock(0.0)
    f = window_filter(clock)
    q = f.epoch_len
    clock.t = 5 * q + 0.3 * q
    f.seen_or_add(b"edge:1")
    clock.t += f.window  # the window has just passed: still within the same epoch count
    assert b"edge:1" in f
    clock.t = (5 + f.E + 1) * q  # the first instant of epoch w + E + 1
    assert b"edge:1" not in f


def test_sweep_clears_expired_cells_and_a_long_idle_clears_all() -> None:
    clock = FakeClock()
    f = window_filter(clock)
    for x in ids("a", 500):
        f.seen_or_add(x)
    assert np.count_nonzero(f.cells) == 500
    for _ in range(f.E + f.S + 1):  # one epoch at a time, no inserts: the sweep alone acts
        clock.t += f.epoch_len
        f.tick()
    assert np.count_nonzero(f.cells) == 0
    for x in ids("b", 300):
        f.seen_or_add(x)
    clock.t += 1000 * f.window  # tags wrap many times over; nothing may look fresh
    assert not any(x in f for x in ids("b", 300))
    assert np.count_nonzero(f.cells) == 0


@pytest.mark.parametrize("rbits,tag_bits", [(13, 3), (9, 7), (1, 15), (25, 7)])
def test_sweep_clears_exactly_the_cells_past_the_window(rbits: int, tag_bits: int) -> None:
    f = DLeftWindowFilter(1, 1, 1, rbits, tag_bits, window=1.0, clock=FakeClock())
    P = f.P
    tags = np.arange(P + 1)
    cells = np.where(tags == 0, 0, (1 << f.e) | tags).astype(f.cells.dtype)
    for ctag in sorted({1, 2, P // 2, P - 1, P}):
        for shift in sorted({1, f.S - 1, f.S, f.E}):
            f.cells = cells.copy()
            f.c = len(cells)
            f._ctag = ctag
            f._sweep(0, 1, shift)
            age = (ctag + P - tags) % P
            assert np.array_equal(f.cells != 0, (tags != 0) & (age + shift <= f.E))


def test_overflow_goes_to_the_stash_and_is_still_remembered() -> None:
    clock = FakeClock()
    f = DLeftWindowFilter(d=2, buckets=2, cells=2, rbits=20, tag_bits=6, window=1.0, clock=clock)
    items = ids("o", 30)  # 30 ids for 8 cells
    assert not any(f.seen_or_add(x) for x in items)
    assert f.overflows >= 22 and len(f.stash) == f.overflows
    assert all(f.seen_or_add(x) for x in items)
    clock.t += 1.0 + 2 * f.epoch_len
    assert not any(x in f for x in items)


# -- dleft-window: FPP ----------------------------------------------------------------------


def test_measured_fpp_matches_the_estimate_and_the_target() -> None:
    clock = FakeClock()
    f = DLeftWindowFilter.for_window(1.0, 20_000.0, 1e-2, clock)  # 16-bit cells, 12-bit rems
    for k in range(30):  # 1.5 windows at the design rate, in batches
        clock.t += 0.05
        f.seen_or_add_many(ids(f"in{k}", 1000))
    est = f.estimated_fpp()
    hits = sum(x in f for x in ids("absent", 30_000))
    assert 1e-3 < est <= 1e-2
    assert est / 1.5 <= hits / 30_000 <= 1.5 * est, (est, hits)


# -- dleft-window: batch, merge, bytes --------------------------------------------------------


def test_batch_vector_path_agrees_with_the_loop() -> None:
    ca, cb = FakeClock(), FakeClock()
    a, b = window_filter(ca), window_filter(cb)
    for k in range(6):
        batch = ids(f"k{k}", 300) + ids(f"k{k - 1}", 50) + ids(f"k{k}", 20)  # repeats, old ids
        ca.t += 0.3
        cb.t += 0.3
        assert a.seen_or_add_many(batch) == [b.seen_or_add(x) for x in batch]
    assert a == b  # same live (fingerprint, epoch) content, wherever the cells are


table_shapes = st.tuples(st.integers(1, 4), st.integers(1, 6), st.sampled_from([1, 2, 4, 8]),
                         st.integers(3, 9), st.integers(3, 6))
batches = st.lists(st.tuples(st.floats(0.0, 0.4),
                             st.lists(st.integers(0, 150), min_size=SMALL_BATCH, max_size=90)),
                   min_size=1, max_size=8)


@settings(max_examples=120, deadline=None)
@given(table_shapes, batches)
def test_batch_equals_the_loop_on_crowded_tables(shape: tuple[int, int, int, int, int],
                                                  steps: list[tuple[float, list[int]]]) -> None:
    """Tiny tables and few remainder bits: batch-mates share buckets and fingerprints, buckets
    fill (expire-or-stash), own cells go stale across windows; answers and live content match
    the loop after every batch, and so do lookups, one by one and vectorised."""
    d, buckets, cells, rbits, tag_bits = shape
    ca, cb = FakeClock(), FakeClock()
    a = DLeftWindowFilter(d, buckets, cells, rbits, tag_bits, window=1.0, clock=ca)
    b = DLeftWindowFilter(d, buckets, cells, rbits, tag_bits, window=1.0, clock=cb)
    universe = [f"h:{i}".encode() for i in range(151)]
    for dt, picks in steps:
        ca.t += dt
        cb.t += dt
        batch = [universe[i] for i in picks]
        assert a.seen_or_add_many(batch) == [b.seen_or_add(x) for x in batch]
        assert a == b and a.live() == b.live()
        assert np.count_nonzero(a.cells) + len(a.stash) >= a.live()
    probe = universe[:80]
    assert a.contains_many(probe).tolist() == [x in b for x in probe]


@settings(max_examples=60, deadline=None)
@given(table_shapes, batches, batches)
def test_merge_holds_the_union_at_the_later_epoch(shape: tuple[int, int, int, int, int],
                                                   a_steps: list[tuple[float, list[int]]],
                                                   b_steps: list[tuple[float, list[int]]]) -> None:
    d, buckets, cells, rbits, tag_bits = shape
    clock = FakeClock()
    fs = []
    for steps in (a_steps, b_steps):
        clock.t = 10_000.0
        f = DLeftWindowFilter(d, buckets, cells, rbits, tag_bits, window=1.0, clock=clock)
        for dt, picks in steps:
            clock.t += dt
            f.seen_or_add_many([f"u:{i}".encode() for i in picks])
        fs.append(f)
    clock.t = 10_000.0 + max(sum(dt for dt, _ in s) for s in (a_steps, b_steps))
    a, b = fs
    a.tick()
    b.tick()
    want: dict[int, int] = {}
    for f in (a, b):
        for x, ep in zip(*f.entries(), strict=True):
            want[int(x)] = max(want.get(int(x), int(ep)), int(ep))
    a.merge(b)
    xs, eps = a.entries()
    assert dict(zip(xs.tolist(), eps.tolist(), strict=True)) == want


def test_batch_mates_choosing_one_bucket_fill_it_in_batch_order() -> None:
    clock = FakeClock()
    f = DLeftWindowFilter(d=1, buckets=1, cells=8, rbits=20, tag_bits=6, window=1.0, clock=clock)
    batch = ids("one", 30)  # one bucket of 8 cells: 8 placed in rounds, 22 to the stash
    assert not any(f.seen_or_add_many(batch))
    assert np.count_nonzero(f.cells) == 8 and len(f.stash) == 22
    placed = {int(c) >> f.e for c in f.cells}
    assert placed == {f.x_of(x) & f.hash.rmask for x in batch[:8]}  # the first 8 got cells
    assert all(f.seen_or_add_many(batch))


def merged(*fs: DLeftWindowFilter) -> DLeftWindowFilter:
    out = fs[0].copy()
    for f in fs[1:]:
        out.merge(f)
    return out


filter_ops = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=40)


@settings(max_examples=30, deadline=None)
@given(filter_ops, filter_ops, filter_ops)
def test_merge_is_commutative_associative_idempotent(
    a_ops: list[tuple[int, int]], b_ops: list[tuple[int, int]], c_ops: list[tuple[int, int]]
) -> None:
    clock = FakeClock()
    fs = []
    for ops in (a_ops, b_ops, c_ops):  # three replicas, each saw its own ids over three epochs
        clock.t = 10_000.0
        f = DLeftWindowFilter(d=4, buckets=3, cells=4, rbits=20, tag_bits=5, window=1.0,
                              clock=clock)
        for step, i in sorted(ops):
            clock.t = 10_000.0 + step * 0.2
            f.seen_or_add(f"m:{i}".encode())
        fs.append(f)
    clock.t = 10_000.0 + 3 * 0.2
    for f in fs:
        f.tick()
    a, b, c = fs
    assert merged(a, b) == merged(b, a)
    assert merged(merged(a, b), c) == merged(a, merged(b, c))
    assert merged(a, a) == a
    ab = merged(a, b)
    for _, i in a_ops + b_ops:  # nothing either held is lost
        assert f"m:{i}".encode() in ab


def test_merge_keeps_the_later_epoch_and_refuses_other_shapes() -> None:
    clock = FakeClock()
    a, b = window_filter(clock), window_filter(clock)
    a.seen_or_add(b"late:1")
    clock.t += 0.6
    b.seen_or_add(b"late:1")  # the same id, written 0.6 s later on the other replica
    a.merge(b)
    clock.t += 0.6  # 1.2 s after a's write, 0.6 s after b's
    assert b"late:1" in a
    with pytest.raises(ValueError, match="shapes"):
        a.merge(DLeftWindowFilter.for_window(2.0, 1000.0, 1e-6, clock))


def test_bytes_round_trip_and_the_dedup_frame() -> None:
    clock = FakeClock()
    d = make_dedup("dleft-window", window=1.0, rate=1000.0, clock=clock)
    d.seen_or_add_many(ids("s", 400))
    f = d.filter  # type: ignore[attr-defined]
    g = DLeftWindowFilter.from_bytes(f.to_bytes(), clock)
    assert g == f and g.to_bytes() == f.to_bytes()
    e = load_dedup(d.to_bytes(), clock=clock)
    assert e.stats() == d.stats()
    assert all(x in e for x in ids("s", 400))


# -- dleft-counting: the seed's pitfalls ------------------------------------------------------


def counting(clock: FakeClock) -> DLeftCountingDedup:
    d = make_dedup("dleft-counting", window=1.0, rate=1000.0, clock=clock)
    assert isinstance(d, DLeftCountingDedup)
    return d


def x_of(d: DLeftCountingDedup, op_id: bytes) -> int:
    return _murmur(op_id, SEED)[0] % d.hash.N


def test_counting_remembers_a_window_after_the_last_sighting() -> None:
    clock = FakeClock()
    d = counting(clock)
    assert d.seen_or_add(b"r:1") is False
    clock.t += 0.8
    assert d.seen_or_add(b"r:1") is True  # a retry: counted, so the memory is extended
    assert d.count_of(x_of(d, b"r:1")) == 2
    clock.t += 0.8  # 1.6 s after the first, 0.8 s after the retry
    assert b"r:1" in d and d.count_of(x_of(d, b"r:1")) == 1
    clock.t += 0.3
    assert b"r:1" not in d and np.count_nonzero(d.cells) == 0


def test_counting_overflow_saturates_without_breaking_deletes() -> None:
    clock = FakeClock()
    d = counting(clock)
    for _ in range(FULL + 5):
        d.seen_or_add(b"hot:1")
        clock.t += 0.01
    assert d.count_of(x_of(d, b"hot:1")) == FULL and d.saturated == 5
    clock.t += 1.0 - 0.05  # the first 15 sightings expire, the 5 uncounted never queued
    d.seen_or_add(b"other:1")
    assert b"hot:1" not in d
    assert d.missing_deletes == 0 and np.count_nonzero(d.cells) == 1


def test_counting_never_deletes_what_was_never_inserted() -> None:
    clock = FakeClock()
    d = counting(clock)
    d.seen_or_add(b"kept:1")
    before = d.cells.copy()
    d._times.append(clock.t)  # a damaged queue: a sighting of an id never counted
    d._xs.append(x_of(d, b"ghost:1"))
    clock.t += 0.5
    d._delete(x_of(d, b"ghost:1"))
    assert d.missing_deletes == 1 and np.array_equal(d.cells, before)
    assert b"kept:1" in d


def test_counting_ids_sharing_a_fingerprint_share_one_counter() -> None:
    clock = FakeClock()
    d = DLeftCountingDedup(d=4, buckets=2, cells=8, rbits=3, window=1.0, clock=clock)
    first: dict[int, bytes] = {}
    pair = None
    for x in ids("f", 400):  # the 64 fingerprints collide quickly: find two ids sharing one
        prev = first.setdefault(x_of(d, x), x)
        if prev != x:
            pair = (prev, x)
            break
    assert pair is not None
    a, b = pair
    assert d.seen_or_add(a) is False
    clock.t += 0.5
    assert d.seen_or_add(b) is True  # a false positive, and counted on a's cell
    assert d.count_of(x_of(d, a)) == 2 and np.count_nonzero(d.cells) == 1
    clock.t += 0.6  # a's sighting expires: b's is still counted, so b is not falsely deleted
    assert b in d
    clock.t += 0.5
    assert b not in d and d.missing_deletes == 0
