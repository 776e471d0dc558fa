"""The due index (``cluster.core.due``) and the sweep it drives (``cluster.roles.expiry``): a
key comes out when due and not before, a key written again is not expired at its old time, a
pass looks only at the keys that are due, and an expired key is deleted by its leader and then
collected. The sweep runs here against one node's real state and store, with its clock in the
test's hands and the quorum delete replaced by its local effect (the floors merged through
``merge_pair``, as ``cluster.roles.deletes`` merges them); tests/test_deletes.py runs the same
path on three real nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from cluster.core.config import NodeConfig
from cluster.core.due import DueIndex
from cluster.core.entry import FLOOR, LAST
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import Op
from cluster.core.tables import TableSettings
from cluster.roles import deletes, expiry
from cluster.roles.state import NodeState

S = 1000  # ms

# -- the index alone --------------------------------------------------------------------------


def test_a_key_comes_out_once_its_bucket_has_ended_and_not_before() -> None:
    due = DueIndex(res_ms=1000)
    due.add("t", "k", 10_500)
    assert due.take(10_999, 100) == []  # its bucket [10 s, 11 s) has not ended
    assert not due.ready(10_999) and due.ready(11_000)
    assert due.take(11_000, 100) == [("t", ["k"])]
    assert due.take(20_000, 100) == [] and len(due) == 0


def test_keys_come_out_in_time_order_each_once_within_the_limit() -> None:
    due = DueIndex(res_ms=1000)
    for i in range(10):
        due.add("t", f"a{i}", 5_000)
    due.add("t", "a3", 5_100)  # a copy in the same bucket: looked at once
    due.add("t", "late", 9_000)
    first = due.take(6_000, 4)
    assert [len(keys) for _t, keys in first] == [4] and due.cursor == 5
    due.configure({}, 1_000)
    before = len(due)
    due.raised("t", "a9", 4_000, 4_500)  # its entry may be in the caller's hands: indexed
    assert len(due) == before + 1 and due.keys_at("t", 5_500).count("a9") == 2
    rest = due.take(6_000, 100)
    got = first[0][1] + rest[0][1]
    assert sorted(got) == sorted(f"a{i}" for i in range(10))
    assert due.cursor == 5
    assert due.take(9_999, 100) == [] and due.take(10_000, 100) == [("t", ["late"])]


def test_an_entry_for_a_time_already_passed_comes_out_at_the_next_take() -> None:
    due = DueIndex(res_ms=1000)
    due.take(50_000, 10)
    assert due.cursor == 49
    due.add("t", "old", 1_000)
    assert due.take(50_000, 10) == [("t", ["old"])]


def test_a_raise_leaves_a_waiting_entry_alone_and_indexes_a_key_with_none() -> None:
    due = DueIndex(res_ms=1000)
    due.configure({"t": (30 * S, 0)}, 60 * S)
    due.raised("t", "k", 0, 10 * S)  # new: at 40 s
    due.raised("t", "k", 10 * S, 12 * S)  # its entry at 40 s still waits: no second one
    assert len(due) == 1 and due.keys_at("t", 40 * S) == ["k"]
    due.raised("u", "d", 0, 10 * S)  # a table without a ttl: the grace
    assert due.keys_at("u", 70 * S) == ["d"]
    assert due.take(41 * S, 10) == [("t", ["k"])]  # taken: in the sweep's hands, which
    due.raised("t", "k", 12 * S, 44 * S)  # will find this change (its time, 42 s, is ahead)
    assert len(due) == 1
    due.take(43 * S, 10)
    due.raised("t", "k", 12 * S, 45 * S)  # 42 s has passed: no entry waits, indexed again
    assert due.keys_at("t", 75 * S) == ["k"]
    due.raised("t", "k", -1, 46 * S)  # former one not known: indexed (a copy, at worst)
    assert len(due) == 3


def test_nothing_is_indexed_before_the_delays_are_set_and_a_changed_table_is_walked_again(
        ) -> None:
    due = DueIndex()
    due.raised("t", "k", 0, 10 * S)
    assert len(due) == 0 and due.build_all
    due.configure({"t": (30 * S, 0)}, 60 * S)
    due.raised("t", "k", 0, 10 * S)
    due.raised("u", "k", 0, 10 * S)
    assert due.configure({"t": (30 * S, 0)}, 60 * S) == []
    assert due.configure({"t": (20 * S, 5)}, 60 * S) == ["t"]  # its entries are dropped
    assert len(due) == 1 and due.building == {"t": 0}
    assert due.configure({"t": (20 * S, 5)}, 61 * S) == [] and due.build_all and len(due) == 0


def test_an_entry_costs_its_names_bytes() -> None:
    due = DueIndex()
    for i in range(1000):
        due.add("t", f"key-{i:06d}", 7 * S)
    assert due.nbytes() == 1000 * (len("key-000000") + 1)


# -- the sweep on one node's state --------------------------------------------------------------


class Ring:
    def __init__(self, node: FakeNode) -> None:
        self.node = node

    def leader(self, table: str, key: str, is_live: Any) -> str:
        return "n1" if self.node.leads else "n2"


class FakeNode:
    """What ``Sweeper`` uses of a node: its state, config, clock, ring and metrics."""

    def __init__(self, tmp_path: Path, *, leads: bool = True, grace: float = 30.0) -> None:
        self.config = NodeConfig(node_id="n1", data_dir=str(tmp_path), listen=("127.0.0.1", 1),
                                 peers=(("n1", "127.0.0.1", 1),), tombstone_grace=grace)
        self.now = 1_000_000.0
        self.state = NodeState(self.config, clock=lambda: self.now)
        self.state.set_origin("n1@1")
        self.state.use_tables([TableSettings("t", ttl_s=30.0)])
        self.id = "n1"
        self.ready = True
        self.leads = leads
        self.ring = Ring(self)
        self.metrics = NodeMetrics()
        self.deletes: list[str] = []

    def clock(self) -> float:
        return self.now

    def is_live(self, node: str) -> bool:
        return True

    def save_collected(self, table: str, high: int) -> None:
        self.state.collected[table] = max(high, self.state.collected.get(table, 0))

    def write(self, key: str, table: str = "t") -> None:
        """An add applied here, as a replica merges one: its pair, then ``touch``."""
        p, _n = self.state.shards.pair(table, key, "n2@1")
        item = [f"op:{key}:{p + 1}", table, key, "n2@1", p + 1, 0, 1, self.now]
        self.state.shards.merge_items([item])
        self.state.touch([item])

    def deleted_by_leader(self, key: str, table: str = "t") -> None:
        """A delete's REPLICATE items arriving from its leader (``merge_items``, ``touch``)."""
        entry = self.state.shards.entry(table, key)
        items = [["~d", table, key, origin, p, n, 0, self.now]
                 for origin, (p, n) in entry.floors(int(self.now * 1000)).items()]
        self.state.shards.merge_items(items)
        self.state.touch(items)


@pytest.fixture
def local_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lead_deletes`` by time without the quorum: each op whose key is expired here gets its
    floors merged through ``merge_pair`` (what the leader's part of the real one does)."""

    async def lead_deletes(node: Any, ops: list[Op], *, only_expired: bool = False
                           ) -> list[int]:
        out = []
        now = node.clock()
        for op in ops:
            shards = node.state.shards
            entry = shards.entry(op.table, op.key)
            if not (entry.live() and node.state.expired(op.table, entry, now)):
                out.append(int(deletes.Status.DUPLICATE))
                continue
            node.deletes.append(op.op_id)
            for origin, (p, n) in entry.floors(int(now * 1000)).items():
                shards.merge_pair(op.table, op.key, origin, p, n)
            out.append(deletes.APPLIED)
        return out

    monkeypatch.setattr(deletes, "lead_deletes", lead_deletes)


async def _pass(node: FakeNode, sweeper: expiry.Sweeper) -> tuple[int, int, int]:
    """One pass: (expired, collected, due keys looked at)."""
    before = sweeper.visited
    expired, collected = await sweeper.sweep(cast(Any, node))  # what the sweep uses of one
    return expired, collected, sweeper.visited - before


@pytest.mark.usefixtures("local_deletes")
async def test_a_pass_looks_only_at_the_keys_that_are_due(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    sweeper = expiry.Sweeper(net_keys=0)
    assert await _pass(node, sweeper) == (0, 0, 0)  # indexes the (empty) store
    for i in range(1000):
        node.write(f"old{i}")
    node.now += 20
    for i in range(3000):
        node.write(f"new{i}")
    node.now += 11  # the old keys' ttl has passed, not the new ones'
    assert await _pass(node, sweeper) == (1000, 0, 1000)
    assert node.deletes[0] == f"~expire:old0:{int((node.now - 31) * 1000)}"
    assert await _pass(node, sweeper) == (0, 0, 0)  # nothing more is due
    node.now += 20
    assert await _pass(node, sweeper) == (3000, 0, 3000)
    assert sweeper.walked == 0  # the writes fed the index; no walk over the store


@pytest.mark.usefixtures("local_deletes")
async def test_a_key_written_again_is_not_expired_at_its_old_time(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    sweeper = expiry.Sweeper(net_keys=0)
    await _pass(node, sweeper)
    node.write("k")
    node.write("quiet")
    node.now += 20
    node.write("k")  # its index entry still waits at the first write's time: no new one
    assert len(node.state.shards.due) == 2
    node.now += 11
    assert await _pass(node, sweeper) == (1, 0, 2)  # 'quiet' expired; 'k' put back
    assert len(node.deletes) == 1 and node.deletes[0].startswith("~expire:quiet:")
    assert node.state.shards.entry("t", "k").value() == 2
    node.now += 18
    assert await _pass(node, sweeper) == (0, 0, 0)
    node.now += 2  # 31 s after its second write
    expired, _collected, looked = await _pass(node, sweeper)
    assert (expired, looked) == (1, 1)
    assert node.deletes[-1].startswith("~expire:k:")


@pytest.mark.usefixtures("local_deletes")
async def test_an_expired_key_is_deleted_by_its_leader_then_collected_after_the_grace(
        tmp_path: Path) -> None:
    node = FakeNode(tmp_path, grace=30.0)
    sweeper = expiry.Sweeper(net_keys=0)
    await _pass(node, sweeper)
    node.write("k")
    node.now += 31
    assert await _pass(node, sweeper) == (1, 0, 1)
    shards = node.state.shards
    assert shards.holds("t", "k") and not shards.entry("t", "k").live()
    node.now += 29  # the tombstone's grace has not passed
    assert await _pass(node, sweeper) == (0, 0, 0)
    node.now += 2
    assert await _pass(node, sweeper) == (0, 1, 1)
    assert not shards.holds("t", "k") and shards.keys == 0
    assert node.metrics.collected_keys == 1 and node.metrics.expired_keys == 1
    assert len(shards.due) == 0


@pytest.mark.usefixtures("local_deletes")
async def test_a_replica_leaves_the_expiry_to_the_leader_and_collects_its_delete(
        tmp_path: Path) -> None:
    node = FakeNode(tmp_path, leads=False)
    sweeper = expiry.Sweeper(net_keys=0, retry_s=10.0)
    await _pass(node, sweeper)
    node.write("k")
    node.now += 31
    assert await _pass(node, sweeper) == (0, 0, 1)  # not its to expire: looked at again later
    node.now += 1
    node.deleted_by_leader("k")  # the leader's delete arrives (merge_items, then touch)
    node.now += 10
    assert await _pass(node, sweeper) == (0, 0, 1)  # the retry finds it deleted: put back
    node.now += 19
    assert await _pass(node, sweeper) == (0, 0, 0)
    node.now += 2
    assert await _pass(node, sweeper) == (0, 1, 1)
    assert not node.state.shards.holds("t", "k") and node.deletes == []


async def test_a_tombstone_with_an_op_in_doubt_is_kept_until_it_is_settled(
        tmp_path: Path) -> None:
    node = FakeNode(tmp_path, leads=False)
    node.state.use_tables([])  # a table without a ttl: its tombstones come due by the grace
    sweeper = expiry.Sweeper(net_keys=0, retry_s=10.0)
    await _pass(node, sweeper)
    node.write("k", table="plain")
    node.deleted_by_leader("k", table="plain")
    node.state.shards.hide("plain", "k", "n1@1", 1)  # an op of this node in doubt on it
    node.now += 31
    assert await _pass(node, sweeper) == (0, 0, 1)
    assert node.state.shards.holds("plain", "k")
    node.state.shards.unhide("plain", "k", "n1@1", 1)
    node.now += 10
    assert await _pass(node, sweeper) == (0, 1, 1)


@pytest.mark.usefixtures("local_deletes")
async def test_a_store_loaded_in_bulk_is_indexed_by_a_walk(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    shards = node.state.shards
    t0 = int(node.now * 1000)
    with shards.loading():  # a log replay: the index hears of nothing meanwhile
        for i in range(500):
            shards.merge_pair("t", f"k{i}", "n2@1", 1, 0)
            shards.merge_pair("t", f"k{i}", LAST, t0 - (40 if i % 2 else 0) * S, 0)
        shards.merge_pair("plain", "gone", "n2@1", 1, 0)
        shards.merge_pair("plain", "gone", FLOOR + "n2@1", 1, 0)
        shards.merge_pair("plain", "gone", LAST, t0 - 40 * S, 0)
    assert len(shards.due) == 0
    sweeper = expiry.Sweeper(net_keys=0)
    assert await _pass(node, sweeper) == (250, 1, 251)  # the overdue ones, at once
    assert sweeper.walked == 501
    node.now += 31
    assert (await _pass(node, sweeper))[0] == 250


@pytest.mark.usefixtures("local_deletes")
async def test_the_safety_net_finds_a_key_the_index_lost(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    sweeper = expiry.Sweeper(net_keys=100)
    await _pass(node, sweeper)
    node.write("k")
    node.state.shards.due.purge("t")  # as if a change had reached the store unheard
    node.now += 31
    assert (await _pass(node, sweeper))[0] == 1
