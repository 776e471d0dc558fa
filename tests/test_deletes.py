"""Observed-remove deletes, floors, table settings and expiry: the pure rules, then three nodes
in one event loop (real sockets, no fsync) through the HTTP API: multi-get, scans, deletes,
ttl, collection of tombstones and a pair restarted above a replica's stale copy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cluster_util import Client, inprocess_configs, inprocess_nodes, node_url, wait_until
from hypothesis import given
from hypothesis import strategies as st

from client.sdk import CounterClient
from cluster.core.entry import FLOOR, LAST, CounterEntry, is_live, value_of
from cluster.core.membership import Membership
from cluster.core.tables import TableError, TableSettings
from cluster.roles.scans import decode_cursor, encode_cursor
from cluster.server import NodeServer

pytestmark = pytest.mark.timeout(90)


# -- the pure rules ------------------------------------------------------------------------

def test_value_counts_only_what_lies_above_each_origins_floor() -> None:
    pairs = {"n1@1": (10, 2), "n2@1": (5, 0), FLOOR + "n1@1": (7, 2)}
    assert value_of(pairs) == (10 - 7) - (2 - 2) + 5
    # a replica that has the floor but not yet the pair under it counts nothing for it
    assert value_of({"n1@1": (3, 0), FLOOR + "n1@1": (7, 2)}) == 0
    assert value_of({"n1@1": (3, 1)}) == 2  # no floor: sum(P) - sum(N)


def test_a_delete_floors_every_origin_it_saw_and_a_later_add_counts_whole() -> None:
    seen = CounterEntry({"n1@1": (10, 3), "n2@1": (4, 0), FLOOR + "n1@1": (2, 0)})
    floors = CounterEntry(seen.floors(now_ms=1_000))
    assert floors.pairs[FLOOR + "n1@1"] == (10, 3)  # the higher of the pair and the old floor
    assert floors.pairs[LAST] == (1_000, 0)
    after = seen.merge(floors)
    assert after.value() == 0 and not after.live()
    later = after.merge(CounterEntry({"n2@1": (9, 0)}))  # +5 the delete did not see
    assert later.value() == 5 and later.live()
    # an old pair arriving late (a hint, a repair) lies under the floor: no resurrection
    assert later.merge(CounterEntry({"n1@1": (8, 1)})).value() == 5


pairs_st = st.dictionaries(st.sampled_from(["a@1", "b@1", "~a@1", "~b@1", "~"]),
                           st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=5)


@given(pairs_st, pairs_st, pairs_st)
def test_merge_stays_a_lattice_with_floors_and_value_never_counts_below_a_floor(
        a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]],
        c: dict[str, tuple[int, int]]) -> None:
    x, y, z = CounterEntry(a), CounterEntry(b), CounterEntry(c)
    assert x.merge(y) == y.merge(x)
    assert x.merge(y).merge(z) == x.merge(y.merge(z))
    assert x.merge(x) == x
    # deleting what was seen then merging anything the delete saw leaves 0 and no live key
    gone = x.merge(CounterEntry(x.floors(now_ms=5)))
    assert gone.value() == 0 and not is_live(dict(gone.pairs))
    assert gone.merge(x).value() == 0


def test_table_settings_are_checked_and_travel_with_the_membership() -> None:
    with pytest.raises(TableError, match="ttl_s"):
        TableSettings("t", 0)
    with pytest.raises(TableError, match="ttl_s"):
        TableSettings("t", float("nan"))
    with pytest.raises(TableError, match="table"):
        TableSettings("bad name", 5)
    t = TableSettings("views", 30, since_ms=1_000)
    assert t.expired(0, 31_000) and not t.expired(0, 30_999)  # no last change: since_ms
    assert t.expired(5_000, 35_000) and not t.expired(5_000, 34_999)
    ms = Membership.bootstrap([("n1", "127.0.0.1", 1)], rf=1, vnodes=4)
    v2 = ms.set_table(t)
    assert v2.version == 2 and v2.table("views") == t
    assert v2.set_table(TableSettings("views", 30, since_ms=9)) is v2  # asked again: same
    assert Membership.from_wire(v2.to_wire()) == v2
    assert Membership.from_wire(ms.to_wire()).tables == ()


def test_a_cursor_round_trips_and_a_forged_one_is_refused() -> None:
    assert decode_cursor(encode_cursor((123, "k:1"))) == (123, "k:1")
    assert decode_cursor(None) is None
    for bad in ("zzz", encode_cursor((123, "k")) + "!", "MTo5OTk5OTk6aw"):
        with pytest.raises(Exception, match="cursor"):
            decode_cursor(bad)


# -- three nodes ---------------------------------------------------------------------------

configs, nodes, url = inprocess_configs, inprocess_nodes, node_url


async def req(client: Client, method: str, u: str, **kw: Any) -> tuple[int, Any]:
    return await client._req(method, u, **kw)


async def test_multi_get_answers_in_order_in_one_read_frame_per_replica(tmp_path: Path) -> None:
    client = Client()
    try:
        async with nodes(configs(tmp_path, max_reads=300)) as servers:
            base = url(servers[0])
            ops = [{"table": "t", "key": f"k{i}", "op_id": f"c:{i}", "delta": i}
                   for i in range(200)]
            for _ in range(20):  # a 503 (a node still starting, on a loaded machine): again
                status, body = await client.batch(base, ops)
                assert status == 200, body
                ops = [op for op, r in zip(ops, body["results"], strict=True)
                       if r.get("status") == 503 or "error" in r]
                if not ops:
                    break
                await asyncio.sleep(0.2)
            assert not ops, ops
            calls: list[int] = []
            for link in servers[0].node.links.values():
                real = link.call

                def counting(kind: int, items: Any, *a: Any, _real: Any = real,
                             **k: Any) -> Any:
                    calls.append(kind)
                    return _real(kind, items, *a, **k)

                link.call = counting  # type: ignore[method-assign]
            reads = [{"table": "t", "key": f"k{i}"} for i in (*range(200), 999)]
            status, body = await req(client, "POST", f"{base}/v1/read",
                                     json={"reads": reads, "consistency": "all"})
            assert status == 200, body
            assert body["values"] == [*range(200), 0]
            from cluster.transport.wire import Kind
            assert calls.count(Kind.READ) == 2  # every key's set is the 3 nodes: one frame each
            status, body = await req(client, "POST", f"{base}/v1/read",
                                     json={"reads": reads * 2})
            assert status == 400 and body["error"]["code"] == "too_many_reads"
            status, body = await req(client, "POST", f"{base}/v1/read",
                                     json={"reads": [{"table": "t", "key": "a b"}]})
            assert status == 400 and "reads[0].key" in body["error"]["message"]
    finally:
        await client.close()


async def scan_all(client: Client, base: str, table: str, **params: Any
                   ) -> tuple[list[tuple[str, int]], int]:
    out: list[tuple[str, int]] = []
    after: str | None = None
    pages = 0
    while True:
        q = {**params, **({"after": after} if after else {})}
        status, body = await req(client, "GET", f"{base}/v1/counters/{table}", params=q)
        assert status == 200, body
        pages += 1
        out.extend((c["key"], c["value"]) for c in body["counters"])
        after = body["next"]
        if after is None:
            return out, pages


async def test_a_scan_returns_every_counter_once_across_pages_while_writes_go_on(
        tmp_path: Path) -> None:
    client = Client()
    try:
        async with nodes(configs(tmp_path)) as servers:
            base = url(servers[1])
            ops = [{"table": "s", "key": f"{'a' if i % 2 else 'b'}{i}", "op_id": f"c:{i}",
                    "delta": 1} for i in range(150)]
            await client.batch(base, ops)

            async def writer() -> None:  # new keys while the scan runs
                for j in range(40):
                    await client.add(url(servers[j % 3]), "s", f"new{j}", f"w:{j}", 1)
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(writer())
            got, pages = await scan_all(client, base, "s", limit="7")
            await task
            keys = [k for k, _v in got]
            assert len(keys) == len(set(keys)), "a key came back twice"
            assert {k for k in keys if not k.startswith("new")} == {o["key"] for o in ops}
            assert pages >= 150 // 7
            only_a, _ = await scan_all(client, base, "s", prefix="a", limit="1000")
            assert {k for k, _ in only_a} == {o["key"] for o in ops if o["key"][0] == "a"}
            status, body = await req(client, "GET", f"{base}/v1/counters/s",
                                     params={"after": "not-a-cursor"})
            assert status == 400 and body["error"]["code"] == "bad_cursor"
            status, body = await req(client, "GET", f"{base}/v1/counters/s",
                                     params={"limit": "0"})
            assert status == 400 and body["error"]["code"] == "bad_limit"
            status, body = await req(client, "GET", f"{base}/v1/counters/s",
                                     params={"prefx": "a"})
            assert status == 400 and body["error"]["code"] == "bad_query"
    finally:
        await client.close()


async def test_a_delete_removes_what_it_saw_is_idempotent_and_survives_restart(
        tmp_path: Path) -> None:
    cfgs = configs(tmp_path)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            b = [url(s) for s in servers]
            for i in range(6):
                await client.add(b[i % 3], "d", "k", f"c:{i}", 10)
            status, body = await req(client, "DELETE", f"{b[1]}/v1/counters/d/k",
                                     params={"op_id": "c:del"})
            assert (status, body) == (200, {"applied": True})
            status, body = await req(client, "DELETE", f"{b[2]}/v1/counters/d/k",
                                     params={"op_id": "c:del", "attempt": "2"})
            assert (status, body) == (200, {"applied": False, "duplicate": True})
            for base in b:
                assert await client.value(base, "d", "k", "quorum") == 0
            # a retry of an increment the delete removed stays a duplicate: it never comes back
            _, body = await client.add(b[0], "d", "k", "c:3", 10, attempt=2)
            assert body == {"applied": False, "duplicate": True}
            await client.add(b[2], "d", "k", "c:after", 4)
            assert await client.value(b[0], "d", "k", "all") == 4
            # the batch form, and a key deleted and never written again leaves scans
            await client.add(b[0], "d", "gone", "c:g", 1)
            _, body = await client.batch(b[0], [
                {"table": "d", "key": "gone", "op_id": "c:g-del", "op": "delete"}])
            assert body["results"] == [{"applied": True}]
            got, _ = await scan_all(client, b[0], "d")
            assert got == [("k", 4)]
            status, body = await req(client, "DELETE", f"{b[0]}/v1/counters/d/k")
            assert status == 400 and body["error"]["code"] == "bad_op_id"
            status, body = await req(client, "DELETE", f"{b[0]}/v1/counters/d/k",
                                     params={"op_id": "x:1", "attempt": "two"})
            assert status == 400 and body["error"]["code"] == "bad_attempt"
        async with nodes(cfgs) as servers:  # replayed from every node's log
            for s in servers:
                assert s.node.state.shards.value("d", "k") == 4
                assert s.node.state.shards.value("d", "gone") == 0
            status, body = await req(client, "DELETE", f"{url(servers[0])}/v1/counters/d/k",
                                     params={"op_id": "c:del", "attempt": "2"})
            assert body == {"applied": False, "duplicate": True}
    finally:
        await client.close()


async def test_a_replica_that_missed_the_delete_never_brings_the_removed_count_back(
        tmp_path: Path) -> None:
    cfgs = configs(tmp_path, antientropy_interval=0.3)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            b = [url(s) for s in servers]
            for i in range(5):
                await client.add(b[0], "r", "k", f"c:{i}", 3)
            await wait_until(lambda: _all_hold(servers, "r", "k", 15), what="15 everywhere")
            await servers[2].stop()  # n3 misses the delete and keeps its pairs of the 15
            status, body = await req(client, "DELETE", f"{b[0]}/v1/counters/r/k",
                                     params={"op_id": "c:del"})
            assert body == {"applied": True}
            await client.add(b[1], "r", "k", "c:after", 2)
            servers[2] = NodeServer(cfgs[2])
            await servers[2].start()
            await wait_until(lambda: _all_hold(servers, "r", "k", 2), timeout=20,
                             what="n3 to learn the delete by anti-entropy")
            for base in (b[0], b[1], url(servers[2])):
                assert await client.value(base, "r", "k", "all") == 2
    finally:
        await client.close()


async def _all_hold(servers: list[NodeServer], table: str, key: str, value: int) -> bool:
    return all(s.node.state.shards.value(table, key) == value for s in servers)


async def test_ttl_is_agreed_by_every_node_and_an_expired_counter_starts_again_from_0(
        tmp_path: Path) -> None:
    client = Client()
    try:
        async with nodes(configs(tmp_path, sweep_interval=0.2)) as servers:
            b = [url(s) for s in servers]
            status, body = await req(client, "PUT", f"{b[2]}/v1/tables/v", json={"ttl_s": 1})
            assert (status, body) == (200, {"table": "v", "ttl_s": 1.0})
            for base in b:
                _, body = await req(client, "GET", f"{base}/v1/tables")
                assert {"name": "v", "ttl_s": 1.0} in body["tables"]
            status, body = await req(client, "PUT", f"{b[0]}/v1/tables/v", json={"ttl_s": "1h"})
            assert status == 400 and body["error"]["code"] == "bad_ttl"
            status, body = await req(client, "PUT", f"{b[0]}/v1/tables/v", json={"ttl": 1})
            assert status == 400 and body["error"]["code"] == "bad_body"
            await client.add(b[0], "v", "k", "c:1", 7)
            await client.add(b[0], "v", "other", "c:2", 1)
            assert await client.value(b[1], "v", "k", "quorum") == 7

            async def expired() -> bool:  # both: "other" was written a moment after "k"
                return (await client.value(b[1], "v", "k", "quorum") == 0
                        and await client.value(b[1], "v", "other", "quorum") == 0)

            await wait_until(expired, timeout=10, what="the counters to expire")
            got, _ = await scan_all(client, b[0], "v")
            assert got == []
            await client.add(b[2], "v", "k", "c:3", 5)  # starts from 0, not 12
            assert await client.value(b[0], "v", "k", "all") == 5
            await wait_until(lambda: _expired_by_leaders(servers), timeout=10,
                             what="the leaders to delete 'other' by time")
    finally:
        await client.close()


async def _expired_by_leaders(servers: list[NodeServer]) -> bool:
    return sum(s.node.metrics.expired_keys for s in servers) >= 2


async def test_collected_tombstones_leave_memory_and_a_stale_replica_cannot_hide_new_writes(
        tmp_path: Path) -> None:
    cfgs = configs(tmp_path, window=1.0, max_clock_skew=0.1, tombstone_grace=1.5,
                   sweep_interval=0.2, antientropy_interval=0.3)
    client = Client()
    try:
        async with nodes(cfgs) as servers:
            b = [url(s) for s in servers]
            ring = servers[0].node.ring
            key = next(f"k{i}" for i in range(1000)
                       if ring.preference_list("g", f"k{i}")[0] == "n1")
            for i in range(4):
                await client.add(b[0], "g", key, f"c:{i}", 5)  # n1's own pair: P = 20
            await req(client, "DELETE", f"{b[0]}/v1/counters/g/{key}", params={"op_id": "c:d"})
            await wait_until(lambda: _all_hold(servers, "g", key, 0), what="the delete")
            await servers[2].stop()  # n3 keeps the tombstone: P = 20 under a floor at 20

            async def collected() -> bool:
                return all(s.node.state.shards.keys == 0 for s in servers[:2])

            await wait_until(collected, timeout=15, what="n1 and n2 to collect the tombstone")
            assert servers[0].node.metrics.collected_keys == 1
            await client.add(b[0], "g", key, "c:new", 3)  # n1 no longer holds its pair of 20
            servers[2] = NodeServer(cfgs[2])
            await servers[2].start()
            # n3's old copy meets the new write: without a pair started above it, max-merge
            # would keep 20 under the floor at 20 and the 3 would be lost, there and, through
            # anti-entropy, everywhere
            await wait_until(lambda: _all_hold(servers, "g", key, 3), timeout=20,
                             what="every replica to count the new write")
            assert await client.value(url(servers[2]), "g", key, "all") == 3
    finally:
        await client.close()


async def test_the_sdk_reads_many_scans_deletes_and_sets_a_ttl_on_real_nodes(
        tmp_path: Path) -> None:
    async with nodes(configs(tmp_path)) as servers:
        addrs = [url(s).removeprefix("http://") for s in servers]
        async with CounterClient(addrs) as c:
            for i in range(40):
                await c.incr("sdk", f"p{i}", i + 1)
            assert await c.get_many("sdk", ["p0", "p39", "none"]) == [1, 40, 0]
            listed = {k: v async for k, v in c.scan("sdk", page_size=6)}
            assert listed == {f"p{i}": i + 1 for i in range(40)}
            gone = await c.delete("sdk", "p5")
            assert gone.applied and gone.kind == "delete"
            assert await c.get("sdk", "p5") == 0
            assert "p5" not in {k async for k, _v in c.scan("sdk", prefix="p5")}
            await c.incr("sdk", "p5", 2)
            assert await c.get("sdk", "p5", consistency="all") == 2
            assert await c.set_table("sdk-ttl", ttl_s=60) == {"table": "sdk-ttl", "ttl_s": 60.0}
            assert {"name": "sdk-ttl", "ttl_s": 60.0} in await c.tables()


async def test_a_leader_without_a_copy_of_an_expired_key_does_not_revive_it(
        tmp_path: Path) -> None:
    # no sweeps and no anti-entropy: the key stays expired and undeleted on its replicas, and
    # its leader stays without a copy, as after missing its writes while down
    client = Client()
    try:
        async with nodes(configs(tmp_path, sweep_interval=3600.0,
                                 antientropy_interval=3600.0)) as servers:
            b = [url(s) for s in servers]
            await req(client, "PUT", f"{b[0]}/v1/tables/x", json={"ttl_s": 1})
            ring = servers[0].node.ring
            key = next(f"k{i}" for i in range(1000)
                       if ring.preference_list("x", f"k{i}")[0] == "n1")
            await client.add(b[0], "x", key, "c:1", 7)

            async def expired() -> bool:
                return await client.value(b[1], "x", key, "quorum") == 0

            await wait_until(expired, timeout=10, what="the counter to expire")
            assert servers[0].node.state.shards.drop("x", [key]) == 1
            _, body = await client.add(b[0], "x", key, "c:2", 5)
            assert body == {"applied": True}
            assert await client.value(b[1], "x", key, "all") == 5  # not 12
            assert all(s.node.state.shards.value("x", key) == 5 for s in servers)
    finally:
        await client.close()


async def test_a_tombstone_past_its_grace_is_not_taken_back_from_a_peer(tmp_path: Path) -> None:
    async with nodes(configs(tmp_path)) as servers:
        node = servers[0].node
        now_ms = int(node.clock() * 1000)
        grace_ms = int(node.config.tombstone_grace * 1000)
        old = CounterEntry({"n2@1": (5, 0), FLOOR + "n2@1": (5, 0), LAST: (now_ms - grace_ms, 0)})
        fresh = CounterEntry({"n2@1": (5, 0), FLOOR + "n2@1": (5, 0), LAST: (now_ms, 0)})
        assert old.collectable(now_ms, grace_ms) and not fresh.collectable(now_ms, grace_ms)
        assert not CounterEntry({"n2@1": (6, 0), FLOOR + "n2@1": (5, 0),
                                 LAST: (1, 0)}).collectable(now_ms, grace_ms)  # live
        await node.on_repair([["t", "dead", old.to_wire()], ["t", "young", fresh.to_wire()]])
        assert not node.state.shards.holds("t", "dead")  # collected here, or never needed
        assert node.state.shards.holds("t", "young")  # not past its grace: kept, merged
        node.state.shards.merge_pair("t", "held", "n3@1", 1, 0)
        await node.on_repair([["t", "held", old.to_wire()]])
        assert node.state.shards.entry("t", "held").pairs[FLOOR + "n2@1"] == (5, 0)
