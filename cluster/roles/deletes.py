"""Deletes and expiry at a key's leader: observed removes written as floors (docs/deletes.md).

A delete reads the key's entry from a read quorum (so it sees every increment acknowledged
before it was sent: each is on W replicas), then writes, for each origin it saw, that origin's
pair as the floor of the origin (``CounterEntry.floors``) through the write path's replication:
the floors are REPLICATE items carrying the delete's op id, so every replica that merges them also
learns the id (a retried delete is a duplicate), logs them before it acks, and hints, anti-entropy,
read repair, snapshots and replay carry them as they carry any pair. The leader answers once W
replicas hold them durably, its own log included.

An increment the delete's read did not see raises its pair above the floor and counts whole; one
it saw lies under it on every replica that learns the floor, whatever order the two arrive in.

Expiry is a delete made by time: before a leader applies an op to a key of a table with a ttl
that its own state shows expired, or that a read quorum shows expired when it holds no copy of
the key, it deletes the key the same way (``expire_first``), so the op starts the counter from 0
on every replica instead of reviving what expired.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from cluster.core.entry import LAST, CounterEntry
from cluster.core.errors import Unavailable
from cluster.core.ops import ItemFields, Op
from cluster.roles.claims import Claims
from cluster.roles.host import Host
from cluster.roles.leader import Leader
from cluster.roles.reads import read_entries
from cluster.transport.wire import Status
from cluster.wal import DurableLog, RecordKind, record_fields

log = logging.getLogger("cluster.deletes")

REPLICA = int(RecordKind.REPLICA)
APPLIED = _APPLIED = int(Status.APPLIED)
_DUPLICATE, _UNAVAILABLE = int(Status.DUPLICATE), int(Status.UNAVAILABLE)


class Node(Host, Protocol):
    """What deletes need of their node."""

    leader: Leader
    log: DurableLog
    claims: Claims

    def clock(self) -> float: ...

    def monotonic(self) -> float: ...

    def is_live(self, node: str) -> bool: ...

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]: ...


async def lead_deletes(node: Node, ops: Sequence[Op], limits: Sequence[float] | None = None,
                       *, only_expired: bool = False) -> list[int]:
    """Delete the keys of ``ops`` (deletes this node leads); a status each, in order.
    ``limits``: per op, the monotonic time after which it must not be applied (its window from
    its birth, cut by its check's lease: ``checks.lead_checked``); one past it answers 503, as
    one claimed here for another node's check does. A delete applied twice is not harmless: the
    second reads the key again and floors away what was added since the first.
    ``only_expired``: deletes by time, each made only if the key's entry as the read quorum
    has it is expired too (this node's own copy may have missed a later write); one that is
    not answers duplicate, having changed nothing."""
    if not ops:
        return []
    try:
        entries = await read_entries(node, [(op[0], op[1]) for op in ops], "quorum")
    except Unavailable:
        node.metrics.unavailable += len(ops)
        return [_UNAVAILABLE] * len(ops)
    if only_expired:
        now = node.clock()
        keep = [i for i, (op, e) in enumerate(zip(ops, entries, strict=True))
                if e.live() and node.state.expired(op[0], e, now)]
        if len(keep) < len(ops):
            out = [_DUPLICATE] * len(ops)
            done = await lead_deletes(node, [ops[i] for i in keep]) if keep else []
            for i, st in zip(keep, done, strict=True):
                out[i] = st
            return out
    # from here to the replication, no await: the time limits and claims, the dedup check, the
    # floors and their log append
    refused = _refused(node, ops, limits)
    if refused:
        out = [_UNAVAILABLE] * len(ops)
        rest = [i for i in range(len(ops)) if i not in refused]
        done = await lead_deletes(node, [ops[i] for i in rest]) if rest else []
        for i, st in zip(rest, done, strict=True):
            out[i] = st
        return out
    state = node.state
    dups = state.seen_or_add_ops(ops)
    now = node.clock()
    now_ms = int(now * 1000)
    statuses: list[int] = []
    items: list[list[Any]] = []
    groups: dict[tuple[str, ...], list[ItemFields]] = {}
    merge = state.shards.merge_pair
    for (table, key, op_id, _delta, _attempt), entry, dup in zip(ops, entries, dups,
                                                                  strict=True):
        if dup:
            statuses.append(_DUPLICATE)
            continue
        statuses.append(_APPLIED)
        mine: list[list[Any]] = [[op_id, table, key, origin, p, n, 0, now]
                for origin, (p, n) in entry.floors(now_ms).items()]
        for _id, _t, _k, origin, p, n, _d, _ts in mine:
            merge(table, key, origin, p, n)
        items.extend(mine)
        groups.setdefault(node.leader.targets_of(table, key), []).extend(mine)
    node.metrics.duplicates += sum(dups)
    replicated: list[asyncio.Future[bool]] = []
    if items:
        own = node.log.append_columns_nowait(
            *record_fields(REPLICA, *zip(*items, strict=True)))
        replicated = [node.leader.replicate(targets, group, own)
                      for targets, group in groups.items()]
    # a copy of a delete in flight (here or in an earlier batch) goes as the delete goes
    inflight = node.leader._inflight
    waits = [(i, inflight[op[2]]) for i, op in enumerate(ops)
             if dups[i] and op[2] in inflight]
    if replicated:
        results = await asyncio.gather(*replicated)
        failed = {item[0] for group, ok in zip(groups.values(), results, strict=True)
                  if not ok for item in group}
        for i, op in enumerate(ops):
            if op[2] in failed and not dups[i]:
                statuses[i] = _UNAVAILABLE
                node.metrics.unavailable += 1
        node.metrics.deletes += sum(1 for s in statuses if s == _APPLIED)
    for i, fut in waits:  # a duplicate of a delete in flight: as it goes, so does its copy
        if not await asyncio.shield(fut):
            statuses[i] = _UNAVAILABLE
    return statuses


def _refused(node: Node, ops: Sequence[Op], limits: Sequence[float] | None) -> set[int]:
    """The deletes that must not apply now (``Admission._claimed``, as for adds): past their
    time limit, or claimed here for another node's check. One this node's own check claimed
    applies, and the dedup answers for it from now on."""
    claims, me = node.claims, node.id
    now = node.monotonic() if limits is not None else 0.0
    refused: set[int] = set()
    for i, (_table, _key, op_id, _delta, _attempt) in enumerate(ops):
        holder = claims.holder(op_id) if claims else None
        if limits is not None and now > limits[i]:
            refused.add(i)
            log.info("delete %s past its time limit by %.3f s: not applied", op_id,
                     now - limits[i])
            if holder == me:
                claims.release(op_id, me)
        elif holder is not None and holder != me:
            refused.add(i)
        elif holder == me:
            claims.applied(op_id)
    node.metrics.unavailable += len(refused)
    return refused


def _expiry_op(table: str, key: str, entry: CounterEntry) -> Op:
    """The delete by time of a key in the state ``entry`` shows: its op id is derived from the
    key's last change, so every leader that expires the same state names the same delete (its
    replicas take a second one as a duplicate)."""
    return Op(table, key, f"~expire:{key}:{entry.last_change_ms()}", 0, 1)


def expire_ops(node: Node, ops: Sequence[Op]) -> tuple[list[Op], list[tuple[str, str]]]:
    """What ``expire_first`` does before ``ops`` are led (tables with a ttl only): the deletes
    by time of the keys this node's own copy shows expired, and the keys it holds no copy of
    (their replicas may hold them expired: a quorum read tells)."""
    state = node.state
    if not state.ttl_tables:
        return [], []
    now = node.clock()
    now_ms = int(now * 1000)
    out: dict[tuple[str, str], Op] = {}
    unknown: dict[tuple[str, str], None] = {}
    shards = state.shards
    for table, key, _op_id, _delta, _attempt in ops:
        if table not in state.ttl_tables or (table, key) in out:
            continue
        if not shards.holds(table, key):
            unknown[(table, key)] = None
            continue
        settings = state.tables[table]
        if not settings.expired(shards.pair(table, key, LAST)[0], now_ms):
            continue  # the common case, a key written lately: one pair looked up
        e = shards.entry(table, key)
        if e.live() and state.expired(table, e, now):
            out[(table, key)] = _expiry_op(table, key, e)
    return list(out.values()), list(unknown)


async def expire_first(node: Node, ops: Sequence[Op]) -> bool:
    """Expire the keys of ``ops`` that have expired before they are led: those this node's
    copy shows expired, and those it holds no copy of that a read quorum shows expired (the
    read's repair gives this node its copy, so a key pays the read once). False when a read or
    a delete could not reach its quorum (the ops then answer 503: applying them on top of an
    expired counter would revive it)."""
    expiring, unknown = expire_ops(node, ops)
    if unknown:
        try:
            entries = await read_entries(node, unknown, "quorum")
        except Unavailable:
            return False
        now = node.clock()
        expiring.extend(_expiry_op(table, key, e) for (table, key), e
                        in zip(unknown, entries, strict=True)
                        if e.live() and node.state.expired(table, e, now))
    if not expiring:
        return True
    statuses = await lead_deletes(node, expiring, only_expired=True)
    node.metrics.expired_keys += sum(1 for s in statuses if s == _APPLIED)
    return all(s in (_APPLIED, _DUPLICATE) for s in statuses)
