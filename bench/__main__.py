"""``python -m bench``: run every benchmark in turn (each prints its own table).

Pass ``--quick`` for the short versions. Each benchmark is bounded in time and stops by itself.
``--jobs N`` runs N benchmarks at once, each in a process of its own, and prints their outputs
in the usual order (their numbers then compete for the cores: a smoke run, not a measure);
``--skip bench.a,bench.b`` leaves some out.
``python -m bench --report`` (``make bench``) instead runs the headline measures and writes
docs/benchmarks.md and the README's table (``bench/report.py``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

BENCHMARKS = ("bench.bench_fbf", "bench.bench_dleft", "bench.bench_hotpath", "bench.bench_wire",
              "bench.bench_wal", "bench.bench_cluster", "bench.bench_scale", "bench.bench_redis",
              "bench.bench_floor", "bench.bench_inprocess", "bench.bench_counters",
              "bench.bench_app")


def _option(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of ``name VALUE`` (or ``name=VALUE``) and the arguments without it."""
    rest, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == name and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(name + "="):
            value = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return value, rest


def _in_process(name: str, argv: list[str]) -> int:
    print(f"\n=== {name} ===", flush=True)
    module = importlib.import_module(name)
    return int(module.main(argv) or 0)


def _subprocess(name: str, argv: list[str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", name, *argv], capture_output=True, text=True)
    return done.returncode, f"\n=== {name} ===\n{done.stdout}{done.stderr}"


def main(argv: list[str]) -> int:
    if "--report" in argv:
        from bench import report

        return report.main([a for a in argv if a != "--report"])
    jobs_arg, argv = _option(argv, "--jobs")
    skip_arg, argv = _option(argv, "--skip")
    skip = set((skip_arg or "").split(","))
    names = [n for n in BENCHMARKS if n not in skip]
    jobs = int(jobs_arg or 1)
    if jobs <= 1:
        return max((_in_process(name, argv) for name in names), default=0)
    worst = 0
    with ThreadPoolExecutor(jobs) as pool:
        for code, text in pool.map(lambda n: _subprocess(n, argv), names):  # in order
            print(text, end="", flush=True)
            worst = max(worst, code)
    return worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
