"""Shedding: once a membership change settled, a node drops the keys it no longer replicates.

After a move finishes, the members that lost keys to a joiner (or a replacement) still hold
them: never read, left out of anti-entropy, but memory, snapshot and replay time for nothing,
and more than RF copies of every key that moved. Riak's way, which this follows: hand the data
off to its owners, and delete it only once they confirmed it, under the new ring.

Once this node has held a finished membership (no move under way) for two failure timeouts
(every member has it, or is fenced; hints and in-doubt ops of the move have settled), it walks
its store in steps of ``STEP`` keys. For each key whose replica set leaves it out it sends the
key's entry to every member of that set (a REPAIR: max-merged and durable there before the
answer) and drops the key (``ShardStore.drop``) only when

- every member of the set answered, so each holds at least what this node held;
- the membership is still the one the pass started with (a newer one may give the key back);
- the key's entry did not change meanwhile (a late hint), and no op of it is in doubt here.

A key that could not be handed off (a replica down) is kept and tried again at the next pass,
a failure timeout later; a pass that left nothing behind is not run again for that version.
Not for ever: a copy no longer replicated here misses every delete made since, and once such a
delete's tombstone is past ``tombstone_grace`` its replicas collect it (``cluster.roles.expiry``);
a hand-off after that would bring the deleted counts back to life there (the simulator's seed
2194). So keys left behind for ``hand_off_limit`` (the grace less twice the clock skew allowed)
since the membership that first left them out of their write sets (looked for at each new
version; a move under way does not stop the clock) are dropped without a hand-off
(``idc_shed_abandoned_total``): the rule of a replica away for longer than the grace, which
must come back by ``--replace`` (docs/deletes.md). The time keys are left behind since is
logged (a DROP record of no key) and snapshotted, so a restart does not start it again.

Why every replica and not W: this node's copy may be the only one with its last pairs on a
replica that missed them, and the key's own pair of this node's origin must be found again if
the key ever comes back here (ScyllaDB's lost increment: a node taking a range back raised its
stale copy of its own shard). A gaining member catches up from every live member before it
leads (``membership.finish_move``), and after the hand-off every replica holds this node's pair.

Dropping is logged (a DROP record, not waited for): a restart that brought a dropped key back
from the log would hand its stale copy off again, perhaps long after the key's replicas deleted
it and then collected the tombstone (``cluster.roles.expiry``): the copy would come back to
life there (the simulator's seed 1838). A crash that loses the record brings the key back a
moment after its hand-off, and the first pass after the restart hands it off again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from cluster.core.entry import CounterEntry
from cluster.core.membership import Membership
from cluster.roles.host import Host
from cluster.transport.wire import Kind
from cluster.wal import DurableLog, RecordKind, make_record

DROP = int(RecordKind.DROP)

log = logging.getLogger("cluster.shed")

STEP = 1000  # keys looked at between two yields to the loop (~1 ms: a placement lookup each)


class Node(Host, Protocol):
    membership: Membership
    log: DurableLog
    ready: bool
    installed_at: float  # when the membership was installed (monotonic)

    def clock(self) -> float: ...

    def is_live(self, node: str) -> bool: ...

    def monotonic(self) -> float: ...


async def shed_loop(node: Node, tick: float | None = None) -> None:
    """Run a pass whenever the membership settled and no pass of it left nothing behind yet
    (``metrics.shed_version``: the last membership whose pass did). Never under version 1,
    the ``--peers`` bootstrap: a static cluster is changed by restarting every node with a
    new list, one at a time, with no agreement between old and new lists, so a key one node
    no longer replicates may still count on it for a node with the old list."""
    tick = tick if tick is not None else node.config.failure_timeout
    state = node.state
    looked = 0  # the last version looked at for keys outside their write sets
    while True:
        await asyncio.sleep(tick)
        ms = node.membership
        if ms.version <= 1 or not node.ready or ms.version == node.metrics.shed_version:
            continue
        if state.foreign_since is None and ms.version != looked:
            installed = node.clock() - (node.monotonic() - node.installed_at)
            found = await _outside_write_sets(node, ms)
            if found is not None:
                looked = ms.version
            if found:  # they have missed every write and delete since this version came
                _left_behind(node, installed)
        if ms.moving or node.monotonic() - node.installed_at < 2 * node.config.failure_timeout:
            continue
        since = state.foreign_since
        stale = since is not None and node.clock() - since > hand_off_limit(node)
        try:
            kept = await shed(node, ms, stale=stale)
        except Exception as exc:  # noqa: BLE001 - the next pass tries again
            log.info("shedding keys not replicated here: %r", exc)
            continue
        if kept == 0 and node.membership is ms:
            node.metrics.shed_version = ms.version
            _left_behind(node, None)


async def _outside_write_sets(node: Node, ms: Membership) -> bool | None:
    """Does this node hold a key whose write set (under a move, the old and the new replicas)
    leaves it out? None when a newer membership came meanwhile. A walk in steps, as a pass."""
    if node.ring.replicates_everywhere:
        return False
    write_set, me = node.ring.write_set, node.id
    async for table, step in _steps(node):
        if node.membership is not ms:
            return None
        if any(me not in write_set(table, k) for k in step):
            return True
    return False


async def _steps(node: Node) -> AsyncIterator[tuple[str, list[str]]]:
    """The keys this node holds, table by table, ``STEP`` at a time, with a yield to the loop
    after each step (~1 ms: a placement lookup a key) is handled."""
    shards = node.state.shards
    for table in list(shards.tables()):
        keys = shards.keys_of(table)
        while step := list(itertools.islice(keys, STEP)):
            yield table, step
            await asyncio.sleep(0)


def _left_behind(node: Node, since: float | None) -> None:
    """Note (and log: a DROP record of no key) since when keys wait for their hand-off."""
    node.state.foreign_since = since
    node.log.append_lazily([make_record(DROP, "", "", "", 0, "", 0, 0, since or 0.0)])


def hand_off_limit(node: Node) -> float:
    """How long a key this node no longer replicates may wait for its hand-off: less than the
    tombstone grace by the clock skew allowed both ways, and never under half of it."""
    grace = node.config.tombstone_grace
    return max(grace / 2, grace - 2 * node.config.max_clock_skew)


async def shed(node: Node, ms: Membership, *, stale: bool = False) -> int:
    """One pass over the store under ``ms``: hand off and drop every key this node does not
    replicate; how many such keys it kept. ``stale``: keys have waited past
    ``hand_off_limit``; drop them without a hand-off."""
    kept = 0
    if node.ring.replicates_everywhere:
        node.metrics.foreign_keys = 0
        return 0
    prefs: Callable[[str, str], tuple[str, ...]] = node.ring.preference_list
    me = node.id
    async for table, step in _steps(node):
        if node.membership is not ms:
            return kept + 1  # a newer membership: its own pass decides
        foreign = {k: owners for k in step if me not in (owners := prefs(table, k))}
        if foreign and stale:
            doubt = node.state.keys_in_doubt()
            dropped = drop_logged(node, table, [k for k in foreign if (table, k) not in doubt])
            node.metrics.shed_abandoned += dropped
            kept += len(foreign) - dropped
        elif foreign:  # a hand-off with no owner up awaits nothing: the step's yield counts
            dropped = await _hand_off(node, ms, table, foreign)
            node.metrics.shed_keys += dropped
            kept += len(foreign) - dropped
    node.metrics.foreign_keys = kept
    if kept:
        log.info("%d keys not replicated here kept (a replica did not take them yet)", kept)
    return kept


async def _hand_off(node: Node, ms: Membership, table: str,
                    keys: dict[str, tuple[str, ...]]) -> int:
    """Send the entries of ``keys`` to every member of their sets (``keys``: key -> its
    replica set); drop the ones all of them took. How many were dropped."""
    shards = node.state.shards
    doubt = node.state.keys_in_doubt()
    sent: dict[str, CounterEntry] = {}
    to: dict[str, list[list[Any]]] = {}
    for key, owners in keys.items():
        if (table, key) in doubt:
            continue  # an op this node applied is in doubt on it: settle first
        # (another leader's staged copy here is that leader's to publish on the key's
        # replicas, which this node no longer is: the visible entry goes, the copy is dropped)
        if not all(r in node.links and node.is_live(r) for r in owners):
            continue
        entry = sent[key] = shards.entry(table, key)
        item = [table, key, entry.to_wire()]
        for r in owners:
            to.setdefault(r, []).append(item)
    if not to:
        return 0
    timeout = 2 * node.config.quorum_timeout + len(sent) / 1000
    peers = list(to)
    answers = await asyncio.gather(
        *(asyncio.wait_for(node.links[r].call(Kind.REPAIR, to[r]), timeout) for r in peers),
        return_exceptions=True)
    failed = {r for r, a in zip(peers, answers, strict=True) if isinstance(a, BaseException)}
    if node.membership is not ms:
        return 0
    taken = [k for k, e in sent.items()
             if not failed.intersection(keys[k]) and shards.entry(table, k) == e]
    return drop_logged(node, table, taken)


def drop_logged(node: Node, table: str, keys: list[str]) -> int:
    """Drop ``keys`` (none with an op in doubt here) and log it; how many were dropped."""
    if keys:
        node.log.append_columns_lazily(DROP, [""] * len(keys), table, keys, 0, "", 0, 0,
                                       node.clock())
    return node.state.shards.drop(table, keys)
