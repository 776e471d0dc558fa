"""A node whose clock is far off (IDC_CLOCK_OFFSET, test only) refuses to count; the others go
on; the counts stay exact. Real node processes on loopback, free ports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cluster_util import Client, running_cluster, wait_until

from cluster.core.clock import OFFSET_ENV
from cluster.core.ring import Ring
from cluster.local import LocalCluster

pytestmark = pytest.mark.timeout(120)

KEYS = [f"k{i}" for i in range(12)]


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert m is not None, f"{name}{labels} not in /metrics"
    return float(m.group(1))


async def health(client: Client, url: str) -> dict:
    status, body = await client.get(f"{url}/v1/health")
    assert status == 200, (status, body)
    return body


async def restart(cluster: LocalCluster, node_id: str, offset: float) -> None:
    node = cluster.nodes[node_id]
    assert await node.stop() == 0
    node.env = {OFFSET_ENV: str(offset)} if offset else {}
    await node.start(timeout=30)


async def test_a_node_far_off_refuses_the_others_count_exactly(tmp_path: Path) -> None:
    """n1 restarted 4 s behind (the tolerance is max_clock_skew, 1 s): it refuses every op with
    503 clock_skew, n2 and n3 lead its keys, retries stay duplicates; restored, it counts again
    and every replica ends exact. (Behind rather than ahead, so that the peers' links to it come
    up at once: a node ahead by d refuses its peers' HELLOs for d seconds after it starts,
    since they look older than its start, cluster.transport.auth.)"""
    ring = Ring(["n1", "n2", "n3"], rf=3)
    assert any(ring.preference_list("t", k)[0] == "n1" for k in KEYS)  # n1 leads some keys
    client = Client()
    try:
        async with running_cluster(3, data_dir=tmp_path, extra_args=["--no-fsync"]) as cluster:
            n1, n2, n3 = (cluster.nodes[i].url for i in ("n1", "n2", "n3"))
            expected: dict[str, int] = {}
            for i, key in enumerate(KEYS):  # before: n1 counts like the others
                status, body = await client.add(n1, "t", key, f"a:{i}", 10)
                assert status == 200 and body == {"applied": True}, (key, status, body)
                expected[key] = 10
            await restart(cluster, "n1", -4.0)

            async def settled() -> bool:
                h1, h2, h3 = [await health(client, u) for u in (n1, n2, n3)]
                # (n1's links come up once its clock passes the peers' start: HELLO)
                return (h1["clock"]["refusing"] and not h2["clock"]["refusing"]
                        and not h3["clock"]["refusing"]
                        and not h2["live"]["n1"] and not h3["live"]["n1"]
                        and len(h1["clock"]["peer_offsets_s"]) == 2
                        and "n1" in h2["clock"]["peer_offsets_s"])
            await wait_until(settled, timeout=20, what="n1 refusing, the others routing around it")

            h1, h2 = await health(client, n1), await health(client, n2)
            assert h1["clock"]["peer_offsets_s"]["n2"] == pytest.approx(4.0, abs=0.2)
            assert h2["clock"]["peer_offsets_s"]["n1"] == pytest.approx(-4.0, abs=0.2)
            assert h2["clock"]["peer_offsets_s"]["n3"] == pytest.approx(0.0, abs=0.2)

            # n1 counts nothing: every op answers 503 clock_skew, a single op or a batch
            for i, key in enumerate(KEYS):
                status, body = await client.add(n1, "t", key, f"c:{i}", i + 1)
                assert status == 503 and body["error"]["code"] == "clock_skew", body
                status, body = await client.add(n1, "t", key, f"a:{i}", 10, attempt=2)
                assert status == 503 and body["error"]["code"] == "clock_skew", body
            status, body = await client.batch(n1, [{"table": "t", "key": "k0", "op_id": "c:b",
                                                    "delta": 100}])
            assert status == 503 and body["error"]["code"] == "clock_skew", body

            # the same ops through n2 and n3 count once, retries included
            for i, key in enumerate(KEYS):
                via, other = (n2, n3) if i % 2 else (n3, n2)
                status, body = await client.add(via, "t", key, f"c:{i}", i + 1)
                assert status == 200 and body == {"applied": True}, (key, status, body)
                expected[key] += i + 1
                for op_id, delta in ((f"c:{i}", i + 1), (f"a:{i}", 10)):
                    status, body = await client.add(other, "t", key, op_id, delta, attempt=2)
                    assert status == 200 and body.get("duplicate") is True, (key, status, body)
            for key in KEYS:
                assert await client.value(n2, "t", key, "quorum") == expected[key]

            _, text = await client.get(f"{n1}/metrics")
            text = text.decode() if isinstance(text, bytes) else text
            assert metric(text, "idc_clock_refusing") == 1
            assert metric(text, "idc_clock_skew_refusals_total") >= 2 * len(KEYS) + 1
            assert metric(text, "idc_applied_total") == 0
            offset = metric(text, "idc_peer_clock_offset_seconds", '{peer="n3"}')
            assert offset == pytest.approx(4.0, abs=0.2)

            # restored: n1 restarts on its data with the machine's clock and counts again
            await restart(cluster, "n1", 0.0)

            async def counting() -> bool:
                h1 = await health(client, n1)
                h2 = await health(client, n2)
                return (h1["status"] == "ok" and not h1["clock"]["refusing"]
                        and h2["live"]["n1"] and "n2" in h1["clock"]["peer_offsets_s"])
            await wait_until(counting, timeout=20, what="n1 counting again")
            for i, key in enumerate(KEYS):  # retries at n1 are duplicates, new ops count
                status, body = await client.add(n1, "t", key, f"c:{i}", i + 1, attempt=3)
                assert status == 200 and body.get("duplicate") is True, (key, status, body)
                status, body = await client.add(n1, "t", key, f"d:{i}", 1)
                assert status == 200 and body == {"applied": True}, (key, status, body)
                expected[key] += 1

            async def converged() -> bool:
                for key in KEYS:
                    for url in (n1, n2, n3):
                        if await client.value(url, "t", key, "one") != expected[key]:
                            return False
                return True
            await wait_until(converged, timeout=20, what="every replica exact")
    finally:
        await client.close()
