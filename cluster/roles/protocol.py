"""The cluster's protocol version on one node: what its peers speak, finalizing, adopting.

A node speaks protocol versions ``PROTOCOL_MIN`` to ``PROTOCOL_MAX`` (``cluster.core.versions``)
and tells its peers in every heartbeat (``speaks``; a node of release 0.4.0 says nothing, which
means 1 only). What it sends and writes is the cluster's finalized version, the membership's
``protocol``, raised by a membership change (``{"change": "protocol"}``, what
``python -m cluster finalize`` asks) that the claimant makes only when every member holding keys
is live and speaks the new version: until then every node still writes what the oldest release
in the cluster reads, so any node can be rolled back (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

from cluster.core.membership import Membership, MembershipError
from cluster.core.versions import PROTOCOL_MAX, PROTOCOL_MIN, speaks
from cluster.transport.wire import SPEAKS, Kind
from cluster.wal.formats import write_format

log = logging.getLogger("cluster.protocol")


class _Link(Protocol):
    form: int


class _Log(Protocol):
    def set_format(self, version: int) -> None: ...


class Heard(Protocol):
    membership: Membership
    peer_speaks: dict[str, tuple[int, int]]


class Node(Heard, Protocol):
    id: str
    links: Any

    @property
    def log(self) -> _Log: ...

    def is_live(self, peer: str) -> bool: ...


def saw(node: Heard, peer: str, value: Any) -> None:
    """A heartbeat from ``peer`` (its ping or its answer) said what it speaks."""
    try:
        got = speaks(value)
    except ValueError:
        return
    before = node.peer_speaks.get(peer)
    node.peer_speaks[peer] = got
    if before != got:
        level = node.membership.protocol
        if got[1] < level:  # a node rolled back after the version was finalized
            log.error("member %s speaks protocol %d to %d, below the cluster's finalized %d: "
                      "it cannot read what the others send; run a release that speaks %d on it",
                      peer, got[0], got[1], level, level)
        elif before is not None:
            log.info("member %s now speaks protocol %d to %d", peer, *got)


async def ask_speaks(node: Node, timeout: float) -> dict[str, tuple[int, int]]:
    """What every other member holding keys speaks *now*: a heartbeat sent to each, the
    answers within ``timeout``. (The last heartbeats may predate a restart on another release:
    a node rolled back faster than the failure timeout would still show its old range.)"""
    ms = node.membership
    ping = {"t": 0.0, "ring": ms.version, "speaks": list(SPEAKS)}
    peers = [m for m in ms.reachable if m != node.id and m in node.links]
    futs = [node.links[m].call(Kind.PING, [ping], probe=True) for m in peers]
    if not futs:
        return {}
    await asyncio.wait(futs, timeout=timeout)
    heard = {}
    for member, fut in zip(peers, futs, strict=True):
        if not fut.done():
            fut.cancel()
            continue
        if fut.exception() is not None:
            continue
        body = fut.result()
        answer = body[0] if isinstance(body, list) and body else body
        if isinstance(answer, dict):
            saw(node, member, answer.get("speaks"))
            if member in node.peer_speaks:
                heard[member] = node.peer_speaks[member]
    return heard


def finalizable(node: Node, asked: Any, heard: dict[str, tuple[int, int]]) -> int:
    """The version a finalize request may take the cluster to: ``asked``, or when None the
    highest every member speaks, by ``heard`` (``ask_speaks``). ``MembershipError`` (nothing
    changes) when a member holding keys did not answer or does not speak that version."""
    ms = node.membership
    highest, lowest_by = PROTOCOL_MAX, node.id
    for member in ms.reachable:
        if member == node.id:
            continue
        got = heard.get(member)
        if got is None or not node.is_live(member):
            raise MembershipError(f"cannot finalize: member {member} is not live or did not "
                                  f"answer; finalize once every member is up")
        if got[1] < highest:
            highest, lowest_by = got[1], member
    if asked is None:
        if highest <= ms.protocol and lowest_by != node.id:  # asked for progress, none to make
            raise MembershipError(f"nothing to finalize: member {lowest_by} speaks up to "
                                  f"{highest}, the version finalized already; upgrade it first")
        return max(highest, ms.protocol)
    if type(asked) is not int or not PROTOCOL_MIN <= asked <= PROTOCOL_MAX:
        raise MembershipError(f"cannot finalize protocol {asked!r}: this node speaks "
                              f"{PROTOCOL_MIN} to {PROTOCOL_MAX}")
    if asked > highest:
        raise MembershipError(f"cannot finalize protocol {asked}: member {lowest_by} speaks up "
                              f"to {highest}; upgrade it first")
    return asked


def adopt(node: Node, level: int, data_dir: Path | None) -> None:
    """Send and write ``level`` from now on: the data directory's FORMAT file first (before
    any file of that version), then new log segments, then the frames on every link."""
    if data_dir is not None and level > 1:
        write_format(data_dir, level)
    node.log.set_format(level)
    for link in node.links.values():
        link.form = level
