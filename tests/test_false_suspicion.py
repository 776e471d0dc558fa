"""A fresh first attempt during a false suspicion: the same op sent, as a first attempt, to the
key's primary (alive, and seeing nobody down: it leads the op unchecked) and at the same moment
to a replica that takes the primary for dead (it leads the op itself, after a check). The two
leaders decide on the third replica: its claim for the checker refuses the primary's copy, or
the primary's copy reached it first and the check finds the op there. Either way the op counts
once. Three nodes in one event loop; the suspicion is forced with the peer transport's fault
hook (``PeerLink.fault``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster_util import Client
from test_fault_inprocess import (
    cluster,
    converged,
    key_with,
    retry_until_acked,
    sees_down,
    until,
)

from cluster.core.ops import Op
from cluster.transport.wire import Kind, Status

pytestmark = pytest.mark.timeout(90)


async def _first_attempts(tmp_path: Path, *, at_once: bool, never_heard: bool = False) -> None:
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n2 = c.servers["n1"].node, c.servers["n2"].node
            # n2's calls to n1 vanish (its heartbeats too): n2 takes n1 for dead, while n1 sees
            # everyone live and leads its keys as ever
            c.fault("n2", "n1")
            if never_heard:  # n2 forgets hearing n1: as if the cut came before the first beat
                n2.detector.remove("n1")
                n2.detector.add("n1")
            await sees_down(c, "n2", "n1")
            assert n1.is_live("n2") and n1.is_live("n3")
            first = client.add(c.url("n1"), "t", key, "hedge:1", 7, attempt=1)
            other = client.add(c.url("n2"), "t", key, "hedge:1", 7, attempt=1)
            if at_once:
                answers = list(await asyncio.gather(first, other))
            else:  # n2 applied it (its copy never reached n1) before n1 reads its copy
                answers = [await other]
                assert answers[0] == (200, {"applied": True})
                answers.append(await first)
                # n1 applied its copy unchecked; n2 and n3 refused it (n3's claim for n2's
                # check, n2's own application): in doubt at n1, never acknowledged
                assert answers[1][0] == 503, answers
                assert n2.metrics.fenced + c.servers["n3"].node.metrics.fenced >= 1
            assert [b.get("applied") for s, b in answers if s == 200].count(True) <= 1, answers
            assert n2.metrics.retry_checks >= 1  # the replica that suspected n1 checked
            c.heal()
            await until(lambda: _settled(c), 20.0, "no op in doubt")
            await converged(c, client, key, 7, timeout=20.0)
            # every later copy of the op is a duplicate, wherever it lands
            for n in ("n1", "n2", "n3"):
                assert await retry_until_acked(client, c.url(n), key, "hedge:1", 7) == {
                    "applied": False, "duplicate": True}
            await converged(c, client, key, 7)
    finally:
        await client.close()


async def _settled(c: object) -> bool:
    return not any(s.node.pending for s in c.servers.values())  # type: ignore[attr-defined]


async def test_a_first_attempt_at_the_primary_and_at_a_suspecting_replica_counts_once(
        tmp_path: Path) -> None:
    await _first_attempts(tmp_path, at_once=True)


async def test_a_first_attempt_read_late_by_the_primary_is_refused_by_the_claims(
        tmp_path: Path) -> None:
    await _first_attempts(tmp_path, at_once=False)


async def test_a_delete_retried_at_another_leader_after_its_ack_removes_nothing_new(
        tmp_path: Path) -> None:
    """A delete acknowledged by n1 (n2 never got its copy), then an add acknowledged on top of
    it; then a copy of the delete (its retry, or a first attempt that waited in n2's socket while
    n2 was frozen) led by n2, which takes n1 for dead. n2 must find the delete on the replicas
    (it is a retry, or stale): a second application would read the key again and floor the new
    add away, losing an acknowledged op."""
    key = key_with(("n1", "n2", "n3"))
    client = Client()
    try:
        async with cluster(tmp_path) as c:
            n1, n2 = c.servers["n1"].node, c.servers["n2"].node
            assert (await client.add(c.url("n1"), "t", key, "a:1", 5))[0] == 200
            c.fault("n1", "n2", {int(Kind.REPLICATE)})  # n2 misses the delete's floors
            born = n1.clock()
            assert await n1.lead_deletes([Op("t", key, "d:1", 0, 1)], [born]) == [
                int(Status.APPLIED)]
            assert (await client.add(c.url("n1"), "t", key, "a:2", 3))[0] == 200
            c.heal()
            c.fault("n2", "n1")
            await sees_down(c, "n2", "n1")
            stale = await n2.lead_deletes([Op("t", key, "d:1", 0, 2)], [born])
            assert stale[0] in (int(Status.DUPLICATE), int(Status.UNAVAILABLE)), stale
            c.heal()
            await converged(c, client, key, 3, timeout=20.0)
    finally:
        await client.close()


async def test_a_first_attempt_at_a_primary_never_heard_from_is_checked(tmp_path: Path) -> None:
    """The replica never heard from the primary (a one-way cut before the first heartbeat): a
    peer never heard from may be up and leading, so its keys' leads here are checked too."""
    await _first_attempts(tmp_path, at_once=False, never_heard=True)
