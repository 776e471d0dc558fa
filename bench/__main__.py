"""``python -m bench``: run every benchmark in turn (each prints its own table).

Pass ``--quick`` for the short versions. Each benchmark is bounded in time and stops by itself.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("bench.bench_fbf", "bench.bench_dleft", "bench.bench_hotpath", "bench.bench_wire",
              "bench.bench_wal", "bench.bench_cluster", "bench.bench_scale", "bench.bench_redis",
              "bench.bench_floor", "bench.bench_inprocess", "bench.bench_counters")


def main(argv: list[str]) -> int:
    worst = 0
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        module = importlib.import_module(name)
        worst = max(worst, module.main(argv) or 0)
    return worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
