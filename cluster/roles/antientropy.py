"""Replicas catching up: hinted handoff, digest-driven anti-entropy, dedup state pulled on join.

- **Hints**: a REPLICATE that a down replica could not take is kept in memory (at most
  ``max_hints`` per peer, oldest dropped) and sent again when the detector sees it up. Hints are
  not written separately: every hinted write is already in this node's log as APPLY or REPLICA,
  so a crash loses only the queue, and the next anti-entropy exchange repairs what it held.
- **Anti-entropy**: per table, the keys this node shares with a peer fall into ``BUCKETS``
  buckets by key hash; a bucket's digest is a 64-bit sum of MurmurHash3 over each key and its
  entry (origin-sorted, so row layouts do not matter), kept up to date as entries change
  (``cluster.core.digests``), so an idle round costs O(buckets), not O(keys). Peers swap
  digests, then the digests one level down the tree under what differs, down to the leaves
  (``LEVELS``), then the hashes of the keys in the leaves that still differ, then the entries
  of the keys that differ, and both max-merge. Runs every ``antientropy_interval``, when a peer
  comes back, and at start; one exchange at a time between two nodes.
- **Dedup pull**: before serving, a node takes each table's dedup state from its replicas and
  keeps it for the window beside its own (``take_pulled``): an op whose id a replica held is
  checked on the replicas before it is applied, so a retry (or a stale first attempt) of an op
  applied while this node was down is still recognised.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from cluster.core.digests import LEAVES, LEVELS, Digests
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

_CHUNK = 2000  # keys listed (entries) between two yields to the loop: a few ms
_FLUSH_CHUNK = 500  # keys rehashed between two yields: 5-8 ms on a busy core (10-15 us each)


def _failure_level(node: Node) -> int:
    """Debug while the node starts (before ready its peers are often still starting and refuse
    connections: nodes started together would each log every one of them), info after."""
    return logging.INFO if node.ready else logging.DEBUG


def _write_set(ring: Any) -> Callable[[str, str], tuple[str, ...]]:
    """Who is written a key under ``ring``: ``Placement.write_set`` (while a move is under way,
    the member gaining the key too); a plain ``Ring``'s preference list."""
    return getattr(ring, "write_set", ring.preference_list)


def _replica_sets(ring: Any, me: str) -> Callable[[str, str], frozenset[str]]:
    """A key's replica set (one frozenset per distinct preference list, shared); while a move
    is under way, with the member gaining the key (``Placement.write_set``). Empty for a key
    ``me`` no longer replicates (a move took it away): it is exchanged with nobody, where it
    would differ from every replica's digests forever."""
    prefs = _write_set(ring)
    sets: dict[tuple[str, ...], frozenset[str]] = {}
    none: frozenset[str] = frozenset()

    def group_of(table: str, key: str) -> frozenset[str]:
        p = prefs(table, key)
        g = sets.get(p)
        if g is None:
            g = sets[p] = frozenset(p) if me in p else none
        return g

    return group_of


class _Cpu:
    """Adds the thread CPU time of a synchronous stretch (never across an await) to the
    node's ``antientropy_seconds``: what anti-entropy costs, apart from everything else."""

    __slots__ = ("metrics", "t0")

    def __init__(self, node: Node) -> None:
        self.metrics = node.metrics

    def __enter__(self) -> None:
        self.t0 = time.thread_time()

    def __exit__(self, *exc: object) -> None:
        self.metrics.antientropy_seconds += time.thread_time() - self.t0


async def _flushed(node: Node) -> Digests:
    """The store's digests, brought up to date in steps of ``_FLUSH_CHUNK`` keys (yielding between
    them, so a burst of changes or a freshly loaded store never stalls the loop); grouped by
    replica set unless every node holds every key."""
    ring = node.ring
    with _Cpu(node):
        shards = node.state.shards
        if shards.digests.owner is not ring:  # a new store (recovery) or the first use
            shards.group_digests(ring, None if ring.replicates_everywhere
                                 else _replica_sets(ring, node.id))
        left = shards.flush_digests(_FLUSH_CHUNK)
    while left:
        await asyncio.sleep(0)
        with _Cpu(node):
            left = node.state.shards.flush_digests(_FLUSH_CHUNK)
    return node.state.shards.digests


async def digests(node: Node, peer: str) -> dict[str, list[int]]:
    """Per table, the ``BUCKETS`` digests of the keys ``peer`` also replicates: O(buckets)
    once the keys changed since the last call are rehashed."""
    d = await _flushed(node)
    with _Cpu(node):
        return d.sums(peer)


async def child_digests(node: Node, peer: str, level: int,
                        parents: dict[str, list[int]]) -> dict[str, list[list[Any]]]:
    """A finer look: per table, ``[id, digest]`` of the nonzero nodes at ``level`` of the
    digest tree (``cluster.core.digests.LEVELS``) under ``parents`` (ids one level up); at
    ``len(LEVELS)``, below the leaves, ``[key, hash]`` of each key in the ``parents`` leaves."""
    if not 1 <= level <= len(LEVELS):
        raise ValueError(f"level must be 1..{len(LEVELS)}, got {level}")
    d = await _flushed(node)
    with _Cpu(node):
        if level == len(LEVELS):
            return {t: [[k, h] for k, h in d.key_hashes(t, ps, peer).items()]
                    for t, ps in parents.items()}
        return {t: [[c, s] for c, s in d.children(t, level, ps, peer).items()]
                for t, ps in parents.items()}


async def entries(node: Node, peer: str, want: dict[str, list[int]],
                  leaves: dict[str, list[int]] | None = None,
                  keys_of: dict[str, list[str]] | None = None) -> list[list[Any]]:
    """``[table, key, entry]`` of the keys ``peer`` also replicates in the ``want`` buckets
    or the ``leaves`` of each table, or of the keys named (``keys_of``, those held); only those
    buckets are walked, ``_CHUNK`` keys a step."""
    d = await _flushed(node)
    out: list[list[Any]] = []
    named = keys_of or {}
    for t in set(want) | set(leaves or {}) | set(named):
        with _Cpu(node):
            keys = d.keys_in(t, want.get(t, ()), (leaves or {}).get(t, ()), peer)
            if t in named:
                keys += [k for k in named[t] if node.state.shards.visible_hash(t, k) is not None]
        for i in range(0, len(keys), _CHUNK):
            if i:
                await asyncio.sleep(0)
            with _Cpu(node):
                entry = node.state.shards.entry
                out.extend([t, k, entry(t, k).to_wire()] for k in keys[i:i + _CHUNK])
    return out


async def on_digest(node: Node, peer: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    if "under" in body:
        return [{"sums": await child_digests(node, peer, body["level"], body["under"])}]
    if _busy(node, peer):
        return [{"busy": True}]
    return [{"digests": await digests(node, peer)}]


async def on_entries(node: Node, peer: str, bodies: list[dict[str, Any]]) -> list[list[Any]]:
    return [await entries(node, peer, b.get("want", {}), b.get("leaves"), b.get("keys"))
            for b in bodies]


def _size(body: Any) -> int:
    """Bytes of ``body`` as msgpack (what the frame carries, without its header and MAC)."""
    return len(msgpack.packb(body))


def _differ(mine: dict[Any, Any], theirs: dict[Any, Any]) -> list[Any]:
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k, 0) != theirs.get(k, 0))


def _leaf_batches(node: Node, leaves: dict[str, list[int]]) -> list[dict[str, list[int]]]:
    """``leaves`` split so that one ENTRIES answer holds about ``_CHUNK`` keys (at the
    table's average keys per leaf): no huge frame to build, encode or merge in one step."""
    per = max(1, _CHUNK * LEAVES // max(1, node.state.shards.keys))
    out: list[dict[str, list[int]]] = []
    for table, ls in leaves.items():
        out.extend({table: ls[i:i + per]} for i in range(0, len(ls), per))
    return out


# node -> peers it is running an exchange with: one at a time per pair, in either direction
# (an exchange merges both ways, so a second one started meanwhile would only resend the same
# entries: after a partition, the periodic round, the catch-up and the other side's would all
# walk the same differing leaves at once)
_running: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _busy(node: Node, peer: str) -> bool:
    """``peer`` asks for our digests while we run an exchange with it ourselves: it skips its
    own. Two started at the same instant both skip; the next round (a tick later for a peer
    that missed writes) runs alone."""
    return peer in _running.get(node, ())


async def converge(node: Node, peer: str, timeout: float) -> bool:
    """One whole exchange with ``peer``, run by this node: one the other side is running
    meanwhile is waited out, not taken for ours (it may have begun before what this one must
    cover). True once it ran, False after ``timeout``. Every entry that differed when it began
    is then merged both ways; writes since then reach both by replication (what a membership
    move waits for before it finishes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        ran = await _exclusive(node, peer)
        if ran is not None and not ran[0]:
            return True
        await asyncio.sleep(0.1)  # an exchange between the two is under way: let it end
    return False


async def sync_with(node: Node, peer: str) -> int:
    """One anti-entropy exchange with ``peer``; the number of keys that differed. The buckets
    that differ are narrowed down level by level (the children of what still differs), so what
    is sent is the entries of the leaves that still differ: about what was missed, not the
    buckets it fell in. A difference that was only in flight is gone by the next look. Skipped
    (0) while another exchange between the two nodes runs."""
    ran = await _exclusive(node, peer)
    return 0 if ran is None else ran[1]


async def _exclusive(node: Node, peer: str) -> tuple[bool, int] | None:
    """``_sync_once`` unless this node is running an exchange with ``peer`` already (None)."""
    running = _running.setdefault(node, set())
    if peer in running:
        return None
    running.add(peer)
    try:
        return await _sync_once(node, peer)
    finally:
        running.discard(peer)


async def _sync_once(node: Node, peer: str) -> tuple[bool, int]:
    """One exchange: (whether ``peer`` was running one with us, so skipped; keys that
    differed)."""
    link = node.links[peer]
    timeout = node.config.quorum_timeout * 2
    m = node.metrics
    m.antientropy_rounds += 1
    first = (await asyncio.wait_for(link.call(Kind.DIGEST, [{}]), timeout))[0]
    if first.get("busy"):  # it is running an exchange with us, which covers this one
        return True, 0
    theirs = first["digests"]
    mine = await digests(node, peer)
    with _Cpu(node):
        m.antientropy_bytes += _size(first)
        differ = {t: diff for t in set(mine) | set(theirs)
                  if (diff := _differ(dict(enumerate(mine.get(t, ()))),
                                      dict(enumerate(theirs.get(t, ())))))}
    for level in range(1, len(LEVELS)):
        if not differ:
            return False, 0
        ask = {"level": level, "under": differ}
        reply = (await asyncio.wait_for(link.call(Kind.DIGEST, [ask]), timeout))[0]
        if "sums" not in reply:  # a peer without the tree answers the first question again
            return False, await _exchange(node, link, peer, {"want": differ})
        ours = await child_digests(node, peer, level, differ)
        with _Cpu(node):
            m.antientropy_bytes += _size(ask) + _size(reply)
            differ = {t: diff for t in differ
                      if (diff := _differ({c: s for c, s in ours.get(t, [])},
                                          {c: s for c, s in reply["sums"].get(t, [])}))}
    done = 0
    for batch in _leaf_batches(node, differ):
        keys = await _differing_keys(node, link, peer, batch)
        if keys:
            done += await _exchange(node, link, peer, {"want": {}, "keys": keys})
    return False, done


async def _differing_keys(node: Node, link: Any, peer: str,
                          leaves: dict[str, list[int]]) -> dict[str, list[str]]:
    """Below the leaves: the keys whose hashes differ (or that one side lacks), so only their
    entries are sent, not every key that shares a leaf with one."""
    timeout = node.config.quorum_timeout * 2
    ask = {"level": len(LEVELS), "under": leaves}
    reply = (await asyncio.wait_for(link.call(Kind.DIGEST, [ask]), timeout))[0]
    ours = await child_digests(node, peer, len(LEVELS), leaves)
    with _Cpu(node):
        node.metrics.antientropy_bytes += _size(ask) + _size(reply)
        return {t: diff for t in leaves
                if (diff := _differ({k: h for k, h in ours.get(t, [])},
                                    {k: h for k, h in reply["sums"].get(t, [])}))}


async def _exchange(node: Node, link: Any, peer: str, body: dict[str, Any]) -> int:
    """Swap the entries ``body`` names (buckets, leaves or keys) and max-merge both ways; keys
    that differed."""
    timeout = node.config.quorum_timeout * 2
    got = (await asyncio.wait_for(link.call(Kind.ENTRIES, [body]), timeout))[0]
    with _Cpu(node):
        node.metrics.antientropy_bytes += _size(body) + _size(got)
        node.on_repair(got)
    ours = await entries(node, peer, body["want"], body.get("leaves"), body.get("keys"))
    with _Cpu(node):
        theirs = {(t, k): CounterEntry.from_wire(e) for t, k, e in got}
        push = [[t, k, e] for t, k, e in ours
                if not theirs.get((t, k), CounterEntry()).dominates(CounterEntry.from_wire(e))]
        node.metrics.antientropy_bytes += _size(push) if push else 0
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
    for peer, link in list(node.links.items()):  # a membership change may add one meanwhile
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
        # keys a move took from the peer meanwhile are left out: their replicas hold them, and
        # a copy there would be a key it no longer replicates (``cluster.roles.shed``)
        while q:
            holds = _write_set(node.ring)
            items = [q.popleft() for _ in range(min(chunk, len(q)))]
            send = [item for item in node.shareable(items)  # published state, as it stands
                    if peer in holds(item[1], item[2])]
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
