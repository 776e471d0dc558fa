"""The chaos workload's deletes, multi-gets and scans against fake clients (no cluster): it
records the events the checker reads, a correct store passes the checker, a store whose deletes
do not hold fails it; and the --mix flag's forms."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from client.chaos.cli import MIX_DEFAULT, _mix, build_parser, config_from_args
from client.chaos.history import History
from client.chaos.workload import Workload, WorkloadConfig, scan_prefix
from client.checker import check
from client.errors import NotAppliedError, OutcomeUnknownError, UnavailableError
from client.nodes import NodePool
from client.retry import AddResult
from client.stats import ClientStats


class Store:
    """A linearizable store shared by the fake clients; ``broken_delete`` acknowledges deletes
    without removing anything."""

    def __init__(self, broken_delete: bool = False) -> None:
        self.value: dict[str, int] = {}
        self.exists: dict[str, bool] = {}
        self.broken_delete = broken_delete


class FakeClient:
    def __init__(self, store: Store, **settings: Any) -> None:
        self.store, self.rng = store, settings["rng"]  # the workload's seeded one
        self.client_id = settings["client_id"]
        self.stats = ClientStats()
        self.pool = NodePool(settings["nodes"])
        self.seq = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def refresh(self) -> None:
        pass

    async def _write(self, key: str, delta: int, delete: bool) -> AddResult:
        self.seq += 1
        op_id = f"{self.client_id}:{self.seq}"
        await asyncio.sleep(0)
        roll = self.rng.random()
        if roll < 0.05:
            raise NotAppliedError("nothing sent", op_id=op_id, attempts=1)
        if roll < 0.1 or not (delete and self.store.broken_delete):
            if delete:
                self.store.value[key], self.store.exists[key] = 0, False
            else:
                self.store.value[key] = self.store.value.get(key, 0) + delta
                self.store.exists[key] = True
        if roll < 0.15:
            raise OutcomeUnknownError("gave up", op_id=op_id, attempts=3)
        await asyncio.sleep(0)
        return AddResult(op_id, delta, True, False, 1, "n1")

    async def add(self, table: str, key: str, delta: int) -> AddResult:
        return await self._write(f"{table}/{key}", delta, False)

    async def delete(self, table: str, key: str) -> AddResult:
        return await self._write(f"{table}/{key}", 0, True)

    async def get(self, table: str, key: str, consistency: str = "quorum") -> int:
        await asyncio.sleep(0)
        if self.rng.random() < 0.05:
            raise UnavailableError("503")
        return self.store.value.get(f"{table}/{key}", 0)

    async def get_many(self, table: str, keys: Sequence[str], *,
                       consistency: str = "quorum") -> list[int]:
        await asyncio.sleep(0)
        return [self.store.value.get(f"{table}/{k}", 0) for k in keys]

    async def scan(self, table: str, *, prefix: str = "", page_size: int = 100,
                   consistency: str = "quorum") -> AsyncIterator[tuple[str, int]]:
        """Pages by cursor, each read at its own instant (as the contract allows)."""
        cursor = ""
        while True:
            await asyncio.sleep(0)
            want = f"{table}/{prefix}"
            page = sorted(k for k, e in self.store.exists.items()
                          if e and k.startswith(want) and k > cursor)[:page_size]
            for k in page:
                yield k.partition("/")[2], self.store.value[k]
            if len(page) < page_size:
                return
            cursor = page[-1]


CFG = WorkloadConfig(clients=2, concurrency=4, rate=3000, duration=0.6, keys=40, table="t",
                     read=0.1, delete=0.08, multiget=0.08, scan=0.04, scan_keys=12,
                     scan_page_size=3)


async def run(store: Store, cfg: WorkloadConfig = CFG) -> list[dict[str, Any]]:
    history = History()
    wl = Workload(cfg, ["http://127.0.0.1:1"], history, seed=3,
                  client_factory=lambda **kw: FakeClient(store, **kw))
    await asyncio.wait_for(wl.run(), timeout=30)
    return history.events


async def test_workload_records_deletes_multigets_and_scans_a_checker_accepts() -> None:
    events = await run(Store())
    kinds = {(e["f"], e["type"]) for e in events}
    for f in ("add", "delete"):
        assert {(f, "invoke"), (f, "ok"), (f, "fail"), (f, "info")} <= kinds
    for f in ("read", "multiget", "scan"):
        assert {(f, "invoke"), (f, "ok")} <= kinds
    mg = next(e for e in events if e["f"] == "multiget" and e["type"] == "ok")
    assert len(mg["keys"]) == len(mg["value"]) and mg["consistency"] == "quorum"
    assert all(k.startswith("t/k") for k in mg["keys"])
    sc = next(e for e in events if e["f"] == "scan" and e["type"] == "ok" and e["value"])
    assert sc["table"] == "t" and all(k.startswith("t/k" + sc["prefix"][1:]) for k, _ in
                                      sc["value"])
    de = next(e for e in events if e["f"] == "delete" and e["type"] == "ok")
    assert de["key"].startswith("t/") and de["value"] is None and de["op_id"]
    rep = check(events)
    assert rep.valid, rep.problems
    assert rep.deletes_ok and rep.deletes_indeterminate and rep.deletes_failed
    assert rep.multiget_values > rep.multigets > 0 and rep.scans and rep.scan_values


async def test_deletes_that_do_not_hold_fail_the_check() -> None:
    rep = check(await run(Store(broken_delete=True)))
    assert not rep.valid
    assert rep.read_errors or rep.scan_errors


async def test_default_mix_issues_no_deletes_multigets_or_scans() -> None:
    cfg = WorkloadConfig(clients=1, concurrency=2, rate=2000, duration=0.2, keys=4, table="t")
    events = await run(Store(), cfg)
    assert {e["f"] for e in events} <= {"add", "read"}
    assert check(events).valid


def test_scan_prefix_is_the_shortest_that_bounds_the_scan() -> None:
    names = sorted(f"k{i}" for i in range(3000))
    rng = random.Random(1)
    for _ in range(200):
        p = scan_prefix(names, rng, 120)
        n = sum(1 for x in names if x.startswith(p))
        assert 1 <= n <= 120
        assert sum(1 for x in names if x.startswith(p[:-1])) > 120
    assert scan_prefix(names[:8], rng, 100) == ""


def test_mix_flag_forms() -> None:
    assert _mix("0.7,0.2,0.1") == MIX_DEFAULT
    assert _mix("0.5,0,0.5") == {**MIX_DEFAULT, "incr": 0.5, "decr": 0.0, "read": 0.5}
    got = _mix("add=0.9,read=0.05,delete=0.03,multiget=0.05,scan=0.02")
    assert got["incr"] == pytest.approx(0.7) and got["decr"] == pytest.approx(0.2)
    assert (got["read"], got["delete"], got["multiget"], got["scan"]) == (0.05, 0.03, 0.05, 0.02)
    assert _mix("delete=0.03") == {**MIX_DEFAULT, "delete": 0.03}
    for bad in ("0.7,0.2", "x=1", "delete=-1", "0,0,0", "read=abc"):
        with pytest.raises(argparse.ArgumentTypeError):
            _mix(bad)


def test_cli_builds_the_workload_mix() -> None:
    cfg = config_from_args(build_parser().parse_args(
        ["--mix", "delete=0.03,scan=0.02", "--scan-keys", "50", "--read-consistency", "all"]))
    wl = cfg.workload
    assert (wl.incr, wl.decr, wl.read, wl.delete, wl.multiget, wl.scan) == (
        0.7, 0.2, 0.1, 0.03, 0.0, 0.02)
    assert wl.scan_keys == 50 and wl.read_consistency == "all"
    old = config_from_args(build_parser().parse_args([])).workload
    assert (old.incr, old.decr, old.read, old.delete, old.multiget, old.scan) == (
        0.7, 0.2, 0.1, 0.0, 0.0, 0.0)
