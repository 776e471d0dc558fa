"""A node that hears from no majority of the membership's voters leads nothing: the other side
of the cut may agree on a new membership and move keys away, and writes acknowledged at the old
version would miss the move. Five nodes in one event loop, cut 2 | 3 with the peer transport's
fault hook; before this rule the two nodes acknowledged writes to keys whose write set they
held two of."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from cluster_util import Client
from test_fault_inprocess import converged, retry_until_acked, sees_down

from cluster.core.config import from_mapping
from cluster.local import free_ports
from cluster.server import NodeServer

pytestmark = pytest.mark.timeout(90)

IDS = ("n1", "n2", "n3", "n4", "n5")


class Five:
    def __init__(self, tmp: Path) -> None:
        ports = free_ports(len(IDS))
        peers = ",".join(f"{n}=127.0.0.1:{p}" for n, p in zip(IDS, ports, strict=True))
        base = {"fsync": False, "quorum_timeout": 1.0, "heartbeat_interval": 0.05,
                "failure_timeout": 0.6, "reconcile_timeout": 3.0, "antientropy_interval": 0.5}
        self.cfgs = [from_mapping({"node_id": n, "listen": f"127.0.0.1:{p}", "peers": peers,
                                   "data_dir": str(tmp / n), **base})
                     for n, p in zip(IDS, ports, strict=True)]
        self.servers: dict[str, NodeServer] = {}

    async def start(self) -> None:
        for cfg in self.cfgs:
            self.servers[cfg.node_id] = NodeServer(cfg)
        await asyncio.gather(*(s.start() for s in self.servers.values()))

    def url(self, name: str) -> str:
        addr = self.servers[name].address
        assert addr is not None
        return f"http://{addr[0]}:{addr[1]}"

    def cut(self, side: set[str]) -> None:
        for a in IDS:
            for b in IDS:
                if a != b and (a in side) != (b in side):
                    self.servers[a].node.links[b].fault = lambda kind, items: True

    def heal(self) -> None:
        for s in self.servers.values():
            for link in s.node.links.values():
                link.fault = None

    async def stop(self) -> None:
        for s in self.servers.values():
            with contextlib.suppress(Exception):
                await s.stop()


def key_led_by(c: Five, first_two: set[str]) -> str:
    ring = c.servers["n1"].node.ring
    return next(f"k{i}" for i in range(100_000)
                if set(ring.preference_list("t", f"k{i}")[:2]) == first_two)


async def test_the_minority_side_of_a_cut_acknowledges_nothing(tmp_path: Path) -> None:
    c = Five(tmp_path)
    client = Client()
    try:
        await c.start()
        minority_key = key_led_by(c, {"n1", "n2"})  # two of its three replicas on the small side
        majority_key = key_led_by(c, {"n3", "n4"})
        for key in (minority_key, majority_key):
            assert (await client.add(c.url("n1"), "t", key, f"{key}:1", 2))[0] == 200
        c.cut({"n1", "n2"})
        for a, b in (("n1", "n3"), ("n1", "n4"), ("n1", "n5"), ("n2", "n3"), ("n3", "n1")):
            await sees_down(c, a, b)  # type: ignore[arg-type]
        status, body = await client.add(c.url("n1"), "t", minority_key, f"{minority_key}:2", 5)
        assert status == 503, (status, body)
        assert c.servers["n1"].node.metrics.minority_refusals >= 1
        # the big side goes on
        assert (await client.add(c.url("n3"), "t", majority_key, f"{majority_key}:2", 5))[0] == 200
        c.heal()
        await converged(c, client, minority_key, 2, timeout=20.0)  # type: ignore[arg-type]
        await converged(c, client, majority_key, 7, timeout=20.0)  # type: ignore[arg-type]
        # the refused add was not applied: its retry applies it once
        assert await retry_until_acked(client, c.url("n2"), minority_key, f"{minority_key}:2",
                                       5) == {"applied": True}
        await converged(c, client, minority_key, 7, timeout=20.0)  # type: ignore[arg-type]
    finally:
        await client.close()
        await c.stop()
