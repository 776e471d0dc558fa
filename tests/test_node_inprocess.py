"""Three nodes in one event loop (real sockets, no fsync): write path, quorum loss, recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster_util import Client, inprocess_configs, inprocess_nodes, node_url

from cluster.core.ring import Ring
from cluster.wal import RecordKind, read_segments

pytestmark = pytest.mark.timeout(60)


configs, nodes, url = inprocess_configs, inprocess_nodes, node_url


async def test_write_read_and_restart_recovers_state_and_dedup(tmp_path: Path) -> None:
    cfgs = configs(tmp_path)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            for i in range(30):
                status, body = await client.add(url(servers[i % 3]), "t", f"k{i % 3}", f"c:{i}", 2)
                assert body == {"applied": True}
            await servers[0].snapshot()  # half the history in a snapshot, half in the log
            for i in range(30, 40):
                await client.add(url(servers[i % 3]), "t", f"k{i % 3}", f"c:{i}", 2)
        async with nodes(cfgs) as servers:
            node = servers[0].node
            assert node.metrics.replayed > 0
            assert sum(node.state.shards.value("t", f"k{j}") for j in range(3)) == 80
            for i in range(40):
                status, body = await client.add(url(servers[0]), "t", f"k{i % 3}", f"c:{i}", 2)
                assert body == {"applied": False, "duplicate": True}, i
            assert node.origin.startswith("n1@") and node.origin != "n1@1"
    finally:
        await client.close()


async def test_quorum_loss_answers_503_and_retry_is_safe(tmp_path: Path) -> None:
    cfgs = configs(tmp_path)
    ring = Ring(["n1", "n2", "n3"])
    key = next(f"k{i}" for i in range(100) if ring.leader("t", f"k{i}") == "n1")
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            await servers[1].stop()
            await servers[2].stop()
            status, body = await client.add(url(servers[0]), "t", key, "q:1", 1)
            assert status == 503 and body["error"]["code"] == "unavailable"
            status, body = await client.batch(url(servers[0]), [
                {"table": "t", "key": key, "op_id": "q:2", "delta": 1}])
            assert status == 200 and body["results"][0]["status"] == 503
            status, body = await client.get(f"{url(servers[0])}/v1/counters/t/{key}"
                                            "?consistency=quorum")
            assert status == 503
            assert (await client.get(f"{url(servers[0])}/v1/counters/t/{key}"
                                     "?consistency=one"))[0] == 200
    finally:
        await client.close()


async def test_duplicate_in_flight_waits_for_the_original(tmp_path: Path) -> None:
    cfgs = configs(tmp_path)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            base = url(servers[0])
            results = await asyncio.gather(*(client.add(base, "t", "same", "d:1", 3)
                                             for _ in range(10)))
            bodies = [b for _, b in results]
            assert bodies.count({"applied": True}) == 1
            assert bodies.count({"applied": False, "duplicate": True}) == 9
            assert await client.value(base, "t", "same", "all") == 3
    finally:
        await client.close()


async def test_per_table_dedup_strategies(tmp_path: Path) -> None:
    cfgs = configs(tmp_path, dedup="fbf,ex=exact,off=none")
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            base = url(servers[1])
            for table in ("ex", "off", "plain"):
                await client.add(base, table, "k", "s:1", 1)
                await client.add(base, table, "k", "s:1", 1)
            assert await client.value(base, "ex", "k", "all") == 1
            assert await client.value(base, "off", "k", "all") == 2  # no dedup: counts twice
            assert await client.value(base, "plain", "k", "all") == 1
            status, health = await client.get(base + "/v1/health")
            assert health["tables"]["ex"]["strategy"] == "exact"
            assert health["tables"]["plain"]["strategy"] == "fbf"
    finally:
        await client.close()


async def test_periodic_snapshot_keeps_the_log_short(tmp_path: Path) -> None:
    cfgs = configs(tmp_path, snapshot_interval=0.2)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            for i in range(20):
                await client.add(url(servers[i % 3]), "t", "snap", f"s:{i}", 1)
            deadline = asyncio.get_running_loop().time() + 10
            while servers[0].node.metrics.snapshots == 0:
                assert asyncio.get_running_loop().time() < deadline, "no snapshot written"
                await asyncio.sleep(0.05)
            assert list((tmp_path / "n1" / "log").glob("snapshot-*"))
        async with nodes(cfgs) as servers:
            assert servers[0].node.state.shards.value("t", "snap") == 20
            status, body = await client.add(url(servers[0]), "t", "snap", "s:3", 1)
            assert body == {"applied": False, "duplicate": True}
    finally:
        await client.close()


async def test_a_published_op_leaves_a_published_record_in_its_leaders_log(
        tmp_path: Path) -> None:
    """After its quorum, the leader logs a PUBLISHED record for each op (one columnar frame a
    publication, riding with the next commit): recovery then need not ask the replicas about
    it. Each record carries the op's pair and a delta of 0."""
    cfgs = configs(tmp_path)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            for i in range(12):  # one op a request, to the node that takes it
                await client.add(url(servers[0]), "t", f"k{i % 4}", f"c:{i}", 3)
    finally:  # stopping the nodes writes their lazy records
        await client.close()

    applied: dict[str, set[str]] = {}
    published: dict[str, list[tuple[str, int, int]]] = {}
    for c in cfgs:
        records = list(read_segments(Path(c.data_dir) / "log"))
        applied[c.node_id] = {r.op_id for r in records if r.kind == RecordKind.APPLY}
        published[c.node_id] = [(r.op_id, r.delta, r.p) for r in records
                                if r.kind == RecordKind.PUBLISHED]
    for node_id, ids in applied.items():  # each leader published exactly what it applied
        assert sorted(op for op, _d, _p in published[node_id]) == sorted(ids), node_id
        assert all(d == 0 and p > 0 for _op, d, p in published[node_id])
    assert set().union(*applied.values()) == {f"c:{i}" for i in range(12)}
