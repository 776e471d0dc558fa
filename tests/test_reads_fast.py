"""Multi-get's fast path (``cluster.roles.reads``): entries compared in their wire form, merged
and repaired only where the replicas differ.

First ``wires`` against ``ShardStore.entry(...).to_wire()``, then reads through a node of three
replica stores whose peers answer READ frames with ``reads.on_read`` over msgpack and take
REPAIR frames into their stores (every frame recorded), then three real nodes in one loop."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from cluster_util import Client, inprocess_configs, inprocess_nodes, node_url, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.config import from_mapping
from cluster.core.entry import FLOOR, LAST, CounterEntry
from cluster.core.errors import PeerError, Unavailable
from cluster.core.membership import Membership
from cluster.core.metrics import NodeMetrics
from cluster.core.shards import ShardStore
from cluster.core.tables import TableSettings
from cluster.roles import reads
from cluster.roles.state import NodeState
from cluster.transport.wire import Kind

pytestmark = pytest.mark.timeout(90)


# -- wires: the store's entries, as to_wire gives them ----------------------------------------

def test_wires_are_the_entries_others_see_in_wire_form() -> None:
    s = ShardStore("n1@1")
    rng = random.Random(7)
    keys = [("t", f"k{i}") for i in range(3000)] + [("u", "k1"), ("t", "missing"),
                                                    ("nosuch", "k1")]
    for table, key in keys[:3000]:
        for origin in rng.sample(["n1@1", "n2@1", "n3@1", FLOOR + "n2@1", LAST], rng.randint(1, 4)):
            s.merge_pair(table, key, origin, rng.randint(0, 9), rng.randint(0, 3))
    s.merge_pair("u", "k1", "n2@1", 4, 1)
    s.merge_pair("t", "k0", "n1@1", 0, 0)  # a (0, 0) pair: no pair at all
    s.apply_hidden("t", "k1", 5)  # unpublished: left out, and a pair hidden whole is none
    s.apply_hidden("t", "k2", -3)
    got = s.wires(keys)
    assert got == [s.entry(table, key).to_wire() for table, key in keys]
    assert got[-2:] == [{}, {}] and got[3000] == {"n2@1": [4, 1]}
    assert all(p or n for wire in got for p, n in wire.values())
    # keys that share a page (not the first of theirs) are read at their own place in it
    assert any(found[1] > 0 for t, k in keys[:3000] if (found := s._find(t, k)) is not None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                          st.sampled_from(["n1@1", "n2@1", FLOOR + "n1@1", LAST]),
                          st.integers(0, 20), st.integers(0, 20)), max_size=30),
       st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-5, 5)), max_size=6))
def test_wires_match_entries_whatever_was_merged_and_hidden(
        merges: list[tuple[str, str, int, int]], hidden: list[tuple[str, int]]) -> None:
    s = ShardStore("n1@1")
    for key, origin, p, n in merges:
        s.merge_pair("t", key, origin, p, n)
    for key, delta in hidden:
        if delta:
            s.apply_hidden("t", key, delta)
    keys = [("t", k) for k in ("a", "b", "c", "d")]
    assert s.wires(keys) == [s.entry(t, k).to_wire() for t, k in keys]


# -- reads through a node of three replica stores ---------------------------------------------

class Peer:
    """A replica behind a link: READ answered by ``reads.on_read`` (through msgpack, as frames
    carry it), REPAIR merged into its store; every call recorded."""

    def __init__(self, node_id: str) -> None:
        self.store = ShardStore(node_id + "@1")
        self.calls: list[tuple[int, list[Any]]] = []
        self.down = False
        self.before_answer: Any = None  # called as a READ is answered (a slow replica)

    def call(self, kind: int, items: list[Any], *, probe: bool = False) -> asyncio.Future[Any]:
        items = msgpack.unpackb(msgpack.packb(items))
        self.calls.append((kind, items))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.down:
            fut.set_exception(PeerError("down"))
        elif kind == Kind.READ:
            if self.before_answer is not None:
                self.before_answer()
            replica: Any = SimpleNamespace(state=SimpleNamespace(shards=self.store))
            answer = reads.on_read(replica, items)
            fut.set_result(msgpack.unpackb(msgpack.packb(answer)))
        else:
            assert kind == Kind.REPAIR
            for table, key, wire in items:
                self.store.merge_entry(table, key, CounterEntry.from_wire(wire))
            fut.set_result(None)
        return fut

    def kinds(self) -> list[int]:
        return [kind for kind, _ in self.calls]


class ReadNode:
    """What a read needs of its node (``reads.Node``): three members n1..n3 (or four), rf 3,
    this node n1."""

    def __init__(self, tmp: Path, members: int = 3) -> None:
        names = [f"n{i + 1}" for i in range(members)]
        self.id = "n1"
        self.config = from_mapping({
            "node_id": "n1", "listen": "127.0.0.1:1", "data_dir": str(tmp), "rf": 3,
            "peers": ",".join(f"{n}=127.0.0.1:{i + 1}" for i, n in enumerate(names)),
            "quorum_timeout": 0.2})
        self.now = 1_000.0
        self.state = NodeState(self.config, clock=self.clock)
        self.ring = Membership.bootstrap([(n, "127.0.0.1", i + 1) for i, n in enumerate(names)],
                                         rf=3, vnodes=16).placement()
        self.metrics = NodeMetrics()
        self.peers = {n: Peer(n) for n in names[1:]}
        self.links: dict[str, Any] = dict(self.peers)
        self.repaired_here: list[list[Any]] = []

    @property
    def store(self) -> ShardStore:
        return self.state.shards

    def clock(self) -> float:
        return self.now

    def is_live(self, node: str) -> bool:
        return node == self.id or not self.peers[node].down

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]:
        self.repaired_here.extend(items)
        for table, key, wire in items:
            self.store.merge_entry(table, key, CounterEntry.from_wire(wire))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def stores(self) -> dict[str, ShardStore]:
        return {self.id: self.store, **{n: p.store for n, p in self.peers.items()}}

    def everywhere(self, table: str, key: str, origin: str, p: int, n: int = 0) -> None:
        for store in self.stores().values():
            store.merge_pair(table, key, origin, p, n)

    def repairs_sent(self) -> dict[str, list[Any]]:
        return {name: [item for kind, items in peer.calls if kind == Kind.REPAIR
                       for item in items] for name, peer in self.peers.items()}


def keys_of(count: int, table: str = "t") -> list[tuple[str, str]]:
    return [(table, f"k{i}") for i in range(count)]


async def test_replicas_that_agree_read_their_values_and_get_no_repair(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    for i in range(50):
        node.everywhere("t", f"k{i}", "n1@1", i + 3, 1)
        node.everywhere("t", f"k{i}", "n2@1", i, 0)
    for consistency in ("one", "quorum", "all"):
        got = await reads.read_values(node, [*keys_of(50), ("t", "none")], consistency)
        assert got == [2 * i + 2 for i in range(50)] + [0]
    assert node.metrics.repairs_out == 0 and not node.repaired_here
    assert all(Kind.REPAIR not in peer.kinds() for peer in node.peers.values())
    # one READ frame for the 51 keys, to the first peer at quorum, to both at all
    assert [len(items) for kind, items in node.peers["n2"].calls] == [51, 51]
    assert [len(items) for kind, items in node.peers["n3"].calls] == [51]


async def test_a_stale_replica_is_repaired_with_the_merge_and_only_it(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    for i in range(20):
        node.everywhere("t", f"k{i}", "n1@1", 10)
    node.store.merge_pair("t", "k7", "n1@1", 15, 0)  # n2 and n3 behind on k7 alone
    node.peers["n2"].store.merge_pair("t", "k3", "n2@1", 4, 0)  # this node and n3 behind on k3
    got = await reads.read_values(node, keys_of(20), "quorum")
    assert got == [14 if i == 3 else 15 if i == 7 else 10 for i in range(20)]
    # n2 (the quorum's other member) gets k7; this node k3; n3 was not asked
    merged3 = {"n1@1": [10, 0], "n2@1": [4, 0]}
    assert node.repairs_sent() == {"n2": [["t", "k7", {"n1@1": [15, 0]}]], "n3": []}
    assert node.repaired_here == [["t", "k3", merged3]]
    assert node.metrics.repairs_out == 2
    assert node.store.entry("t", "k3").to_wire() == merged3
    assert node.peers["n2"].store.entry("t", "k7").to_wire() == {"n1@1": [15, 0]}
    # read again: the two agree now, nothing more to repair
    assert await reads.read_values(node, keys_of(20), "quorum") == got
    assert node.metrics.repairs_out == 2
    # at all, n3 is behind on both and gets both, in one REPAIR frame
    assert await reads.read_values(node, keys_of(20), "all") == got
    assert node.repairs_sent()["n3"] == [["t", "k3", merged3], ["t", "k7", {"n1@1": [15, 0]}]]
    assert [kind for kind in node.peers["n3"].kinds() if kind == Kind.REPAIR] == [Kind.REPAIR]
    stores = node.stores()
    assert all(s.entry("t", k).to_wire() == stores["n1"].entry("t", k).to_wire()
               for s in stores.values() for _, k in keys_of(20))


async def test_replicas_each_missing_a_pair_both_get_the_merge(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    node.store.merge_pair("t", "k", "n1@1", 5, 0)
    node.peers["n2"].store.merge_pair("t", "k", "n2@1", 7, 2)
    assert await reads.read_values(node, [("t", "k")], "quorum") == [10]
    merged = {"n1@1": [5, 0], "n2@1": [7, 2]}
    assert node.repaired_here == [["t", "k", merged]]
    assert node.repairs_sent()["n2"] == [["t", "k", merged]]
    # read_entries gives the merge as an entry (a delete's look at what it removes)
    got = await reads.read_entries(node, [("t", "k"), ("t", "other")], "quorum")
    assert got == [CounterEntry({"n1@1": (5, 0), "n2@1": (7, 2)}), CounterEntry()]


async def test_one_key_behind_among_many_is_merged_alone(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    for i in range(300):
        node.everywhere("t", f"k{i}", "n1@1", i + 1)
    node.peers["n2"].store.merge_pair("t", "k150", "n1@1", 1000, 0)  # ahead on one key
    got = await reads.read_values(node, keys_of(300), "quorum")
    assert got == [1000 if i == 150 else i + 1 for i in range(300)]
    assert node.repaired_here == [["t", "k150", {"n1@1": [1000, 0]}]]
    assert node.repairs_sent()["n2"] == []


async def test_deleted_and_expired_keys_read_0(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    node.everywhere("t", "gone", "n1@1", 9, 2)
    node.everywhere("t", "kept", "n1@1", 4)
    floors = CounterEntry(node.store.entry("t", "gone").floors(now_ms=900_000))
    for store in node.stores().values():
        store.merge_entry("t", "gone", floors)  # a delete on every replica: a tombstone
    node.state.use_tables([TableSettings("tt", 5, since_ms=0)])
    for key, last_ms in (("old", 990_000), ("new", 998_000)):  # the read starts at 1,000 s
        node.everywhere("tt", key, "n1@1", 6)
        node.everywhere("tt", key, LAST, last_ms)
    want = [0, 4, 0, 6, 0]
    for consistency in ("one", "quorum", "all"):
        got = await reads.read_values(node, [("t", "gone"), ("t", "kept"), ("tt", "old"),
                                             ("tt", "new"), ("tt", "never")], consistency)
        assert got == want
    assert node.metrics.repairs_out == 0


async def test_a_key_is_judged_expired_at_the_reads_start(tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    node.state.use_tables([TableSettings("tt", 5, since_ms=0)])
    node.everywhere("tt", "k", "n1@1", 6)
    node.everywhere("tt", "k", LAST, 996_000)  # expires at 1,001 s
    node.peers["n2"].store.merge_pair("tt", "k", "n2@1", 1, 0)  # makes the read merge it

    def slow() -> None:
        node.now += 3.0  # the replica answers after the key's expiry

    node.peers["n2"].before_answer = slow
    assert await reads.read_values(node, [("tt", "k")], "quorum") == [7]
    assert await reads.read_values(node, [("tt", "k")], "quorum") == [0]  # starts at 1,003 s


async def test_too_few_answers_is_unavailable_and_a_down_peer_is_replaced(
        tmp_path: Path) -> None:
    node = ReadNode(tmp_path)
    node.everywhere("t", "k0", "n1@1", 3)
    node.peers["n2"].down = True
    assert await reads.read_values(node, keys_of(1), "quorum") == [3]  # n3 answered instead
    assert Kind.READ in node.peers["n3"].kinds()
    with pytest.raises(Unavailable):
        await reads.read_values(node, keys_of(1), "all")
    node.peers["n3"].down = True
    with pytest.raises(Unavailable):
        await reads.read_values(node, keys_of(1), "quorum")
    assert node.metrics.unavailable == 2
    assert await reads.read_values(node, keys_of(1), "one") == [3]


async def test_groups_of_other_replica_sets_and_keys_this_node_does_not_hold(
        tmp_path: Path) -> None:
    """Four members, rf 3: keys fall in several replica sets, some without this node; answers
    from peers alone are checked and merged, and repaired where they differ."""
    node = ReadNode(tmp_path, members=4)
    keys = keys_of(60)
    stores = node.stores()
    for i, (table, key) in enumerate(keys):
        for name in node.ring.preference_list(table, key):
            stores[name].merge_pair(table, key, "n1@1", i + 1, 0)
    assert not node.ring.replicates_everywhere
    assert any("n1" not in node.ring.preference_list(t, k) for t, k in keys)
    assert await reads.read_values(node, keys, "all") == [i + 1 for i in range(60)]
    assert node.metrics.repairs_out == 0
    t, k = next((t, k) for t, k in keys if "n1" not in node.ring.preference_list(t, k))
    prefs = node.ring.preference_list(t, k)
    stores[prefs[0]].merge_pair(t, k, "n9@1", 100, 0)
    got = await reads.read_values(node, keys, "all")
    assert got[keys.index((t, k))] == keys.index((t, k)) + 1 + 100
    behind = list(prefs[1:])
    assert node.metrics.repairs_out == len(behind)
    assert all(stores[n].entry(t, k) == stores[prefs[0]].entry(t, k) for n in behind)


# -- three real nodes ------------------------------------------------------------------------

async def test_a_multi_get_repairs_a_stale_replica_through_real_frames(tmp_path: Path) -> None:
    client = Client()
    try:
        cfgs = inprocess_configs(tmp_path, antientropy_interval=600.0)
        async with inprocess_nodes(cfgs) as servers:
            base = url = node_url(servers[0])
            ops = [{"table": "t", "key": f"k{i}", "op_id": f"c:{i}", "delta": i + 1}
                   for i in range(40)]
            status, body = await client.batch(base, ops)
            assert status == 200 and all(r == {"applied": True} for r in body["results"])
            shards = [s.node.state.shards for s in servers]

            async def converged() -> bool:
                return all(s.entry("t", f"k{i}") == shards[0].entry("t", f"k{i}")
                           for s in shards for i in range(40))

            await wait_until(converged, what="the writes on every replica")
            sent: list[tuple[str, int, Any]] = []
            for name, link in servers[0].node.links.items():
                real = link.call

                def recording(kind: int, items: Any, *a: Any, _real: Any = real,
                              _name: str = name, **k: Any) -> Any:
                    sent.append((_name, kind, items))
                    return _real(kind, items, *a, **k)

                link.call = recording
            reads_body = {"reads": [{"table": "t", "key": f"k{i}"} for i in range(40)],
                          "consistency": "all"}
            status, body = await client._req("POST", f"{url}/v1/read", json=reads_body)
            assert status == 200 and body["values"] == [i + 1 for i in range(40)]
            assert [kind for _, kind, _ in sent] == [Kind.READ, Kind.READ]  # no repair

            # n2 alone learns a pair of k5: n1 (this node) and n3 are behind
            shards[1].merge_pair("t", "k5", "zz@1", 100, 0)
            sent.clear()
            status, body = await client._req("POST", f"{url}/v1/read", json=reads_body)
            assert status == 200 and body["values"] == [i + 1 + (100 if i == 5 else 0)
                                                        for i in range(40)]
            repairs = [(name, items) for name, kind, items in sent if kind == Kind.REPAIR]
            assert repairs == [("n3", [["t", "k5", shards[1].entry("t", "k5").to_wire()]])]

            async def repaired() -> bool:
                return shards[0].entry("t", "k5") == shards[1].entry("t", "k5") \
                    == shards[2].entry("t", "k5")

            await wait_until(repaired, what="the read repair on n1 and n3")
    finally:
        await client.close()
