"""Anti-entropy scales with the difference, not the data: three nodes in one loop holding many
keys, one cut off while the others take writes, then healed with hinted handoff off, so the
repair is anti-entropy's alone. Every replica ends equal, and the bytes exchanged stay within a
small multiple of the writes missed, far below the dataset."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_util import Client
from test_fault_inprocess import cluster, sees_down, until

from cluster.roles import antientropy

pytestmark = pytest.mark.timeout(90)

KEYS = 20_000
MISSED = 40


def _seed(servers: list, keys: int) -> None:
    """The same entries on every node (as if replicated long ago): the data to not resend."""
    for s in servers:
        store = s.node.state.shards
        for i in range(keys):
            store.merge_pair("t", f"k{i}", "n9", i + 1, 0)


async def test_a_healed_node_gets_about_what_it_missed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the exchanges this test starts run (the nodes' own rounds, on a tick or when a peer
    comes back, are switched off), so the bytes counted are those of one repair."""

    async def no_rounds(node: object, peers: object = None) -> None:
        return None

    monkeypatch.setattr(antientropy, "sync_all", no_rounds)
    client = Client()
    try:
        async with cluster(tmp_path, max_hints=0, antientropy_interval=3600.0) as c:
            servers = [c.servers[n] for n in ("n1", "n2", "n3")]
            _seed(servers, KEYS)
            for s in servers:  # the first rounds rehash the seeded keys: idle from here on
                await antientropy.digests(s.node, "n1")
            # an idle round: digests equal, nothing else sent
            assert await antientropy.sync_with(c.servers["n1"].node, "n3") == 0
            for a in ("n1", "n2"):
                c.fault(a, "n3")
                c.fault("n3", a)
            await sees_down(c, "n1", "n3")
            await sees_down(c, "n2", "n3")
            before = sum(s.node.metrics.antientropy_bytes for s in servers)
            written = [f"k{i * (KEYS // MISSED)}" for i in range(MISSED)]
            for j, key in enumerate(written):
                status, _ = await client.add(c.url("n1" if j % 2 else "n2"), "t", key,
                                             f"w:{j}", 5)
                assert status == 200, status
            n3 = c.servers["n3"].node.state.shards
            assert all(n3.value("t", k) != c.servers["n1"].node.state.shards.value("t", k)
                       for k in written)  # n3 missed every one of them
            c.heal()
            started = time.monotonic()
            for peer in ("n1", "n2"):  # the second finds n3 equal to n2 already
                await antientropy.sync_with(c.servers["n3"].node, peer)

            async def equal() -> bool:
                ref = c.servers["n1"].node.state.shards
                return all(s.node.state.shards.entry("t", k) == ref.entry("t", k)
                           for s in servers for k in written)

            await until(equal, 20.0, "every replica equal on the written keys")
            sent = sum(s.node.metrics.antientropy_bytes for s in servers) - before
            dataset = KEYS * 30  # an entry as msgpack is some 30 bytes here
            # the digests of the levels under the ~MISSED differing buckets and a leaf's
            # worth of entries per missed write, well under 2 KB each; the dataset is 20x that
            assert sent < 2_000 * MISSED, sent
            assert sent < dataset / 5, (sent, dataset)
            assert time.monotonic() - started < 20
    finally:
        await client.close()
