"""Node logic: coordinate, lead, apply, log, replicate, wait for a quorum; reads with repair.

The write path of DESIGN.md, batch-shaped end to end: a coordinator groups ops by leader and
sends each leader one FORWARD frame; a leader checks each op id in its table's dedup, raises its
own shard pair, appends the batch to the durable log (one group-commit fsync) while replicating
it to the other replicas in one REPLICATE frame each, and answers when W durable copies exist
(its own log counts as one). A replica inserts the op id into its own dedup (this is how dedup
state is synchronised), merges the pair by max, logs it, and acks.

Run as ``python -m cluster.node``; the CLI lives in ``cluster.cli``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster import antientropy, checks, settle
from cluster.antientropy import Hints
from cluster.auth import PeerAuth, load_secret
from cluster.batching import TickBatcher
from cluster.config import NodeConfig
from cluster.errors import PeerError, Unavailable
from cluster.failure import FailureDetector
from cluster.metrics import NodeMetrics
from cluster.peer import PeerLink, peer_ssl
from cluster.quorum import next_incarnation, quorum_future
from cluster.reads import read_counter
from cluster.records import make_record
from cluster.ring import Ring
from cluster.shards import CounterEntry
from cluster.state import NodeState
from cluster.wal import DurableLog, LogRecord, RecordKind
from cluster.wire import Kind, Status

__all__ = ["Node", "Op", "next_incarnation", "quorum_future"]

log = logging.getLogger("cluster.node")

# A client op after validation: (table, key, op_id, delta, attempt)
Op = tuple[str, str, str, int, int]

APPLY, REPLICA = int(RecordKind.APPLY), int(RecordKind.REPLICA)
PUBLISHED, WITHDRAW = int(RecordKind.PUBLISHED), int(RecordKind.WITHDRAW)
_APPLIED, _DUPLICATE, _UNAVAILABLE = int(Status.APPLIED), int(Status.DUPLICATE), int(
    Status.UNAVAILABLE)
_OVERFLOW = int(Status.OVERFLOW)



def _stamped(ops: Sequence[Op]) -> list[list[Any]]:
    """FORWARD items carry the coordinator's wall clock (ms) as a sixth field."""
    now_ms = int(time.time() * 1000)
    return [[*op, now_ms] for op in ops]


_U64_MAX = (1 << 64) - 1
# Below this, an entry plus a batch's deltas (their absolute sum also below it) cannot pass
# _U64_MAX, so the common case skips the op-by-op overflow check.
_SAFE_ENTRY = 1 << 62


def _unstamped(body: list[list[Any]], stale_after_ms: int) -> list[Op]:
    """Ops of a FORWARD frame; one that waited past ``stale_after_ms`` (in a paused leader's
    socket buffer, say) goes as a retry: another replica may have taken over and applied it
    meanwhile, so it is checked there first. Items without the stamp are taken as they are."""
    now_ms = int(time.time() * 1000)
    out: list[Op] = []
    for item in body:
        table, key, op_id, delta, attempt = item[:5]
        if len(item) > 5 and now_ms - item[5] > stale_after_ms:
            attempt = max(attempt, 2)
        out.append((table, key, op_id, delta, attempt))
    return out

def _with_flags(out: asyncio.Future[Any], flags: list[bool], durable: asyncio.Future[Any]
                ) -> None:
    """``out`` gets the per-item flags once ``durable`` is (TickBatcher slices them per frame)."""
    if out.done():
        return
    if durable.cancelled():
        out.cancel()
    elif durable.exception() is not None:
        out.set_exception(durable.exception())  # type: ignore[arg-type]
    else:
        out.set_result(flags)


def _frame_reply(out: asyncio.Future[Any], merged: asyncio.Future[Any]) -> None:
    """A REPLICATE frame's reply: None once durable, False if any of its ops was refused."""
    if out.done():
        return
    if merged.cancelled():
        out.cancel()
    elif merged.exception() is not None:
        out.set_exception(merged.exception())  # type: ignore[arg-type]
    else:
        result = merged.result()
        out.set_result(False if isinstance(result, list) and not all(result) else None)


class Node:
    """One cluster member: owns the log, the peer links and the state; the HTTP layer calls it."""

    def __init__(self, config: NodeConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.id = config.node_id
        self.clock = clock
        self.ring = Ring([p[0] for p in config.peers], vnodes=config.vnodes, rf=config.rf)
        self.state = NodeState(config, clock=clock)
        self.origin = self.id  # becomes "<id>@<incarnation>" in recover()
        self.log = DurableLog(Path(config.data_dir) / "log", fsync=config.fsync,
                              archive=config.keep_log)
        secret = load_secret(config.secret_file) if config.secret_file else None
        self.auth = PeerAuth(self.id, secret, skew=config.peer_auth_skew)
        link_ssl = peer_ssl(config)
        self.links: dict[str, PeerLink] = {
            pid: PeerLink(self.id, pid, *config.dial_addr(pid),
                          connect_timeout=config.peer_connect_timeout,
                          max_inflight_frames=config.max_inflight_frames, auth=self.auth,
                          ssl_context=link_ssl)
            for pid, _, _ in config.peers if pid != self.id
        }
        self.metrics = NodeMetrics()
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        # (table, key) -> resolved when this node's last unpublished op on the key is settled
        self._key_free: dict[tuple[str, str], asyncio.Future[None]] = {}
        # (table, key, origin) -> resolved when the settle pass under way for it ends
        self.settling: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        self._leads: TickBatcher[Op] = TickBatcher(self._lead_now)
        self._replicas: TickBatcher[list[Any]] = TickBatcher(self._replicate_now)
        self._targets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._everyone_else = (tuple(m for m in self.ring.members if m != self.id)
                               if self.ring.replicates_everywhere else None)
        self.detector = FailureDetector(
            list(self.links), interval=config.heartbeat_interval,
            threshold=config.phi_threshold, timeout=config.failure_timeout)
        self.detector.on_change = self._peer_changed
        # Every member counts as live until heartbeats run (the server starts them): a guess
        # from one failed connection would move a key's leader for no good reason.
        self.is_live: Callable[[str], bool] = lambda _node: True
        self.ready = False  # set once in-doubt ops are settled and dedup state pulled
        self.checked = checks.Checked(config.window, clock)
        # Ops claimed here for a node checking them (or by this node's own check), and the
        # time until which this node may apply an op its check let through (cluster.checks)
        self.claims = checks.Claims()
        self.leases: dict[str, float] = {}
        self.hints = Hints(config.max_hints)
        self._degraded_until = 0.0  # a restart sets it (recover), so does a peer gone silent
        self._near_limit = False  # an own entry passed 2^62: check batches for overflow
        self._silent: set[str] = set()
        self.behind: set[str] = set()  # replicas that missed a write: anti-entropy them soon
        self._bg: set[asyncio.Task[Any]] = set()

    @property
    def pending(self) -> dict[str, list[Any]]:
        """In-doubt ops: applied here as leader, not known to be on a quorum (op id -> item)."""
        return self.state.pending

    @property
    def inflight(self) -> dict[str, asyncio.Future[bool]]:
        return self._inflight

    def use_detector(self) -> None:
        self.is_live = self.detector.is_live

    def recently_degraded(self) -> bool:
        """A peer was down (or this node restarted) within the window: another leader may
        have applied ops this one never saw, so non-primary leads are checked on the replicas."""
        return time.monotonic() < self._degraded_until

    def _peer_changed(self, peer: str, live: bool) -> None:
        # A peer never heard from yet (still starting), or that said it is recovering, was not
        # cut off: no reason to check ops.
        d = self.detector.peers[peer]
        silent = not live and d.ready and d.heard
        if silent or live and peer in self._silent:
            self._degraded_until = time.monotonic() + self.config.window
        if live:
            self._silent.discard(peer)
            self.spawn(self._caught_up(peer))
        elif silent:
            self._silent.add(peer)

    async def _caught_up(self, peer: str) -> None:
        await self.hints.deliver(self, peer)
        await antientropy.sync_all(self, [peer])

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- lifecycle -------------------------------------------------------------------------

    async def recover(self) -> int:
        """Open the log, load the snapshot, replay the log; returns the records replayed.

        Each start is a new incarnation with its own origin id (``n1@7``), so this node never
        raises a pair that peers may know a higher value of: a record replicated but lost from
        our own log tail in a crash cannot collide with what we apply after the restart.
        """
        self.origin = f"{self.id}@{next_incarnation(Path(self.config.data_dir))}"
        self.state.set_origin(self.origin)
        await self.log.start()
        blob = self.log.load_snapshot()
        if blob is not None:
            self.state.load_blob(blob)
        count = 0
        replay, pending = self.state.replay, dict(self.state.pending)
        for rec in self.log.replay():
            kind = rec.kind
            if kind in (APPLY, REPLICA, WITHDRAW):
                replay(rec.op_id, rec.table, rec.key, rec.origin, rec.p, rec.n, rec.ts)
                count += 1
            if kind == APPLY:
                pending[rec.op_id] = [rec.op_id, rec.table, rec.key, rec.origin, rec.p, rec.n,
                                      rec.delta, rec.ts]
            elif kind in (PUBLISHED, WITHDRAW):
                pending.pop(rec.op_id, None)
                if kind == WITHDRAW:
                    self.state.withdrawn[rec.op_id] = rec.ts
        self.state.set_pending(list(pending.values()))  # unpublished: hidden until settled
        self.metrics.replayed = count
        if count or blob is not None:  # a restart: others may have led our keys meanwhile
            self._degraded_until = time.monotonic() + self.config.window
        return count

    async def prepare(self) -> None:
        """Before serving: pull the replicas' dedup state and entries, settle in-doubt ops."""
        await antientropy.pull_dedup(self)
        await antientropy.sync_all(self, list(self.links))
        await settle.settle_all(self)

    async def close(self) -> None:
        for task in list(self._bg):
            task.cancel()
        for link in self.links.values():
            await link.stop()
        await self.log.stop()

    def abort(self) -> None:
        for task in list(self._bg):
            task.cancel()
        for link in self.links.values():
            link.abort()
        self.log.abort()

    def health(self) -> dict[str, Any]:
        state = self.state
        return {
            "node": self.id,
            "status": "ok" if self.ready else "recovering",
            "members": list(self.ring.members),
            "rf": self.ring.rf,
            "write_quorum": self.config.quorum,
            "window_s": min([d.window for d in state.dedups.values() if d.window > 0]
                            or [self.config.window]),
            "dedup": {"default": self.config.dedup, **dict(self.config.dedup_tables)},
            "tables": {t: {"strategy": d.name, "window_s": d.window,
                           "estimated_fpp": d.estimated_fpp()}
                       for t, d in state.dedups.items()},
            "peers": {pid: link.connected for pid, link in self.links.items()},
            "addresses": {pid: f"{host}:{port}" for pid, host, port in self.config.peers},
            "ring": {"vnodes": self.ring.vnodes, "hash": "murmur3_x64_128",
                     "key": "<table>/<key>"},
            "counters": state.shards.keys,
            "live": {pid: self.is_live(pid) for pid in self.links},
            "in_doubt": len(state.pending),
            "hints": {pid: self.hints.pending(pid) for pid in self.links},
        }

    # -- coordinator -----------------------------------------------------------------------

    async def submit(self, ops: Sequence[Op]) -> list[int]:
        """Route every op to its leader (one FORWARD frame per leader); statuses in op order."""
        me = self.id
        if len(ops) == 1:
            leader = self.ring.leader(ops[0][0], ops[0][1], self.is_live)
            if leader == me:
                return await self.lead(ops)
            return await self._forward(leader, list(ops))
        groups: dict[str | None, list[int]] = {}
        leader_of = self.ring.leader
        is_live = self.is_live
        for i, op in enumerate(ops):
            leader = leader_of(op[0], op[1], is_live)
            idx = groups.get(leader)
            if idx is None:
                groups[leader] = [i]
            else:
                idx.append(i)
        out = [_UNAVAILABLE] * len(ops)
        waits = []
        for leader, idx in groups.items():
            sub = [ops[i] for i in idx]
            waits.append(self.lead(sub) if leader == me else self._forward(leader, sub))
        for idx, statuses in zip(groups.values(), await asyncio.gather(*waits), strict=True):
            for i, s in zip(idx, statuses, strict=True):
                out[i] = s
        return out

    async def _forward(self, leader: str | None, ops: list[Op]) -> list[int]:
        if leader is None:
            return [_UNAVAILABLE] * len(ops)
        self.metrics.forwarded += len(ops)
        fut = self.links[leader].call(Kind.FORWARD, _stamped(ops))
        try:
            statuses = await asyncio.wait_for(fut, self.config.quorum_timeout * 1.5)
        except PeerError as exc:  # the leader is unreachable: the next live replica leads
            log.info("forward to %s failed, re-routing: %r", leader, exc)
            return await self._reroute(leader, ops)
        except (TimeoutError, Unavailable) as exc:
            log.warning("forward to %s failed: %r", leader, exc)
            return [_UNAVAILABLE] * len(ops)
        if len(statuses) != len(ops):
            return [_UNAVAILABLE] * len(ops)
        return statuses

    async def _reroute(self, failed: str, ops: list[Op]) -> list[int]:
        """Lead or forward (once) to the next live replica. The failed leader may have applied
        some of the ops, so they go as retries (attempt >= 2): checked on the replicas first."""
        is_live = self.is_live
        out = [_UNAVAILABLE] * len(ops)
        groups: dict[str | None, list[int]] = {}
        for i, op in enumerate(ops):
            leader = self.ring.leader(op[0], op[1], lambda n: n != failed and is_live(n))
            groups.setdefault(leader, []).append(i)
        for leader, idx in groups.items():
            sub: list[Op] = [(t, k, o, d, max(a, 2)) for t, k, o, d, a in (ops[i] for i in idx)]
            if leader is None:
                continue
            if leader == self.id:
                res = await self.lead(sub)
            else:
                try:
                    res = await asyncio.wait_for(self.links[leader].call(Kind.FORWARD,
                                                                         _stamped(sub)),
                                                 self.config.quorum_timeout * 1.5)
                except (TimeoutError, Unavailable):
                    continue
            for i, st in zip(idx, res, strict=True):
                out[i] = st
        return out

    # -- leader ----------------------------------------------------------------------------

    def lead(self, ops: Sequence[Op]) -> asyncio.Future[list[int]]:
        """Lead ``ops``; merged with every other batch led in this loop turn. Statuses in order.
        Retries, and every op while a peer was recently down, are first checked on the replicas
        (``cluster.checks``); a node still recovering leads nothing."""
        if not self.ready:
            done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            done.set_result([_UNAVAILABLE] * len(ops))
            return done
        if self.is_live == self.detector.is_live:
            self.detector.check_all()  # after a pause, see the silence before leading anything
        if self.recently_degraded() or any(op[4] > 1 for op in ops):
            return asyncio.ensure_future(checks.lead_checked(self, list(ops)))
        return self._leads.submit(list(ops))

    def lead_plain(self, ops: Sequence[Op]) -> asyncio.Future[list[int]]:
        return self._leads.submit(list(ops))

    async def _lead_now(self, ops: list[Op], deadline: float | None = None) -> list[int]:
        """Dedup, apply, log and replicate a batch this node leads; statuses in op order.
        Ops claimed for another node's check, and checked ops whose lease ran out (this node
        was paused after its check), answer 503 unapplied (``cluster.checks``); ops that
        would overflow their entry answer ``counter_overflow`` (``_overflowing``). Ops on a key
        that still has an unpublished op here wait for it (``_lead_later``)."""
        later: list[int] = []
        if self.state.pending:
            busy, own = self.state.busy, self.origin
            later = [i for i, op in enumerate(ops) if busy(op[0], op[1], own)]
        if later:
            self.metrics.deferred += len(later) if deadline is None else 0
            waiting = set(later)
            ready = [i for i in range(len(ops)) if i not in waiting]
            deferred = asyncio.ensure_future(self._lead_later([ops[i] for i in later], deadline))
            statuses = [_UNAVAILABLE] * len(ops)
            if ready:  # no await before the apply of the ready ones
                for i, st in zip(ready, await self._lead_ready([ops[i] for i in ready]),
                                 strict=True):
                    statuses[i] = st
            for i, st in zip(later, await deferred, strict=True):
                statuses[i] = st
            return statuses
        return await self._lead_ready(ops)

    async def _lead_ready(self, ops: list[Op]) -> list[int]:
        refused = self._refused(ops) if self.leases or self.claims else {}
        if self._near_limit or sum(abs(op[3]) for op in ops) >= _SAFE_ENTRY:
            refused.update(self._overflowing(ops, refused))
        if not refused:
            return await self._lead_admitted(ops)
        statuses = [refused.get(i, _UNAVAILABLE) for i in range(len(ops))]
        keep = [i for i in range(len(ops)) if i not in refused]
        if keep:  # no await before the apply: the admission still holds there
            led = await self._lead_admitted([ops[i] for i in keep])
            for i, st in zip(keep, led, strict=True):
                statuses[i] = st
        return statuses

    async def _lead_later(self, ops: list[Op], deadline: float | None) -> list[int]:
        """Ops on keys with an unpublished op of this node: applied once it is published or
        settled, never beside it. Their pair would carry its delta (pairs are cumulative), so
        it would become visible with them before it is known to stand. Keys whose op stays in
        doubt past ``quorum_timeout`` (a partition) answer 503."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.quorum_timeout
        waits = []
        busy, own = self.state.busy, self.origin
        for table, key in {(op[0], op[1]) for op in ops}:
            if not busy(table, key, own):
                continue  # settled since: go on at once
            fut = self._key_free.get((table, key))
            if fut is None:
                fut = self._key_free[(table, key)] = loop.create_future()
            waits.append(fut)
            unpublished = self.state.unpublished(table, key, self.origin)
            if unpublished and not any(item[0] in self._inflight for item in unpublished):
                self.spawn(settle.settle_key(self, table, key, self.origin))
        remaining = deadline - loop.time()
        if waits and remaining > 0:
            await asyncio.wait(waits, timeout=remaining)
        if loop.time() >= deadline and all(busy(op[0], op[1], own) for op in ops):
            self.metrics.unavailable += len(ops)
            return [_UNAVAILABLE] * len(ops)
        return await self._lead_now(ops, deadline)

    def release(self, op_ids: Iterable[str]) -> None:
        """These unpublished ops are published or withdrawn: visible (or cancelled) now; ops
        waiting for their key go on."""
        release, free = self.state.release, self._key_free
        for op_id in op_ids:
            item = release(op_id)
            if item is not None and free:
                fut = free.get((item[1], item[2]))
                if fut is not None and not self.state.busy(item[1], item[2], self.origin):
                    del free[(item[1], item[2])]
                    if not fut.done():
                        fut.set_result(None)

    def _refused(self, ops: Sequence[Op]) -> dict[int, int]:
        """Ops this node must not apply now (see ``_lead_now``): index -> 503."""
        refused: dict[int, int] = {}
        now = time.monotonic()
        leases, claims, me = self.leases, self.claims, self.id
        for i, (table, key, op_id, _delta, _attempt) in enumerate(ops):
            deadline = leases.pop(op_id, None)
            if deadline is not None:
                if now > deadline:
                    refused[i] = _UNAVAILABLE
                    log.info("op %s passed its check %.3f s ago: stale, not applied", op_id,
                             now - deadline)
                    checks.release_claims(self, table, key, op_id)
                else:
                    claims.applied(op_id)  # applied now: the dedup answers for it
                continue
            if claims:
                holder = claims.holder(op_id)
                if holder is not None and holder != me:
                    refused[i] = _UNAVAILABLE
        self.metrics.unavailable += len(refused)
        return refused

    async def _lead_admitted(self, ops: list[Op]) -> list[int]:
        statuses, own, groups, dup_waits = self._apply_batch(ops)
        if own is not None:
            waits = [self._replicate(targets, items, own) for targets, items in groups.items()]
            results = await asyncio.gather(*waits)
            ok_by_group = dict(zip(groups, results, strict=True))
            if not all(results):
                self._settle_failures(ops, statuses, ok_by_group)
            self.metrics.applied += sum(1 for s in statuses if s == _APPLIED)
        for i, fut in dup_waits:
            if not await fut:
                statuses[i] = _UNAVAILABLE
        return statuses

    def _apply_batch(self, ops: Sequence[Op]) -> tuple[
            list[int], asyncio.Future[None] | None, dict[tuple[str, ...], list[list[Any]]],
            list[tuple[int, asyncio.Future[bool]]]]:
        """The synchronous part: no await between the dedup check, the apply and the log
        append (one columnar frame for the batch); the append's future, None if no op was new."""
        me, now = self.origin, self.clock()
        dups = self.state.seen_or_add_many(ops, 0, 2)
        apply_local = self.state.shards.apply_local
        targets_of = self.targets_of
        inflight, pending, hold = self._inflight, self.state.pending, self.state.hold
        statuses: list[int] = []
        rows: list[tuple[str, str, str, int, int, int]] = []
        groups: dict[tuple[str, ...], list[list[Any]]] = {}
        dup_waits: list[tuple[int, asyncio.Future[bool]]] = []
        for (table, key, op_id, delta, _attempt), dup in zip(ops, dups, strict=True):
            if dup:
                wait = inflight.get(op_id)
                if wait is None and op_id in pending:  # in doubt here: settle it first
                    wait = asyncio.ensure_future(settle.settle_one(self, pending[op_id]))
                if wait is not None:
                    dup_waits.append((len(statuses), wait))
                statuses.append(_DUPLICATE)
                continue
            p, n = apply_local(table, key, delta)
            statuses.append(_APPLIED)
            rows.append((op_id, table, key, delta, p, n))
            targets = targets_of(table, key)
            item = [op_id, table, key, me, p, n, delta, now]
            hold(item)  # unpublished: hidden from everyone else until its quorum acks
            group = groups.get(targets)
            if group is None:
                groups[targets] = [item]
            else:
                group.append(item)
        self.metrics.duplicates += len(ops) - len(rows)
        if not rows:
            return statuses, None, groups, dup_waits
        op_ids, tables, keys, deltas, ps, ns = zip(*rows, strict=True)
        if max(ps) >= _SAFE_ENTRY or max(ns) >= _SAFE_ENTRY:
            self._near_limit = True  # from now on every batch is checked op by op
        own = self.log.append_columns_nowait(APPLY, op_ids, tables, keys, deltas, me, ps, ns, now)
        return statuses, own, groups, dup_waits

    def _overflowing(self, ops: Sequence[Op], skip: Mapping[int, int]) -> dict[int, int]:
        """Ops (not in ``skip``) that would raise this node's own entry of their key past
        2^64 - 1, the most the log, the peer frames and the snapshots carry: index -> status.
        Such an op is refused (``counter_overflow``) and its id is not remembered, unless the
        dedup already holds it: a retry of an op applied before is still a duplicate."""
        own_pair, dedup = self.state.shards.own_pair, self.state.dedup
        totals: dict[tuple[str, str], list[int]] = {}
        refused: dict[int, int] = {}
        for i, (table, key, op_id, delta, _attempt) in enumerate(ops):
            if i in skip:
                continue
            total = totals.get((table, key))
            if total is None:
                total = totals[(table, key)] = list(own_pair(table, key))
            side = 0 if delta >= 0 else 1
            if total[side] + abs(delta) > _U64_MAX:
                refused[i] = _DUPLICATE if op_id.encode() in dedup(table) else _OVERFLOW
            else:
                total[side] += abs(delta)
        self.metrics.overflows += sum(1 for s in refused.values() if s == _OVERFLOW)
        return refused

    def targets_of(self, table: str, key: str) -> tuple[str, ...]:
        """The key's replicas other than this node (cached per preference list)."""
        if self._everyone_else is not None:
            return self._everyone_else
        prefs = self.ring.preference_list(table, key)
        targets = self._targets.get(prefs)
        if targets is None:
            targets = self._targets[prefs] = tuple(t for t in prefs if t != self.id)
        return targets

    def _replicate(self, targets: tuple[str, ...], items: list[list[Any]],
                   own: asyncio.Future[None]) -> asyncio.Future[bool]:
        """True once the op is durable here AND on W-1 other replicas: the leader's own copy is
        required, so an acked op is always in its leader's log (never in a torn tail).

        Synchronous on purpose: the ids are registered as in flight before anything else can
        run, so a duplicate arriving meanwhile waits for this outcome."""
        remote = [self.links[t].call(Kind.REPLICATE, items) for t in targets]
        for t, fut in zip(targets, remote, strict=True):
            fut.add_done_callback(functools.partial(self._hint_on_failure, t, items))
        self.metrics.replicated_out += len(items) * len(targets)
        timeout = self.config.quorum_timeout
        every = quorum_future(remote, len(remote), timeout)
        every.add_done_callback(functools.partial(self._mark_behind, targets, remote))
        others = quorum_future(remote, self.config.quorum - 1, timeout)
        done = quorum_future([own, others], 2, timeout)
        inflight = self._inflight
        for op in items:
            inflight[op[0]] = done

        def forget(f: asyncio.Future[bool]) -> None:
            for op in items:
                if inflight.get(op[0]) is done:
                    del inflight[op[0]]
            if f.result():
                self.release([op[0] for op in items])
                self.published(items)

        done.add_done_callback(forget)
        return done

    def _mark_behind(self, targets: tuple[str, ...], remote: list[asyncio.Future[Any]],
                     all_acked: asyncio.Future[bool]) -> None:
        """A replica that did not ack in time (a lost frame leaves no error to hint on) gets
        an anti-entropy exchange at the next tick."""
        if not all_acked.result():
            for t, f in zip(targets, remote, strict=True):
                if not f.done() or f.cancelled() or f.exception() is not None:
                    self.behind.add(t)

    def _hint_on_failure(self, target: str, items: list[list[Any]],
                         fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            self.hints.add(target, items)

    def published(self, items: list[list[Any]]) -> None:
        """PUBLISHED records for ops now on a quorum; appended without waiting: a record lost
        in a crash only makes recovery ask the replicas about one more op."""
        try:
            fut = self.log.append_nowait([
                make_record(PUBLISHED, op_id, table, key, 0, origin, p, n, ts)
                for op_id, table, key, origin, p, n, _delta, ts in items])
        except Exception as exc:  # noqa: BLE001 - a closed log: recovery asks instead
            log.debug("PUBLISHED records not written: %r", exc)
            return
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    def learn(self, table: str, key: str, op_id: str, entry: CounterEntry) -> None:
        """A replica holds ``op_id``: remember it and merge the key's entry (logged)."""
        self.state.dedup(table).seen_or_add(op_id.encode())
        self.claims.drop(op_id)
        self.on_repair([[table, key, entry.to_wire()]], op_id)

    def _settle_failures(self, ops: Sequence[Op], statuses: list[int],
                         ok_by_group: dict[tuple[str, ...], bool]) -> None:
        """Ops of groups without a quorum answer 503; so do their duplicates in this batch
        (a duplicate must never be reported for an op that may not be durable)."""
        failed = {op_id for targets, ok in ok_by_group.items() if not ok
                  for op_id in self._group_ids(targets, ops)}
        for i, op in enumerate(ops):
            if op[2] in failed and statuses[i] != _UNAVAILABLE:
                statuses[i] = _UNAVAILABLE
                self.metrics.unavailable += 1

    def _group_ids(self, targets: tuple[str, ...], ops: Sequence[Op]) -> Iterable[str]:
        for table, key, op_id, _, _ in ops:
            if self.targets_of(table, key) == targets:
                yield op_id

    # -- replica ---------------------------------------------------------------------------

    def on_replicate(self, items: list[list[Any]]) -> asyncio.Future[Any]:
        """Merged with the other REPLICATE frames of this loop turn; resolves once durable:
        None, or False when some of the frame's ops were refused (``_fenced``)."""
        done = asyncio.get_running_loop().create_future()
        self._replicas.submit(items).add_done_callback(functools.partial(_frame_reply, done))
        return done

    def _replicate_now(self, items: list[list[Any]]) -> asyncio.Future[Any]:
        flags = self._fenced(items) if self.claims else None
        if flags is not None:
            items = [item for item, ok in zip(items, flags, strict=True) if ok]
        self.state.seen_or_add_many(items, 1, 0)  # learn the ids: dedup state stays in sync
        claims = self.claims
        if claims:  # the application arrived: the dedup answers for these ops now
            for item in items:
                claims.applied(item[0])
        self.state.shards.merge_items(items)
        self.metrics.replicated_in += len(items)
        if not items:
            durable = self.log.append_nowait([])
        else:
            op_id, table, key, origin, p, n, delta, ts = zip(*items, strict=True)
            durable = self.log.append_columns_nowait(REPLICA, op_id, table, key, delta, origin,
                                                     p, n, ts)
        if flags is None:
            return durable
        out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        durable.add_done_callback(functools.partial(_with_flags, out, flags))
        return out

    def _fenced(self, items: list[list[Any]]) -> list[bool] | None:
        """Per item, False for a copy of an op claimed here for (or applied by) another node
        than its origin's: a leader that was cut off or paused while a replica that took over
        applied the op after a check. Merging it would count the op twice, so the copy is
        refused, and so is every later item of the same key and origin in the frame (its pair
        carries the refused delta). None when nothing is refused."""
        fence = self.claims.fence
        flags: list[bool] | None = None
        cut: set[tuple[str, str, str]] = set()
        for i, item in enumerate(items):
            k = (item[1], item[2], item[3])
            if k not in cut:
                holder = fence(item[0])
                if holder is None or holder == item[3].partition("@")[0]:
                    continue
                cut.add(k)
                log.info("refused %s's copy of op %s: claimed for %s", item[3], item[0], holder)
            if flags is None:
                flags = [True] * len(items)
            flags[i] = False
        if flags is not None:
            self.metrics.fenced += flags.count(False)
        return flags

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]:
        records = []
        now = self.clock()
        merge = self.state.shards.merge_pair
        for table, key, wire_entry in items:
            for origin, (p, n) in CounterEntry.from_wire(wire_entry).pairs.items():
                if merge(table, key, origin, p, n):
                    records.append(LogRecord(REPLICA, op_id, table, key, 0, origin, p, n, now))
        self.metrics.repairs_in += len(records)
        return self.log.append_nowait(records)

    def shareable(self, items: list[list[Any]]) -> list[list[Any]]:
        """REPLICATE items queued earlier (hints), as they may be sent now: ops still
        unpublished or withdrawn left out, and each pair the visible one of its key and origin
        (never less than the item's own once it is published)."""
        pending, withdrawn, pair = self.state.pending, self.state.withdrawn, self.state.shards.pair
        out = []
        for item in items:
            if item[0] in pending or item[0] in withdrawn:
                continue
            op_id, table, key, origin = item[0], item[1], item[2], item[3]
            p, n = pair(table, key, origin)
            out.append([op_id, table, key, origin, p, n, item[6], item[7]])
        return out

    def on_read(self, items: list[list[str]]) -> list[dict[str, list[int]]]:
        entry = self.state.shards.entry
        return [entry(table, key).to_wire() for table, key in items]

    def handle_peer(self, peer_id: str, kind: int, body: Any) -> Any:
        """Dispatch one inbound peer frame (the ``PeerProtocol`` handler)."""
        if kind == Kind.REPLICATE:
            return self.on_replicate(body)  # replies None once durable
        if kind == Kind.FORWARD:
            return self.lead(_unstamped(body, int(self.config.failure_timeout * 500)))
        if kind == Kind.READ:
            return self.on_read(body)
        if kind == Kind.REPAIR:
            return self.on_repair(body)
        if kind == Kind.PING:
            return [{"ready": self.ready}] * len(body)
        if kind == Kind.HOLDS:
            return checks.on_holds(self, body, peer_id)
        if kind == Kind.DIGEST:
            return antientropy.on_digest(self, peer_id, body[0] if body else {})
        if kind == Kind.ENTRIES:
            return [antientropy.on_entries(self, peer_id, b) for b in body]
        if kind == Kind.DEDUP:
            return [antientropy.on_dedup(self, b) for b in body]
        raise ValueError(f"unknown peer frame kind {kind}")

    # -- reads -----------------------------------------------------------------------------

    async def read(self, table: str, key: str, consistency: str) -> int:
        """Merge the entries of ``consistency`` many replicas; repair the stale ones seen."""
        return await read_counter(self, table, key, consistency)


if __name__ == "__main__":
    import sys

    from cluster.cli import main

    sys.exit(main())
