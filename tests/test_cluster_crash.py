"""Real nodes, kill -9 and restart: acked ops survive, their retries are still caught, and a torn
log tail is survived."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from cluster_util import Client, running_cluster, wait_until

from cluster.core.ring import Ring
from cluster.local import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RING = Ring(["n1", "n2", "n3"], rf=3)


async def write_acked(client: Client, cluster: LocalCluster, table: str, n: int,
                      prefix: str, keys: list[str]) -> dict[str, int]:
    """Send ``n`` ops round-robin over coordinators; returns the expected value per key."""
    expected: dict[str, int] = {}

    async def one(i: int) -> None:
        key = keys[i % len(keys)]
        status, body = await client.add(cluster.urls[i % 3], table, key, f"{prefix}:{i}", i + 1)
        assert (status, body) == (200, {"applied": True})
        expected[key] = expected.get(key, 0) + i + 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return expected


async def check_counts_and_retries(client: Client, cluster: LocalCluster, table: str,
                                   expected: dict[str, int], prefix: str, n: int,
                                   keys: list[str]) -> None:
    for key, value in expected.items():
        for url in cluster.urls:
            assert await client.value(url, table, key, "all") == value, (url, key)
    # every retry, through every coordinator, is answered duplicate and changes nothing
    for i in range(n):
        for url in cluster.urls:
            status, body = await client.add(url, table, keys[i % len(keys)], f"{prefix}:{i}",
                                            i + 1, attempt=2)
            assert (status, body) == (200, {"applied": False, "duplicate": True}), (i, url)
    for key, value in expected.items():
        assert await client.value(cluster.urls[0], table, key, "all") == value

    async def one_reads_agree() -> bool:
        for key, value in expected.items():
            for url in cluster.urls:
                if await client.value(url, table, key, "one") != value:
                    return False
        return True

    await wait_until(one_reads_agree, 10.0, "consistency=one reads to agree everywhere")


async def test_kill9_after_acks_then_restart() -> None:
    keys = [f"k{i}" for i in range(9)]
    client = Client()
    try:
        async with running_cluster(3, rf=3) as cluster:
            expected = await write_acked(client, cluster, "crash", 90, "a", keys)
            await cluster.nodes["n1"].kill()  # kill -9 right after the acks
            await cluster.nodes["n1"].start()
            await check_counts_and_retries(client, cluster, "crash", expected, "a", 90, keys)
            # and it keeps working after the restart: new ops from the new incarnation add up
            more = await write_acked(client, cluster, "crash", 30, "b", keys)
            for key in keys:
                value = expected.get(key, 0) + more.get(key, 0)
                assert await client.value(cluster.urls[0], "crash", key, "all") == value
    finally:
        await client.close()


def active_segment(data_dir: Path) -> Path:
    segments = sorted((data_dir / "log").glob("log-*.wal"))
    assert segments, f"no log segment in {data_dir}"
    return segments[-1]


def last_record_start(buf: bytes) -> int:
    """Offset of the last ``[u32 len][u32 crc][payload]`` record in a segment."""
    off, last = 0, -1
    while off + 8 <= len(buf):
        (length,) = struct.unpack_from("<I", buf, off)
        if off + 8 + length > len(buf):
            break
        last, off = off, off + 8 + length
    assert last >= 0
    return last


async def test_torn_log_tail_is_survived() -> None:
    # the last writes are led by other nodes, so n1's last records are replicas of ops that
    # the leader and the third replica hold durably
    keys = [f"t{i}" for i in range(200) if RING.leader("torn", f"t{i}") != "n1"][:6]
    client = Client()
    try:
        async with running_cluster(3, rf=3) as cluster:
            expected = await write_acked(client, cluster, "torn", 60, "t", keys)
            node = cluster.nodes["n1"]
            await node.kill()
            segment = active_segment(node.data_dir)
            data = segment.read_bytes()
            cut = last_record_start(data) + 11  # inside the last record's payload
            with open(segment, "r+b") as f:
                f.truncate(cut)
            await node.start()  # READY means it recovered, dropping the torn record
            await check_counts_and_retries(client, cluster, "torn", expected, "t", 60, keys)
            # a second crash, this time with garbage after the last good record
            await node.kill()
            with open(active_segment(node.data_dir), "ab") as f:
                f.write(struct.pack("<II", 4000, 0xDEADBEEF) + b"partial")
            await node.start()
            await check_counts_and_retries(client, cluster, "torn", expected, "t", 60, keys)
    finally:
        await client.close()


async def test_sigterm_drains_and_exits_zero() -> None:
    client = Client()
    try:
        async with running_cluster(3, rf=3) as cluster:
            await write_acked(client, cluster, "term", 10, "s", ["a", "b"])
            code = await cluster.nodes["n2"].stop(timeout=10)
            assert code == 0
            await cluster.nodes["n2"].start()
            assert await client.value(cluster.urls[1], "term", "a", "one") == sum(
                i + 1 for i in range(0, 10, 2))
    finally:
        await client.close()
