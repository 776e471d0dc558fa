"""Deletes meeting the rest of the guarantee's machinery on one node: an in-doubt op withdrawn
after a delete floored it, and a key handed off (dropped) staying dropped across a restart.

Each is a story the simulator told (``python -m cluster.sim`` seeds 1786 and 1838 with every
fault, ``--mix delete=0.1,multiget=0.05,scan=0.05 --ttl 3``), forced here on a real node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_util import inprocess_configs, inprocess_nodes, wait_until

from cluster.core.entry import floor_of
from cluster.core.ops import Item
from cluster.roles import settle, shed

pytestmark = pytest.mark.timeout(60)


def _in_doubt(node: object, key: str, op_id: str, delta: int) -> Item:
    """Apply ``delta`` at ``node`` as its leader whose quorum failed: hidden, unpublished."""
    state = node.state  # type: ignore[attr-defined]
    item = [op_id, "t", key, node.origin, 0, 0, delta, node.clock()]  # type: ignore[attr-defined]
    state.shards.apply_hidden_items([item])
    state.hold_many([item], hidden=True)
    return Item.of(item)


@pytest.mark.parametrize("floored", [True, False], ids=["delete-saw-it", "delete-did-not"])
async def test_withdrawing_an_op_a_delete_removed_does_not_remove_it_twice(
        tmp_path: Path, floored: bool) -> None:
    """The leader's first replication of an op reached a replica, its quorum did not; a delete
    read that replica and floored the op with the rest; another leader had applied the op, so
    this one withdraws its copy. The delete removed the op already: the withdrawal must leave
    the key at 0, not at minus the op. A floor below the op (the delete did not see it) is left
    alone: the compensation cancels the op above it. Both survive a restart."""
    cfgs = inprocess_configs(tmp_path)
    async with inprocess_nodes(cfgs) as servers:
        node = servers[0].node
        shards, origin = node.state.shards, node.origin
        node.state.shards.apply_local("t", "k", 2)  # an op that stands
        item = _in_doubt(node, "k", "c1:9", 5)
        assert (item.p, item.n) == (7, 0)
        seen = (7, 0) if floored else (2, 0)  # what the delete read on the replica
        shards.merge_pair("t", "k", floor_of(origin), *seen)
        await node.log.append_columns_nowait(  # what the write path and the delete logged
            2, ["c1:1", "c1:8"], "t", "k", 0, [origin, floor_of(origin)], [2, seen[0]], 0,
            node.clock())
        assert shards.value("t", "k") == 0
        await settle.withdraw(node, item)
        assert "c1:9" not in node.pending
        assert shards.pair("t", "k", origin) == (7, 5)
        assert shards.pair("t", "k", floor_of(origin)) == ((7, 5) if floored else (2, 0))
        assert shards.value("t", "k") == 0
    async with inprocess_nodes(cfgs) as servers:  # replayed: the WITHDRAW and the floor
        shards = servers[0].node.state.shards
        assert shards.pair("t", "k", origin) == (7, 5)
        assert shards.value("t", "k") == 0


async def test_a_floor_only_a_replica_holds_is_raised_too(tmp_path: Path) -> None:
    """The delete's floor may not have reached the withdrawing leader yet: the replicas'
    entries its settling read (``seen``) count as much as its own."""
    from cluster.core.entry import CounterEntry

    async with inprocess_nodes(inprocess_configs(tmp_path)) as servers:
        node = servers[0].node
        item = _in_doubt(node, "k", "c1:9", 3)
        replica = CounterEntry({node.origin: (3, 0), floor_of(node.origin): (3, 0)})
        await settle.withdraw(node, item, [replica])
        shards = node.state.shards
        assert shards.pair("t", "k", floor_of(node.origin)) == (3, 3)
        assert shards.value("t", "k") == 0


async def test_a_key_handed_off_stays_dropped_across_a_restart(tmp_path: Path) -> None:
    """A node that no longer replicates a key hands it off and drops it; a restart must not
    bring the stale copy back from the log, or the next pass would hand it off again, maybe
    after the key's replicas deleted it and collected its tombstone: a resurrection."""
    cfgs = inprocess_configs(tmp_path)
    async with inprocess_nodes(cfgs) as servers:
        node = servers[0].node
        for key in ("gone", "kept"):
            node.state.shards.apply_local("t", key, 4)
        await node.log.append_columns_nowait(  # the pairs durable, as the write path has them
            2, ["a", "b"], "t", ["gone", "kept"], 4, node.origin, 4, 0, node.clock())
        assert shed.drop_logged(node, "t", ["gone"]) == 1
        assert not node.state.shards.holds("t", "gone")
    async with inprocess_nodes(cfgs) as servers:
        shards = servers[0].node.state.shards
        assert shards.holds("t", "kept") and shards.value("t", "kept") == 4
        assert not shards.holds("t", "gone")


async def test_since_when_keys_wait_for_their_hand_off_survives_a_restart(
        tmp_path: Path) -> None:
    """Keys a node no longer replicates miss every delete made since the move that took them
    away: past ``hand_off_limit`` they are dropped, not handed off. The clock of that wait
    must not start again when the node restarts (the simulator's seed 1781: a hand-off 87 s
    after the move, its count resurrected)."""
    cfgs = inprocess_configs(tmp_path)
    async with inprocess_nodes(cfgs) as servers:
        node = servers[0].node
        since = node.clock() - 30.0
        shed._left_behind(node, since)
        await servers[0].snapshot()  # once in the snapshot, once in the log
        shed._left_behind(node, since - 1.0)
    async with inprocess_nodes(cfgs) as servers:
        node = servers[0].node
        assert node.state.foreign_since == since - 1.0
        shed._left_behind(node, None)  # a pass left nothing behind (logged lazily: a stop
        # writes it)
    async with inprocess_nodes(cfgs) as servers:
        assert servers[0].node.state.foreign_since is None
    assert shed.hand_off_limit(servers[0].node) < servers[0].node.config.tombstone_grace


async def test_the_raised_floor_is_logged_before_the_withdrawal(tmp_path: Path) -> None:
    """The two records are two frames: a crash mid-write may keep a prefix of them. Kept, a
    WITHDRAW without its floor would replay the compensation alone (the simulator's seed 3036:
    a delete's count taken twice after a torn write); a floor without its WITHDRAW is safe (the
    op is settled again, and the floor already covers the compensation)."""
    from cluster.wal import RecordKind

    async with inprocess_nodes(inprocess_configs(tmp_path)) as servers:
        node = servers[0].node
        item = _in_doubt(node, "k", "c1:9", 5)
        node.state.shards.merge_pair("t", "k", floor_of(node.origin), 5, 0)
        logged: list[list[Any]] = []
        append = node.log.append_nowait

        def spy(recs: list[Any]) -> Any:
            logged.append(list(recs))
            return append(recs)

        node.log.append_nowait = spy
        await settle.withdraw(node, item)
        assert [[r.kind for r in recs] for recs in logged] == [
            [RecordKind.REPLICA, RecordKind.WITHDRAW]]
        assert logged[0][0].origin == floor_of(node.origin)


async def test_a_withdrawal_reaching_replicas_that_collected_the_key_reads_0_there(
        tmp_path: Path) -> None:
    """An op in doubt for longer than the grace: its key was deleted, and its replicas
    collected the tombstone. The withdrawal's compensation goes out with the floor it lies on
    and the key's last change, so a replica taking the key back reads 0 (the simulator's seed
    4287: two replicas read the op's whole pair, 10, where the others read 0)."""
    from cluster.core.entry import LAST

    async with inprocess_nodes(inprocess_configs(tmp_path)) as servers:
        node = servers[0].node
        shards = node.state.shards
        shards.merge_pair("t", "k", node.origin, 10, 0)  # deleted: under the floor
        shards.merge_pair("t", "k", floor_of(node.origin), 10, 0)
        shards.merge_pair("t", "k", LAST, int((node.clock() - 7200) * 1000), 0)
        item = _in_doubt(node, "k", "c1:9", 3)  # beyond the floor: the delete did not see it
        await settle.withdraw(node, item)
        assert shards.value("t", "k") == 0
        others = [s.node for s in servers[1:]]

        async def taken() -> bool:
            return all(o.state.shards.holds("t", "k") for o in others)

        await wait_until(taken, timeout=10, what="the replicas to take the compensation")
        for o in others:
            assert o.state.shards.value("t", "k") == 0
            assert o.state.shards.pair("t", "k", floor_of(node.origin)) == (10, 0)


def test_a_claimed_ops_floor_item_is_not_refused_with_its_origin() -> None:
    """A replica refuses a copy of an op claimed for another node than its origin's (the
    leader that was cut off). A leader's pair started again at its mark comes with a floor
    item of origin "~n5@2" and the op's own id: taken for another node's copy ("~n5" is not
    "n5"), it was refused while the pair above it was merged, and the replica read the
    restarted pair above its old floor (the simulator's seed 5043: -4)."""
    from types import SimpleNamespace

    from cluster.roles.replica import Replica

    claims = SimpleNamespace(fence=lambda op_id: "n5", forgot_before=0.0,
                             amnesiac=lambda: False)
    replica = SimpleNamespace(claims=claims, metrics=SimpleNamespace(fenced=0))
    floor = ["c3:22", "e", "k7", "~n5@2", 5, 5, 0, 1.0]
    op = ["c3:22", "e", "k7", "n5@2", 6, 5, 1, 1.0]
    assert Replica._fenced(replica, [floor, op]) is None  # type: ignore[arg-type]
    other = ["c3:22", "e", "k7", "n4@1", 1, 0, 1, 1.0]  # another leader's copy: refused
    assert Replica._fenced(replica, [floor, other]) == [True, False]  # type: ignore[arg-type]
