"""``python -m bench --quick``: every benchmark runs end to end and prints its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_every_benchmark_runs_quick() -> None:
    # two at a time (they mostly wait on their clusters); bench_counters and bench_app have
    # tests of their own
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--jobs", "2", "--skip",
                           "bench.bench_counters,bench.bench_app"], cwd=ROOT, timeout=280,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    for name in ("bench.bench_fbf", "bench.bench_hotpath", "bench.bench_wire",
                 "bench.bench_wal", "bench.bench_cluster", "bench.bench_dleft",
                 "bench.bench_scale", "bench.bench_redis", "bench.bench_floor",
                 "bench.bench_inprocess"):
        assert f"=== {name} ===" in out
    assert "idle, loaded:" in out and "partition and repair:" in out
    assert "signed us" in out and '"batch"' in out and "records/s" in out
    assert "bytes per remembered id" in out and "unpublished hold+busy+release" in out
    assert "floor: {'batch': 1," in out and "floor: {'batch': 100," in out
    assert "in-process cluster, batches of 100:" in out
    # Redis side by side where redis-server is installed; elsewhere it says how to get it
    assert "ours / redis, ops/s:" in out or "redis-server not found" in out \
        or "the redis package is missing" in out
    if "ours / redis, ops/s:" in out:  # and then the hot-path targets, each judged
        assert "single p99 at 80% of peak (ms)" in out and "batched ops/s" in out


def test_the_targets_are_judged_by_their_sense() -> None:
    from bench.bench_redis import targets

    out = {"ours_pipelined": {"ops_per_s": 120_000, "node_cpu_us_per_op": 16.0},
           "ours_single": {"ops_per_s": 4_999, "node_cpu_us_per_op": 250.0},
           "ours_single_paced": {"p99_ms": 20.5},
           "ratios": {"pipelined": 2.0, "single": 0.34}}
    met = {r["target"]: r["met"] for r in targets(out)}
    assert met == {"batched ops/s": True, "batched node CPU per op (us)": False,
                   "batched / Redis pipelined": True, "single ops/s": False,
                   "single node CPU per op (us)": True, "single / Redis single": False,
                   "single p99 at 80% of peak (ms)": False}


def test_the_soak_finds_nodes_started_with_a_relative_data_dir(tmp_path: Path) -> None:
    """The chaos driver passes --data-dir as given; the soak must still find each node (its
    RSS samples were empty when --out was relative)."""
    from bench.soak import node_processes

    (tmp_path / "soak" / "data").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "cluster.node", "--id", "n9",
         "--data-dir", "soak/data/n9"], cwd=tmp_path)
    try:
        # the kernel closes the exec pipe Popen waits on before it sets the new argv: until
        # then /proc/<pid>/cmdline is empty (seen under load)
        deadline = time.monotonic() + 10
        while b"cluster.node" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        assert node_processes(tmp_path / "soak" / "data") == {"n9": proc.pid}
        assert node_processes(tmp_path / "elsewhere") == {}
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(180)
def test_bench_counters_runs_quick() -> None:
    """Multi-get, deletes, a scan checked key by key and a short churn, each printing its
    table (the targets are printed and judged, not asserted: they depend on the machine)."""
    done = subprocess.run([sys.executable, "-m", "bench.bench_counters", "--quick"], cwd=ROOT,
                          timeout=170, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert "check: multi-gets at quorum of all 10000 counters: 0 wrong, every value right" in out
    assert "node CPU a counter, single GET / multi-get:" in out
    assert "node CPU a delete / an add (single):" in out
    assert "node CPU a delete / an add (batch):" in out
    assert "deleted counters read 0" in out
    assert "20000 keys written, 20000 returned" in out and "every key exactly once" in out
    assert "churn: RSS (MiB) and keys held by each node" in out
    assert "n3: RSS after the second period:" in out
    assert "peers taken for down (every node stayed up):" in out


def test_churn_flatness_is_judged_from_its_base_sample() -> None:
    from bench.bench_counters import flatness

    rows = [{"t": float(t), "n1_rss_mib": rss, "n1_keys": keys}
            for t, rss, keys in ((0, 50.0, 0), (10, 90.0, 9), (20, 100.0, 10), (30, 114.0, 10),
                                 (40, 86.0, 10))]
    got = flatness(rows, ["n1"], 20, "from t=20")["n1"]
    assert got["from_t"] == 20 and got["rss_base_mib"] == 100.0 and got["within_15pct"]
    assert got["max_deviation_pct"] == 14.0 and got["keys_max"] == 10
    assert not flatness(rows, ["n1"], 10, "from t=10")["n1"]["within_15pct"]  # 114 / 90
    assert flatness(rows, ["n1"], 40, "too late") == {}  # one sample judges nothing


@pytest.mark.timeout(120)
def test_bench_app_counts_every_acknowledged_op_once(tmp_path: Path) -> None:
    """Coroutines sharing one SDK client: some ops acknowledged, and the counters read back
    sum to exactly that many (none lost, none counted twice)."""
    out = tmp_path / "app.json"
    done = subprocess.run([sys.executable, "-m", "bench.bench_app", "--quick", "--seconds",
                           "0.5", "--coroutines", "16", "--keys", "50", "--json", str(out)],
                          cwd=ROOT, timeout=110, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "ours, app shape:" in done.stdout
    results = json.loads(out.read_text())
    ours = results["ours"]
    assert ours["ops"] > 0 and ours["errors"] == 0
    assert ours["counted"] == ours["ops"]
    if "redis" in results:  # where redis-server is installed, the same check of its side
        assert results["redis"]["counted"] == results["redis"]["ops"] > 0


@pytest.mark.timeout(120)
def test_bench_cluster_splits_cpu_by_role(tmp_path: Path) -> None:
    """``--phases roles``: every op led by the first node, the other two only replicating;
    the leader's CPU and each replica's, for both shapes, from a real cluster."""
    out = tmp_path / "roles.json"
    done = subprocess.run([sys.executable, "-m", "bench.bench_cluster", "--quick", "--phases",
                           "roles", "--seconds", "1", "--json", str(out)], cwd=ROOT,
                          timeout=110, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    roles = json.loads(out.read_text())["roles"]
    assert json.loads(out.read_text())["errors"] == 0
    for shape in ("batch", "single"):
        got = roles[shape]
        assert got["ops_per_s"] > 0
        assert set(got["replica_us_per_op"]) == {"n2", "n3"}
        # the leader does the edge's work and its own apply besides what a replica does
        leader = got["leader_us_per_op"]["user"] + got["leader_us_per_op"]["sys"]
        for replica in got["replica_us_per_op"].values():
            assert 0 < replica["user"] + replica["sys"] < leader
