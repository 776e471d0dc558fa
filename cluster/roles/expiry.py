"""Expiry by time and the collection of tombstones, in passes over the store (docs/deletes.md).

Every ``sweep_interval`` each node walks its keys, a step at a time:

- a live key of a table with a ttl that this node leads and whose last change is older than the
  ttl is deleted by time (``cluster.roles.deletes``, an op id derived from the key and its last
  change, so two leaders expiring the same state name the same delete). Reads already answer 0
  for it; the delete turns it into a tombstone every replica holds, so a later write starts it
  from 0 everywhere;
- a tombstone (a key no origin's pair lies above the floor of: deleted, or expired and
  deleted) whose last change is older than ``tombstone_grace`` is dropped from memory, and from
  disk at the next snapshot. By then every replica that was up has learned it (anti-entropy
  runs every few seconds), and a retry of anything it removed is past its window. A replica away
  for longer may still hold what the tombstone removed, so it must come back by ``--replace``.

Dropping a key drops this node's own pair of it too. A replica that has not dropped it yet may
still hold that pair, and a new pair started from 0 would lie under it (max-merge): the write
after would be lost there. So before dropping, the node records, per table, the highest count
its own pairs of the dropped keys reached (``collected``); when it later raises its own pair on
a key it does not hold in such a table, the pair starts at that mark, with a floor at the same
mark (``cluster.roles.leader``): above every old copy, and counting only what comes after. The
mark lives as long as the process: a restarted node raises a new origin (``<id>@<n>``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from cluster.core.entry import floor_of
from cluster.core.ops import Op
from cluster.roles import deletes

log = logging.getLogger("cluster.expiry")

STEP = 2000  # keys looked at between two yields to the event loop
MAX_KEYS = 50_000  # keys one pass looks at


class Node(deletes.Node, Protocol):
    ready: bool

    def save_collected(self, table: str, high: int) -> None: ...


async def expiry_loop(node: Node, interval: float | None = None) -> None:
    interval = interval if interval is not None else node.config.sweep_interval
    sweeper = Sweeper()
    while True:
        await asyncio.sleep(interval)
        if not node.ready:
            continue
        try:
            await sweeper.sweep(node)
        except Exception as exc:  # noqa: BLE001 - the next pass tries again
            log.info("expiry and collection pass: %r", exc)


class Sweeper:
    """Where the passes stand: each pass looks at up to ``max_keys`` keys, going on from
    where the last one stopped, table by table in scan order, so a pass costs a bounded step
    however many counters a node holds (a whole round over 1M keys: 20 passes by default)."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.at: dict[str, tuple[int, str] | None] = {}  # table -> position reached

    def wanted(self, node: Node) -> bool:
        """Anything to expire or collect at all: a table with a ttl, or some floor held."""
        return bool(node.state.ttl_tables) or node.state.shards.has_floors()

    async def sweep(self, node: Node) -> tuple[int, int]:
        """One pass: (keys deleted by time as their leader, keys collected)."""
        if not self.wanted(node):
            return 0, 0
        shards, state = node.state.shards, node.state
        grace_ms = int(node.config.tombstone_grace * 1000)
        expired = collected = looked = 0
        tables = sorted(shards.tables())
        for table in [t for t in tables if t in self.at] + [t for t in tables
                                                            if t not in self.at]:
            while looked < self.max_keys:
                found, upto = shards.scan(table, self.at.get(table), "", STEP, STEP)
                self.at[table] = upto
                looked += max(1, len(found))
                now_ms = int(node.clock() * 1000)
                settings = state.tables.get(table)
                ttl = settings if settings is not None and settings.ttl_s is not None else None
                expiring: list[Op] = []
                dead: list[str] = []
                for _leaf, key, entry in found:
                    last = entry.last_change_ms()
                    if entry.live():
                        if (ttl is not None and ttl.expired(last, now_ms)
                                and node.ring.leader(table, key, node.is_live) == node.id):
                            expiring.append(Op(table, key, f"~expire:{key}:{last}", 0, 1))
                    elif (entry.collectable(now_ms, grace_ms)
                          and not shards.has_hidden(table, key)):
                        dead.append(key)
                if dead:
                    collected += collect(node, table, dead)
                if expiring:
                    statuses = await deletes.lead_deletes(node, expiring, only_expired=True)
                    done = sum(1 for s in statuses if s == deletes.APPLIED)
                    node.metrics.expired_keys += done
                    expired += done
                await asyncio.sleep(0)
                if upto is None:  # the table's round is done; the next pass starts it again
                    del self.at[table]
                    break
            if looked >= self.max_keys:
                break
        return expired, collected


def collect(node: Node, table: str, keys: list[str]) -> int:
    """Drop ``keys`` (tombstones past their grace) of ``table``; how many were dropped. The
    highest count this node's own pairs of them reached is noted first (module docstring)."""
    shards = node.state.shards
    own, floor = shards.own, floor_of(shards.own)
    high = 0
    for key in keys:
        for origin in (own, floor):
            p, n = shards.pair(table, key, origin, visible=False)
            high = max(high, p, n)
    if high > node.state.collected.get(table, -1):
        node.save_collected(table, high)
    dropped = shards.drop(table, keys)
    node.metrics.collected_keys += dropped
    return dropped
