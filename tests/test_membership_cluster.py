"""Elastic membership with real node processes under load: join, decommission, replace, and
kill -9 of the joining node mid-move. Every acknowledged op is counted exactly once on every
replica of the final membership, and retries of ops acked during a move are recognised by the
new leaders (docs/membership.md)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from client import CounterClient
from cluster.core.membership import Membership
from cluster.local import LocalCluster, StartError
from tests.cluster_util import Client, running_cluster, wait_until, write_certs

pytestmark = pytest.mark.asyncio

WINDOW = 2.0  # a move lasts window + max_clock_skew + 2 failure timeouts: ~5-6 s here
ARGS = ["--window", str(WINDOW), "--antientropy-interval", "1"]
KEYS = [f"k{i}" for i in range(40)]


@contextlib.asynccontextmanager
async def cluster_and_client(nodes: int, **kw: Any) -> AsyncIterator[tuple[LocalCluster, Client]]:
    """``running_cluster`` and a ``Client`` closed after it."""
    async with running_cluster(nodes, **kw) as cluster:
        client = Client()
        try:
            yield cluster, client
        finally:
            await client.close()


class Load:
    """Writers with explicit op ids that retry (same id, attempt 2+) on any other node until
    the op is answered 200; what was acked, and what may or may not have applied."""

    def __init__(self, client: Client, urls: list[str], prefix: str) -> None:
        self.client, self.urls, self.prefix = client, urls, prefix
        self.acked: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()
        self.log: list[tuple[float, str, str]] = []  # (acked at, op id, key)
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, writers: int = 4) -> None:
        self.tasks = [asyncio.create_task(self._writer(w)) for w in range(writers)]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def _writer(self, w: int) -> None:
        rng = random.Random(w)
        i = 0
        while not self.stop.is_set():
            i += 1
            key, op_id = rng.choice(KEYS), f"{self.prefix}{w}:{i}"
            born = time.monotonic()
            for attempt in range(1, 1000):
                try:
                    status, _ = await self.client.add(rng.choice(self.urls), "t", key, op_id, 1,
                                                      attempt=attempt)
                except Exception:  # noqa: BLE001 - a node going away: retry elsewhere
                    status = 0
                if status == 200:
                    self.acked[key] += 1
                    self.log.append((time.monotonic(), op_id, key))
                    break
                if time.monotonic() - born > WINDOW * 0.6:  # a retry would soon be refused
                    self.unknown[key] += 1
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.01)


async def ring(client: Client, url: str) -> dict[str, Any]:
    status, body = await client.get(f"{url}/v1/ring")
    assert status == 200, body
    return body


def membership(view: dict[str, Any]) -> Membership:
    return Membership.from_wire({**view, "members": [
        [m["id"], *m["addr"].rsplit(":", 1), "normal" if m["state"] == "down" else m["state"],
         m["since"]] for m in view["members"]]})


async def settled(client: Client, urls: list[str], version: int) -> bool:
    """Every node in ``urls`` holds ``version`` (or newer) and no move is under way."""
    for url in urls:
        try:
            view = await ring(client, url)
        except Exception:  # noqa: BLE001 - not up yet
            return False
        if view["version"] < version or view["move"] is not None:
            return False
    return True


def counters(metrics: bytes) -> float:
    """``idc_counters`` (the keys a node holds) from its ``/metrics`` page."""
    return next(float(ln.split()[-1]) for ln in metrics.decode().splitlines()
                if ln.startswith("idc_counters "))


async def on_their_replicas_only(client: Client, nodes: list[Any], placement: Any) -> bool:
    """Each node holds exactly the keys of ``KEYS`` that ``placement`` gives it."""
    for n in nodes:
        _, metrics = await client.get(f"{n.url}/metrics")
        if counters(metrics) != sum(n.id in placement.preference_list("t", k) for k in KEYS):
            return False
    return True


async def check_counts(client: Client, cluster: LocalCluster, load: Load) -> None:
    """Every replica of every key of the final membership holds exactly what was acked
    (give or take the ops whose outcome the writers never learned)."""
    live = [n for n in cluster.nodes.values() if n.running]
    placement = membership(await ring(client, live[0].url)).placement()
    url = {n.id: n.url for n in live}

    async def equal() -> bool:
        for key in KEYS:
            values = {await client.value(url[r], "t", key, "one")
                      for r in placement.preference_list("t", key)}
            if len(values) != 1:
                return False
        return True

    await wait_until(equal, timeout=30, what="every replica of every key equal")
    for key in KEYS:
        value = await client.value(url[placement.preference_list("t", key)[0]], "t", key, "one")
        assert load.acked[key] <= value <= load.acked[key] + load.unknown[key], (
            key, value, load.acked[key], load.unknown[key])
    assert sum(load.acked.values()) > 100  # the load ran through the changes


async def test_join_then_decommission_under_load_counts_every_op_once() -> None:
    async with cluster_and_client(3, extra_args=ARGS) as (cluster, client):
        urls = [n.url for n in cluster.nodes.values()]
        load = Load(client, urls[1:], "a")  # n1 will leave: the writers use n2, n3
        load.start()
        await asyncio.sleep(1.0)
        before = Counter(load.acked)  # acked before the join: n4 must hold it when normal
        n4 = cluster.add_node("n4", join=["n1"])
        await n4.start()
        view = await ring(client, n4.url)
        assert view["version"] == 2 and view["move"]["joining"] == "n4"
        assert {m["id"]: m["state"] for m in view["members"]}["n4"] == "joining"
        every = [*urls, n4.url]
        await wait_until(lambda: settled(client, every, 3), timeout=40,
                         what="n4 normal everywhere")
        finished = time.monotonic()
        placement = membership(await ring(client, n4.url)).placement()
        mine = [k for k in KEYS if "n4" in placement.preference_list("t", k)]
        assert mine
        for key in mine:  # n4's own copy, read the moment it became a replica
            assert await client.value(n4.url, "t", key, "one") >= before[key], key
        # retries of ops acked during the move, sent to the new member: duplicates
        recent = [(op_id, key) for t, op_id, key in load.log if finished - t < WINDOW / 3]
        assert recent
        for op_id, key in recent[-20:]:
            status, body = 503, None
            while status == 503:  # the SDK's retry, same op id
                status, body = await client.add(n4.url, "t", key, op_id, 1, attempt=2)
            assert status in (200, 410), body
            assert status == 410 or body.get("duplicate") is True, (op_id, body)
        status, metrics = await client.get(f"{n4.url}/metrics")
        assert "idc_ring_version 4" in metrics.decode()  # join, new sets serve, normal
        assert counters(metrics) > 0  # n4 gained keys
        # n1..n3 hand the keys that moved to n4 off and drop them: RF copies of every key
        nodes = [*cluster.nodes.values()]

        async def shed() -> bool:  # each node's pass of version 4 done, nothing foreign left
            views = [(await ring(client, n.url))["shed"] for n in nodes]
            return (all(v["done_version"] == 4 and v["foreign_keys"] == 0 for v in views)
                    and await on_their_replicas_only(client, nodes, placement))

        await wait_until(shed, timeout=30, what="every key on exactly RF replicas")
        views = [await ring(client, n.url) for n in nodes]
        assert sum(v["shed"]["dropped_keys"] for v in views) >= len(mine), views

        dec = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster", "decommission", "n1", "--via",
            cluster.nodes["n2"].address, "--secret-file", str(cluster.secret_file),
            "--timeout", "60", stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(dec.communicate(), 90)
        assert dec.returncode == 0, out
        assert b"n1: left on every member" in out
        proc = cluster.nodes["n1"].proc
        assert proc is not None
        assert await asyncio.wait_for(proc.wait(), 30) == 0  # it exits by itself, 0
        # a supervisor starting it again: it says it left and exits 0, serving nothing
        with pytest.raises(StartError) as gone:
            await cluster.nodes["n1"].start()
        assert gone.value.code == 0
        assert "n1 left the cluster" in cluster.nodes["n1"].log_path.read_text()
        await asyncio.sleep(1.0)
        await load.finish()
        view = await ring(client, urls[1])
        assert {m["id"]: m["state"] for m in view["members"]} == {
            "n1": "left", "n2": "normal", "n3": "normal", "n4": "normal"}
        await check_counts(client, cluster, load)
        # an SDK told of the old members learns the new one and forgets the one that left
        async with CounterClient(urls) as sdk:
            await sdk.refresh()
            assert n4.url in sdk.pool.urls and urls[0] not in sdk.pool.urls, sdk.pool.urls
            assert (await sdk.add("t", "after-the-moves", 1)).applied


async def test_replace_a_dead_member_under_load() -> None:
    async with cluster_and_client(4, extra_args=ARGS) as (cluster, client):
        urls = [n.url for n in cluster.nodes.values() if n.id != "n3"]
        load = Load(client, urls, "r")
        load.start()
        await asyncio.sleep(1.0)
        await cluster.nodes["n3"].kill()  # its disk is gone: a new node takes its ranges
        n5 = cluster.add_node("n5", join=["n2", "n1"], replaces="n3")
        await n5.start()
        await wait_until(lambda: settled(client, [*urls, n5.url], 3), timeout=40,
                         what="n5 normal, n3 left")
        await load.finish()
        view = await ring(client, n5.url)
        states = {m["id"]: m["state"] for m in view["members"]}
        assert states["n3"] == "left" and states["n5"] == "normal"
        await check_counts(client, cluster, load)


async def test_kill_9_of_the_joining_node_mid_move_then_the_move_resumes() -> None:
    async with cluster_and_client(3, extra_args=ARGS) as (cluster, client):
        urls = [n.url for n in cluster.nodes.values()]
        load = Load(client, urls, "k")
        load.start()
        n4 = cluster.add_node("n4", join=["n2"])
        await n4.start()
        await asyncio.sleep(1.0)
        await n4.kill()
        await asyncio.sleep(8.0)  # past the move's hold: it cannot finish without n4
        view = await ring(client, urls[0])
        assert view["version"] == 2 and view["move"]["joining"] == "n4"
        assert {m["id"]: m["state"] for m in view["members"]}["n4"] == "down"
        await n4.start()  # same data dir: it resumes as the joining member
        await wait_until(lambda: settled(client, [*urls, n4.url], 3), timeout=40,
                         what="the move finished after n4 came back")
        await load.finish()
        await check_counts(client, cluster, load)


async def test_a_join_can_be_aborted_and_membership_needs_the_secret() -> None:
    async with cluster_and_client(3, extra_args=ARGS) as (cluster, client):
        n2 = cluster.nodes["n2"]
        no_secret = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster", "decommission", "n1", "--via", n2.address,
            "--timeout", "5", stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(no_secret.communicate(), 30)
        assert no_secret.returncode == 1 and b"error: decommission n1" in err, err
        assert (await ring(client, n2.url))["version"] == 1  # nothing changed
        from cluster import admin

        with pytest.raises(admin.AdminError, match="a move finishes by itself"):
            await admin.ask([(n2.host, n2.port)], "admin-test", str(cluster.secret_file),
                            {"op": "change", "change": "finish", "version": 1})

        again = cluster.add_node("n2x", join=["n1"])
        again.args[again.args.index("n2x")] = "n2"  # an id that is a member already
        with pytest.raises(RuntimeError, match="already a member"):
            await again.start()

        n4 = cluster.add_node("n4", join=["n1"])
        await n4.start()
        await n4.kill()  # its machine is gone for good: abort the join
        dec = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster", "decommission", "n4", "--via", n2.address,
            "--secret-file", str(cluster.secret_file), "--timeout", "30",
            stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(dec.communicate(), 60)
        assert dec.returncode == 0, out
        view = await ring(client, n2.url)
        assert view["move"] is None and view["version"] == 3
        assert {m["id"]: m["state"] for m in view["members"]}["n4"] == "left"


async def test_kill_9_of_the_leaving_node_and_the_claimant_mid_move() -> None:
    """The leaving node and the claimant die mid-move: the move finishes once the members
    gaining keys are up (the next live member drives it), the decommission command returns 0,
    and the leaving node, restarted on its data dir, learns it left and exits 0."""
    async with cluster_and_client(4, extra_args=ARGS) as (cluster, client):
        n1, n2, n3, n4 = (cluster.nodes[f"n{i}"] for i in range(1, 5))
        load = Load(client, [n2.url, n3.url], "l")
        load.start()
        dec = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster", "decommission", "n4", "--via", n2.address,
            "--secret-file", str(cluster.secret_file), "--timeout", "90",
            stdout=asyncio.subprocess.PIPE)
        await wait_until(lambda: _moving(client, n2.url), timeout=20, what="n4 leaving")
        await n1.kill()
        await n4.kill()
        await asyncio.sleep(3.0)
        await n1.start()
        await wait_until(lambda: settled(client, [n1.url, n2.url, n3.url], 3), timeout=40,
                         what="the move finished without the leaving node")
        out, _ = await asyncio.wait_for(dec.communicate(), 60)
        assert dec.returncode == 0, out
        await n4.start()  # its saved ring says leaving: a heartbeat tells it it left
        assert n4.proc is not None
        assert await asyncio.wait_for(n4.proc.wait(), 30) == 0
        await load.finish()
        await check_counts(client, cluster, load)


async def _moving(client: Client, url: str) -> bool:
    return (await ring(client, url))["move"] is not None


async def test_a_node_that_lost_its_disk_never_reuses_an_origin() -> None:
    """n3's disk is wiped and it restarts with the same command (--peers, same id): it takes
    an incarnation above every one its peers hold pairs of, so what it counts from then on is
    not hidden under its past life's higher copies (max-merge), and every count stays exact."""
    import shutil

    from cluster.core.ring import Ring

    async with cluster_and_client(3) as (cluster, client):
        n3 = cluster.nodes["n3"]
        ring3 = Ring(["n1", "n2", "n3"], rf=3)
        keys = [k for k in (f"w{i}" for i in range(200)) if ring3.leader("t", k) == "n3"][:5]
        expected: Counter[str] = Counter()

        async def write(prefix: str) -> None:
            for i in range(30):
                key = keys[i % len(keys)]
                status, _ = await client.add(n3.url, "t", key, f"{prefix}:{i}", 1)
                assert status == 200
                expected[key] += 1

        await write("before")
        assert (await client.get(f"{n3.url}/v1/health"))[1]["origin"] == "n3@1"
        await n3.kill()
        shutil.rmtree(n3.data_dir)
        await n3.start()
        assert (await client.get(f"{n3.url}/v1/health"))[1]["origin"] == "n3@2"
        await write("after")  # led by n3 again, from 0 under its new origin

        async def exact() -> bool:
            for k in keys:
                values = [await client.value(n.url, "t", k, "one")
                          for n in cluster.nodes.values()]
                if values != [expected[k]] * 3:
                    return False
            return True

        await wait_until(exact, timeout=30, what="every replica exact")


async def test_a_tls_cluster_is_joined_and_drained_over_tls(tmp_path: Path) -> None:
    """Nodes whose port speaks TLS: a node joins with the same TLS flags (it dials the seeds
    as its peers do), and ``python -m cluster decommission --tls-ca`` drains it. Without TLS
    the command cannot reach the cluster, says so, and changes nothing."""
    import ssl

    import aiohttp

    paths = write_certs(tmp_path)
    tls = ["--tls-cert", paths["cert"], "--tls-key", paths["key"], "--tls-ca", paths["ca"]]
    ctx = ssl.create_default_context(cafile=paths["ca"])
    async with (running_cluster(3, extra_args=[*ARGS, *tls]) as cluster,
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s):
        n4 = cluster.add_node("n4", join=["n1"])
        await n4.start()  # READY: admitted by the claimant, over TLS

        async def states() -> dict[str, str]:
            async with s.get(f"https://{cluster.nodes['n2'].address}/v1/ring") as r:
                view = await r.json()
            return {m["id"]: m["state"] for m in view["members"]} if view["move"] is None \
                else {}

        async def joined() -> bool:
            return (await states()).get("n4") == "normal"

        await wait_until(joined, timeout=40, what="n4 normal")

        def decommission(node: str, *flags: str) -> Any:
            return asyncio.create_subprocess_exec(
                sys.executable, "-m", "cluster", "decommission", node, "--via",
                cluster.nodes["n2"].address, "--secret-file", str(cluster.secret_file),
                "--timeout", "60", *flags, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)

        plain = await decommission("n3")
        _out, err = await asyncio.wait_for(plain.communicate(), 60)
        assert plain.returncode == 1 and b"error: decommission n3" in err, err
        assert (await states())["n3"] == "normal"
        dec = await decommission("n4", "--tls-ca", paths["ca"])
        out, err = await asyncio.wait_for(dec.communicate(), 90)
        assert dec.returncode == 0, out + err
        assert b"n4: left on every member" in out
        assert n4.proc is not None and await asyncio.wait_for(n4.proc.wait(), 30) == 0
