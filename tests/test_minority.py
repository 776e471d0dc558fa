"""A node that hears from no majority of the membership's voters leads nothing: the other side
of the cut may agree on a new membership and move keys away, and writes acknowledged at the old
version would miss the move. Five nodes in one event loop, cut 2 | 3 with the peer transport's
fault hook; before this rule the two nodes acknowledged writes to keys whose write set they
held two of."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_util import Client
from test_fault_inprocess import converged, retry_until_acked, sees_down
from test_staged_copies import NAMES, Cluster5, cluster5

pytestmark = pytest.mark.timeout(90)


def key_led_by(c: Cluster5, first_two: set[str]) -> str:
    ring = c.servers["n1"].node.ring
    return next(f"k{i}" for i in range(100_000)
                if set(ring.preference_list("t", f"k{i}")[:2]) == first_two)


async def test_the_minority_side_of_a_cut_acknowledges_nothing(tmp_path: Path) -> None:
    client = Client()
    try:
        async with cluster5(tmp_path, rf=3, write_quorum=2) as c:
            minority_key = key_led_by(c, {"n1", "n2"})  # two of its three replicas there
            majority_key = key_led_by(c, {"n3", "n4"})
            for key in (minority_key, majority_key):
                assert (await client.add(c.url("n1"), "t", key, f"{key}:1", 2))[0] == 200
            small = {"n1", "n2"}
            for a in NAMES:
                for b in NAMES:
                    if a != b and (a in small) != (b in small):
                        c.drop(a, b)
            for a, b in (("n1", "n3"), ("n1", "n4"), ("n1", "n5"), ("n2", "n3"), ("n3", "n1")):
                await sees_down(c, a, b)  # type: ignore[arg-type]
            status, body = await client.add(c.url("n1"), "t", minority_key,
                                            f"{minority_key}:2", 5)
            assert status == 503, (status, body)
            assert c.servers["n1"].node.metrics.minority_refusals >= 1
            # so are reads that promise every acknowledged write; one replica's view is served
            for consistency, want in (("quorum", 503), ("all", 503), ("one", 200)):
                status, body = await client.get(f"{c.url('n1')}/v1/counters/t/{minority_key}"
                                                f"?consistency={consistency}")
                assert status == want, (consistency, status, body)
            # the big side goes on
            assert (await client.add(c.url("n3"), "t", majority_key,
                                     f"{majority_key}:2", 5))[0] == 200
            c.heal()
            for key, value in ((minority_key, 2), (majority_key, 7)):
                await converged(c, client, key, value, timeout=20.0)  # type: ignore[arg-type]
            # the refused add was not applied: its retry applies it once
            assert await retry_until_acked(client, c.url("n2"), minority_key,
                                           f"{minority_key}:2", 5) == {"applied": True}
            await converged(c, client, minority_key, 7, timeout=20.0)  # type: ignore[arg-type]
    finally:
        await client.close()
