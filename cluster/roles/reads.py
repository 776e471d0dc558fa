"""Reads with ``consistency=one|quorum|all``: merge replicas' entries, repair the stale ones.

``one`` reads the local replica when this node holds the key, ``quorum`` a majority of the
preference list, ``all`` every replica; a replica that fails is replaced by the next one in the
list. Every replica that answered with less than the merge gets the merged entry (read repair).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from cluster.core.errors import Unavailable
from cluster.core.shards import CounterEntry
from cluster.roles.checks import consume
from cluster.roles.host import Host
from cluster.transport.wire import Kind


class Node(Host, Protocol):
    """What a read needs of its node."""

    def is_live(self, node: str) -> bool: ...

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]: ...


async def read_counter(node: Node, table: str, key: str, consistency: str) -> int:
    prefs = node.ring.preference_list(table, key)
    need = {"one": 1, "quorum": node.config.read_quorum, "all": len(prefs)}[consistency]
    order = sorted(prefs, key=lambda n: (n != node.id, not node.is_live(n)))
    answers: dict[str, CounterEntry] = {}
    tried = 0
    while len(answers) < need and tried < len(order):
        batch = order[tried : tried + need - len(answers)]
        tried += len(batch)
        answers.update(await _read_from(node, table, key, batch))
    if len(answers) < need:
        node.metrics.unavailable += 1
        raise Unavailable(f"{len(answers)} of {need} replicas answered the read")
    merged = CounterEntry()
    for entry in answers.values():
        merged = merged.merge(entry)
    stale = [n for n, e in answers.items() if not e.dominates(merged)]
    if stale:
        _repair(node, table, key, merged, stale)
    return merged.value()


async def _read_from(node: Node, table: str, key: str,
                     names: list[str]) -> dict[str, CounterEntry]:
    out: dict[str, CounterEntry] = {}
    futs: dict[str, asyncio.Future[Any]] = {}
    for name in names:
        if name == node.id:
            out[name] = node.state.shards.entry(table, key)
        else:
            futs[name] = node.links[name].call(Kind.READ, [[table, key]])
    if futs:
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
        for name, fut in futs.items():
            if not fut.done():
                fut.cancel()
            elif fut.exception() is None:
                out[name] = CounterEntry.from_wire(fut.result()[0])
    return out


def _repair(node: Node, table: str, key: str, merged: CounterEntry, stale: list[str]) -> None:
    node.metrics.repairs_out += len(stale)
    wire_entry = merged.to_wire()
    for name in stale:
        if name == node.id:
            node.on_repair([[table, key, wire_entry]])
        else:
            fut = node.links[name].call(Kind.REPAIR, [[table, key, wire_entry]])
            fut.add_done_callback(consume)

