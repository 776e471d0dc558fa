"""The hard cases of DESIGN.md forced deterministically: three nodes in one event loop, faults
injected by the peer transport's hook (``PeerLink.fault``), "crash" = abort without flushing.

In every case: no acknowledged op lost, nothing counted twice, all replicas equal after healing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cluster_util import Client
from hypothesis import given
from hypothesis import strategies as st

from cluster.core.config import NodeConfig, from_mapping
from cluster.core.errors import PeerError
from cluster.core.ring import Ring
from cluster.local import free_ports
from cluster.roles import checks
from cluster.roles.failure import FailureDetector, PhiDetector
from cluster.server import NodeServer
from cluster.transport.wire import Kind, Status

pytestmark = pytest.mark.timeout(60)

RING = Ring(["n1", "n2", "n3"])


def key_with(prefs: tuple[str, ...], table: str = "t") -> str:
    return next(f"k{i}" for i in range(10_000)
                if RING.preference_list(table, f"k{i}") == prefs)


def configs(tmp: Path, **extra: object) -> list[NodeConfig]:
    ports = free_ports(3)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    base = {"fsync": False, "quorum_timeout": 1.0, "heartbeat_interval": 0.05,
            "failure_timeout": 0.6, "reconcile_timeout": 3.0, "antientropy_interval": 0.5}
    return [from_mapping({"node_id": f"n{i + 1}", "listen": f"127.0.0.1:{p}", "peers": peers,
                          "data_dir": str(tmp / f"n{i + 1}"), **base, **extra})
            for i, p in enumerate(ports)]


class Cluster:
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

    def fault(self, src: str, dst: str, kinds: set[int] | None = None) -> None:
        """Drop every call of ``kinds`` (all when None) from ``src`` to ``dst``."""
        self.servers[src].node.links[dst].fault = (
            lambda kind, _items: kinds is None or kind in kinds)

    def heal(self) -> None:
        for s in self.servers.values():
            for link in s.node.links.values():
                link.fault = None


@contextlib.asynccontextmanager
async def cluster(tmp: Path, **extra: object) -> AsyncIterator[Cluster]:
    c = Cluster(configs(tmp, **extra))
    try:
        await asyncio.gather(*(c.start(n) for n in ("n1", "n2", "n3")))
        yield c
    finally:
        for s in list(c.servers.values()):
            with contextlib.suppress(Exception):
                await s.stop()


async def until(cond: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def converged(c: Cluster, client: Client, key: str, value: int,
                    table: str = "t", timeout: float = 10.0) -> None:
    seen: list[dict[str, int]] = [{}]

    async def ok() -> bool:
        seen[0] = {n: await client.value(c.url(n), table, key, "one") for n in c.servers}
        return list(seen[0].values()) == [value] * len(seen[0])

    try:
        await until(ok, timeout, f"every replica of {table}/{key} at {value}")
    except AssertionError as exc:  # say what the replicas held: slow, or wrong?
        raise AssertionError(f"{exc}; last seen {seen[0]}") from None


async def sees_down(c: Cluster, observer: str, peer: str) -> None:
    async def down() -> bool:
        return not c.servers[observer].node.is_live(peer)

    await until(down, 5.0, f"{observer} to see {peer} down")


async def test_crash_after_local_apply_before_replication_then_retry_elsewhere(
        tmp_path: Path) -> None:
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            c.fault("n1", "n2", {Kind.REPLICATE})
            c.fault("n1", "n3", {Kind.REPLICATE})
            status, _ = await client.add(c.url("n1"), "t", key, "c1:1", 5)
            assert status == 503  # applied and logged on n1 only
            assert c.servers["n1"].node.pending  # in doubt
            c.crash("n1")
            await sees_down(c, "n2", "n1")
            status, body = await client.add(c.url("n3"), "t", key, "c1:1", 5, attempt=2)
            assert (status, body) == (200, {"applied": True})  # n2 leads, n3 confirmed unknown
            await c.start("n1")  # recovery finds c1:1 in doubt; n2 applied it: withdraw
            n1 = c.servers["n1"].node
            assert not n1.pending and n1.metrics.withdrawn == 1
            await converged(c, client, key, 5)
            for n in ("n1", "n2", "n3"):
                assert (await client.add(c.url(n), "t", key, "c1:1", 5, attempt=3))[1] == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 5)
    finally:
        await client.close()


async def test_crash_after_partial_replication_then_retry(tmp_path: Path) -> None:
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path, write_quorum=3) as c:
            c.fault("n1", "n2", {Kind.REPLICATE})  # only n3 gets it: no quorum of 3
            status, _ = await client.add(c.url("n1"), "t", key, "c2:1", 7)
            assert status == 503
            c.crash("n1")
            await sees_down(c, "n2", "n1")
            # n2 leads now; it never saw the op but n3 holds it: duplicate, never a 2nd count.
            # (If n3's answer comes late, n2 may apply it and fail W=3: 503, and n1 withdraws
            # its own copy at restart; the count is the same.)
            status, body = await client.add(c.url("n2"), "t", key, "c2:1", 7, attempt=2)
            assert (status, body) == (200, {"applied": False, "duplicate": True}) or status == 503
            await c.start("n1")  # in doubt: published, or withdrawn if n2 applied it
            assert not c.servers["n1"].node.pending
            # If n2 applied it, its copy needs all three replicas (W = 3), and the restarted
            # n1 refuses copies of ops applied before its restart for one window (it may have
            # fenced them before the crash: claims.Claims.forget), so n2 publishes it, and
            # shows it, only after that window: wait for it, and a little more
            window = c.servers["n1"].node.config.window
            await converged(c, client, key, 7, timeout=window + 5.0)
            for n in ("n1", "n2", "n3"):
                # W = 3: a duplicate needs every replica to answer that it shows the op, and
                # n2's first call to the restarted n1 may find the old connection gone: 503
                assert await _answer(client, c.url(n), key, "c2:1", 7) == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 7)
    finally:
        await client.close()


async def _answer(client: Client, url: str, key: str, op_id: str, delta: int) -> Any:
    """The answer to a retry of ``op_id`` once it is not 503 (a few tries)."""
    for attempt in range(3, 13):
        status, body = await client.add(url, "t", key, op_id, delta, attempt=attempt)
        if status != 503:
            return body
        await asyncio.sleep(0.1)
    return body


async def test_replica_down_during_writes_converges_and_recognises_retries(
        tmp_path: Path) -> None:
    key = key_with(("n3", "n1", "n2"))  # n3 leads it when up
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            c.crash("n3")
            await sees_down(c, "n1", "n3")
            for i in range(20):
                status, body = await client.add(c.url("n1"), "t", key, f"c3:{i}", 1)
                assert (status, body) == (200, {"applied": True})
            assert c.servers["n1"].node.hints.pending("n3") > 0
            await c.start("n3")
            await converged(c, client, key, 20)
            # a late copy of an op applied while n3 was away reaches n3, its leader again
            for i in range(20):
                status, body = await client.add(c.url("n3"), "t", key, f"c3:{i}", 1)
                assert (status, body) == (200, {"applied": False, "duplicate": True}), i
            await converged(c, client, key, 20)
    finally:
        await client.close()


async def test_partition_of_one_node_under_load_then_healed(tmp_path: Path) -> None:
    keys = [key_with(p) for p in (("n1", "n2", "n3"), ("n2", "n3", "n1"), ("n3", "n1", "n2"))]
    client = Client()
    rng = random.Random(4)
    total = {k: 0 for k in keys}
    try:
        async with cluster(tmp_path) as c:
            names = ["n1", "n2", "n3"]

            async def op(i: int) -> None:
                key, delta = keys[i % 3], rng.randint(1, 9)
                attempt, deadline = 0, time.monotonic() + 30
                while True:  # retry with the same id until acknowledged
                    assert time.monotonic() < deadline, f"c4:{i} never acknowledged"
                    attempt += 1
                    status, _ = await client.add(c.url(rng.choice(names)), "t", key,
                                                 f"c4:{i}", delta, attempt=attempt)
                    if status == 200:
                        total[key] += delta
                        return
                    await asyncio.sleep(0.05)

            first = asyncio.gather(*(op(i) for i in range(60)))
            await asyncio.sleep(0.1)
            for other in ("n2", "n3"):  # isolate n1 both ways
                c.fault("n1", other)
                c.fault(other, "n1")
            await sees_down(c, "n2", "n1")
            await asyncio.gather(first, *(op(i) for i in range(60, 120)))
            c.heal()
            await asyncio.gather(*(op(i) for i in range(120, 150)))
            for key in keys:
                await converged(c, client, key, total[key], timeout=15)
            assert not any(s.node.pending for s in c.servers.values())
    finally:
        await client.close()


async def test_retry_past_the_window_is_op_expired_never_a_second_count(tmp_path: Path) -> None:
    client = Client()
    try:
        async with cluster(tmp_path, window=2.0) as c:
            status, health = await client.get(c.url("n2") + "/v1/health")
            assert health["window_s"] == 2.0
            assert (await client.add(c.url("n1"), "t", "late", "c5:1", 3))[0] == 200
            status, body = await client.add(c.url("n2"), "t", "late", "c5:1", 3, attempt=2,
                                            age_ms=2500)
            assert status == 410 and body["error"]["code"] == "op_expired"
            old = int(time.time() * 1000) - 4000  # replayed late, with its original age
            status, body = await client.add(c.url("n3"), "t", "late", "c5:1", 3, age_ms=0,
                                            ts_ms=old)
            assert status == 410
            status, body = await client.batch(c.url("n3"), [
                {"table": "t", "key": "late", "op_id": "c5:1", "delta": 3, "age_ms": 9000}])
            assert body["results"][0]["status"] == 410
            await converged(c, client, "late", 3)
    finally:
        await client.close()


async def retry_until_acked(client: Client, url: str, key: str, op_id: str, delta: int,
                            attempt: int = 3, table: str = "t") -> dict[str, Any]:
    """The client's retries: the same op id until an answer (503 means retry)."""
    deadline = time.monotonic() + 10
    while True:
        status, body = await client.add(url, table, key, op_id, delta, attempt=attempt)
        if status == 200:
            return dict(body)
        assert status == 503 and time.monotonic() < deadline, (status, body)
        attempt += 1
        await asyncio.sleep(0.1)


async def test_two_leaders_checking_one_op_at_once_never_both_apply(tmp_path: Path) -> None:
    """Over-counts under the pause nemesis, forced. A primary that was paused resumes
    with stale copies of an op (retries, so it checks them on the replicas) while the replica
    that took over its keys is checking its own retry of the same op, waiting for the
    primary's answer. Each answered the other's HOLDS "not held" (neither had applied yet),
    both checks passed, both applied, and both reached a quorum (n3 took both REPLICATEs):
    the op counted twice, as the chaos histories showed (the same op ids APPLYed by n2 and n3
    5 ms apart, right after n2's SIGCONT). Now the first HOLDS to reach a replica claims the
    op there and every other check of it answers 503 until that application arrives."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n2 = c.servers["n1"].node, c.servers["n2"].node
            op = ("t", key, "c6:1", 4, 2)
            first = await asyncio.gather(n1.lead([op]), n2.lead([op]))
            assert [s for (s,) in first].count(int(Status.APPLIED)) <= 1, first
            await retry_until_acked(client, c.url("n1"), key, "c6:1", 4)
            await converged(c, client, key, 4)
            for n in ("n1", "n2", "n3"):  # every later copy is a duplicate, wherever it lands
                assert await retry_until_acked(client, c.url(n), key, "c6:1", 4) == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 4)
            assert not n1.pending and not n2.pending
    finally:
        await client.close()


async def test_a_check_older_than_its_lease_is_not_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader paused between its check and its apply resumes with answers that may be stale:
    the claims it got may have expired and another check passed meanwhile. It applies only
    within its lease of sending the HOLDS; here every lease is already over (standing in for
    a SIGSTOP longer than it), so the op answers 503 unapplied and its claims are given back."""
    monkeypatch.setattr(checks, "lease", lambda node, table: -1.0)
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n2 = c.servers["n2"].node
            assert await n2.lead([("t", key, "c7:1", 5, 2)]) == [int(Status.UNAVAILABLE)]
            assert not n2.pending

            async def released() -> bool:
                return not any(s.node.claims for s in c.servers.values())

            await until(released, 5.0, "the claims given back")
            await converged(c, client, key, 0)
    finally:
        await client.close()


async def _true(value: bool) -> bool:
    return value


def isolate(c: Cluster, name: str) -> None:
    for other in c.servers:
        if other != name:
            c.fault(name, other)
            c.fault(other, name)


class Watch:
    """Reads a key over and over on every node, at every consistency, plus every node's
    visible state directly, and keeps each value above ``bound`` (the attempted sum)."""

    def __init__(self, c: Cluster, client: Client, key: str) -> None:
        self.c, self.client, self.key = c, client, key
        self.bound = 0
        self.over: list[tuple[str, str, int, int]] = []
        self.reads = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            for name, server in list(self.c.servers.items()):
                self._see(name, "state", server.node.state.shards.value("t", self.key))
                for consistency in ("one", "quorum", "all"):
                    with contextlib.suppress(Exception):
                        status, body = await self.client.get(
                            f"{self.c.url(name)}/v1/counters/t/{self.key}"
                            f"?consistency={consistency}")
                        if status == 200:
                            self.reads += 1
                            self._see(name, consistency, body["value"])
            await asyncio.sleep(0.005)

    def _see(self, name: str, how: str, value: int) -> None:
        if value > self.bound:
            self.over.append((name, how, value, self.bound))

    def stop(self) -> None:
        self._stop.set()


async def acked(client: Client, c: Cluster, names: list[str], key: str, op_id: str,
                delta: int) -> None:
    """Retry ``op_id`` with the same id, rotating over ``names``, until acknowledged."""
    deadline = time.monotonic() + 20
    attempt = 0
    while True:
        attempt += 1
        status, _ = await client.add(c.url(names[attempt % len(names)]), "t", key, op_id,
                                     delta, attempt=attempt)
        if status == 200:
            return
        assert time.monotonic() < deadline, f"{op_id} never acknowledged"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("flap", [False, True], ids=["heal", "heal-cut-heal"])
async def test_in_doubt_application_is_never_visible_while_a_partition_heals(
        tmp_path: Path, flap: bool) -> None:
    """The partition double count: the leader applies, its replication is cut, the client
    retries elsewhere and the op is applied there, the cut heals (``flap``: and comes back
    mid-settle, then heals again). No read on any node at any consistency, and no node's
    visible state, ever exceeds the attempted sum; the leader withdraws its copy unseen."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            watch = Watch(c, client, key)
            reader = asyncio.ensure_future(watch.run())
            isolate(c, "n1")  # and write to it before anyone notices: a plain first attempt
            watch.bound += 5
            status, _ = await client.add(c.url("n1"), "t", key, "c9:1", 5)
            assert status == 503  # applied on n1 alone: in doubt there
            assert "c9:1" in c.servers["n1"].node.pending
            await sees_down(c, "n2", "n1")
            status, body = await client.add(c.url("n2"), "t", key, "c9:1", 5, attempt=2)
            assert (status, body) == (200, {"applied": True})  # n2 leads, n3 claims it
            c.heal()
            if flap:  # cut again while n1 settles, then heal for good
                await asyncio.sleep(0.02)
                isolate(c, "n1")
                await asyncio.sleep(0.3)
                c.heal()
            # a new op on the same key at n1 waits for the settle, never rides along with it
            watch.bound += 1
            await acked(client, c, ["n1"], key, "c9:2", 1)
            await until(lambda: _settled(c), 10.0, "n1 to settle its in-doubt op")
            await converged(c, client, key, 6)
            watch.stop()
            await reader
            assert watch.reads > 50
            assert watch.over == [], watch.over[:10]
            assert c.servers["n1"].node.metrics.withdrawn == 1
            for n in ("n1", "n2", "n3"):  # every copy answers duplicate, nothing counts again
                assert await retry_until_acked(client, c.url(n), key, "c9:1", 5) == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 6)
    finally:
        await client.close()


async def _settled(c: Cluster) -> bool:
    return not any(s.node.pending for s in c.servers.values())


async def test_a_replica_refuses_a_copy_of_an_op_claimed_for_another_leader(
        tmp_path: Path) -> None:
    """The fence: n3 claimed op x:1 for n2's check, so n1's copy (held back by a partition or
    a pause) is refused whole: not merged, not remembered, and the frame's reply says so. n2's
    own application is taken, and the claim stays behind it as a fence."""
    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path) as c:
        n1, n2, n3 = (c.servers[n].node for n in ("n1", "n2", "n3"))
        assert n3.claims.take("x:1", "n2", 10.0)
        now = time.time()
        copy = [["x:1", "t", key, n1.origin, 5, 0, 5, now],
                ["x:2", "t", key, n1.origin, 6, 0, 1, now]]  # carries x:1 in its pair
        assert await n1.links["n3"].call(Kind.REPLICATE, copy) is False
        assert n3.state.shards.entry("t", key).value() == 0
        assert b"x:1" not in n3.state.dedup("t") and n3.metrics.fenced == 2
        mine = [["x:1", "t", key, n2.origin, 5, 0, 5, now]]
        assert await n2.links["n3"].call(Kind.REPLICATE, mine) is None
        assert n3.state.shards.entry("t", key).value() == 5
        assert n3.claims.holder("x:1") is None and n3.claims.fence("x:1") == "n2"
        assert await n1.links["n3"].call(Kind.REPLICATE, copy[:1]) is False  # still fenced
        assert n3.state.shards.entry("t", key).value() == 5


async def reached(link: Any, kind: Kind, items: Any, timeout: float = 5.0) -> Any:
    """``link.call`` once the link (to a peer just restarted) connects again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await link.call(kind, items)
        except PeerError:
            assert time.monotonic() < deadline, f"{link} never reached"
            await asyncio.sleep(0.05)


async def test_a_restarted_replica_gives_no_claim_it_may_have_given_before(
        tmp_path: Path) -> None:
    """The simulator's seed 6154: n3 claimed op x:1 for n2's check, then crashed; claims live in
    memory, so after its restart it claimed x:1 again for n1 (whose own copy, held in doubt
    through a pause, was then published next to n2's application). For a claim's life after a
    restart a node gives no claim on an op born before it (FORGOT), does not count its own
    claim in its checks of such ops, and refuses copies applied before it. Ops born after the
    restart are claimed as usual."""
    from cluster.core.ops import Op

    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path) as c:
        n1 = c.servers["n1"].node
        born = time.time() - 0.5
        ask = [["t", key, "x:1", checks.CLAIM, born]]
        assert (await c.servers["n2"].node.links["n3"].call(Kind.HOLDS, ask))[0][0] == 0
        assert c.servers["n3"].node.claims.holder("x:1") == "n2"
        c.crash("n3")
        n3 = (await c.start("n3")).node
        assert n3.claims.holder("x:1") is None and n3.claims.amnesiac()
        held = (await reached(n1.links["n3"], Kind.HOLDS, ask))[0][0]
        assert held == checks.FORGOT and n3.claims.holder("x:1") is None
        later = time.time() + n3.config.max_clock_skew + 0.01
        fresh = [["t", key, "y:1", checks.CLAIM, later]]
        assert (await n1.links["n3"].call(Kind.HOLDS, fresh))[0][0] == 0
        assert n3.claims.holder("y:1") == "n1"
        # n1's copy of x:1, applied before the restart: perhaps fenced before it, so refused
        stale = [["x:1", "t", key, n1.origin, 5, 0, 5, born]]
        assert await n1.links["n3"].call(Kind.REPLICATE, stale) is False
        assert n3.state.shards.entry("t", key).value() == 0 and n3.metrics.fenced == 1
        # n1 checks x:1 while n2 is silent: n3's FORGOT is no claim, so no majority
        c.fault("n1", "n2", {Kind.HOLDS})
        status, _deadline = await checks._check_one(n1, Op("t", key, "x:1", 5, 2), born)
        assert status == int(Status.UNAVAILABLE) and n1.claims.holder("x:1") is None
        # and n3's own check of an op born before its restart needs both others' claims
        await reached(n3.links["n1"], Kind.READ, [["t", key]])
        c.fault("n3", "n2", {Kind.HOLDS})
        status, _deadline = await checks._check_one(n3, Op("t", key, "z:1", 5, 2), born)
        assert status == int(Status.UNAVAILABLE)
        status, _deadline = await checks._check_one(n3, Op("t", key, "z:2", 5, 2), later)
        assert status is None  # born after the restart: n3's claim and n1's make a majority


async def _in_doubt_at_n1_copy_on_n2(c: Cluster, client: Client, key: str, op_id: str) -> None:
    """n1 applies ``op_id`` (+5), but its REPLICATE and HOLDS reach nobody: the op is in doubt
    and hidden on n1. Then its copy reaches n2 after all, and n1 does not hear of it (the ack is
    "lost")."""
    n1 = c.servers["n1"].node
    c.fault("n1", "n2", {Kind.REPLICATE, Kind.HOLDS})
    c.fault("n1", "n3", {Kind.REPLICATE, Kind.HOLDS})
    status, _ = await client.add(c.url("n1"), "t", key, op_id, 5)
    assert status == 503 and op_id in n1.pending and op_id not in n1.inflight
    c.heal()
    assert await n1.links["n2"].call(Kind.REPLICATE, [list(n1.pending[op_id])]) is None


async def test_a_duplicate_is_answered_only_once_the_op_is_visible_on_a_quorum(
        tmp_path: Path) -> None:
    """The read window the simulator found (seed 16): n1 applies c7:1 and its copy reaches n2,
    but n2's ack is lost, so n1 holds the op in doubt and hides it. The client's retry reaches
    n2 (n1 cut off), which holds the id: before answering "duplicate" it makes sure W replicas
    show the op (here by pushing its entry to n3). Without that, a quorum read of n1 and n3
    would miss an acknowledged op until n1 settles."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n2, n3 = (c.servers[n].node for n in ("n1", "n2", "n3"))
            await _in_doubt_at_n1_copy_on_n2(c, client, key, "c7:1")
            assert n2.state.shards.entry("t", key).value() == 5
            assert n3.state.shards.entry("t", key).value() == 0
            isolate(c, "n1")
            c.fault("n2", "n3", {Kind.DIGEST})  # no anti-entropy meanwhile: n3 must learn
            c.fault("n3", "n2", {Kind.DIGEST})  # the op from the duplicate's confirmation
            await sees_down(c, "n2", "n1")
            assert n3.state.shards.entry("t", key).value() == 0
            status, body = await client.add(c.url("n2"), "t", key, "c7:1", 5, attempt=2)
            assert (status, body) == (200, {"applied": False, "duplicate": True})
            # acknowledged: visible on W = 2 replicas other than the one still hiding it
            assert n3.state.shards.entry("t", key).value() == 5
            assert "c7:1" in n1.pending and n1.state.shards.entry("t", key).value() == 0
            c.heal()
            await until(lambda: _settled(c), 10.0, "n1 to settle c7:1")
            assert n1.metrics.withdrawn == 0  # published: its copy is the one that stands
            await converged(c, client, key, 5)
    finally:
        await client.close()


async def test_a_duplicate_of_an_op_still_in_doubt_at_its_leader_is_503(
        tmp_path: Path) -> None:
    """As above, but n1 is reachable and still in doubt about c8:1 (its HOLDS cannot reach
    the replicas, so it cannot settle yet): n2 must not answer "duplicate" for it."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n2 = c.servers["n1"].node, c.servers["n2"].node
            c.fault("n1", "n2", {Kind.REPLICATE, Kind.HOLDS})
            c.fault("n1", "n3", {Kind.REPLICATE, Kind.HOLDS})
            status, _ = await client.add(c.url("n1"), "t", key, "c8:1", 5)
            assert status == 503 and "c8:1" in n1.pending
            n1.links["n2"].fault = None
            assert await n1.links["n2"].call(Kind.REPLICATE, [list(n1.pending["c8:1"])]) is None
            c.fault("n1", "n2", {Kind.REPLICATE, Kind.HOLDS})
            dup = n2.leader._apply_batch([("t", key, "c8:1", 5, 2)])  # n2 leads the retry
            statuses, _own, _groups, waits = dup
            assert [await w for _i, w in waits] == [False]  # n1 answered IN_DOUBT
            assert n2.metrics.unconfirmed_duplicates == 1
            c.heal()
            await until(lambda: _settled(c), 10.0, "n1 to settle c8:1")
            await acked(client, c, ["n2", "n3"], key, "c8:1", 5)
            await converged(c, client, key, 5)
    finally:
        await client.close()


async def test_a_check_of_an_op_this_node_holds_unpublished_never_answers_duplicate(
        tmp_path: Path) -> None:
    """The simulator's seed 6121: two copies of one request checked side by side at the key's
    leader; the first applies the op, and the second hears a replica hold a copy. The leader
    still hides the op (its quorum is not met), so the replicas' entries covering its own prove
    nothing: the answer comes from its own application (here in doubt: 503), never from
    ``confirm_duplicates``, which answered "duplicate" before the op was visible anywhere a
    quorum read looks."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n3 = c.servers["n1"].node, c.servers["n3"].node
            await _in_doubt_at_n1_copy_on_n2(c, client, key, "c9:1")
            c.fault("n1", "n2", {Kind.REPLICATE})  # n1 cannot settle meanwhile
            c.fault("n1", "n3", {Kind.REPLICATE})
            status, _deadline = await checks._check_one(n1, ("t", key, "c9:1", 5, 2))
            assert status == int(Status.UNAVAILABLE)  # n2 holds it; n1's own copy is in doubt
            assert n1.state.shards.entry("t", key).value() == 0  # still hidden here
            assert n3.state.shards.entry("t", key).value() == 0
            c.heal()
            await until(lambda: _settled(c), 10.0, "n1 to settle c9:1")
            await converged(c, client, key, 5)
    finally:
        await client.close()


async def test_a_duplicate_given_up_while_waiting_leaves_the_ops_own_quorum_wait_alone(
        tmp_path: Path) -> None:
    """A duplicate of an op in flight waits for that op's quorum; if the wait is given up (its
    task cancelled), the op's own wait must go on, or the op would never be published here."""
    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path) as c:
        n1 = c.servers["n1"].node
        op = ("t", key, "c10:1", 1, 1)
        n1.state.seen_or_add_ops([op])  # applied, its quorum still awaited:
        own: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        n1.leader._inflight["c10:1"] = own
        dup = asyncio.ensure_future(n1.leader._lead_admitted([op]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not dup.done()  # waiting for the op's quorum
        dup.cancel()
        await asyncio.gather(dup, return_exceptions=True)
        assert dup.cancelled() and not own.cancelled()
        own.set_result(True)
        del n1.leader._inflight["c10:1"]


async def test_pulled_dedup_state_forces_a_check_and_is_never_answered_as_held(
        tmp_path: Path) -> None:
    """The acknowledged op withdrawn (simulator seeds 4, 5, 61): a restarted node pulled a
    peer's dedup, which held the id of that peer's own op still in doubt; answering HOLDS "held"
    for it made the peer withdraw the op while a retry had been answered "duplicate". Pulled
    ids now only make an op go through the check."""
    from cluster.roles.admission import needs_check
    from cluster.roles.antientropy import take_pulled

    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path) as c:
        n2, n3 = c.servers["n2"].node, c.servers["n3"].node
        n3.state.dedup("t").seen_or_add(b"z:1")
        assert take_pulled(n2, "t", n3.state.dedup("t").to_bytes())
        held, _checked, _entry = checks.on_holds(n2, [["t", key, "z:1", checks.QUERY]], "n1")[0]
        assert held == 0
        assert n2.state.suspected("t", "z:1") and not n2.state.suspected("t", "z:2")
        assert needs_check(("t", key, "z:1", 1, 1), False, n2.state.suspected)
        assert not needs_check(("t", key, "z:2", 1, 1), False, n2.state.suspected)


async def test_a_forwarded_op_older_than_its_window_is_refused_at_its_leader(
        tmp_path: Path) -> None:
    """The simulator's seed 101: a retry forwarded inside the window sat in a paused leader's
    socket buffer until after it; by then the replicas had forgotten the op's first
    application, the check passed, and the op counted twice. The FORWARD stamp is the op's
    birth, so the leader refuses it (``op_expired``) instead."""
    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path, window=5.0) as c:
        n1, n2 = c.servers["n1"].node, c.servers["n2"].node
        now_ms = int(time.time() * 1000)
        old = [["t", key, "old:1", 5, 2, now_ms - 6_000]]  # born 6 s ago, window 5 s
        assert await n2.links["n1"].call(Kind.FORWARD, old) == [int(Status.EXPIRED)]
        fresh = [["t", key, "new:1", 5, 2, now_ms - 1_000]]
        assert await n2.links["n1"].call(Kind.FORWARD, fresh) == [int(Status.APPLIED)]
        assert n1.state.shards.entry("t", key).value() == 5
        assert b"old:1" not in n1.state.dedup("t")


async def test_a_copy_older_than_its_window_less_the_skew_is_never_applied(
        tmp_path: Path) -> None:
    """Chaos at a 2 s window (seed 23, all nemeses): a leader applied an op a second time 2.1 s
    after the first, once its dedup had forgotten it. One copy had waited behind an
    unpublished op on its key; its time limit was a lease keyed by op id, which a sibling copy
    in the same batch took, and a first attempt led without a check had no limit at all. Now
    every copy carries its own limit from its birth (window less ``max_clock_skew``): old
    copies answer 503 unapplied, checked or not, one at a time or two in a batch."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path, window=2.0, max_clock_skew=1.0) as c:
            n1 = c.servers["n1"].node
            now = n1.clock()
            old = now - 1.5  # inside the 2 s window, past the 1 s it can be trusted for
            first, retry = ("t", key, "old:1", 5, 1), ("t", key, "old:1", 5, 2)
            assert await n1.lead([first], [old]) == [int(Status.UNAVAILABLE)]
            assert await n1.lead([first, first], [old, old]) == [int(Status.UNAVAILABLE)] * 2
            assert await n1.lead([retry, first], [old, old]) == [  # the check says why
                int(Status.EXPIRED), int(Status.UNAVAILABLE)]
            assert b"old:1" not in n1.state.dedup("t")
            assert await n1.lead([("t", key, "new:1", 2, 1)], [n1.clock()]) == [
                int(Status.APPLIED)]
            await converged(c, client, key, 2)
    finally:
        await client.close()


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), max_size=300),
       st.integers(min_value=1, max_value=50))
def test_phi_detector_mean_is_that_of_the_last_window_of_intervals(
        gaps: list[float], window: int) -> None:
    """``PhiDetector.mean`` (kept at each heartbeat, read for every routed op) is the mean of the
    last ``window`` intervals between heartbeats, never below the floor; ``phi`` grows with
    silence measured in that mean."""
    floor = 0.5
    d = PhiDetector(0.0, floor=floor, window=window)
    now, seen = 0.0, []
    d.heartbeat(now)
    for gap in gaps:
        now += gap
        d.heartbeat(now)
        seen.append(gap)
    last = seen[-window:]
    expected = max(sum(last) / len(last), floor) if last else floor
    assert d.mean() == pytest.approx(expected)
    assert d.phi(now + 2 * expected) == pytest.approx(2 * d.phi(now + expected))


@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=3.0), st.booleans()), max_size=60),
       st.floats(min_value=-1.0, max_value=30.0), st.floats(min_value=0.5, max_value=12.0),
       st.floats(min_value=0.1, max_value=20.0))
def test_is_live_is_the_phi_and_timeout_test(beats: list[tuple[float, bool]], after: float,
                                             threshold: float, timeout: float) -> None:
    """``FailureDetector.is_live`` answers from the time folded at each heartbeat
    (``live_until``) what ready, ``now - last < timeout`` and ``phi(now) < threshold`` say, at
    any time after any heartbeats (outside a rounding's width of the boundary)."""
    clock = [0.0]
    det = FailureDetector(["p"], interval=0.5, threshold=threshold, timeout=timeout,
                          clock=lambda: clock[0])
    for gap, ready in beats:
        clock[0] += gap
        det.heartbeat("p", ready)
    clock[0] += after
    d, now = det.peers["p"], clock[0]
    want = d.ready and now - d.last < timeout and d.phi(now) < threshold
    if abs(now - d.live_until) > 1e-9:
        assert det.is_live("p") == want
    assert det.is_live("self")  # not a peer: this node
