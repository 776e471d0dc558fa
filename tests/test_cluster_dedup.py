"""Real node processes: duplicates sent to different coordinators count once; replicas converge."""

from __future__ import annotations

import asyncio
import random

import pytest
import pytest_asyncio
from cluster_util import Client, running_cluster, wait_until

import cluster.wal.committer as wal_committer
from cluster.core import batch_kernel, store_kernel
from cluster.core.fbf import hotpath
from cluster.local import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90),
              pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster():  # type: ignore[no-untyped-def]
    async with running_cluster(3, rf=3) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def client():  # type: ignore[no-untyped-def]
    c = Client()
    yield c
    await c.close()


async def test_duplicates_to_different_coordinators_count_once(
        cluster: LocalCluster, client: Client) -> None:
    urls = cluster.urls
    rng = random.Random(7)
    expected: dict[str, int] = {}
    for i in range(60):
        key = f"k{i % 12}"
        delta = rng.choice([1, 2, 5, -3])
        first, second, third = rng.sample(urls, 3)
        status, body = await client.add(first, "dup", key, f"c1:{i}", delta)
        assert (status, body) == (200, {"applied": True})
        status, body = await client.add(second, "dup", key, f"c1:{i}", delta, attempt=2)
        assert (status, body) == (200, {"applied": False, "duplicate": True})
        status, body = await client.batch(third, [{"table": "dup", "key": key,
                                                   "op_id": f"c1:{i}", "delta": delta}])
        assert status == 200 and body["results"] == [{"applied": False, "duplicate": True}]
        expected[key] = expected.get(key, 0) + delta
    for key, value in expected.items():
        for url in urls:
            assert await client.value(url, "dup", key, "all") == value
            assert await client.value(url, "dup", key, "quorum") == value
    # after the all-reads (which repair), every replica holds the same value locally
    for key, value in expected.items():
        assert [await client.value(url, "dup", key, "one") for url in urls] == [value] * 3


async def test_batch_results_in_order_with_duplicates_inside(
        cluster: LocalCluster, client: Client) -> None:
    ops = [{"table": "b", "key": f"k{i % 5}", "op_id": f"b1:{i}", "delta": 1} for i in range(40)]
    ops.insert(10, dict(ops[3]))  # a duplicate inside the batch
    status, body = await client.batch(cluster.urls[0], ops)
    assert status == 200
    results = body["results"]
    assert len(results) == 41
    assert results[10] == {"applied": False, "duplicate": True}
    assert all(r == {"applied": True} for i, r in enumerate(results) if i != 10)
    status, body = await client.batch(cluster.urls[1], ops)
    assert all(r == {"applied": False, "duplicate": True} for r in body["results"])
    total = sum([await client.value(cluster.urls[2], "b", f"k{i}", "all") for i in range(5)])
    assert total == 40


async def test_replicas_converge_under_concurrent_writes(
        cluster: LocalCluster, client: Client) -> None:
    async def writer(w: int) -> None:
        for i in range(50):
            url = cluster.urls[(w + i) % 3]
            status, _ = await client.add(url, "conv", f"k{i % 4}", f"w{w}:{i}", 1)
            assert status == 200

    await asyncio.gather(*(writer(w) for w in range(6)))

    async def converged() -> bool:
        values = [await client.value(u, "conv", f"k{i}", "one") for u in cluster.urls
                  for i in range(4)]
        return values == [78, 78, 72, 72] * 3  # 50 ops over 4 keys, from 6 writers

    await wait_until(converged, 10.0, "replicas to converge")


async def test_health_and_metrics(cluster: LocalCluster, client: Client) -> None:
    status, body = await client.get(cluster.urls[0] + "/v1/health")
    assert status == 200
    assert body["node"] == "n1" and body["status"] == "ok"
    assert body["members"] == ["n1", "n2", "n3"] and body["rf"] == 3
    assert body["window_s"] > 0
    async with client.session.get(cluster.urls[0] + "/metrics") as resp:
        text = await resp.text()
        assert resp.status == 200
    for name in ("idc_applied_total", "idc_duplicates_total", "idc_log_fsync_seconds_bucket",
                 "idc_request_seconds_bucket", "idc_dedup_estimated_fpp", "idc_fbf_n_past",
                 "idc_fbf_period_seconds", "idc_fbf_fill", "idc_replication_pending",
                 "idc_antientropy_rounds_total", "idc_antientropy_bytes_total"):
        assert name in text, name
    assert f'idc_fbf_kernel_info{{kernel="{hotpath.KERNEL}"}} 1' in text
    assert f'idc_store_kernel_info{{kernel="{store_kernel.KERNEL}"}} 1' in text
    assert f'idc_batch_kernel_info{{kernel="{batch_kernel.KERNEL}"}} 1' in text
    writer = "c" if wal_committer._native is not None else "python"  # the cluster fsyncs
    assert f'idc_log_writer_info{{writer="{writer}"}} 1' in text
    assert "idc_loop_lag_seconds_count " in text

    async def lag_sampled() -> bool:  # the loop-lag timer runs from the start, ten a second
        async with client.session.get(cluster.urls[0] + "/metrics") as resp:
            lines = (await resp.text()).splitlines()
        return any(ln.startswith("idc_loop_lag_seconds_count ") and float(ln.split()[1]) > 0
                   for ln in lines)

    await wait_until(lag_sampled, 5.0, "a loop-lag sample")
