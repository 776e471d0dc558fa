"""Scans of a table: pages of counters in one order every node shares, chained by a cursor.

The order is (leaf, key): a key's digest leaf (``cluster.core.digests``: a hash of table and
key) then its name. It depends on nothing a node holds, so the coordinator can ask every member
for its next keys after the cursor (one SCAN frame each), merge the entries each key's holders
sent, and hand back the page with the position of its last key as the cursor. Positions only
grow from page to page, so a key is never returned twice, and one that exists for the whole scan
is held by a quorum of its replicas while the scan passes its position, whatever is written,
deleted or moved meanwhile: enough members answer (``_enough``) that one of them holds it.

A member answers up to ``limit`` keys, or fewer when it looked at ``SCAN_BUDGET`` keys first (a
rare prefix); it says up to where its answer is complete, and the page stops at the first such
bound, so no key beyond a member's bound is returned before that member has been asked about it.
A page can therefore be short, even empty, with a cursor to go on from (as Redis's SCAN). Keys
that are tombstones (deleted and not written since) or expired are left out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any, Protocol

from cluster.core.digests import LEAVES
from cluster.core.errors import BadRequest, Unavailable
from cluster.core.membership import Membership
from cluster.core.shards import CounterEntry
from cluster.roles.checks import write_sets
from cluster.roles.host import Host
from cluster.transport.wire import Kind
from idc_contract import NAME_RE

SCAN_BUDGET = 20_000  # keys a member looks at for one page before it answers what it has

Position = tuple[int, str]


class Node(Host, Protocol):
    membership: Membership

    def clock(self) -> float: ...

    def is_live(self, node: str) -> bool: ...

    def refuse_minority_read(self, consistency: str) -> None: ...


def encode_cursor(pos: Position) -> str:
    leaf, key = pos
    return base64.urlsafe_b64encode(f"1:{leaf}:{key}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """The position a cursor names; ``BadRequest`` (``bad_cursor``) for anything a scan did not
    hand out."""
    if not cursor:
        return None
    try:
        if len(cursor) > 400:
            raise ValueError("too long")
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, leaf, key = text.split(":", 2)
        pos = int(leaf)
        if version != "1" or not 0 <= pos < LEAVES or not NAME_RE.fullmatch(key):
            raise ValueError("not a position")
        if encode_cursor((pos, key)) != cursor:  # int() and b64decode take more than that:
            raise ValueError("not as handed out")  # " 5", "+5", "05", "٥", "=", junk chars
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        raise BadRequest("after: not a cursor this cluster handed out (take 'next' from the "
                         "previous page as it is)", code="bad_cursor") from exc
    return pos, key


def on_scan(node: Node, body: Any) -> Any:
    """A member's part of a page (a SCAN item), or its tables."""
    if not isinstance(body, dict):
        raise ValueError("a SCAN item is a map")
    shards = node.state.shards
    if body.get("tables"):
        return sorted(shards.tables())
    after = body.get("after")
    pos = (int(after[0]), str(after[1])) if after else None
    limit = max(1, min(int(body.get("limit", 1000)), 100_000))
    found, upto = shards.scan(str(body["table"]), pos, str(body.get("prefix", "")), limit,
                              SCAN_BUDGET)
    node.metrics.scanned += len(found)
    return {"keys": [[leaf, key, entry.to_wire()] for leaf, key, entry in found],
            "upto": list(upto) if upto is not None else None}


def _need(node: Node, consistency: str) -> int:
    rf = node.ring.rf
    return {"one": 1, "quorum": node.config.read_quorum, "all": rf}[consistency]


async def _ask_members(node: Node, item: dict[str, Any]) -> tuple[list[tuple[str, Any]], int]:
    """``item`` to every member holding keys (this node answers itself); the answers, each
    with its member, and how many members did not answer."""
    answers = []
    futs: dict[str, asyncio.Future[Any]] = {}
    missing = 0
    for member in node.membership.reachable:
        if member == node.id:
            answers.append((member, on_scan(node, item)))
        elif member in node.links and node.is_live(member):
            futs[member] = node.links[member].call(Kind.SCAN, [item])
        else:
            missing += 1
    if futs:
        done, pending = await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
        for f in pending:
            f.cancel()
        for member, f in futs.items():
            if f in done and f.exception() is None:
                answers.append((member, f.result()[0]))
            else:
                missing += 1
    return answers, missing


async def scan_page(node: Node, table: str, prefix: str, after: Position | None, limit: int,
                    consistency: str) -> tuple[list[tuple[str, int]], Position | None]:
    """One page: ``(key, value)`` pairs in scan order and the position to go on from (None:
    the scan is done)."""
    item = {"table": table, "prefix": prefix, "after": list(after) if after else None,
            "limit": limit}
    # expiry is judged at the page's start, as a read's is (``reads.read_values``): judged once
    # the last member answered, up to a quorum timeout later, the entries of the first could
    # show expired a key written meanwhile, and the page would skip a key that existed throughout
    node.refuse_minority_read(consistency)
    now = node.clock()
    answers, missing = await _ask_members(node, item)
    # a key's replica set lost at most ``missing`` members: still ``need`` of them answered
    if missing > node.ring.rf - _need(node, consistency) or not answers:
        node.metrics.unavailable += 1
        raise Unavailable(f"{missing} members did not answer the scan; a {consistency} scan "
                          f"needs {_need(node, consistency)} of each key's {node.ring.rf} "
                          "replicas")
    bound: Position | None = None
    for _member, a in answers:
        upto = a.get("upto")
        if upto is not None:
            pos = (int(upto[0]), str(upto[1]))
            bound = pos if bound is None or pos < bound else bound
    merged: dict[Position, CounterEntry] = {}
    write_set = write_sets(node.ring)
    for member, a in answers:
        for leaf, key, wire in a["keys"]:
            pos = (leaf, key)
            if bound is not None and pos > bound:
                continue
            if member not in write_set(table, key):
                # a copy a member no longer replicates, waiting for its hand-off: it misses
                # the deletes made since, and its replicas may have collected the key's
                # tombstone (the simulator's seed 2333: a deleted key back in a page)
                continue
            entry = CounterEntry.from_wire(wire)
            got = merged.get(pos)
            merged[pos] = entry if got is None else got.merge(entry)
    state = node.state
    page: list[tuple[str, int]] = []
    nxt = bound
    for pos in sorted(merged):
        entry = merged[pos]
        if not entry.live() or state.expired(table, entry, now):
            continue
        page.append((pos[1], entry.value()))
        if len(page) >= limit:
            nxt = pos
            break
    node.metrics.reads += len(page)
    return page, nxt


async def tables(node: Node) -> list[dict[str, Any]]:
    """Every table some member holds keys of or has settings for, with its settings."""
    answers, _missing = await _ask_members(node, {"tables": True})
    names = set(node.state.tables)
    for _member, a in answers:
        names.update(a)
    out = []
    for name in sorted(names):
        settings = node.state.tables.get(name)
        out.append({"name": name, "ttl_s": settings.ttl_s if settings else None})
    return out
