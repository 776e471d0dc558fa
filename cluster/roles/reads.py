"""Reads with ``consistency=one|quorum|all``: merge replicas' entries, repair the stale ones.

``one`` reads the local replica when this node holds the key, ``quorum`` a majority of the
preference list, ``all`` every replica; a replica that fails is replaced by the next one in the
list. Every replica that answered with less than the merge gets the merged entry (read repair).

Many keys at once (``POST /v1/read``, a delete's look at what it removes) are grouped by
preference list: each replica of a group gets one READ frame with all of the group's keys, and
each stale replica one REPAIR frame, never a message per key.

Entries travel as their wire form (``CounterEntry.to_wire``: origin -> [P, N], no (0, 0) pair),
and a read handles them so: a replica answers them straight from its store
(``ShardStore.wires``), and where every replica that answered holds the same entry as this
node's copy, that copy is the merge and no replica is stale; one dict comparison decides it,
for a whole group at once when they all agree. Only a key the replicas disagree on (or one
read from peers alone, whose answers are checked by ``CounterEntry.from_wire``) is merged entry
by entry and repaired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from cluster.core.entry import CounterEntry, wire_value
from cluster.core.errors import Unavailable
from cluster.core.shards import Wire
from cluster.roles.checks import consume
from cluster.roles.host import Host
from cluster.roles.state import NodeState
from cluster.transport.wire import Kind


class Node(Host, Protocol):
    """What a read needs of its node."""

    state: NodeState

    def clock(self) -> float: ...

    def is_live(self, node: str) -> bool: ...

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]: ...


def on_read(node: Node, items: list[list[str]]) -> list[Wire]:
    """A READ frame's answer: each [table, key]'s entry, in order."""
    return node.state.shards.wires(items)


async def read_counter(node: Node, table: str, key: str, consistency: str) -> int:
    return (await read_values(node, [(table, key)], consistency))[0]


async def read_values(node: Node, reads: Sequence[tuple[str, str]], consistency: str
                      ) -> list[int]:
    """The value of each (table, key), in order: 0 for a counter never written, deleted or
    expired (``NodeState.read_value``). Expiry is judged at the read's start: the replicas'
    entries are at least that recent, while judged later (a replica slow to answer) a stale
    entry would call a key expired that a write kept alive meanwhile."""
    now = node.clock()
    merged = await _read_wires(node, reads, consistency)
    state = node.state
    ttl = state.ttl_tables  # a key of another table never expires: its value is the wire's
    return [state.read_value(table, CounterEntry.from_wire(wire), now) if table in ttl
            else wire_value(wire)
            for (table, _key), wire in zip(reads, merged, strict=True)]


async def read_entries(node: Node, reads: Sequence[tuple[str, str]], consistency: str
                       ) -> list[CounterEntry]:
    """Each key's entry merged from ``consistency`` many of its replicas, in order; the stale
    replicas seen are repaired. ``Unavailable`` when some key's group has too few answers."""
    return [CounterEntry.from_wire(w) for w in await _read_wires(node, reads, consistency)]


async def _read_wires(node: Node, reads: Sequence[tuple[str, str]], consistency: str
                      ) -> list[Wire]:
    """``read_entries``, in wire form."""
    ring = node.ring
    if ring.replicates_everywhere:  # one replica set, every member's
        return await _read_group(node, tuple(sorted(ring.members)), reads, consistency)
    groups: dict[tuple[str, ...], list[int]] = {}
    prefs_of = ring.preference_list
    for i, (table, key) in enumerate(reads):  # by replica set: the order of a list differs
        groups.setdefault(tuple(sorted(prefs_of(table, key))), []).append(i)
    out: list[Wire] = [{}] * len(reads)
    results = await asyncio.gather(*[
        _read_group(node, prefs, [reads[i] for i in idx], consistency)
        for prefs, idx in groups.items()])
    for idx, merged in zip(groups.values(), results, strict=True):
        for i, wire in zip(idx, merged, strict=True):
            out[i] = wire
    return out


async def _read_group(node: Node, prefs: tuple[str, ...], keys: Sequence[tuple[str, str]],
                      consistency: str) -> list[Wire]:
    need = {"one": 1, "quorum": node.config.read_quorum, "all": len(prefs)}[consistency]
    order = sorted(prefs, key=lambda n: (n != node.id, not node.is_live(n)))
    answers: dict[str, list[Wire]] = {}
    tried = 0
    while len(answers) < need and tried < len(order):
        batch = order[tried : tried + need - len(answers)]
        tried += len(batch)
        answers.update(await _read_from(node, keys, batch))
    if len(answers) < need:
        node.metrics.unavailable += 1
        raise Unavailable(f"{len(answers)} of {need} replicas answered the read")
    # this node's copy, when it answered, is the merge of every key all the answers agree on
    mine = answers.get(node.id)
    got = list(answers.values())
    if mine is not None and all(g == mine for g in got):
        return mine  # no key to merge, no replica stale
    merged: list[Wire] = []
    stale: dict[str, list[list[Any]]] = {}
    for i, (table, key) in enumerate(keys):
        if mine is not None and all(g[i] == mine[i] for g in got):
            merged.append(mine[i])
            continue
        entries = {name: CounterEntry.from_wire(g[i]) for name, g in answers.items()}
        entry = CounterEntry()
        for e in entries.values():
            entry = entry.merge(e)
        wire = entry.to_wire()
        merged.append(wire)
        for name, e in entries.items():
            if not e.dominates(entry):
                stale.setdefault(name, []).append([table, key, wire])
    if stale:
        _repair(node, stale)
    return merged


async def _read_from(node: Node, keys: Sequence[tuple[str, str]],
                     names: list[str]) -> dict[str, list[Wire]]:
    """The keys' entries from each of ``names`` that answered in time, this node's own first."""
    out: dict[str, list[Wire]] = {}
    futs: dict[str, asyncio.Future[Any]] = {}
    for name in names:
        if name == node.id:
            out[name] = node.state.shards.wires(keys)
        else:
            futs[name] = node.links[name].call(Kind.READ, list(keys))
    if futs:
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
        for name, fut in futs.items():
            if not fut.done():
                fut.cancel()
            elif fut.exception() is None:
                got = fut.result()
                if isinstance(got, list) and len(got) == len(keys):
                    out[name] = got
    return out


def _repair(node: Node, stale: dict[str, list[list[Any]]]) -> None:
    for name, items in stale.items():
        node.metrics.repairs_out += len(items)
        if name == node.id:
            node.on_repair(items)
        else:
            fut = node.links[name].call(Kind.REPAIR, items)
            fut.add_done_callback(consume)
