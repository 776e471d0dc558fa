"""The SDK against real node processes, with the fault proxy where a fault is needed."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from client import (
    BadRequestError,
    CounterClient,
    DeadlineExceededError,
    NotAppliedError,
    OpExpiredError,
    OutcomeUnknownError,
    SyncCounterClient,
)
from client.proxy import Proxy, ProxyServer
from client.retry import PendingOp
from cluster.local import LocalCluster, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90),
              pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[LocalCluster]:
    c = LocalCluster(3)
    await c.start()
    try:
        yield c
    finally:
        try:
            await asyncio.wait_for(c.stop(timeout=5.0), 20.0)
        finally:
            await c.abort()


@pytest_asyncio.fixture(loop_scope="module")
async def proxies(cluster: LocalCluster) -> AsyncIterator[list[Proxy]]:
    async with ProxyServer(seed=11) as srv:
        yield [await srv.create(n.id, "127.0.0.1:0", n.address, protocol="http")
               for n in cluster.nodes.values()]


async def values(c: CounterClient, cluster: LocalCluster, table: str, key: str) -> list[int]:
    return [await c.get(table, key, "one", node=u) for u in cluster.urls]


async def test_incr_decr_get_batch_and_stats(cluster: LocalCluster) -> None:
    async with CounterClient(cluster.urls) as c:
        r = await c.incr("sdk", "a")
        assert r.applied and not r.duplicate and r.attempts == 1
        assert r.op_id.startswith(c.client_id + ":")
        await c.decr("sdk", "a", 3)
        await c.add("sdk", "a", 10)
        assert await c.get("sdk", "a") == 8
        results = await c.batch([("sdk", "b", 2), ("sdk", "c", -1)])
        assert [x.applied for x in results] == [True, True]  # type: ignore[union-attr]
        assert await c.get("sdk", "b", "all") == 2
        assert c.window_s == 10.0 and 0 < c.op_budget < c.window_s
        assert (c.stats.ops, c.stats.acknowledged, c.stats.failures) == (5, 5, 0)


async def test_bad_input_is_rejected_before_an_id_is_spent(cluster: LocalCluster) -> None:
    async with CounterClient(cluster.urls) as c:
        with pytest.raises(BadRequestError, match="table"):
            await c.incr("bad table", "k")
        with pytest.raises(BadRequestError, match="delta"):
            await c.add("t", "k", 1 << 70)
        assert c.opids is not None and c.opids.next_seq == 0


async def test_retry_after_lost_ack_counts_once(cluster: LocalCluster,
                                                proxies: list[Proxy]) -> None:
    for p in proxies:
        p.add_toxic(type="lost_ack", toxicity=0.4)
    async with CounterClient([p.url for p in proxies], batch_interval=0,
                             attempt_timeout=1.0, rng=random.Random(1)) as c:
        results = await asyncio.gather(*(c.incr("lostack", f"k{i % 4}") for i in range(60)))
        assert all(r.applied or r.duplicate for r in results)
        assert c.stats.duplicates >= 5 and c.stats.retries >= c.stats.duplicates
        assert sum([await c.get("lostack", f"k{i}", "all") for i in range(4)]) == 60
    assert sum(p.counters["lost_ack_downstream"] for p in proxies) >= 5


async def test_duplicated_and_dropped_requests_count_once(cluster: LocalCluster,
                                                          proxies: list[Proxy]) -> None:
    for p in proxies:
        p.add_toxic(type="duplicate", toxicity=0.5)
        p.add_toxic(type="drop", toxicity=0.2, attributes={"mode": "close"})
    async with CounterClient([p.url for p in proxies], attempt_timeout=1.0) as c:
        await asyncio.gather(*(c.incr("dupdrop", "k") for _ in range(80)))
        assert c.stats.acknowledged == 80
        assert await c.get("dupdrop", "k", "all") == 80


async def test_deadline_gives_outcome_unknown(cluster: LocalCluster,
                                             proxies: list[Proxy]) -> None:
    for p in proxies:
        p.add_toxic(type="lost_ack")  # every answer lost: the op is applied, never confirmed
    async with CounterClient([p.url for p in proxies], batch_interval=0, total_timeout=0.8,
                             attempt_timeout=0.2) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError) as exc:
            await c.incr("deadline", "k")
        assert isinstance(exc.value, OutcomeUnknownError) and exc.value.applied is None
        assert time.monotonic() - start < 2.0 and exc.value.attempts >= 2
        assert c.stats.unknown == 1
    async with CounterClient(cluster.urls) as c:
        assert await c.get("deadline", "k", "all") == 1  # retries were recognised


async def test_unreachable_nodes_give_not_applied(cluster: LocalCluster) -> None:
    dead = [f"127.0.0.1:{p}" for p in free_ports(2)]
    async with CounterClient(dead, total_timeout=0.5, batch_interval=0) as c:
        with pytest.raises(NotAppliedError) as exc:
            await c.incr("dead", "k")
        assert exc.value.applied is False and exc.value.retriable
        assert c.stats.errors["ConnectFailedError"] >= 2


async def test_failover_past_a_dead_seed(cluster: LocalCluster) -> None:
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    async with CounterClient([dead, *cluster.urls], batch_interval=0) as c:
        for _ in range(6):
            await c.incr("failover", "k")
        assert await c.get("failover", "k") == 6


async def test_op_expired_is_outcome_unknown_only_when_an_attempt_may_have_landed(
        cluster: LocalCluster) -> None:
    async with CounterClient(cluster.urls, batch_interval=0) as c:
        now = time.monotonic()
        fresh = PendingOp("exp", "k", 1, f"{c.client_id}:x1", now - 60, now + 5)
        fut1 = asyncio.get_running_loop().create_future()
        fresh.waiters.append(fut1)
        await c.retry.run([fresh])
        with pytest.raises(NotAppliedError):
            fut1.result()
        retried = PendingOp("exp", "k", 1, f"{c.client_id}:x2", now - 60, now + 5)
        retried.maybe_sent = True
        fut2 = asyncio.get_running_loop().create_future()
        retried.waiters.append(fut2)
        await c.retry.run([retried])
        with pytest.raises(OpExpiredError):
            fut2.result()
        assert await c.get("exp", "k", "all") == 0


async def test_batching_sends_fewer_requests(cluster: LocalCluster) -> None:
    async with CounterClient(cluster.urls, batch_interval=0.005) as c:
        await asyncio.gather(*(c.incr("batching", f"k{i % 7}") for i in range(300)))
        batched = c.stats.http_requests
    async with CounterClient(cluster.urls, batch_interval=0) as c:
        await asyncio.gather(*(c.incr("batching", f"k{i % 7}") for i in range(300)))
        single = c.stats.http_requests
        assert sum([await c.get("batching", f"k{i}") for i in range(7)]) == 600
    assert batched <= 20 and single >= 300


async def _forwarded(cluster: LocalCluster) -> int:
    """Ops the nodes forwarded to another node (the leader), summed from their /metrics."""
    import aiohttp

    total = 0
    async with aiohttp.ClientSession() as s:
        for url in cluster.urls:
            async with s.get(f"{url}/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("idc_forwarded_total "):
                        total += int(float(line.split()[1]))
    return total


async def test_ops_go_straight_to_their_leader(cluster: LocalCluster) -> None:
    """The SDK computes each key's leader from the ring /v1/health publishes and sends the op
    there: no node forwards it. With ``route_to_leader=False`` the coordinators rotate, and
    about two ops in three are forwarded."""
    keys = [f"k{i}" for i in range(30)]
    async with CounterClient(cluster.urls, batch_interval=0) as c:
        assert c.pool.ring is not None and len(c.pool.ring.members) == 3
        before = await _forwarded(cluster)
        await asyncio.gather(*(c.incr("routed", k) for k in keys))
        assert await _forwarded(cluster) == before
        assert c.stats.http_requests >= len(keys)
    async with CounterClient(cluster.urls, batch_interval=0.005) as c:  # batched per leader
        before = await _forwarded(cluster)
        await asyncio.gather(*(c.incr("routed", k) for k in keys))
        assert await _forwarded(cluster) == before
    async with CounterClient(cluster.urls, batch_interval=0, route_to_leader=False) as c:
        before = await _forwarded(cluster)
        await asyncio.gather(*(c.incr("routed", k) for k in keys))
        assert await _forwarded(cluster) > before
        assert [await c.get("routed", k) for k in keys] == [3] * len(keys)


async def test_coalescing_merges_adds_to_one_key(cluster: LocalCluster) -> None:
    async with CounterClient(cluster.urls, batch_interval=0.01, coalesce=True) as c:
        results = await asyncio.gather(*(c.add("coalesce", f"k{i % 2}", 1 + i % 3)
                                         for i in range(100)))
        assert c.stats.sent_ops <= 6 and c.stats.coalesced >= 94
        assert len({r.op_id for r in results}) == c.stats.sent_ops
        assert await c.get("coalesce", "k0") + await c.get("coalesce", "k1") == \
            sum(1 + i % 3 for i in range(100))


async def test_high_water_mark_survives_restart_and_crash(cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    state = tmp_path / "client.json"
    async with CounterClient(cluster.urls, state_path=str(state), seq_block=10) as c:
        ids = [(await c.incr("hwm", "k")).op_id for _ in range(3)]
        client_id = c.client_id
        assert json.loads(state.read_text()) == {"client_id": client_id, "next_seq": 10}
    assert [int(i.rsplit(":", 1)[1]) for i in ids] == [0, 1, 2]
    crashed = CounterClient(cluster.urls, state_path=str(state), seq_block=10)
    await crashed.start()
    assert crashed.client_id == client_id
    ids += [(await crashed.incr("hwm", "k")).op_id for _ in range(12)]
    await crashed.abort()  # no graceful stop: only the fsynced reservation remains
    async with CounterClient(cluster.urls, state_path=str(state), seq_block=10) as c:
        nxt = (await c.incr("hwm", "k")).op_id
        assert nxt not in ids and int(nxt.rsplit(":", 1)[1]) == 30
        assert await c.get("hwm", "k", "all") == 16  # nothing was taken for a duplicate


async def test_sync_facade(cluster: LocalCluster) -> None:
    def work() -> tuple[int, int]:
        with SyncCounterClient(cluster.urls) as c:
            c.incr("sync", "k")
            c.incr("sync", "k", 4)
            c.decr("sync", "k")
            return c.get("sync", "k"), c.stats.acknowledged

    assert await asyncio.to_thread(work) == (4, 3)
