"""The chaos driver end to end against real nodes, plus its pieces that need no cluster."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from client.chaos import ChaosConfig, WorkloadConfig, run_chaos
from client.chaos.cli import main
from client.chaos.forensics import explain, trace
from client.chaos.history import load
from client.chaos.nemesis import Partition, choose, partition_pairs
from client.chaos.report import render
from client.chaos.topology import connect_via_args, directed_links
from client.checker import check

# Fixed: a SIGSTOPped leader resuming while the replica that took over checked the
# same ops (two checks passing at once, now excluded by claims, cluster/roles/claims.py) and links
# left without a connection at start (cluster/roles/failure.py) made pause and kill over-count.
SURVIVED = ("lost-ack", "drop", "duplicate", "delay", "reset", "down", "pause")
# A seed whose fast-partition run is INVALID on the code before unpublished deltas were hidden:
# 220 reads above the attempted sum right after heals (the run below, with the code of commit
# 3c0b635).
FAST_PARTITION_SEED = 3


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_chaos_run_with_the_faults_the_node_survives(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        workload=WorkloadConfig(clients=3, concurrency=3, rate=120, duration=20, keys=6),
        nemeses=SURVIVED, quiet=(0.3, 0.7), fault=(1.2, 1.8), out_dir=str(tmp_path),
        seed=5, progress=False)
    res = await run_chaos(cfg)
    text = render(res)
    assert res.valid, text
    assert {p["nemesis"] for p in res.played} == set(SURVIVED), text
    r = res.report
    assert r.acknowledged > 300 and r.reads > 20 and r.retries > 0, text
    assert r.duplicates_absorbed > 0 and r.over_count == 0 and r.under_count == 0, text
    assert all(f.converged and len(f.values) == 3 for f in r.finals)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["valid"] is True and saved["checker"]["acknowledged"] == r.acknowledged
    events = load(tmp_path / "history.jsonl")
    assert check(events, nodes=res.nodes).valid
    kinds = {(e["f"], e["type"]) for e in events}
    assert {("add", "invoke"), ("add", "ok"), ("read", "ok"), ("final-read", "ok"),
            ("start", "info"), ("stop", "info")} <= kinds


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_fast_partitions_never_show_an_op_twice(tmp_path: Path) -> None:
    """Partitions every 0.5-1.5 s for 1-3 s at 300 ops/s: a leader cut off applies ops its
    clients then retry elsewhere, and heals come while those are being settled. Before unpublished
    deltas were hidden this run read values above what had been attempted, right after heals,
    and left a final over-count; every read must now stay within Jepsen's bounds."""
    cfg = ChaosConfig(
        workload=WorkloadConfig(rate=300, duration=40, incr=0.6, decr=0.1, read=0.3),
        nemeses=("partition",), quiet=(0.5, 1.5), fault=(1.0, 3.0), out_dir=str(tmp_path),
        seed=FAST_PARTITION_SEED, progress=False)
    res = await run_chaos(cfg)
    text = render(res)
    assert res.valid, text
    r = res.report
    assert len(res.played) >= 10 and r.acknowledged > 3000 and r.reads > 300, text
    assert r.retries > 100 and r.over_count == 0 and r.under_count == 0, text


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_chaos_kill_and_restart(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        workload=WorkloadConfig(clients=2, concurrency=3, rate=100, duration=12, keys=4),
        nemeses=("kill",), quiet=(0.3, 0.6), fault=(1.5, 2.0), out_dir=str(tmp_path),
        seed=7, progress=False)
    res = await run_chaos(cfg)
    assert res.valid, render(res)


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_without_dedup_lost_acks_over_count_and_the_checker_says_so(
        tmp_path: Path) -> None:
    cfg = ChaosConfig(
        workload=WorkloadConfig(clients=2, concurrency=3, rate=100, duration=5, keys=3,
                                decr=0.0, read=0.0, send_age=False),
        node_args=("--dedup", "none"), nemeses=("lost-ack",), quiet=(0.2, 0.3),
        fault=(4.0, 4.5), out_dir=str(tmp_path), seed=3, progress=False)
    res = await run_chaos(cfg)
    assert not res.valid
    assert res.report.over_count > 0 and res.report.under_count == 0
    assert any("over-count" in p for p in res.report.problems)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cli_runs_and_reports(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "client.chaos", "--duration", "3", "--nemesis", "lost-ack",
         "--quiet", "0.2,0.3", "--fault", "1,1.5", "--clients", "1", "--concurrency", "2",
         "--rate", "60", "--out", str(tmp_path), "--seed", "1"],
        capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RESULT: VALID" in out.stdout and "[####" in out.stderr
    assert (tmp_path / "report.json").exists()


def _history(final: int) -> list[dict[str, Any]]:
    return [{"type": "invoke", "process": 0, "f": "add", "value": 2, "key": "t/k"},
            {"type": "ok", "process": 0, "f": "add", "value": 2, "key": "t/k"},
            {"type": "invoke", "process": "final-n1", "f": "final-read", "key": "t/k",
             "node": "n1"},
            {"type": "ok", "process": "final-n1", "f": "final-read", "value": final,
             "key": "t/k", "node": "n1"}]


@pytest.mark.parametrize(("final", "code"), [(2, 0), (4, 1)])
def test_cli_check_exit_status(tmp_path: Path, final: int, code: int,
                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in _history(final)) + "\n")
    assert main(["--check", str(path)]) == code
    assert ("VALID" if code == 0 else "INVALID") in capsys.readouterr().out


class FakeTopo:
    def __init__(self, n: int, links: bool) -> None:
        self.ids = [f"n{i + 1}" for i in range(n)]
        self.linked_ids = self.ids  # every node's peer links go through proxies
        self.peer_links = links
        self.external: list[str] = []
        self.can_control_processes = True
        self.cuts: list[tuple[list[tuple[str, str]], str]] = []

    async def cut(self, pairs: list[tuple[str, str]], *, mode: str = "down") -> None:
        self.cuts.append((list(pairs), mode))


async def test_partition_cuts_every_link_across_the_cut() -> None:
    topo = FakeTopo(5, links=True)
    shapes = set()
    for seed in range(20):
        detail = await Partition().start(topo, random.Random(seed))  # type: ignore[arg-type]
        pairs, mode = topo.cuts[-1]
        shapes.add(detail["shape"])
        side, rest = set(detail["side"]), set(detail["rest"])
        bridge = {detail["bridge"]} - {None}
        assert side and rest and side | rest | bridge == set(topo.ids)
        assert mode == detail["mode"] and len(side) <= len(rest)
        one_way = {(a, b) for a in side for b in rest}
        both = one_way | {(b, a) for a in side for b in rest}
        assert set(pairs) == (one_way if detail["shape"] == "one-way" else both)
    assert shapes == {"isolate", "halves", "bridge", "one-way"}


def test_partition_shapes_on_three_nodes() -> None:
    for shape in ("isolate", "halves", "bridge", "one-way"):
        pairs, detail = partition_pairs(["n1", "n2", "n3"], shape, random.Random(1))
        assert pairs and len(detail["side"]) == 1


def test_peer_link_plan() -> None:
    links = directed_links(["n1", "n2", "n3"])
    assert len(links) == 6 and ("n1", "n2") in links and ("n2", "n1") in links
    assert connect_via_args("n1", {"n3": "127.0.0.1:9", "n2": "127.0.0.1:8"}) == [
        "--connect-via", "n2=127.0.0.1:8,n3=127.0.0.1:9"]


def test_choose_explains_what_it_skips() -> None:
    chosen, skipped = choose(None, FakeTopo(3, links=False))  # type: ignore[arg-type]
    assert "partition" in skipped and "connect-via" in skipped["partition"]
    assert {n.name for n in chosen} >= {"lost-ack", "kill", "pause"}
    with pytest.raises(ValueError, match="unknown"):
        choose(["nope"], FakeTopo(3, links=False))  # type: ignore[arg-type]


async def test_explain_names_the_origins_of_an_op_counted_twice(tmp_path: Path) -> None:
    from cluster.wal import DurableLog, LogRecord, RecordKind

    apply, replica, withdraw = (int(RecordKind.APPLY), int(RecordKind.REPLICA),
                                int(RecordKind.WITHDRAW))
    logs = {
        "n1": [LogRecord(apply, "c:1", "t", "k", 2, "n1@1", 2, 0, 10.0),
               LogRecord(apply, "c:2", "t", "k", 1, "n1@1", 3, 0, 11.0)],
        "n2": [LogRecord(replica, "c:1", "t", "k", 2, "n1@1", 2, 0, 10.0),
               LogRecord(apply, "c:1", "t", "k", 2, "n2@1", 2, 0, 10.1),
               LogRecord(apply, "c:2", "t", "k", 1, "n2@1", 3, 0, 11.1),
               LogRecord(withdraw, "c:2", "t", "k", -1, "n2@1", 3, 1, 12.0)],
    }
    for node, recs in logs.items():
        log = DurableLog(tmp_path / node / "log", fsync=False)
        await log.start()
        await log.append_nowait(recs)
        await log.stop()
    traces = trace(tmp_path)
    assert traces["c:1"].counted == 2 and traces["c:2"].counted == 1
    events = [{"type": "ok", "f": "add", "op_id": "c:1", "attempts": 3, "duplicate": True}]
    text = explain(tmp_path, events)
    assert "counted more than once: 1" in text and "c:1 on t/k delta 2: counted 2" in text
    assert "n2@1" in text and "after 3 attempt(s) (duplicate)" in text and "c:2 on" not in text


async def test_explain_counts_an_op_one_leader_applied_twice(tmp_path: Path) -> None:
    """Two APPLY records of one op under one origin, with their own pairs: the leader applied
    it twice (its dedup had forgotten it). Found in a chaos run with a 2 s window, where the
    explanation said "counted more than once: 0"."""
    from cluster.wal import DurableLog, LogRecord, RecordKind

    apply, replica = int(RecordKind.APPLY), int(RecordKind.REPLICA)
    log = DurableLog(tmp_path / "n1" / "log", fsync=False)
    await log.start()
    await log.append_nowait([LogRecord(apply, "c:1", "t", "k", 1, "n1@1", 111, 35, 8.6),
                             LogRecord(apply, "c:1", "t", "k", 1, "n1@1", 112, 35, 10.7)])
    await log.stop()
    log = DurableLog(tmp_path / "n2" / "log", fsync=False)
    await log.start()
    await log.append_nowait([LogRecord(replica, "c:1", "t", "k", 1, "n1@1", 111, 35, 8.6)])
    await log.stop()
    assert trace(tmp_path)["c:1"].counted == 2
    text = explain(tmp_path, [])
    assert "counted more than once: 1" in text
    assert "applied at 8.600 (p=111 n=35)" in text and "applied at 10.700 (p=112 n=35)" in text


async def test_explain_reads_archived_segments_and_audits_final_values(tmp_path: Path) -> None:
    """--keep-log archives what a snapshot covers, and --explain still sees it: an op applied
    twice before the snapshot is named; a key whose final value the logs cannot account for
    (a delta carried without its op) is flagged by the audit."""
    from cluster.wal import DurableLog, LogRecord, RecordKind

    apply = int(RecordKind.APPLY)
    log = DurableLog(tmp_path / "n1" / "log", fsync=False, archive=True)
    await log.start()
    await log.append_nowait([LogRecord(apply, "c:1", "t", "k", 2, "n1@1", 2, 0, 10.0),
                             LogRecord(apply, "c:1", "t", "k", 2, "n1@2", 2, 0, 11.0)])
    await log.write_snapshot(lambda: b"state")
    await log.append_nowait([LogRecord(apply, "c:2", "t", "j", 1, "n1@2", 1, 0, 12.0)])
    await log.stop()
    assert list((tmp_path / "n1" / "log" / "archive").glob("*.wal"))  # covered, kept
    assert trace(tmp_path)["c:1"].counted == 2
    finals = [{"type": "ok", "f": "final-read", "key": "t/k", "value": 4},
              {"type": "ok", "f": "final-read", "key": "t/j", "value": 3}]
    text = explain(tmp_path, finals)
    assert "counted more than once: 1" in text and "c:1 on t/k delta 2: counted 2" in text
    assert "final values the logs do not account for: 1" in text
    assert "t/j: final value 3, the logs account for 1 (unexplained +2" in text
    assert "t/k: final" not in text  # 4 = c:1 counted twice, explained by the op list


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_clock_nemesis_refuses_beyond_the_tolerance_and_stays_valid(
        tmp_path: Path) -> None:
    """A node restarted with its clock 0.4 s behind counts; 5 s ahead it refuses (503
    clock_skew, recorded in the history); the run stays exact."""
    from client.chaos.nemesis import ALL

    ALL["clock"].turn = 0  # type: ignore[attr-defined]
    cfg = ChaosConfig(
        workload=WorkloadConfig(clients=2, concurrency=3, rate=80, duration=14, keys=6),
        nemeses=("clock",), quiet=(0.3, 0.5), fault=(3.0, 3.5), out_dir=str(tmp_path),
        seed=2, progress=False)
    res = await run_chaos(cfg)
    text = render(res)
    assert res.valid, text
    plays = [(p["offset_s"], p["refusing"]) for p in res.played]
    assert plays[:2] == [(-0.4, False), (5.0, True)], plays
    r = res.report
    assert r.acknowledged > 300 and r.over_count == 0 and r.under_count == 0, text
