"""FBF hot path: check+insert cost against a plain Bloom add, batch cost, refresh, bytes per id.

Run: ``python -m bench.bench_fbf [--quick]``. Prints a table; every number comes from this run.
Two Bloom baselines: ``BloomFilter.add`` (the project's, same hashing as the FBF) and the
simplest add one would write (``mmh3.hash64``, a ``bitarray``, k positions ``(a + i*b) mod m``),
which the hot path's target is stated against (FBF check+insert at most 2x it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import mmh3
import numpy as np
from bitarray import bitarray

from cluster.core.bloom import BloomFilter
from cluster.core.fbf import ForgetfulBloomFilter, hotpath


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _ids(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i % 997}:{i}".encode() for i in range(n)]


def per_op(n: int, repeat: int) -> dict[str, float]:
    """Microseconds per check+insert of a new id, each structure fresh for each repeat."""
    m, k = 1 << 22, 7
    items = _ids("c", n)
    out: dict[str, float] = {}

    def run_bloom() -> None:
        b = BloomFilter(m, k)
        add = b.add
        for it in items:
            add(it)

    out["bloom add"] = _best(run_bloom, repeat) / n * 1e6

    def run_simplest() -> None:
        bits = bitarray(m)
        bits.setall(0)
        for it in items:
            a, b = mmh3.hash64(it)
            for i in range(k):
                bits[(a + i * b) % m] = 1

    out["bloom add, simplest"] = _best(run_simplest, repeat) / n * 1e6
    for nf in (3, 8, 24):

        def run_fbf(nf: int = nf) -> None:
            f = ForgetfulBloomFilter(m, k, nf - 2, 3600.0, time.monotonic)
            add = f.add
            for it in items:
                add(it)

        out[f"fbf add, {nf} filters"] = _best(run_fbf, repeat) / n * 1e6
    f = ForgetfulBloomFilter(m, k, 6, 3600.0, time.monotonic)
    f.add_many(items)

    def run_check() -> None:
        for it in items:
            it in f  # noqa: B015

    out["fbf check (member), 8 filters"] = _best(run_check, repeat) / n * 1e6
    return out


def batch(n: int, batch_size: int, repeat: int) -> dict[str, float]:
    m, k = 1 << 22, 7
    items = _ids("b", n)
    chunks = [items[i : i + batch_size] for i in range(0, n, batch_size)]
    out: dict[str, float] = {}
    for nf in (3, 8, 24):

        def run(nf: int = nf) -> None:
            f = ForgetfulBloomFilter(m, k, nf - 2, 3600.0, time.monotonic)
            for c in chunks:
                f.add_many(c)

        out[f"fbf add_many, {nf} filters"] = _best(run, repeat) / n * 1e6
    return out


def memory(window: float, rate: float, fpp: float) -> dict[str, float]:
    """Bytes per remembered op id for an FBF sized for the window, and for a Python set."""
    f = ForgetfulBloomFilter.for_window(window, rate, fpp, clock=time.monotonic)
    remembered = rate * window
    ids = _ids("mem", 200_000)
    s = set(ids)
    set_bytes = sys.getsizeof(s) + sum(sys.getsizeof(x) for x in ids)
    refresh = _best(f.refresh, 5)
    blob = f.to_bytes()
    to_bytes = _best(f.to_bytes, 3)
    from_bytes = _best(lambda: ForgetfulBloomFilter.from_bytes(blob), 3)
    return {
        "fbf m (bits per filter)": f.m,
        "fbf k": f.k,
        "fbf filters": f.n_past + 2,
        "fbf period s": f.period,
        "fbf bytes": f.nbytes(),
        "fbf bytes per remembered id": f.nbytes() / remembered,
        "python set bytes per id": set_bytes / len(ids),
        "fbf refresh ms": refresh * 1e3,
        "fbf to_bytes ms": to_bytes * 1e3,
        "fbf from_bytes ms": from_bytes * 1e3,
        "fbf snapshot bytes": len(blob),
    }


def measured_fpp(window: float, rate: float, fpp: float) -> float:
    """Fill an FBF sized for (window, rate, fpp) at its design rate, probe absent ids."""

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    f = ForgetfulBloomFilter.for_window(window, rate, fpp, clock=clock)
    step = f.period / 4
    seq = 0
    for tick in range(4 * (f.n_past + 3)):
        clock.t = (tick + 0.5) * step  # mid-tick: no insert lands on an epoch boundary
        n = int(rate * step)
        f.add_many([f"in:{seq + i}".encode() for i in range(n)])
        seq += n
    # probed at the end of a period, when the future filter is fullest (the worst moment)
    probes = [f"absent:{i}".encode() for i in range(1_000_000)]
    return float(np.mean(f.contains_many(probes)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer ids and repeats (CI smoke run)")
    args = ap.parse_args(argv)
    n, repeat = (20_000, 2) if args.quick else (200_000, 5)
    rows = per_op(n, repeat)
    rows.update(batch(n * 5, 10_000, repeat))
    base = rows["bloom add"]
    why = f": {hotpath.KERNEL_REASON}" if hotpath.KERNEL_REASON else ""
    print(f"fbf hot path: {hotpath.KERNEL}{why}")
    print(f"{'per id (us)':40s} {'us':>8s} {'x bloom':>8s}")
    for name, us in rows.items():
        print(f"{name:40s} {us:8.3f} {us / base:8.2f}")
    flat = rows["fbf add, 24 filters"] / rows["fbf add, 3 filters"]
    print(f"{'fbf add: 24 filters / 3 filters':40s} {flat:8.2f}")
    simplest = rows["bloom add, simplest"]
    for nf in (3, 8, 24):
        ratio = rows[f"fbf add, {nf} filters"] / simplest
        print(f"{f'fbf add, {nf} filters / simplest bloom':40s} {ratio:8.2f}")
    window, rate, fpp = 10.0, 100_000.0, 1e-6
    print(f"\nmemory, window {window:g} s at {rate:g} ids/s (1M remembered ids), FPP {fpp:g}")
    for name, v in memory(window, rate, fpp).items():
        print(f"{name:40s} {v:12.3f}" if isinstance(v, float) else f"{name:40s} {v:12d}")
    if not args.quick:
        measured = measured_fpp(window, rate, fpp)
        print(f"{'measured FPP at design rate (1M probes)':40s} {measured:12.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
