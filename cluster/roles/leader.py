"""The leader's write path: admit, dedup, apply, log and replicate a batch; wait for W copies.

    Node.lead -> Leader.submit -> (one batch per loop turn) _lead_now
        -> ops on a key with an unpublished op here wait (_lead_later)
        -> _lead_ready: admission (time limits, claims, overflow)
        -> _lead_admitted -> _apply_batch (sync: dedup, raise own pair, hide it, log append)
        -> _replicate (one REPLICATE frame per replica group) -> quorum: own log + W-1 acks
        -> published: the ops become visible (release), a PUBLISHED record; or in doubt: 503,
           settled later (cluster.roles.settle)

A leader checks all the op ids of a batch in the table's dedup in one call, raises its own pair
for each new op, appends APPLY records (one group-commit fsync for the batch) and, without
waiting for the disk, replicates; it answers once its own log has the records and W-1 replicas
acked theirs. Until then the ops are unpublished and their deltas hidden (docs/node.md "What is
visible when").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from cluster.core.batch_kernel import new_items
from cluster.core.config import NodeConfig
from cluster.core.entry import floor_of
from cluster.core.membership import Placement
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import ITEM_OP_ID, ItemFields, Op
from cluster.roles.admission import SAFE_ENTRY, Admission
from cluster.roles.antientropy import Hints
from cluster.roles.batching import TickBatcher
from cluster.roles.quorum import quorum_future
from cluster.roles.state import NodeState
from cluster.transport.peer import PeerLink
from cluster.transport.wire import Kind, Status
from cluster.wal import DurableLog, LogError, RecordKind, record_fields

log = logging.getLogger("cluster.leader")

APPLY, PUBLISHED = int(RecordKind.APPLY), int(RecordKind.PUBLISHED)
REPLICA = int(RecordKind.REPLICA)
_APPLIED, _DUPLICATE, _UNAVAILABLE = int(Status.APPLIED), int(Status.DUPLICATE), int(
    Status.UNAVAILABLE)


_TICK = 1e-6  # seconds: below the event loop's clock resolution, a wait is no wait


class Leader:
    """The leader role of one node. Its collaborators are passed in: the node's state, log,
    links, metrics, claims and hints, and four calls back into the node's recovery (settle a
    key, settle one op, give back a check's claims, confirm duplicates)."""

    def __init__(self, config: NodeConfig, ring: Placement, state: NodeState, log: DurableLog,
                 links: dict[str, PeerLink], metrics: NodeMetrics, claims: Any, hints: Hints,
                 *, clock: Callable[[], float],
                 monotonic: Callable[[], float] = time.monotonic,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None],
                 settle_key: Callable[[str, str, str], Coroutine[Any, Any, None]],
                 settle_one: Callable[[ItemFields], Coroutine[Any, Any, bool]],
                 release_claims: Callable[[str, str, str], None],
                 confirm: Callable[[list[tuple[str, str, str]]],
                                   Coroutine[Any, Any, list[bool]]] | None = None) -> None:
        self.config, self.ring, self.state, self.log = config, ring, state, log
        self.links, self.metrics, self.claims, self.hints = links, metrics, claims, hints
        self.clock = clock
        self._spawn, self._settle_key, self._settle_one = spawn, settle_key, settle_one
        self._release_claims = release_claims
        self._confirm = confirm  # a duplicate visible on W replicas? (checks.confirm_duplicates)
        self.id = config.node_id
        # op id -> the quorum wait of its application (or publication) under way
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        # (table, key) -> resolved when this node's last unpublished op on the key is settled
        self._key_free: dict[tuple[str, str], asyncio.Future[None]] = {}
        # op id -> monotonic time until which an op this node's check let through may apply
        self.leases: dict[str, float] = {}
        self.behind: set[str] = set()  # replicas that missed a write: anti-entropy them soon
        self.admission = Admission(config, state, claims, self.leases, metrics,
                                   release_claims=release_claims, monotonic=monotonic)
        self.batcher: TickBatcher[Op] = TickBatcher(self._lead_now, side=math.inf)
        # W > 2: a replica that merged a new op is not yet a quorum, so the op goes out staged
        # (hidden there) and is published once its quorum is known (``replicate``)
        self.stages = config.quorum > 2
        self.use_ring(ring)

    def use_ring(self, ring: Placement) -> None:
        """Place keys by ``ring`` from now on (a membership change, ``member.Node.install``)."""
        self.ring = ring
        self._targets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._everyone_else = (tuple(m for m in ring.members if m != self.id)
                               if ring.replicates_everywhere else None)
        self._moving = getattr(ring, "moving", False)  # a plain Ring never moves

    def submit(self, ops: Sequence[Op], limits: list[float] | None = None
               ) -> asyncio.Future[list[int]]:
        """Lead ``ops`` (admitted by the caller's checks); merged with every other batch led in
        this loop turn. Statuses in op order. ``limits``: for each op, the monotonic time after
        which it must not be applied (its check's lease, or the end of its window counted from
        its birth: ``checks.birth_limits``); none when not given. Each copy of an op carries its
        own, so a copy that waited (``_lead_later``) is judged by its own age."""
        return self.batcher.submit(list(ops), limits)

    async def _lead_now(self, ops: list[Op], limits: list[float],
                        deadline: float | None = None) -> list[int]:
        """Dedup, apply, log and replicate a batch this node leads; statuses in op order.
        Ops claimed for another node's check, and checked ops whose lease ran out (this node
        was paused after its check), answer 503 unapplied (``cluster.roles.checks``); ops that
        would overflow their entry answer ``counter_overflow`` (``cluster.roles.admission``). Ops
        on a key that still has an unpublished op here wait for it (``_lead_later``)."""
        later = self.state.busy_among(ops, self.state.shards.own)
        if later:
            self.metrics.deferred += len(later) if deadline is None else 0
            waiting = set(later)
            ready = [i for i in range(len(ops)) if i not in waiting]
            deferred = asyncio.ensure_future(self._lead_later(
                [ops[i] for i in later], [limits[i] for i in later], deadline))
            statuses = [_UNAVAILABLE] * len(ops)
            if ready:  # no await before the apply of the ready ones
                led = await self._lead_ready([ops[i] for i in ready], [limits[i] for i in ready])
                for i, st in zip(ready, led, strict=True):
                    statuses[i] = st
            for i, st in zip(later, await deferred, strict=True):
                statuses[i] = st
            return statuses
        return await self._lead_ready(ops, limits)

    async def _lead_ready(self, ops: list[Op], limits: list[float]) -> list[int]:
        refused = self.admission.before_apply(ops, limits)
        if not refused:
            return await self._lead_admitted(ops)
        statuses = [refused.get(i, _UNAVAILABLE) for i in range(len(ops))]
        keep = [i for i in range(len(ops)) if i not in refused]
        if keep:  # no await before the apply: the admission still holds there
            led = await self._lead_admitted([ops[i] for i in keep])
            for i, st in zip(keep, led, strict=True):
                statuses[i] = st
        return statuses

    async def _lead_later(self, ops: list[Op], limits: list[float], deadline: float | None
                          ) -> list[int]:
        """Ops on keys with an unpublished op of this node: applied once it is published or
        settled, never beside it. Their pair would carry its delta (pairs are cumulative), so
        it would become visible with them before it is known to stand. Keys whose op stays in
        doubt past ``quorum_timeout`` (a partition) answer 503."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.quorum_timeout
        waits = []
        busy, own = self.state.busy, self.state.shards.own
        for table, key in {(table, key) for table, key, _id, _delta, _attempt in ops}:
            if not busy(table, key, own):
                continue  # settled since: go on at once
            fut = self._key_free.get((table, key))
            if fut is None or fut.done():  # a done one would make this wait return at once
                fut = self._key_free[(table, key)] = loop.create_future()
            waits.append(fut)
            unpublished = self.state.unpublished(table, key, self.state.shards.own)
            if unpublished and not any(item[ITEM_OP_ID] in self._inflight
                                       for item in unpublished):
                self._spawn(self._settle_key(table, key, self.state.shards.own))
        remaining = deadline - loop.time()
        if waits and remaining > _TICK:
            await asyncio.wait(waits, timeout=remaining)
        # within a tick of the deadline is past it: a timer that close fires at once, without
        # the clock moving (the simulator's virtual clock then never reached the deadline, and
        # this and _lead_now called each other forever: sim seed 5 after the digest tree)
        if loop.time() >= deadline - _TICK and all(busy(table, key, own)
                                                   for table, key, _id, _delta, _attempt in ops):
            self.metrics.unavailable += len(ops)
            return [_UNAVAILABLE] * len(ops)
        return await self._lead_now(ops, limits, deadline)

    def release(self, op_ids: Iterable[str]) -> None:
        """These unpublished ops are published or withdrawn: visible (or cancelled) now; ops
        waiting for their key go on."""
        items = self.state.release_many(op_ids)
        free = self._key_free
        if not free:
            return
        busy, own = self.state.busy, self.state.shards.own
        for _id, table, key, _origin, _p, _n, _delta, _ts in items:
            fut = free.get((table, key))
            if fut is not None and not busy(table, key, own):
                del free[(table, key)]
                if not fut.done():
                    fut.set_result(None)

    async def _lead_admitted(self, ops: list[Op]) -> list[int]:
        statuses, own, groups, dup_waits = self._apply_batch(ops)
        if own is not None:
            waits = [self.replicate(targets, items, own, stage=self._stages(targets))
                     for targets, items in groups.items()]
            results = await asyncio.gather(*waits)
            if not all(results):
                # the ids sent in each group that failed (not the groups the ring would make
                # now: a membership change meanwhile moves a key's write set)
                self._settle_failures(ops, statuses, {
                    item[ITEM_OP_ID] for items, ok in zip(groups.values(), results, strict=True)
                    if not ok for item in items})
            self.metrics.applied += statuses.count(_APPLIED)
        for i, fut in dup_waits:  # shielded: another op's quorum wait, or its settling
            if not await asyncio.shield(fut):
                statuses[i] = _UNAVAILABLE
        return statuses

    def _apply_batch(self, ops: Sequence[Op]) -> tuple[
            list[int], asyncio.Future[None] | None, dict[tuple[str, ...], list[ItemFields]],
            list[tuple[int, asyncio.Future[bool]]]]:
        """The synchronous part: no await between the dedup check, the apply and the log
        append (one columnar frame for the batch); the append's future, None if no op was new.
        Each new op becomes an item, built as a list (``cluster.core.ops``: cheaper than an
        ``Item``, which names its fields)."""
        me, now = self.state.shards.own, self.clock()
        dups = self.state.seen_or_add_ops(ops)
        applied, groups, dup_at = new_items(ops, dups, me, now, self.targets_of)
        statuses = [_APPLIED] * len(ops)
        inflight, pending = self._inflight, self.state.pending
        dup_waits: list[tuple[int, asyncio.Future[bool]]] = []
        confirms: list[tuple[int, tuple[str, str, str]]] = []
        for i in dup_at:
            table, key, op_id, _delta, _attempt = ops[i]
            wait = inflight.get(op_id)
            if wait is None and op_id in pending:  # in doubt here: settle it first
                wait = asyncio.ensure_future(self._settle_one(pending[op_id]))
            if wait is not None:
                dup_waits.append((i, wait))
            elif self._confirm is not None:  # ran elsewhere, or published: is it visible?
                confirms.append((i, (table, key, op_id)))
            statuses[i] = _DUPLICATE
        collected = self.state.collected
        floors = self._floors(applied, groups, collected, now) if collected and applied else []
        self.metrics.duplicates += len(ops) - len(applied)
        if confirms and self._confirm is not None:
            confirmed = asyncio.ensure_future(self._confirm([c for _i, c in confirms]))
            dup_waits.extend(zip([i for i, _c in confirms], _split(confirmed, len(confirms)),
                                 strict=True))
        if not applied:
            return statuses, None, groups, dup_waits
        # unpublished: applied hidden until the quorum acks (each item gets its new pair)
        self.state.shards.apply_hidden_items(applied)
        self.state.touch(applied)
        self.state.hold_many(applied, hidden=True)
        op_ids, tables, keys, _origins, ps, ns, deltas, _ts = zip(*applied, strict=True)
        if max(ps) >= SAFE_ENTRY or max(ns) >= SAFE_ENTRY:
            self.admission.near_limit = True  # from now on every batch is checked op by op
        if floors:  # queued before the APPLY records: durable no later than they are
            self.log.append_columns_nowait(*record_fields(REPLICA, *zip(*floors, strict=True)))
        # origin and ts are one value for the whole frame (shared, not a column)
        own = self.log.append_columns_nowait(
            *record_fields(APPLY, op_ids, tables, keys, me, ps, ns, deltas, now))
        return statuses, own, groups, dup_waits

    def _floors(self, applied: list[list[Any]], groups: dict[tuple[str, ...], list[ItemFields]],
                collected: dict[str, int], now: float) -> list[list[Any]]:
        """The floors of the new items' keys in tables this node collected keys of
        (``_restart``), each put in its group just before the first item of its key: replicas
        learn the floor first. The floors, in order."""
        floor_before: dict[int, list[Any]] = {}
        for item in applied:
            table, key = item[1], item[2]
            if table in collected:
                floor = self._restart(table, key, item[0], collected[table], now)
                if floor is not None:
                    floor_before[id(item)] = floor
        if floor_before:
            for targets, group in groups.items():
                groups[targets] = [x for item in group for x in (
                    (floor_before[id(item)], item) if id(item) in floor_before else (item,))]
        return list(floor_before.values())

    def _restart(self, table: str, key: str, op_id: str, high: int, now: float
                 ) -> list[Any] | None:
        """This node raises its own pair on a key of a table it collected keys of: if it holds
        no pair of its own there (it may have collected the key), the pair starts at ``high``
        with a floor at ``high`` (``cluster.roles.expiry``): above any copy of the old pair a
        replica still holds, counting from 0. The floor's REPLICATE item, or None."""
        shards = self.state.shards
        if not high or shards.own_pair(table, key) != (0, 0):
            return None
        me = shards.own
        floor = floor_of(me)
        shards.merge_pair(table, key, floor, high, high)
        shards.merge_pair(table, key, me, high, high)
        return [op_id, table, key, floor, high, high, 0, now]

    def targets_of(self, table: str, key: str) -> tuple[str, ...]:
        """The key's replicas other than this node (cached per preference list); while a
        move is under way, also the member gaining the key (``Placement.write_set``)."""
        if self._everyone_else is not None:
            return self._everyone_else
        prefs = (self.ring.write_set if self._moving else self.ring.preference_list)(table, key)
        targets = self._targets.get(prefs)
        if targets is None:
            targets = self._targets[prefs] = tuple(t for t in prefs if t != self.id)
        return targets

    def replicate(self, targets: tuple[str, ...], items: list[ItemFields],
                  own: asyncio.Future[None] | None = None, *, stage: bool = False
                  ) -> asyncio.Future[bool]:
        """True once the op is durable here AND on W-1 other replicas: the leader's own copy is
        required, so an acked op is always in its leader's log (never in a torn tail). ``own``
        is the append of its records, None when they are in the log already (a publication of
        an in-doubt op, ``cluster.roles.settle``). On success the ops are published: visible
        here (``release``) and a PUBLISHED record each.

        ``stage`` (W > 2, a leader's new ops): the copies go out as STAGE frames, which the
        replicas keep hidden; once W copies are durable the op stands (no check of a retry can
        pass without one of them), so it is published: visible here, then a REPLICATE of the
        same items to every target makes it visible there, and the answer is True once W-1 of
        them acked it too (a quorum read then counts it). A second round, for W > 2 only.

        Synchronous on purpose: the ids are registered as in flight before anything else can
        run, so a duplicate arriving meanwhile waits for this outcome."""
        if own is None:
            own = asyncio.get_running_loop().create_future()
            own.set_result(None)
        timeout = self.config.quorum_timeout
        done = quorum_future([own, self._copies(targets, items, stage, timeout)], 2, timeout)
        inflight = self._inflight
        op_ids = [item[ITEM_OP_ID] for item in items]

        def stands(f: asyncio.Future[bool]) -> None:
            if f.result():
                self.release(op_ids)
                self.published(items)

        done.add_done_callback(stands)
        out = done
        if stage:
            loop = done.get_loop()
            out = loop.create_future()
            deadline = loop.time() + timeout
            done.add_done_callback(functools.partial(self._publish, targets, items, out,
                                                     deadline))
        for op_id in op_ids:
            inflight[op_id] = out

        def forget(f: asyncio.Future[bool]) -> None:
            for op_id in op_ids:
                if inflight.get(op_id) is out:
                    del inflight[op_id]

        out.add_done_callback(forget)
        return out

    def _stages(self, targets: tuple[str, ...]) -> bool:
        """New ops to ``targets`` go out staged when more than one other copy is needed: W > 2,
        or W = 2 while a move adds a member gaining the key (W + 1 copies then; a replica that
        merged one is not yet a quorum either)."""
        return self.stages or (self._moving and len(targets) + 1 > self.ring.rf
                               and self.config.quorum > 1)

    def _copies(self, targets: tuple[str, ...], items: list[ItemFields], stage: bool,
                timeout: float) -> asyncio.Future[bool]:
        """Send ``items`` to every target (REPLICATE, or STAGE); True once W-1 of them (plus
        one for each member gaining the key in a move) acked."""
        kind = Kind.STAGE if stage else Kind.REPLICATE
        remote = [self.links[t].call(kind, items) for t in targets]
        for t, fut in zip(targets, remote, strict=True):
            fut.add_done_callback(functools.partial(self._hint_on_failure, t, items))
        self.metrics.replicated_out += len(items) * len(targets)
        every = quorum_future(remote, len(remote), timeout)
        every.add_done_callback(functools.partial(self._mark_behind, targets, remote))
        # one more copy for each member gaining the key in a move (targets beyond rf - 1): W
        # copies in the old replica set and W in the new one (core/membership.py)
        extra = max(0, len(targets) + 1 - self.ring.rf) if self._moving else 0
        return quorum_future(remote, self.config.quorum - 1 + extra, timeout)

    def _publish(self, targets: tuple[str, ...], items: list[ItemFields],
                 out: asyncio.Future[bool], deadline: float, staged: asyncio.Future[bool]
                 ) -> None:
        """The staged copies' quorum answered: if it was reached, the ops stand and are
        published here (``replicate``'s ``stands``) and to the replicas (a REPLICATE of the
        same items: every pair it carries is published now); ``out`` then follows its W-1
        acks, within what is left of the quorum timeout. Calls made in one loop turn share a
        frame per peer, so the publications of a turn's batches go out together."""
        if out.done():
            return
        if not staged.result():
            out.set_result(False)
            return
        left = max(0.0, deadline - staged.get_loop().time())
        published = self._copies(targets, items, False, left)
        published.add_done_callback(functools.partial(_follow, out))

    def _mark_behind(self, targets: tuple[str, ...], remote: list[asyncio.Future[Any]],
                     all_acked: asyncio.Future[bool]) -> None:
        """A replica that did not ack in time (a lost frame leaves no error to hint on) gets
        an anti-entropy exchange at the next tick."""
        if not all_acked.result():
            for t, f in zip(targets, remote, strict=True):
                if not f.done() or f.cancelled() or f.exception() is not None:
                    self.behind.add(t)

    def _hint_on_failure(self, target: str, items: list[ItemFields],
                         fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            self.hints.add(target, items)

    def published(self, items: list[ItemFields]) -> None:
        """PUBLISHED records for ops now on a quorum (their delta 0), appended lazily: they
        ride with the log's next commit instead of forcing an fsync of their own, since a
        record lost in a crash only makes recovery ask the replicas about one more op."""
        if not items:
            return
        try:  # one columnar frame (a record each cost 4x as much to encode, measured)
            op_ids, tables, keys, origins, ps, ns, _deltas, ts = zip(*items, strict=True)
            self.log.append_columns_lazily(
                *record_fields(PUBLISHED, op_ids, tables, keys, origins, ps, ns, 0, ts))
        except LogError as exc:  # a closed or failed log: recovery asks instead
            log.debug("PUBLISHED records not written: %r", exc)

    def _settle_failures(self, ops: Sequence[Op], statuses: list[int],
                         failed: set[str]) -> None:
        """Ops of groups without a quorum (``failed``: their ids) answer 503; so do their
        duplicates in this batch (a duplicate must never be reported for an op that may not
        be durable)."""
        for i, (_table, _key, op_id, _delta, _attempt) in enumerate(ops):
            if op_id in failed and statuses[i] != _UNAVAILABLE:
                statuses[i] = _UNAVAILABLE
                self.metrics.unavailable += 1


def _follow(out: asyncio.Future[bool], fut: asyncio.Future[bool]) -> None:
    if not out.done():
        out.set_result(fut.result())


def _split(fut: asyncio.Future[list[bool]], n: int) -> list[asyncio.Future[bool]]:
    """One future per element of ``fut``'s list (False each when it fails)."""
    loop = asyncio.get_running_loop()
    parts: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(n)]

    def done(f: asyncio.Future[list[bool]]) -> None:
        failed = f.cancelled() or f.exception() is not None
        for part, ok in zip(parts, [False] * n if failed else f.result(), strict=True):
            part.set_result(ok)

    fut.add_done_callback(done)
    return parts
