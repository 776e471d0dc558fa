"""RF 5, W 3: a replica never shows a copy that is not on a quorum (docs/node.md, "What is
visible when"). Five nodes in one event loop, faults forced by the peer transport's hook
(``PeerLink.fault``), as in ``test_fault_inprocess``.

The case: leader L1 applies op X while cut off from all but one replica R, whose copy it gets;
X's quorum fails. The client's retry goes to L2, whose check claims X on a majority that leaves
R out (L2's HOLDS to R is lost), and applies it; L2's copy reaches R too. Before the copies
were staged (kept hidden until their leader knew its quorum), R showed both: a read at ``one``
on R returned twice the attempted sum until L1's withdrawal reached it. Here no read at any
consistency, and no node's visible state, exceeds the attempted sum; after healing every
replica counts X once. Variants: R restarts with the staged copy in its log, or in a snapshot;
W 4.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cluster_util import Client
from test_fault_inprocess import Watch, acked, converged, sees_down, until

from cluster.core.config import NodeConfig, from_mapping
from cluster.local import free_ports
from cluster.server import NodeServer
from cluster.transport.wire import Kind

pytestmark = pytest.mark.timeout(90)

NAMES = ("n1", "n2", "n3", "n4", "n5")
# the kinds that carry a leader's copy of a new op (STAGE, where the node has it)
COPIES = {int(Kind.REPLICATE)} | ({int(Kind["STAGE"])} if "STAGE" in Kind.__members__ else set())


def configs(tmp: Path, **extra: object) -> list[NodeConfig]:
    ports = free_ports(len(NAMES))
    peers = ",".join(f"{n}=127.0.0.1:{p}" for n, p in zip(NAMES, ports, strict=True))
    base = {"fsync": False, "quorum_timeout": 1.0, "heartbeat_interval": 0.05,
            "failure_timeout": 0.6, "reconcile_timeout": 3.0, "antientropy_interval": 0.5,
            "rf": 5, "write_quorum": 3, **extra}
    return [from_mapping({"node_id": n, "listen": f"127.0.0.1:{p}", "peers": peers,
                          "data_dir": str(tmp / n), **base})
            for n, p in zip(NAMES, ports, strict=True)]


class Cluster5:
    """The subset of ``test_fault_inprocess.Cluster`` that ``Watch`` and its helpers use,
    for five nodes, with a fault hook that can let some kinds through."""

    def __init__(self, cfgs: list[NodeConfig]) -> None:
        self.cfgs = cfgs
        self.servers: dict[str, NodeServer] = {}

    async def start(self, name: str) -> NodeServer:
        cfg = next(c for c in self.cfgs if c.node_id == name)
        server = self.servers[name] = NodeServer(cfg)
        await server.start()
        return server

    def crash(self, name: str) -> None:
        self.servers.pop(name).abort()

    def url(self, name: str) -> str:
        addr = self.servers[name].address
        assert addr is not None
        return f"http://{addr[0]}:{addr[1]}"

    def drop(self, src: str, dst: str, kinds: set[int] | None = None,
             allow: set[int] | None = None) -> None:
        """Drop the calls of ``kinds`` (every kind but ``allow`` when None) from src to dst."""
        def fault(kind: int, _items: Any) -> bool:
            if kinds is not None:
                return kind in kinds
            return allow is None or kind not in allow

        self.servers[src].node.links[dst].fault = fault

    def heal(self) -> None:
        for s in self.servers.values():
            for link in s.node.links.values():
                link.fault = None


@contextlib.asynccontextmanager
async def cluster5(tmp: Path, **extra: object) -> AsyncIterator[Cluster5]:
    c = Cluster5(configs(tmp, **extra))
    try:
        await asyncio.gather(*(c.start(n) for n in NAMES))
        yield c
    finally:
        for s in list(c.servers.values()):
            with contextlib.suppress(Exception):
                await s.stop()


def key_led_by(c: Cluster5, first: str, second: str) -> tuple[str, tuple[str, ...]]:
    ring = c.servers[first].node.ring
    for i in range(10_000):
        prefs = tuple(ring.preference_list("t", f"k{i}"))
        if prefs[:2] == (first, second):
            return f"k{i}", prefs
    raise AssertionError("no such key")


async def _settled(c: Cluster5) -> bool:
    return not any(s.node.pending for s in c.servers.values())


@pytest.mark.parametrize("restart, w", [("none", 3), ("log", 3), ("snapshot", 3), ("none", 4)])
async def test_a_replica_outside_the_claiming_majority_never_shows_a_cut_off_copy(
        tmp_path: Path, restart: str, w: int) -> None:
    client = Client()
    try:
        async with cluster5(tmp_path, write_quorum=w) as c:
            key, prefs = key_led_by(c, "n1", "n2")
            r = prefs[4]  # R: the replica L2's check leaves out
            majority = list(prefs[1:4])  # n2 and two others: the claims
            watch = Watch(c, client, key)  # type: ignore[arg-type]  # a Cluster5 will do
            reader = asyncio.ensure_future(watch.run())
            # L1 = n1 is cut off from everyone, except that its copies still reach R; it leads
            # before it sees the cut (it would then know it hears no majority and lead nothing)
            c.servers["n1"].node.in_minority = lambda count=1: False  # type: ignore[method-assign]
            for other in NAMES[1:]:
                c.drop(other, "n1")
                c.drop("n1", other, allow=COPIES if other == r else None)
            watch.bound += 5
            status, _ = await client.add(c.url("n1"), "t", key, "x:1", 5)
            assert status == 503  # 2 copies of 3: in doubt at n1
            assert "x:1" in c.servers["n1"].node.pending
            async def r_has_it() -> bool:  # R has n1's copy (its frame may still be on the way)
                return b"x:1" in c.servers[r].node.state.dedup("t")

            await until(r_has_it, 5.0, "n1's staged copy at R")
            assert await client.value(c.url(r), "t", key, "one") <= watch.bound
            if restart != "none":
                if restart == "snapshot":
                    await c.servers[r].snapshot()
                c.crash(r)
                await c.start(r)
                c.drop(r, "n1")  # R's new links: n1 stays cut off from it
                assert await client.value(c.url(r), "t", key, "one") <= watch.bound
                # a copy of an op applied before its restart is refused for a while (the claims
                # it may have given are forgotten): let n2's copy be younger than that
                await asyncio.sleep(1.2)
            # the retry: L2 = n2 checks on a majority that leaves R out, and applies
            await sees_down(c, "n2", "n1")
            c.drop("n2", r, {int(Kind.HOLDS)})
            status, body = await client.add(c.url("n2"), "t", key, "x:1", 5, attempt=2)
            assert (status, body) == (200, {"applied": True}), majority
            # n2's copy reaches R too; R must still count x:1 once
            await until(lambda: _has(c, r, key, 5), 5.0, "n2's copy at R")
            for consistency in ("one", "quorum", "all"):  # "all" answers 503 while n1 is cut
                status, body = await client.get(
                    f"{c.url(r)}/v1/counters/t/{key}?consistency={consistency}")
                assert status == 503 or body["value"] <= 5, (consistency, body)
            await asyncio.sleep(0.3)  # reads on every node meanwhile (the watch)
            c.heal()
            watch.bound += 1
            await acked(client, c, ["n1"], key, "x:2", 1)  # n1's key waits for its settle
            await until(lambda: _settled(c), 15.0, "n1 to settle x:1")
            await converged(c, client, key, 6, timeout=15.0)
            watch.stop()
            await reader
            assert watch.reads > 50
            assert watch.over == [], watch.over[:10]
            assert c.servers["n1"].node.metrics.withdrawn == 1
            await until(lambda: _unstaged(c), 10.0, "no staged copy left hidden")
            for n in NAMES:  # every copy answers duplicate, nothing counts again
                assert (await client.add(c.url(n), "t", key, "x:1", 5, attempt=3))[1] == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 6)
    finally:
        await client.close()


async def _has(c: Cluster5, name: str, key: str, value: int) -> bool:
    return c.servers[name].node.state.shards.value("t", key) >= value


async def _unstaged(c: Cluster5) -> bool:
    return not any(getattr(s.node.state.shards, "_staged", None) for s in c.servers.values())


async def test_rf5_writes_take_two_rounds_and_read_back_at_quorum(tmp_path: Path) -> None:
    """With W 3 every acknowledged op is visible on W replicas when acknowledged (its
    publication acked): a quorum read right after the ack counts it, on every node."""
    client = Client()
    try:
        async with cluster5(tmp_path) as c:
            total = 0
            for i in range(20):
                key = f"q{i % 4}"
                status, _ = await client.add(c.url(NAMES[i % 5]), "t", key, f"w:{i}", i + 1)
                assert status == 200
                total += i + 1
                for n in NAMES:
                    got = sum([await client.value(c.url(n), "t", f"q{j}", "quorum")
                               for j in range(4)])
                    assert got == total, (n, got, total)
            assert not any(s.node.state.staged for s in c.servers.values()
                           if hasattr(s.node.state, "staged"))
    finally:
        await client.close()


async def test_a_peer_that_does_not_know_stage_refuses_it_cleanly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node of a version before STAGE answers it as any unknown kind: an ERROR reply on a
    link that stays up (simulated here: four nodes answer STAGE as they did). The copy counts
    nowhere: the op is in doubt at its leader (503) and visible nowhere; once the peers know
    the kind, the leader settles it and writes go on."""
    from cluster.roles.member import Node

    old: set[str] = set(NAMES[1:])
    handle = Node.handle_peer

    def older(self: Node, peer_id: str, kind: int, body: Any) -> Any:
        if self.id in old and kind == Kind.STAGE:
            raise ValueError(f"unknown peer frame kind {kind}")
        return handle(self, peer_id, kind, body)

    monkeypatch.setattr(Node, "handle_peer", older)
    client = Client()
    try:
        async with cluster5(tmp_path) as c:
            key, _prefs = key_led_by(c, "n1", "n2")
            status, _ = await client.add(c.url("n1"), "t", key, "y:1", 3)
            assert status == 503
            assert "y:1" in c.servers["n1"].node.pending
            for n in NAMES:
                assert await client.value(c.url(n), "t", key, "one") == 0
            assert all(link.connected for link in c.servers["n1"].node.links.values())
            old.clear()  # upgraded: the op is settled (published: nobody else applied it)
            await until(lambda: _settled(c), 15.0, "n1 to settle y:1")
            status, _ = await client.add(c.url("n1"), "t", key, "y:2", 1)
            assert status == 200
            await converged(c, client, key, 4)  # type: ignore[arg-type]  # a Cluster5 will do
    finally:
        await client.close()


def test_staged_pairs_stay_hidden_in_hashes_snapshots_and_merges() -> None:
    """``ShardStore.stage``: the visible pair (entry, value, the key's digest hash) does not
    move; a visible pair of the origin raises it (never above what it carries); the leader's
    own hidden deltas are untouched; a snapshot keeps the staged part hidden."""
    from cluster.core.shards import ShardStore

    s = ShardStore("n2@1")
    s.merge_pair("t", "k", "n1@1", 9, 2)
    s.apply_hidden("t", "k", 4)  # n2's own op, unpublished
    before = s.visible_hash("t", "k")
    assert s.stage("t", "k", "n1@1", 10, 2) and s.stage("t", "k", "n1@1", 12, 2)
    assert s.value("t", "k") == 7 and s.visible_hash("t", "k") == before
    assert s.pair("t", "k", "n1@1") == (9, 2)
    assert s.pair("t", "k", "n1@1", visible=False) == (12, 2)
    loaded = ShardStore.from_bytes(s.to_bytes(), "n2@2")
    assert loaded.pair("t", "k", "n1@1") == (9, 2) and loaded.has_staged()
    s.merge_visible_items([["a", "t", "k", "n1@1", 10, 3, 1, 0.0]])  # one published, one
    assert s.pair("t", "k", "n1@1") == (10, 3) and s.value("t", "k") == 7  # withdrawn
    assert s.has_staged() and s.pair("t", "k", "n1@1", visible=False) == (12, 3)
    s.merge_pair("t", "k", "n1@1", 12, 3)  # the last one published
    assert not s.has_staged() and s.value("t", "k") == 9
    s.unhide("t", "k", "n2@1", 4)
    assert s.value("t", "k") == 13
    fresh = ShardStore("n9@1")  # the digests moved as a store built whole would have them
    fresh.merge_pair("t", "k", "n1@1", 12, 3)
    fresh.merge_pair("t", "k", "n2@1", 4, 0)
    s.flush_digests()
    fresh.flush_digests()
    assert fresh.visible_hash("t", "k") == s.visible_hash("t", "k")
    assert fresh.digests.checksums() == s.digests.checksums()


@pytest.mark.parametrize("published", [False, True])
def test_a_snapshot_cut_before_a_staged_copy_keeps_it_hidden_after_replay(
        tmp_path: Path, published: bool) -> None:
    """A snapshot's pages are encoded after its cut, in steps; its staged copies' visible pairs
    are taken once every page is. A copy staged between a page's encoding and that moment (its
    STAGED record in the log after the cut) stays hidden after loading and replaying the log;
    one published meanwhile too (its REPLICA record) is visible."""
    from cluster.roles.state import NodeState

    cfg = configs(tmp_path)[1]
    state = NodeState(cfg)
    state.set_origin("n2@1")
    state.shards.merge_pair("t", "k", "n1@1", 5, 0)
    cut = state.snapshot_cut()
    chunks = [next(cut._chunks)]  # every page encoded: "k" at 5
    staged = ["y:1", "t", "k", "n1@1", 6, 0, 1, 1.0]
    state.stage_items([staged])  # its STAGED record: after the cut
    if published:
        state.shards.merge_visible_items([staged])  # its REPLICA record: after the cut
    chunks += list(cut._chunks)  # the tail: the staged copies as they are now
    loaded = NodeState(cfg)
    loaded.set_origin("n2@2")
    loaded.load_blob(b"".join(cut._parts(chunks)))
    loaded.replay(*staged[:6], staged[7], staged[6], staged=True)  # the log after the cut
    if published:
        loaded.replay(*staged[:6], staged[7])
    loaded.shards.flush_digests()
    assert loaded.shards.value("t", "k") == (6 if published else 5)
    assert loaded.shards.pair("t", "k", "n1@1", visible=False) == (6, 0)


def test_a_key_handed_off_goes_with_another_leaders_staged_copy_not_with_an_own_op() -> None:
    """A member that no longer replicates a key drops it once its replicas took it
    (``ShardStore.drop``): another leader's staged copy there is that leader's to publish on
    the key's replicas, and kept it the key forever (the simulator's seed 1009: a copy staged
    during a move, its publication lost); a delta of this node's own op in doubt keeps it."""
    from cluster.core.shards import ShardStore

    s = ShardStore("n2@1")
    s.merge_pair("t", "a", "n1@1", 3, 0)
    assert s.stage("t", "a", "n1@1", 5, 0)
    s.merge_pair("t", "b", "n1@1", 3, 0)
    s.apply_hidden("t", "b", 4)  # n2's own op, unpublished
    assert s.stage("t", "b", "n1@1", 5, 0)
    assert s.drop("t", ["a", "b"]) == 1
    assert not s.holds("t", "a") and s.holds("t", "b")
    assert not s.has_hidden("t", "a")
