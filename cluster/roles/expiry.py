"""Expiry by time and the collection of tombstones, in passes over the keys that are due
(docs/deletes.md).

Every ``sweep_interval`` each node looks at the keys its due index (``cluster.core.due``, kept
by the store) says have come due, a step at a time (``Sweeper``):

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

from cluster.core.due import DueIndex
from cluster.core.entry import floor_of
from cluster.core.ops import Op
from cluster.roles import deletes

log = logging.getLogger("cluster.expiry")

STEP = 1000  # keys looked at between two yields to the event loop
DELETING = 2  # batches of deletes by time in flight at once (each waits on two quorums)
EXPIRE_BATCH = 1000  # deletes by time a batch (one READ and one REPLICATE frame a replica)
QUEUED = 20_000  # deletes by time waiting for a batch beyond which a pass takes no more keys
TICK_S = 1.0  # the longest wait between two looks at the due keys (the index's bucket)
MAX_KEYS = 50_000  # due keys one pass looks at (more: the next pass begins at once)
WALK_KEYS = 50_000  # keys one pass indexes by a walk (a new or reloaded store, a ttl changed)
NET_KEYS = 10_000  # keys one pass's safety net looks at once the index is built
RETRY_S = 10.0  # a due key left as it was (led by another node, an op in doubt on it, a
#                 delete by time that did not go through) is looked at again this much later


class Node(deletes.Node, Protocol):
    ready: bool

    def save_collected(self, table: str, high: int) -> None: ...


async def expiry_loop(node: Node, interval: float | None = None) -> None:
    """A pass every ``interval`` (``sweep_interval``), and in between, every ``TICK_S`` at most,
    a pass over the keys come due alone (no walk): cheap when none is, and a second's keys at a
    time instead of ``interval``'s (replicas collect a key within about a second of each
    other, so their digests differ for as long, and the work comes in smaller steps)."""
    interval = interval if interval is not None else node.config.sweep_interval
    tick = min(interval, TICK_S)
    loop = asyncio.get_running_loop()
    sweeper = Sweeper()
    walked = loop.time()
    try:
        while True:
            await asyncio.sleep(0 if sweeper.more else tick)
            if not node.ready:
                continue
            walk = loop.time() - walked >= interval - tick / 2
            try:
                await sweeper.sweep(node, walk=walk, wait=False)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                sweeper.more = False
                log.info("expiry and collection pass: %r", exc)
            if walk:
                walked = loop.time()
    finally:
        sweeper.cancel()


class Sweeper:
    """The passes. The store's due index (``ShardStore.due``, ``cluster.core.due``) holds every
    key by the time its last change makes it due (``min(ttl, grace)`` after it in a table with
    a ttl, ``grace`` in one without); a pass takes the keys whose time has come, up to
    ``max_keys`` of them, and for each decides from its state now:

    - its last change rose since it was indexed: put back at its new time;
    - live and expired by its table's ttl: deleted by time if this node leads it, else looked at
      again ``retry_s`` later (its leader's delete normally arrives first and moves it);
    - live, not expired yet: put back at last change + ttl; live in a table without a ttl:
      nothing (a delete raises its last change, which indexes it again);
    - a tombstone past its grace: collected, unless an op of this node is in doubt on it
      (looked at again later); one not yet past it: put back at last change + grace.

    So a pass costs the keys that are due, not the keys held. A store that is new (a start, a
    snapshot or a log loaded) or whose table settings changed is indexed first by a walk over
    its keys (``walk_keys`` a pass, reading each key's last change off its page); once built,
    the walk goes on as a slow safety net (``net_keys`` a pass) that indexes again any key whose
    time has passed, in case some change reached the store without its index hearing of it."""

    def __init__(self, max_keys: int = MAX_KEYS, walk_keys: int = WALK_KEYS,
                 net_keys: int = NET_KEYS, retry_s: float = RETRY_S,
                 deleting: int = DELETING) -> None:
        self.max_keys, self.walk_keys, self.net_keys = max_keys, walk_keys, net_keys
        self.deleting = max(1, deleting)
        self._deletes: set[asyncio.Task[None]] = set()
        self._queued: dict[str, list[Op]] = {}  # table -> deletes by time not yet sent
        self.queued = 0
        self.retry_ms = max(1, int(retry_s * 1000))
        self.more = False  # the last pass stopped at ``max_keys`` with keys still due
        self.net: list[str] = []  # tables the safety net has yet to walk in this round
        self.net_at = 0  # the digest leaf it goes on from in ``net[0]``
        self.visited = 0  # due keys looked at, in all
        self.expired = 0  # keys deleted by time, in all
        self.walked = 0  # keys the walks looked at, in all

    def wanted(self, node: Node) -> bool:
        """Anything to expire or collect at all: a table with a ttl, or some floor held."""
        return bool(node.state.ttl_tables) or node.state.shards.has_floors()

    def index(self, node: Node) -> DueIndex:
        """The store's due index, with the delays of the tables as they are agreed now."""
        state = node.state
        due = state.shards.due
        grace_ms = int(node.config.tombstone_grace * 1000)
        settings = {name: (min(int(t.ttl_s * 1000), grace_ms), t.since_ms)
                    for name, t in state.tables.items() if t.ttl_s is not None}
        if due.default != grace_ms or settings != due.settings:
            due.configure(settings, grace_ms)
        if due.build_all:
            due.build_all = False
            for table in state.shards.tables():
                due.building.setdefault(table, 0)
        return due

    async def sweep(self, node: Node, *, walk: bool = True, wait: bool = True
                    ) -> tuple[int, int]:
        """One pass: (keys deleted by time as their leader, keys collected). ``walk``: go on
        with the walk too (indexing a store, or the safety net). The deletes by time go in
        batches, a few in flight, while the pass goes on (a tombstone due is collected however
        far behind the deletes are); ``wait``: the pass ends once they are done (else the next
        pass counts them, and takes no more keys while ``QUEUED`` are waiting)."""
        self.more = False
        if not self.wanted(node):
            return 0, 0
        due = self.index(node)
        if walk or due.building:
            await self.walk(node, due)
        expired = collected = looked = 0
        expired_before = self.expired
        try:
            while looked < self.max_keys:
                if self.queued >= QUEUED:
                    break  # the deletes are far behind: the next pass goes on
                batch = due.take(int(node.clock() * 1000), min(STEP, self.max_keys - looked))
                if not batch:
                    break
                for table, keys in batch:
                    looked += len(keys)
                    e, c = await self.visit(node, due, table, keys)
                    expired += e
                    collected += c
                await asyncio.sleep(0)
            else:
                self.more = due.ready(int(node.clock() * 1000))
        finally:
            self.visited += looked
            while wait and (self._deletes or self.queued):
                self._launch(node, due)
                await asyncio.wait(self._deletes)
            expired += self.expired - expired_before
        return expired, collected

    def _launch(self, node: Node, due: DueIndex) -> None:
        """Send queued deletes by time, a batch a task, up to ``deleting`` in flight."""
        while self.queued and len(self._deletes) < self.deleting:
            table = next(iter(self._queued))
            ops = self._queued[table]
            batch, rest = ops[:EXPIRE_BATCH], ops[EXPIRE_BATCH:]
            if rest:
                self._queued[table] = rest
            else:
                del self._queued[table]
            self.queued -= len(batch)
            task = asyncio.ensure_future(self._expire(node, due, table, batch))
            self._deletes.add(task)
            task.add_done_callback(self._deletes.discard)

    def cancel(self) -> None:
        """Stop the deletes in flight and forget the queued ones (the node stops)."""
        for task in self._deletes:
            task.cancel()
        self._queued.clear()
        self.queued = 0

    async def walk(self, node: Node, due: DueIndex) -> None:
        """Index the keys of the tables being built, then (once none is) go on with the
        safety net: a bounded part of the store each pass."""
        shards = node.state.shards
        budget = self.walk_keys
        while due.building and budget > 0:
            table = next(iter(due.building))
            found, nxt = shards.lasts(table, due.building[table], min(STEP, budget))
            if nxt is None:
                del due.building[table]
            else:
                due.building[table] = nxt
            budget -= max(1, len(found))
            self.walked += len(found)
            self._index(node, due, table, found, every=True)
            await asyncio.sleep(0)
        if due.building:
            return
        budget = self.net_keys
        if not self.net:
            self.net, self.net_at = sorted(shards.tables()), 0
        while self.net and budget > 0:
            table = self.net[0]
            found, nxt = shards.lasts(table, self.net_at, min(STEP, budget))
            if nxt is None:
                self.net.pop(0)
                self.net_at = 0
            else:
                self.net_at = nxt
            budget -= max(1, len(found))
            self.walked += len(found)
            self._index(node, due, table, found, every=False)
            await asyncio.sleep(0)

    def _index(self, node: Node, due: DueIndex, table: str, found: list[tuple[str, int]],
               *, every: bool) -> None:
        """Index the keys ``found`` (key, last change) at their times; ``every``: all of them
        (building), else only those whose time has passed (the safety net: per the index's
        invariant, those whose time is still ahead are waiting in it already)."""
        settings = node.state.tables.get(table)
        since = settings.since_ms if settings is not None and settings.ttl_s is not None else 0
        d, res = due.delay(table), due.res
        upto = max(due.cursor, int(node.clock() * 1000) // res - 1)  # buckets that have ended
        add = due.add
        for key, last in found:
            at = (last or since) + d
            if at > d and (every or at // res <= upto):
                add(table, key, at)

    async def visit(self, node: Node, due: DueIndex, table: str, keys: list[str]
                    ) -> tuple[int, int]:
        """Look at due keys of ``table`` (the class docstring): the expired ones this node
        leads are queued for deletes by time (``_launch``); (0, keys collected)."""
        state = node.state
        shards = state.shards
        now_ms = int(node.clock() * 1000)
        grace_ms = int(node.config.tombstone_grace * 1000)
        settings = state.tables.get(table)
        ttl = settings if settings is not None and settings.ttl_s is not None else None
        ttl_ms = int(ttl.ttl_s * 1000) if ttl is not None and ttl.ttl_s is not None else 0
        since = ttl.since_ms if ttl is not None else 0
        d, res = due.delay(table), due.res
        retry = (now_ms // self.retry_ms + 1) * self.retry_ms  # one bucket for a step's keys
        expiring: list[Op] = []
        dead: list[str] = []
        cursor = due.cursor

        def is_due(last: int) -> bool:
            changed = last or since
            return bool(changed) and (changed + d) // res <= cursor

        look = shards.due_entry
        for key in keys:
            found = look(table, key, is_due)
            if found is None:
                continue  # not held (collected, handed off)
            last, entry = found
            changed = last or since
            if entry is None:
                if changed:  # written or deleted again since it was indexed: its new time
                    due.add(table, key, changed + d)
                continue  # (no last change, in a table without a ttl: never due)
            if entry.live():
                if ttl is None:
                    continue  # written again after a delete: due again at its next delete
                if ttl.expired(last, now_ms):
                    if node.ring.leader(table, key, node.is_live) == node.id:
                        expiring.append(Op(table, key, f"~expire:{key}:{last}", 0, 1))
                    else:
                        due.add(table, key, retry)
                else:
                    due.add(table, key, changed + ttl_ms)
            elif entry.collectable(now_ms, grace_ms):
                if shards.has_hidden(table, key):
                    due.add(table, key, retry)
                else:
                    dead.append(key)
            elif last:
                due.add(table, key, last + grace_ms)
        collected = collect(node, table, dead) if dead else 0
        if expiring:
            self._queued.setdefault(table, []).extend(expiring)
            self.queued += len(expiring)
            self._launch(node, due)
        return 0, collected

    async def _expire(self, node: Node, due: DueIndex, table: str, expiring: list[Op]) -> None:
        """Delete by time the keys of ``expiring`` (this node leads them)."""
        try:
            statuses = await deletes.lead_deletes(node, expiring, only_expired=True)
        except Exception as exc:  # noqa: BLE001 - looked at again later, like any not applied
            log.info("deletes by time: %r", exc)
            statuses = [-1] * len(expiring)
        # an applied delete raised the key's last change, which indexed it again; the others
        # (expired on no quorum, unavailable, failed) are looked at again later
        later = ((int(node.clock() * 1000) // self.retry_ms) + 1) * self.retry_ms
        expired = 0
        for op, status in zip(expiring, statuses, strict=True):
            if status == deletes.APPLIED:
                expired += 1
            else:
                due.add(table, op.key, later)
        node.metrics.expired_keys += expired
        self.expired += expired
        me = asyncio.current_task()
        if me is not None:
            self._deletes.discard(me)  # done: not in flight for the next one
        self._launch(node, due)  # the next batch, without waiting for the next pass


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
