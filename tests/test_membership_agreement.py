"""Membership versions agreed by a majority (docs/membership.md, "Agreement"): in-process
nodes in one event loop, links cut by the peer transport's hook (``PeerLink.fault``).

A partition splits the members and an operator issues a different change on each side: the
side with the claimant alone has no majority and answers so, the other side's next normal
member issues its change to a majority, and after healing every member holds that one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.core.config import NodeConfig, from_mapping
from cluster.core.errors import PeerError
from cluster.core.membership import Membership, MembershipError
from cluster.local import free_ports
from cluster.server import NodeServer
from cluster.transport.wire import Kind

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]


def configs(tmp: Path, n: int, rf: int) -> list[NodeConfig]:
    ports = free_ports(n)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    # a long window: a move started here does not finish within the test
    base = {"fsync": False, "quorum_timeout": 0.5, "heartbeat_interval": 0.05,
            "failure_timeout": 0.6, "reconcile_timeout": 3.0, "antientropy_interval": 0.5,
            "window": 60.0, "rf": rf}
    return [from_mapping({"node_id": f"n{i + 1}", "listen": f"127.0.0.1:{p}", "peers": peers,
                          "data_dir": str(tmp / f"n{i + 1}"), **base})
            for i, p in enumerate(ports)]


class Cluster:
    def __init__(self, servers: dict[str, NodeServer]) -> None:
        self.servers = servers

    def node(self, name: str) -> Any:
        return self.servers[name].node

    def split(self, *sides: set[str], kinds: set[int] | None = None) -> None:
        """Cut every link between two sides (both ways); ``kinds``: only those frames."""
        side_of = {n: i for i, side in enumerate(sides) for n in side}
        for name, server in self.servers.items():
            for peer, link in server.node.links.items():
                if side_of.get(peer, -1) != side_of[name]:
                    link.fault = lambda kind, _items: kinds is None or kind in kinds

    def heal(self) -> None:
        for server in self.servers.values():
            for link in server.node.links.values():
                link.fault = None

    def rings(self) -> dict[str, Membership]:
        return {n: s.node.membership for n, s in self.servers.items()}


@contextlib.asynccontextmanager
async def cluster(tmp: Path, n: int = 3, rf: int = 2) -> AsyncIterator[Cluster]:
    servers = {c.node_id: NodeServer(c) for c in configs(tmp, n, rf)}
    try:
        await asyncio.gather(*(s.start() for s in servers.values()))
        yield Cluster(servers)
    finally:
        for s in servers.values():
            with contextlib.suppress(Exception):
                await s.stop()


async def until(cond: Callable[[], bool], timeout: float, what: str,
                c: Cluster | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            held = {n: (ms.version, ms.moves(), [t.to_wire() for t in ms.tables])
                    for n, ms in c.rings().items()} if c is not None else {}
            raise AssertionError(f"timed out waiting for {what}; rings held: {held}")
        await asyncio.sleep(0.05)


def sees_down(c: Cluster, observer: str, *peers: str) -> Callable[[], bool]:
    return lambda: not any(c.node(observer).is_live(p) for p in peers)


async def test_different_changes_on_two_sides_of_a_partition_do_not_both_take_effect(
        tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        assert c.node("n1").membership.claimant() == "n1"
        c.split({"n1"}, {"n2", "n3"})
        await until(sees_down(c, "n1", "n2", "n3"), 5.0, "n1 to see n2, n3 down")
        await until(sees_down(c, "n2", "n1"), 5.0, "n2 to see n1 down")
        await until(sees_down(c, "n3", "n1"), 5.0, "n3 to see n1 down")

        # the claimant's side: a decommission of n3, with no majority behind it
        minority: Exception | None = None
        try:
            await c.node("n1").changes.change({"change": "leave", "id": "n3"})
        except MembershipError as exc:
            minority = exc
        # the other side: n2, the next normal member, issues the decommission of n1
        got = Membership.from_wire(
            await c.node("n3").changes.change({"change": "leave", "id": "n1"}))
        assert got.version == 2 and got.get("n1").state == "leaving"  # type: ignore[union-attr]

        c.heal()
        await until(lambda: all(ms == got for ms in c.rings().values()), 10.0,
                    "every member at the majority's version 2", c)
        # (on a single claimant's versions, n1 kept its own version 2, n3 leaving, for good)
        assert minority is not None and "no majority: change not made" in str(minority)
        assert c.node("n3").membership.get("n3").state == "normal"  # type: ignore[union-attr]
        assert all(s.node.metrics.ring_conflicts == 0 for s in c.servers.values())


async def test_a_change_accepted_by_a_minority_is_completed_by_the_next_proposer(
        tmp_path: Path) -> None:
    """n1's accepts are lost on their way to n2 and n3 (its prepares got through): n1 holds its
    change accepted alone and answers that it is not confirmed. The next proposer, n2, finds it
    in n1's promise and completes it instead of its own: one value for version 2."""
    async with cluster(tmp_path) as c:
        n1, n2 = c.node("n1"), c.node("n2")
        for link in n1.links.values():
            link.fault = lambda kind, items: kind == Kind.RING and any(
                isinstance(i, dict) and i.get("op") in ("accept", "install") for i in items)
        with pytest.raises(MembershipError, match="no majority: change not confirmed"):
            await n1.changes.change({"change": "table", "name": "a", "ttl_s": 5})
        assert n1.membership.version == 1
        assert n1.changes.votes.get(2).value is not None  # accepted here only
        c.heal()
        got = Membership.from_wire(await n2.changes.apply(
            {"change": "table", "name": "b", "ttl_s": 7}))
        # n2 completed n1's version 2 first, then issued its own as version 3
        assert got.version == 3
        assert got.table("a") is not None and got.table("b") is not None

        await until(lambda: all(ms == got for ms in c.rings().values()), 10.0,
                    "every member at version 3", c)
        for name in c.servers:  # decided versions are forgotten by the acceptors
            votes = json.loads((tmp_path / name / "votes.json").read_text())
            assert all(int(v) > 1 for v in votes)


async def test_a_five_member_cluster_agrees_on_the_side_with_three(tmp_path: Path) -> None:
    """Five members split 2 | 3, the claimant on the smaller side: a table setting asked on
    each side; only the three's takes effect, and the two learn it after healing."""
    async with cluster(tmp_path, n=5, rf=3) as c:
        c.split({"n1", "n2"}, {"n3", "n4", "n5"})
        await until(sees_down(c, "n3", "n1", "n2"), 5.0, "n3 to see n1, n2 down")
        await until(sees_down(c, "n2", "n3", "n4", "n5"), 5.0, "n2 to see the others down")
        # n2 hands it to the claimant n1 (live on its side), whose answer comes back
        with pytest.raises((MembershipError, PeerError), match="no majority: change not made"):
            await c.node("n2").changes.change({"change": "table", "name": "t", "ttl_s": 1})
        got = Membership.from_wire(
            await c.node("n4").changes.apply({"change": "table", "name": "t", "ttl_s": 2}))
        assert got.version == 2
        c.heal()

        await until(lambda: all(ms == got for ms in c.rings().values()), 10.0,
                    "every member at version 2 with ttl 2", c)
        assert c.node("n1").membership.table("t").ttl_s == 2  # type: ignore[union-attr]


async def test_an_unconfirmed_change_is_completed_by_the_claimant_once_a_majority_is_back(
        tmp_path: Path) -> None:
    """As above, but nobody asks another change: the claimant, holding the value it accepted
    alone, proposes it again once the others are back, and every member installs it."""
    async with cluster(tmp_path) as c:
        n1 = c.node("n1")
        for link in n1.links.values():
            link.fault = lambda kind, items: kind == Kind.RING and any(
                isinstance(i, dict) and i.get("op") in ("accept", "install") for i in items)
        with pytest.raises(MembershipError, match="no majority: change not confirmed"):
            await n1.changes.change({"change": "table", "name": "a", "ttl_s": 5})
        assert all(ms.version == 1 for ms in c.rings().values())
        c.heal()
        await until(lambda: all(ms.version == 2 and ms.table("a") is not None
                                for ms in c.rings().values()), 10.0,
                    "every member at version 2 with table a", c)


async def test_two_proposers_at_once_end_with_one_value_per_version(tmp_path: Path) -> None:
    """n2 and n3 propose different table settings at the same moment, neither through the
    claimant: each version gets one value, the change that lost version 2 is applied again on
    top of the winner, and every member ends with both."""
    async with cluster(tmp_path) as c:
        a, b = await asyncio.gather(
            c.node("n2").changes.apply({"change": "table", "name": "a", "ttl_s": 5}),
            c.node("n3").changes.apply({"change": "table", "name": "b", "ttl_s": 6}))
        got = [Membership.from_wire(x) for x in (a, b)]
        assert sorted(ms.version for ms in got) == [2, 3]
        final = max(got, key=lambda ms: ms.version)
        assert final.table("a") is not None and final.table("b") is not None
        await until(lambda: all(ms == final for ms in c.rings().values()), 10.0,
                    "every member at version 3", c)
        assert all(s.node.metrics.ring_conflicts == 0 for s in c.servers.values())
