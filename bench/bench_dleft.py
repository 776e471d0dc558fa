"""d-left dedup against the FBF: bytes per id, measured FPP, forgetting edge, check+insert cost.

Run: ``python -m bench.bench_dleft [--quick]``. The issue's design point: window 10 s at 100k ids/s
(1M remembered ids), FPP 1e-6. Every number comes from this run; the FBF is measured in the same
process, interleaved, best of the repeats (the machine may be shared).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from cluster.core.dedup import DLeftCountingDedup
from cluster.core.dedup.dleft_window import DLeftWindowFilter
from cluster.core.fbf import ForgetfulBloomFilter

WINDOW, RATE, FPP = 10.0, 100_000.0, 1e-6


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _ids(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i % 997}:{i}".encode() for i in range(n)]


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def fill_and_probe(probes: int) -> dict[str, float]:
    """Fill a dleft-window at the design rate for 1.5 windows (batches of 1000 ids, the clock
    advancing with them), then: bytes per id, misses among the last window's ids, FPP."""
    clock = Clock()
    f = DLeftWindowFilter.for_window(WINDOW, RATE, FPP, clock)
    step = 1000 / RATE
    recent: list[bytes] = []
    batches = int(1.5 * WINDOW / step)
    for k in range(batches):
        clock.t += step
        batch = _ids(f"in{k}", 1000)
        f.seen_or_add_many(batch)
        if k >= batches - int(WINDOW / step) + 1:  # written less than a window ago
            recent += batch
    misses = int(np.count_nonzero(~f.contains_many(recent)))
    hits = int(np.count_nonzero(f.contains_many(_ids("absent", probes))))
    return {"buckets per subtable": f.B, "remainder bits": f.r, "epoch bits": f.e,
            "epochs per window E": f.E, "epoch s": f.epoch_len,
            "bytes": f.nbytes(), "bytes per remembered id": f.nbytes() / (WINDOW * RATE),
            "cell occupancy": f.occupancy(), "stash entries": len(f.stash),
            "in-window ids checked": len(recent), "in-window misses": misses,
            "estimated FPP": f.estimated_fpp(), "measured FPP": hits / probes,
            "probes": probes}


def forget_ages(make: Callable[[Clock], object], n: int, span: float, stop: float,
                dt: float) -> np.ndarray:
    """Age at which each of ``n`` ids (written at times spread over ``span``) stops being a member,
    probed every ``dt`` seconds."""
    rng = np.random.default_rng(1)
    clock = Clock(0.0)
    f: object = make(clock)
    times = np.sort(rng.uniform(10.0, 10.0 + span, n))
    items = _ids("edge", n)
    for t, x in zip(times, items, strict=True):
        clock.t = float(t)
        f.seen_or_add(x) if hasattr(f, "seen_or_add") else f.add(x)  # type: ignore[attr-defined]
    gone = np.full(n, np.nan)
    t = float(times[0])
    while t < times[-1] + stop:
        clock.t = t
        for i in np.flatnonzero(np.isnan(gone)):
            if items[i] not in f:  # type: ignore[operator]
                gone[i] = t - times[i]
        t += dt
    return gone


def sharpness() -> dict[str, float]:
    rate = 1000.0  # the edge does not depend on the rate; a small filter probes fast
    dl = forget_ages(lambda c: DLeftWindowFilter.for_window(WINDOW, rate, FPP, c),
                     200, 3.0, WINDOW + 2.0, 0.01)
    fbf = forget_ages(lambda c: ForgetfulBloomFilter.for_window(WINDOW, rate, FPP, clock=c),
                      200, 3.0, WINDOW + 3.0, 0.01)
    return {"dleft-window forgotten at age min s": float(np.nanmin(dl)),
            "dleft-window forgotten at age max s": float(np.nanmax(dl)),
            "dleft-window edge width s": float(np.nanmax(dl) - np.nanmin(dl)),
            "fbf forgotten at age min s": float(np.nanmin(fbf)),
            "fbf forgotten at age max s": float(np.nanmax(fbf)),
            "fbf edge width s": float(np.nanmax(fbf) - np.nanmin(fbf))}


def speed(n: int, repeat: int, batch: int = 1000) -> dict[str, float]:
    """ns per check+insert of a new id at the design shape, scalar and in batches."""
    runs: dict[str, Callable[[list[bytes]], object]] = {
        "fbf add (scalar)": lambda items: _loop(
            ForgetfulBloomFilter.for_window(WINDOW, RATE, FPP, clock=Clock()).add, items),
        "dleft-window seen_or_add (scalar)": lambda items: _loop(
            DLeftWindowFilter.for_window(WINDOW, RATE, FPP, Clock()).seen_or_add, items),
        "dleft-counting seen_or_add (scalar)": lambda items: _loop(
            DLeftCountingDedup.for_window(WINDOW, RATE, FPP, Clock()).seen_or_add, items),
        f"fbf add_many ({batch})": lambda items: _chunks(
            ForgetfulBloomFilter.for_window(WINDOW, RATE, FPP, clock=Clock()).add_many,
            items, batch),
        f"dleft-window seen_or_add_many ({batch})": lambda items: _chunks(
            DLeftWindowFilter.for_window(WINDOW, RATE, FPP, Clock()).seen_or_add_many,
            items, batch),
    }
    best = dict.fromkeys(runs, float("inf"))
    for r in range(repeat):  # interleaved, so a busy moment hurts every contender alike
        items = _ids(f"s{r}", n)
        for name, run in runs.items():
            t = time.perf_counter()
            run(items)
            best[name] = min(best[name], time.perf_counter() - t)
    return {name: s / n * 1e9 for name, s in best.items()}


def steady(batch: int = 1000) -> dict[str, float]:
    """ns per id of batch check+insert at the design fill: both filters take the same batches at
    the design rate for 1.5 windows, the clock advancing (sweeps and rotations included), each
    batch timed for both, interleaved; the last window's batches are counted."""
    clock = Clock()
    dl = DLeftWindowFilter.for_window(WINDOW, RATE, FPP, clock)
    fbf = ForgetfulBloomFilter.for_window(WINDOW, RATE, FPP, clock=clock)
    step = batch / RATE
    batches = int(1.5 * WINDOW / step)
    counted = int(WINDOW / step)
    spent = {"dl": 0.0, "fbf": 0.0}
    for k in range(batches):
        clock.t += step
        items = _ids(f"st{k}", batch)
        for name, add_many in (("dl", dl.seen_or_add_many), ("fbf", fbf.add_many)):
            t = time.perf_counter()
            add_many(items)
            if k >= batches - counted:
                spent[name] += time.perf_counter() - t
    n = counted * batch
    return {f"fbf add_many ({batch}), at design fill": spent["fbf"] / n * 1e9,
            f"dleft-window seen_or_add_many ({batch}), at design fill": spent["dl"] / n * 1e9}


def _loop(add: Callable[[bytes], object], items: list[bytes]) -> None:
    for x in items:
        add(x)


def _chunks(add_many: Callable[[list[bytes]], object], items: list[bytes], k: int) -> None:
    for i in range(0, len(items), k):
        add_many(items[i : i + k])


def sweep_cost() -> float:
    """ms for one epoch's sweep (1/S of the table) at the design shape."""
    clock = Clock()
    f = DLeftWindowFilter.for_window(WINDOW, RATE, FPP, clock)
    f.cells[:] = np.random.default_rng(2).integers(0, 1 << 32, len(f.cells), dtype=np.uint32)

    t = time.perf_counter()
    for _ in range(4 * f.S):  # four rounds of the table
        f._advance(f.epoch + 1)
    return (time.perf_counter() - t) / (4 * f.S) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer ids and repeats (CI smoke run)")
    args = ap.parse_args(argv)
    n, repeat, probes = (20_000, 2, 100_000) if args.quick else (100_000, 5, 2_000_000)
    print(f"dleft-window at window {WINDOW:g} s, {RATE:g} ids/s, target FPP {FPP:g}")
    for name, v in fill_and_probe(probes).items():
        print(f"  {name:42s} {v:14.4g}")
    fbf = ForgetfulBloomFilter.for_window(WINDOW, RATE, FPP, clock=Clock())
    print(f"  {'fbf bytes per remembered id':42s} {fbf.nbytes() / (WINDOW * RATE):14.4g}")
    print(f"  {'dleft-window sweep per epoch ms':42s} {sweep_cost():14.4g}")
    if not args.quick:
        print("forgetting edge (200 ids, probed every 10 ms)")
        for name, v in sharpness().items():
            print(f"  {name:42s} {v:14.4g}")
    print(f"check+insert of new ids, ns per id (best of {repeat}, {n} ids, interleaved)")
    rows = speed(n, repeat)
    for name, ns in rows.items():
        print(f"  {name:42s} {ns:14.0f}")
    if not args.quick:
        print("batch check+insert at the design fill (1.5 windows at the design rate)")
        for name, ns in steady().items():
            print(f"  {name:54s} {ns:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
