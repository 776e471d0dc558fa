"""Reads with ``consistency=one|quorum|all``: merge replicas' entries, repair the stale ones.

``one`` reads the local replica when this node holds the key, ``quorum`` a majority of the
preference list, ``all`` every replica; a replica that fails is replaced by the next one in the
list. Every replica that answered with less than the merge gets the merged entry (read repair).

Many keys at once (``POST /v1/read``, a delete's look at what it removes) are grouped by
preference list: each replica of a group gets one READ frame with all of the group's keys, and
each stale replica one REPAIR frame, never a message per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from cluster.core.errors import Unavailable
from cluster.core.shards import CounterEntry
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


async def read_counter(node: Node, table: str, key: str, consistency: str) -> int:
    return (await read_values(node, [(table, key)], consistency))[0]


async def read_values(node: Node, reads: Sequence[tuple[str, str]], consistency: str
                      ) -> list[int]:
    """The value of each (table, key), in order: 0 for a counter never written, deleted or
    expired (``NodeState.read_value``). Expiry is judged at the read's start: the replicas'
    entries are at least that recent, while judged later (a replica slow to answer) a stale
    entry would call a key expired that a write kept alive meanwhile."""
    now = node.clock()
    entries = await read_entries(node, reads, consistency)
    value = node.state.read_value
    return [value(table, entry, now) for (table, _key), entry in zip(reads, entries, strict=True)]


async def read_entries(node: Node, reads: Sequence[tuple[str, str]], consistency: str
                       ) -> list[CounterEntry]:
    """Each key's entry merged from ``consistency`` many of its replicas, in order; the stale
    replicas seen are repaired. ``Unavailable`` when some key's group has too few answers."""
    groups: dict[tuple[str, ...], list[int]] = {}
    prefs_of = node.ring.preference_list
    for i, (table, key) in enumerate(reads):  # by replica set: the order of a list differs
        groups.setdefault(tuple(sorted(prefs_of(table, key))), []).append(i)
    out = [CounterEntry()] * len(reads)
    results = await asyncio.gather(*[
        _read_group(node, prefs, [reads[i] for i in idx], consistency)
        for prefs, idx in groups.items()])
    for idx, merged in zip(groups.values(), results, strict=True):
        for i, entry in zip(idx, merged, strict=True):
            out[i] = entry
    return out


async def _read_group(node: Node, prefs: tuple[str, ...], keys: list[tuple[str, str]],
                      consistency: str) -> list[CounterEntry]:
    need = {"one": 1, "quorum": node.config.read_quorum, "all": len(prefs)}[consistency]
    order = sorted(prefs, key=lambda n: (n != node.id, not node.is_live(n)))
    answers: dict[str, list[CounterEntry]] = {}
    tried = 0
    while len(answers) < need and tried < len(order):
        batch = order[tried : tried + need - len(answers)]
        tried += len(batch)
        answers.update(await _read_from(node, keys, batch))
    if len(answers) < need:
        node.metrics.unavailable += 1
        raise Unavailable(f"{len(answers)} of {need} replicas answered the read")
    merged = []
    stale: dict[str, list[list[Any]]] = {}
    for i, (table, key) in enumerate(keys):
        entry = CounterEntry()
        for got in answers.values():
            entry = entry.merge(got[i])
        merged.append(entry)
        wire = None
        for name, got in answers.items():
            if not got[i].dominates(entry):
                wire = entry.to_wire() if wire is None else wire
                stale.setdefault(name, []).append([table, key, wire])
    if stale:
        _repair(node, stale)
    return merged


async def _read_from(node: Node, keys: list[tuple[str, str]],
                     names: list[str]) -> dict[str, list[CounterEntry]]:
    out: dict[str, list[CounterEntry]] = {}
    futs: dict[str, asyncio.Future[Any]] = {}
    body = [[table, key] for table, key in keys]
    for name in names:
        if name == node.id:
            entry = node.state.shards.entry
            out[name] = [entry(table, key) for table, key in keys]
        else:
            futs[name] = node.links[name].call(Kind.READ, body)
    if futs:
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
        for name, fut in futs.items():
            if not fut.done():
                fut.cancel()
            elif fut.exception() is None:
                got = fut.result()
                if isinstance(got, list) and len(got) == len(keys):
                    out[name] = [CounterEntry.from_wire(w) for w in got]
    return out


def _repair(node: Node, stale: dict[str, list[list[Any]]]) -> None:
    for name, items in stale.items():
        node.metrics.repairs_out += len(items)
        if name == node.id:
            node.on_repair(items)
        else:
            fut = node.links[name].call(Kind.REPAIR, items)
            fut.add_done_callback(consume)
