"""A leader frozen (SIGSTOP, a stolen VM) between applying an op and sending its copies wakes
and sends them after the window: the fences another leader's application left on the replicas
last the window, so a copy that old is refused unless it brings nothing new or the op is
claimed for its own leader (a publication after settling). Three nodes in one event loop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_fault_inprocess import cluster, key_with

from cluster.transport.wire import Kind

pytestmark = pytest.mark.timeout(60)


async def test_a_copy_older_than_the_window_is_refused_unless_it_brings_nothing_new(
        tmp_path: Path) -> None:
    key = key_with(("n1", "n2", "n3"))
    async with cluster(tmp_path) as c:
        n1, n3 = c.servers["n1"].node, c.servers["n3"].node
        window = n3.state.window("t")
        late = time.time() - window - 0.5  # applied by its leader longer ago than the window
        fresh = time.time()
        # the other leader's application, a while ago: its fence here has long expired
        assert await c.servers["n2"].node.links["n3"].call(
            Kind.REPLICATE, [["y:1", "t", key, c.servers["n2"].node.origin, 4, 0, 4, fresh]]
        ) is None
        assert n3.state.shards.entry("t", key).value() == 4
        copy = [["x:1", "t", key, n1.origin, 5, 0, 5, late],
                ["x:2", "t", key, n1.origin, 6, 0, 1, fresh]]  # carries x:1 in its pair
        assert await n1.links["n3"].call(Kind.REPLICATE, copy) is False
        assert n3.state.shards.entry("t", key).value() == 4  # nothing of n1's merged
        assert b"x:1" not in n3.state.dedup("t")
        # the same pair once held here (merged fresh), then again late: nothing new, taken
        assert await n1.links["n3"].call(
            Kind.REPLICATE, [["x:1", "t", key, n1.origin, 5, 0, 5, fresh]]) is None
        assert await n1.links["n3"].call(Kind.REPLICATE, copy[:1]) is None
        assert n3.state.shards.entry("t", key).value() == 9
        # an op n1 settles past its window goes with the claim its HOLDS took here
        assert n3.claims.take("x:3", "n1", window)
        assert await n1.links["n3"].call(
            Kind.REPLICATE, [["x:3", "t", key, n1.origin, 8, 0, 3, late]]) is None
        assert n3.state.shards.entry("t", key).value() == 12
