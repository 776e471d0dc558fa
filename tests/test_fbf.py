"""The Forgetful Bloom Filter: the paper's guarantees as properties, driven by a fake clock."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.bloom import BloomFilter
from cluster.core.fbf import MAX_FILTERS, ForgetfulBloomFilter
from cluster.core.fbf_model import fbf_fpp, projected_fpp


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ids(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}:{i}".encode() for i in range(n)]


def test_add_reports_new_then_duplicate() -> None:
    f = ForgetfulBloomFilter(m=6250, k=5, n_past=1, period=5.0, clock=FakeClock())
    assert f.add(b"c1:1") is True
    assert f.add(b"c1:1") is False
    assert b"c1:1" in f
    assert b"c1:2" not in f


# Big filters and few ids: false positives are ~1e-30, so every assertion below is exact.
@settings(max_examples=60, deadline=None)
@given(
    n_past=st.integers(1, 10),
    period=st.floats(0.05, 10.0),
    offset=st.floats(0.0, 1.0, exclude_max=True),
    probe=st.floats(0.0, 1.0, exclude_max=True),
)
def test_no_false_negative_inside_window_and_forgotten_after(
    n_past: int, period: float, offset: float, probe: float
) -> None:
    clock = FakeClock(12345.0)
    f = ForgetfulBloomFilter(m=1 << 16, k=8, n_past=n_past, period=period, clock=clock)
    clock.t += offset * period  # insert anywhere inside a period
    inserted_at = clock.t
    assert f.add(b"op")
    window = (n_past + 1) * period
    clock.t = inserted_at + probe * window
    assert b"op" in f, "forgotten inside the guaranteed window"
    clock.t = inserted_at + window * (1 - 1e-9)
    assert b"op" in f
    clock.t = inserted_at + (n_past + 2) * period * (1 + 1e-9)  # epochs are float products
    assert b"op" not in f, "still remembered after (N+2) periods"
    assert not f.contains_simple(b"op")


def test_oldest_past_filter_alone_is_checked() -> None:
    """The paper's Algorithm 2 skips the oldest filter when N > 1; ours must not."""
    clock = FakeClock(0.0)
    f = ForgetfulBloomFilter(m=1 << 16, k=8, n_past=3, period=1.0, clock=clock)
    f.add(b"late-retry")
    for _ in range(4):  # N+1 refreshes: only the oldest past filter still holds the id
        f.refresh()
    oldest = 1 << (f.n_past + 1)
    assert f._probe(b"late-retry") == oldest, "the id should sit in the oldest filter only"
    assert b"late-retry" in f
    assert f.add(b"late-retry") is False, "a retry inside the window would double count"


def test_refresh_schedule_follows_clock() -> None:
    clock = FakeClock(100.0)
    f = ForgetfulBloomFilter(m=1 << 14, k=6, n_past=1, period=5.0, clock=clock)
    f.add(b"a")
    clock.t = 100.0 + 3 * 5.0  # three refreshes due at once
    assert b"a" not in f
    assert f._starts[0] == pytest.approx(115.0)


def test_long_idle_clears_everything() -> None:
    clock = FakeClock(0.0)
    f = ForgetfulBloomFilter(m=1 << 12, k=4, n_past=2, period=1.0, clock=clock)
    f.add_many(ids("x", 200))
    clock.t = 1e6
    assert f.fills() == [0.0] * 4
    assert f.add(b"x:1")


def test_add_many_matches_sequential_semantics() -> None:
    clock = FakeClock()
    f = ForgetfulBloomFilter(m=1 << 16, k=7, n_past=2, period=5.0, clock=clock)
    f.add(b"old")
    new = f.add_many([b"a", b"b", b"a", b"old", b"c", b"b"])
    assert new.tolist() == [True, True, False, False, True, False]
    assert all(x in f for x in (b"a", b"b", b"c", b"old"))
    assert f.contains_many([b"a", b"zz"]).tolist() == [True, False]


def test_estimates_follow_equation_3_and_measured_fpp() -> None:
    clock = FakeClock()
    f = ForgetfulBloomFilter(m=6250, k=5, n_past=1, period=5.0, clock=clock)
    f.add_many(ids("in", 300))
    clock.t += 5.0
    f.add_many(ids("in2", 300))
    absent = ids("absent", 100_000)
    measured = float(np.mean(f.contains_many(absent)))
    est = f.estimated_fpp()
    assert f.paper_fpp() == pytest.approx(fbf_fpp(f.filter_fpps()))
    assert 0.3 * est <= measured <= 3 * est, (measured, est)
    simple = float(np.mean(f.contains_many(absent, simple=True)))
    assert simple > measured, "the optimised check must lower the FPP (Fig. 8)"


def test_shared_generation_estimate_beats_independence() -> None:
    """With many past filters the pair terms dominate; the paper's independent product
    underestimates them, the shared-generation estimate does not."""
    clock = FakeClock(0.0)
    f = ForgetfulBloomFilter(m=8000, k=5, n_past=10, period=1.0, clock=clock)
    seq = 0
    for tick in range(139):
        clock.t = (tick + 0.5) / 10
        f.add_many([f"in:{seq + i}".encode() for i in range(80)])
        seq += 80
    measured = float(np.mean(f.contains_many(ids("absent", 100_000))))
    assert f.paper_fpp() < 0.8 * measured, (f.paper_fpp(), measured)
    assert 0.9 * measured <= f.estimated_fpp() <= 1.3 * measured, (f.estimated_fpp(), measured)


def test_fills_track_inserts() -> None:
    f = ForgetfulBloomFilter(m=1 << 12, k=4, n_past=1, period=5.0, clock=FakeClock())
    f.add_many(ids("x", 300))
    fills = f.fills()
    assert fills[0] == fills[1] > 0.2
    assert fills[2] == 0.0


def _filled(clock: FakeClock, items: list[list[bytes]], m: int = 4096) -> ForgetfulBloomFilter:
    f = ForgetfulBloomFilter(m=m, k=4, n_past=2, period=1.0, clock=clock)
    for batch in items:
        f.add_many(batch)
        clock.t += 1.0
    return f


batches = st.lists(st.lists(st.binary(min_size=1, max_size=8), max_size=20), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(a=batches, b=batches, c=batches)
def test_merge_is_commutative_associative_idempotent(a, b, c) -> None:  # type: ignore[no-untyped-def]
    def build(items: list[list[bytes]]) -> ForgetfulBloomFilter:
        clock = FakeClock(1000.0)
        f = _filled(clock, items)
        clock.t = 1000.0 + 4.0  # every replica at the same instant
        return f

    ab = build(a)
    ab.merge(build(b))
    ba = build(b)
    ba.merge(build(a))
    assert ab == ba

    left = build(a)
    left.merge(build(b))
    left.merge(build(c))
    bc = build(b)
    bc.merge(build(c))
    right = build(a)
    right.merge(bc)
    assert left == right

    once = build(a)
    twice = build(a)
    twice.merge(build(a))
    assert once == twice


def test_merge_unions_members_across_generations() -> None:
    c1, c2 = FakeClock(500.0), FakeClock(500.0)
    f1 = ForgetfulBloomFilter(m=1 << 15, k=6, n_past=2, period=1.0, clock=c1)
    f2 = ForgetfulBloomFilter(m=1 << 15, k=6, n_past=2, period=1.0, clock=c2)
    f1.add(b"one")
    c1.t = c2.t = 501.5
    f2.add(b"two")
    f1.merge(f2)
    assert b"one" in f1 and b"two" in f1
    c1.t = 504.0  # "one" (inserted at 500) ages out, "two" (501.5) is still remembered
    assert b"one" not in f1 and b"two" in f1


def test_merge_refuses_mismatched_shapes() -> None:
    clock = FakeClock()
    f = ForgetfulBloomFilter(m=1000, k=4, clock=clock)
    with pytest.raises(ValueError, match="different shapes"):
        f.merge(ForgetfulBloomFilter(m=2000, k=4, clock=clock))
    with pytest.raises(ValueError, match="different shapes"):
        f.merge(ForgetfulBloomFilter(m=1000, k=4, period=2.0, clock=clock))
    with pytest.raises(ValueError, match="different shapes"):
        BloomFilter(100, 3).merge(BloomFilter(100, 4))


@settings(max_examples=30, deadline=None)
@given(items=batches, n_past=st.integers(1, 30), adaptive=st.booleans())
def test_bytes_round_trip(items: list[list[bytes]], n_past: int, adaptive: bool) -> None:
    clock = FakeClock(77.0)
    f = ForgetfulBloomFilter(
        m=3001, k=3, n_past=n_past, period=0.5, clock=clock,
        target_fpp=1e-3 if adaptive else None,
    )
    for batch in items:
        f.add_many(batch)
        clock.t += 0.5
    g = ForgetfulBloomFilter.from_bytes(f.to_bytes(), clock=clock)
    assert g == f
    assert (g.n_past, g.period, g.window, g.adaptive) == (f.n_past, f.period, f.window, f.adaptive)
    flat = [x for b in items for x in b] + [b"never-added"]
    assert g.contains_many(flat).tolist() == f.contains_many(flat).tolist()
    assert g.estimated_fpp() == pytest.approx(f.estimated_fpp())


def test_from_bytes_rejects_garbage() -> None:
    f = ForgetfulBloomFilter(m=100, k=3, clock=FakeClock())
    data = f.to_bytes()
    with pytest.raises(ValueError):
        ForgetfulBloomFilter.from_bytes(b"nope")
    with pytest.raises(ValueError):
        ForgetfulBloomFilter.from_bytes(data[:-1])
    with pytest.raises(ValueError):
        ForgetfulBloomFilter.from_bytes(b"NOPE" + data[4:])


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="n_past"):
        ForgetfulBloomFilter(m=10, k=1, n_past=0)
    with pytest.raises(ValueError, match="n_past"):
        ForgetfulBloomFilter(m=10, k=1, n_past=MAX_FILTERS)
    with pytest.raises(ValueError, match="period"):
        ForgetfulBloomFilter(m=10, k=1, period=0)
    with pytest.raises(ValueError, match="target_fpp"):
        ForgetfulBloomFilter(m=10, k=1, target_fpp=2.0)
    with pytest.raises(ValueError, match="window"):
        ForgetfulBloomFilter(m=10, k=1, n_past=1, period=1.0, window=5.0)


def test_grow_and_fold_keep_members() -> None:
    clock = FakeClock()
    f = ForgetfulBloomFilter(m=5000, k=5, n_past=2, period=1.0, clock=clock, target_fpp=1e-3)
    members = ids("m", 400)
    f.add_many(members)
    f.grow()
    assert f.m == 10_000
    assert all(f.contains_many(members))
    f.fold()
    assert f.m == 5000
    assert all(f.contains_many(members))


def _run_load(f: ForgetfulBloomFilter, clock: FakeClock, rates: list[float], step: float) -> dict:
    """Insert at each rate for one step of clock time, adapt once per step, check the window."""
    history: list[tuple[float, bytes]] = []
    seq = 0
    worst = 0.0
    for rate in rates:
        n = max(1, int(rate * step / 10))
        for _ in range(10):  # spread the step's inserts over it, as a real load would be
            batch = [f"op:{seq + i}".encode() for i in range(n)]
            seq += n
            new = f.add_many(batch)
            # ids taken for members at insert are false positives, not forgetting: skip them
            sample = [x for x, is_new in zip(batch, new, strict=True) if is_new]
            history.extend((clock.t, x) for x in sample[:: max(1, n // 5)])
            clock.t += step / 10
        f.adapt()
        worst = max(worst, f.estimated_fpp())
        young = [x for t, x in history if clock.t - t < f.window]
        assert all(f.contains_many(young)), "an id inside the window was forgotten"
        assert (f.n_past + 1) * f.period >= f.window - 1e-9
        history = [(t, x) for t, x in history if clock.t - t < f.window]
    return {"worst": worst}


def test_adaptive_keeps_target_while_rate_grows_100x() -> None:
    clock = FakeClock(10_000.0)
    target = 1e-3
    f = ForgetfulBloomFilter(
        m=6250, k=5, n_past=1, period=5.0, clock=clock, target_fpp=target
    )
    window = f.window
    rates = [20.0 * (1.1 ** i) for i in range(49)]  # 20/s rising to ~2000/s
    out = _run_load(f, clock, rates, step=1.0)
    assert f.window == window
    assert f.period < 5.0 and f.n_past > 1, "the filter should have adapted"
    assert out["worst"] <= target, out
    assert not f.over_target


def test_adaptive_respects_memory_cap_and_says_so() -> None:
    clock = FakeClock(10_000.0)
    cap = 40_000
    f = ForgetfulBloomFilter(
        m=6250, k=5, n_past=1, period=5.0, clock=clock, target_fpp=1e-6, max_bytes=cap
    )
    _run_load(f, clock, [5000.0] * 12, step=1.0)
    assert f.nbytes() <= cap
    assert f.over_target, "the cap forces the FPP over target: the filter must flag it"


@settings(max_examples=15, deadline=None)
@given(
    rates=st.lists(st.floats(1.0, 3000.0), min_size=3, max_size=25),
    step=st.floats(0.05, 2.0),
)
def test_adaptive_never_shrinks_window(rates: list[float], step: float) -> None:
    clock = FakeClock(5_000.0)
    f = ForgetfulBloomFilter(m=2048, k=4, n_past=2, period=2.0, clock=clock, target_fpp=1e-3)
    window = f.window
    _run_load(f, clock, rates, step)
    assert f.window == window
    assert f.window_violations == 0


def test_projected_fpp_grows_with_rate_and_period() -> None:
    base = projected_fpp(100.0, 1.0, 10_000, 5, 4)
    assert projected_fpp(200.0, 1.0, 10_000, 5, 4) > base
    assert projected_fpp(100.0, 2.0, 10_000, 5, 4) > base
    assert projected_fpp(100.0, 1.0, 20_000, 5, 4) < base


def test_for_window_meets_fpp_at_design_rate() -> None:
    clock = FakeClock()
    f = ForgetfulBloomFilter.for_window(window=7.0, rate=2000.0, fpp=1e-4, clock=clock)
    assert f.window == pytest.approx(7.0)
    for _ in range(int(f.n_past) + 3):
        f.add_many([f"{clock.t}:{i}".encode() for i in range(int(2000 * f.period))])
        clock.t += f.period
    absent = ids("absent", 200_000)
    measured = float(np.mean(f.contains_many(absent)))
    assert measured <= 3e-4
    assert f.estimated_fpp() <= 1e-4 * 1.01


@settings(max_examples=200, deadline=None)
@given(
    h1=st.integers(0, 2**64 - 1),
    h2=st.integers(0, 2**64 - 1),
    k=st.integers(1, 30),
    m=st.integers(1, 2**40),
)
def test_scalar_and_numpy_positions_agree(h1: int, h2: int, k: int, m: int) -> None:
    from cluster.core.hashing import positions, positions_np

    arr = positions_np(np.array([h1], dtype=np.uint64), np.array([h2], dtype=np.uint64), k, m)
    assert arr[:, 0].tolist() == positions(h1, h2, k, m)
    assert all(0 <= p < m for p in positions(h1, h2, k, m))


@pytest.mark.parametrize("n", [1, 10, 100, 1000])
def test_add_many_sets_the_same_bits_as_add(n: int) -> None:
    clock = FakeClock()
    one = ForgetfulBloomFilter(m=50_000, k=9, n_past=3, period=1.0, clock=clock)
    many = ForgetfulBloomFilter(m=50_000, k=9, n_past=3, period=1.0, clock=clock)
    items = ids("same", n)
    assert [one.add(x) for x in items] == many.add_many(items).tolist()
    assert one == many


def test_the_expected_fill_follows_the_measured_one() -> None:
    """``estimated_fill`` (the node's metric: no pass over the words) stays within a few
    percent of the exact ``fill`` as ids go in."""
    from cluster.core.dedup import make_dedup

    d = make_dedup("fbf", window=10.0, rate=10000, target_fpp=0.001)
    f = d._f  # type: ignore[attr-defined]
    for step in range(1, 5):
        d.seen_or_add_many([f"w{step}:{i}".encode() for i in range(15000)])
        assert f.fill() > 0.01
        assert abs(f.estimated_fill() - f.fill()) < 0.03 * f.fill() + 1e-3
