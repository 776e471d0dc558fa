"""``python -m bench --quick``: every benchmark runs end to end and prints its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_every_benchmark_runs_quick() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--quick"], cwd=ROOT, timeout=280,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    for name in ("bench.bench_fbf", "bench.bench_hotpath", "bench.bench_wire",
                 "bench.bench_wal", "bench.bench_cluster", "bench.bench_dleft",
                 "bench.bench_scale", "bench.bench_redis"):
        assert f"=== {name} ===" in out
    assert "idle, loaded:" in out and "partition and repair:" in out
    assert "signed us" in out and '"batch"' in out and "records/s" in out
    assert "bytes per remembered id" in out and "unpublished hold+busy+release" in out
    # Redis side by side where redis-server is installed; elsewhere it says how to get it
    assert "ours / redis, ops/s:" in out or "redis-server not found" in out \
        or "the redis package is missing" in out
