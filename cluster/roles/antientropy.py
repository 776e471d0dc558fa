"""Replicas catching up: hinted handoff, digest-driven anti-entropy, dedup state pulled on join.

- **Hints**: a REPLICATE that a down replica could not take is kept in memory (at most
  ``max_hints`` per peer, oldest dropped) and sent again when the detector sees it up. Hints are
  not written separately: every hinted write is already in this node's log as APPLY or REPLICA,
  so a crash loses only the queue, and the next anti-entropy exchange repairs what it held.
- **Anti-entropy**: per table, the keys this node shares with a peer fall into ``BUCKETS``
  buckets by key hash; a bucket's digest is a 64-bit sum of MurmurHash3 over each key and its
  entry (origin-sorted, so row layouts do not matter). Peers swap digests and then the entries
  of the buckets that differ, and both max-merge. Runs every ``antientropy_interval``, when a
  peer comes back, and at start.
- **Dedup pull**: before serving, a node takes each table's dedup state from its replicas and
  keeps it for the window beside its own (``take_pulled``): an op whose id a replica held is
  checked on the replicas before it is applied, so a retry (or a stale first attempt) of an op
  applied while this node was down is still recognised.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

import mmh3
import msgpack

from cluster.core.ops import ItemFields
from cluster.core.shards import CounterEntry
from cluster.roles.host import Host
from cluster.transport.wire import Kind


class Node(Host, Protocol):
    """What anti-entropy, hinted handoff and the dedup pull need of their node."""
    ready: bool

    @property
    def behind(self) -> set[str]: ...

    def clock(self) -> float: ...

    def is_live(self, node: str) -> bool: ...

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]: ...

    def shareable(self, items: list[ItemFields]) -> list[ItemFields]: ...

log = logging.getLogger("cluster.antientropy")

BUCKETS = 64
_SEED = 0x5EED_AE
_MASK = (1 << 64) - 1
_CHUNK = 2000


def _failure_level(node: Node) -> int:
    """Debug while the node starts (before ready its peers are often still starting and refuse
    connections: nodes started together would each log every one of them), info after."""
    return logging.INFO if node.ready else logging.DEBUG


def bucket_of(table: str, key: str) -> int:
    return mmh3.hash(f"{table}/{key}", _SEED, signed=False) % BUCKETS


def _shared(node: Node, peer: str) -> Any:
    """(table, key, row entry) of every key ``peer`` also replicates."""
    shards = node.state.shards
    everywhere = node.ring.replicates_everywhere
    prefs = node.ring.preference_list
    for table in list(shards.tables()):
        for key in list(shards.keys_of(table)):
            if everywhere or peer in prefs(table, key):
                yield table, key


async def digests(node: Node, peer: str) -> dict[str, list[int]]:
    """Per table, ``BUCKETS`` digests; yields to the loop every ``_CHUNK`` keys so a large
    store does not stall the requests being served."""
    out: dict[str, list[int]] = {}
    entry = node.state.shards.entry
    for i, (table, key) in enumerate(_shared(node, peer)):
        if i and i % _CHUNK == 0:
            await asyncio.sleep(0)
        pairs = sorted(entry(table, key).pairs.items())
        if not pairs:
            continue
        d = out.get(table)
        if d is None:
            d = out[table] = [0] * BUCKETS
        h = mmh3.hash64(msgpack.packb([key, pairs]), _SEED, signed=False)[0]
        b = bucket_of(table, key)
        d[b] = (d[b] + h) & _MASK
    return out


def entries(node: Node, peer: str, want: dict[str, list[int]]) -> list[list[Any]]:
    sets = {t: set(bs) for t, bs in want.items()}
    entry = node.state.shards.entry
    return [[t, k, entry(t, k).to_wire()] for t, k in _shared(node, peer)
            if t in sets and bucket_of(t, k) in sets[t]]


async def on_digest(node: Node, peer: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"digests": await digests(node, peer)}]


def on_entries(node: Node, peer: str, body: dict[str, Any]) -> list[list[Any]]:
    return entries(node, peer, body["want"])


async def sync_with(node: Node, peer: str) -> int:
    """One anti-entropy exchange with ``peer``; the number of keys that differed."""
    link = node.links[peer]
    timeout = node.config.quorum_timeout * 2
    theirs = (await asyncio.wait_for(link.call(Kind.DIGEST, [{}]), timeout))[0]["digests"]
    mine = await digests(node, peer)
    want: dict[str, list[int]] = {}
    for table in set(mine) | set(theirs):
        a, b = mine.get(table, [0] * BUCKETS), theirs.get(table, [0] * BUCKETS)
        diff = [i for i in range(BUCKETS) if a[i] != b[i]]
        if diff:
            want[table] = diff
    if not want:
        return 0
    got = (await asyncio.wait_for(link.call(Kind.ENTRIES, [{"want": want}]), timeout))[0]
    node.on_repair(got)
    ours = entries(node, peer, want)
    theirs_map = {(t, k): CounterEntry.from_wire(e) for t, k, e in got}
    push = [[t, k, e] for t, k, e in ours
            if not theirs_map.get((t, k), CounterEntry()).dominates(CounterEntry.from_wire(e))]
    if push:
        await asyncio.wait_for(link.call(Kind.REPAIR, push), timeout)
    node.metrics.antientropy_keys += len(got) + len(push)
    return len(push) + len(got)


async def sync_all(node: Node, peers: list[str] | None = None) -> None:
    for peer in peers if peers is not None else list(node.links):
        if not node.is_live(peer) and peers is None:
            continue
        try:
            await sync_with(node, peer)
        except Exception as exc:  # noqa: BLE001 - the next round tries again
            # a peer still starting refuses connections: routine while this node starts too
            log.log(_failure_level(node), "anti-entropy with %s failed: %r", peer, exc)


async def antientropy_loop(node: Node, interval: float, tick: float = 1.0) -> None:
    """Every ``tick``: an exchange with each live replica that missed a write; every
    ``interval``: with every live replica."""
    loop = asyncio.get_running_loop()
    last_full = loop.time()
    while True:
        await asyncio.sleep(min(tick, interval))
        if loop.time() - last_full >= interval:
            last_full = loop.time()
            node.behind.clear()
            await sync_all(node)
        elif node.behind:
            peers = sorted(p for p in node.behind if node.is_live(p))  # a stable order
            node.behind.difference_update(peers)
            await sync_all(node, peers)


# -- dedup state -----------------------------------------------------------------------------


def on_dedup(node: Node, tables: list[str]) -> dict[str, bytes]:
    names = tables or list(node.state.dedups)
    return {t: node.state.dedup(t).to_bytes() for t in names}


def take_pulled(node: Node, table: str, blob: bytes) -> bool:
    """Keep a replica's dedup state of ``table`` as *pulled*: an op whose id it holds is
    checked on the replicas before it is applied (``NodeState.suspected``). Not merged into our
    own dedup: a HOLDS answer must say "held" only for an op this node saw applied (its own
    application, a REPLICATE, a check that learned it with its entry); a peer's dedup also holds
    the ids of ops still in doubt there, which that peer may yet withdraw. False when the blob
    does not load as the table's strategy."""
    from cluster.core.dedup import load_dedup
    from cluster.core.dedup._base import unframe

    try:
        name, _version, _payload = unframe(blob)
        if name != node.state.dedup(table).name:
            return False
        node.state.add_pulled(table, load_dedup(blob, clock=node.clock))
        return True
    except (ValueError, TypeError) as exc:
        log.info("dedup of %s not pulled: %s", table, exc)
    return False


async def pull_dedup(node: Node) -> int:
    """Take every live replica's dedup state (``take_pulled``); the number of tables taken."""
    merged = 0
    for peer, link in node.links.items():
        try:
            blobs = (await asyncio.wait_for(link.call(Kind.DEDUP, [[]]),
                                            node.config.quorum_timeout * 2))[0]
        except Exception as exc:  # noqa: BLE001 - a peer that is down has nothing to give
            log.log(_failure_level(node), "dedup pull from %s failed: %r", peer, exc)
            continue
        for table, blob in blobs.items():
            merged += take_pulled(node, table, blob)
    return merged


# -- hinted handoff --------------------------------------------------------------------------


class Hints:
    """Per peer, the REPLICATE items it missed while down (bounded, oldest dropped)."""

    def __init__(self, max_per_peer: int) -> None:
        self.max = max_per_peer
        self.queues: dict[str, deque[ItemFields]] = {}
        self.dropped = 0

    def add(self, peer: str, items: list[ItemFields]) -> None:
        if self.max <= 0:
            return
        q = self.queues.get(peer)
        if q is None:
            q = self.queues[peer] = deque(maxlen=self.max)
        self.dropped += max(0, len(q) + len(items) - self.max)
        q.extend(items)

    def pending(self, peer: str) -> int:
        return len(self.queues.get(peer, ()))

    async def deliver(self, node: Node, peer: str, chunk: int = 5000) -> int:
        q = self.queues.get(peer)
        sent = 0
        while q:
            items = [q.popleft() for _ in range(min(chunk, len(q)))]
            send = node.shareable(items)  # published state only, as it stands now
            if not send:
                continue
            try:
                await asyncio.wait_for(node.links[peer].call(Kind.REPLICATE, send),
                                       node.config.quorum_timeout * 2)
            except Exception:  # noqa: BLE001 - still down: keep them for the next time
                q.extendleft(reversed(items))
                return sent
            sent += len(send)
        node.metrics.hints_delivered += sent
        return sent
