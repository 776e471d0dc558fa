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
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cluster.batching import TickBatcher
from cluster.config import NodeConfig
from cluster.errors import Unavailable
from cluster.metrics import NodeMetrics
from cluster.peer import PeerLink
from cluster.reads import read_counter
from cluster.records import make_record
from cluster.ring import Ring
from cluster.shards import CounterEntry
from cluster.state import NodeState
from cluster.wal import DurableLog, LogRecord, RecordKind
from cluster.wire import Kind, Status

log = logging.getLogger("cluster.node")

# A client op after validation: (table, key, op_id, delta, attempt)
Op = tuple[str, str, str, int, int]

APPLY = int(RecordKind.APPLY)
REPLICA = int(RecordKind.REPLICA)
_APPLIED, _DUPLICATE, _UNAVAILABLE = int(Status.APPLIED), int(Status.DUPLICATE), int(
    Status.UNAVAILABLE)


def next_incarnation(data_dir: Path) -> int:
    """Read, bump and durably store this data directory's incarnation number."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "incarnation"
    try:
        current = int(path.read_text().strip() or 0)
    except FileNotFoundError:
        current = 0
    tmp = data_dir / "incarnation.tmp"
    with open(tmp, "w") as f:
        f.write(f"{current + 1}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return current + 1


def quorum_future(futures: Sequence[asyncio.Future[Any]], need: int,
                  timeout: float) -> asyncio.Future[bool]:
    """Resolves True once ``need`` of ``futures`` succeed (a result other than False), False
    when that became impossible or ``timeout`` passed. Callbacks, not ``asyncio.wait``: no task
    per wait on the hot path."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()
    if need <= 0:
        done.set_result(True)
        return done
    state = [0, 0]  # successes, failures
    total = len(futures)

    def on_done(f: asyncio.Future[Any]) -> None:
        if done.done():
            if not f.cancelled():
                f.exception()  # consume it: a late failure is expected, not an error
            return
        if f.cancelled() or f.exception() is not None or f.result() is False:
            state[1] += 1
        else:
            state[0] += 1
        if state[0] >= need:
            done.set_result(True)
            timer.cancel()
        elif state[1] > total - need:
            done.set_result(False)
            timer.cancel()

    def on_timeout() -> None:
        if not done.done():
            done.set_result(False)

    timer = loop.call_later(timeout, on_timeout)
    for f in futures:
        f.add_done_callback(on_done)
    return done


class Node:
    """One cluster member: owns the log, the peer links and the state; the HTTP layer calls it."""

    def __init__(self, config: NodeConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.id = config.node_id
        self.clock = clock
        self.ring = Ring([p[0] for p in config.peers], vnodes=config.vnodes, rf=config.rf)
        self.state = NodeState(config, clock=clock)
        self.origin = self.id  # becomes "<id>@<incarnation>" in recover()
        self.log = DurableLog(Path(config.data_dir) / "log", fsync=config.fsync)
        self.links: dict[str, PeerLink] = {
            pid: PeerLink(self.id, pid, host, port, connect_timeout=config.peer_connect_timeout,
                          max_inflight_frames=config.max_inflight_frames)
            for pid, host, port in config.peers if pid != self.id
        }
        self.metrics = NodeMetrics()
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self._leads: TickBatcher[Op] = TickBatcher(self._lead_now)
        self._replicas: TickBatcher[list[Any]] = TickBatcher(self._replicate_now)
        self._targets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._everyone_else = (tuple(m for m in self.ring.members if m != self.id)
                               if self.ring.replicates_everywhere else None)
        self.is_live: Callable[[str], bool] = self._is_live

    def _is_live(self, node_id: str) -> bool:
        """Liveness predicate for leader choice. Every member counts as live until a failure
        detector is plugged in here (``node.is_live = detector.is_live``): a guess based on one
        failed connection would move a key's leader, and with it the point where duplicates
        are caught, for no good reason."""
        return True

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
        replay = self.state.replay
        for rec in self.log.replay():
            if rec.kind in (APPLY, REPLICA):
                replay(rec.op_id, rec.table, rec.key, rec.origin, rec.p, rec.n, rec.ts)
                count += 1
        self.metrics.replayed = count
        return count

    async def close(self) -> None:
        for link in self.links.values():
            await link.stop()
        await self.log.stop()

    def abort(self) -> None:
        for link in self.links.values():
            link.abort()
        self.log.abort()

    def health(self) -> dict[str, Any]:
        state = self.state
        return {
            "node": self.id,
            "status": "ok",
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
        fut = self.links[leader].call(Kind.FORWARD, ops)
        try:
            statuses = await asyncio.wait_for(fut, self.config.quorum_timeout * 1.5)
        except (TimeoutError, Unavailable) as exc:
            log.warning("forward to %s failed: %r", leader, exc)
            return [_UNAVAILABLE] * len(ops)
        if len(statuses) != len(ops):
            return [_UNAVAILABLE] * len(ops)
        return statuses

    # -- leader ----------------------------------------------------------------------------

    def lead(self, ops: Sequence[Op]) -> asyncio.Future[list[int]]:
        """Lead ``ops``; merged with every other batch led in this loop turn. Statuses in order."""
        return self._leads.submit(list(ops))

    async def _lead_now(self, ops: list[Op]) -> list[int]:
        """Dedup, apply, log and replicate a batch this node leads; statuses in op order."""
        statuses, records, groups, dup_waits = self._apply_batch(ops)
        if records:
            own = self.log.append_nowait(records)
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
            list[int], list[LogRecord], dict[tuple[str, ...], list[list[Any]]],
            list[tuple[int, asyncio.Future[bool]]]]:
        """The synchronous part: no await between the dedup check and the apply."""
        me, now = self.origin, self.clock()
        dups = self.state.seen_or_add_many(ops, 0, 2)
        apply_local = self.state.shards.apply_local
        targets_of = self._targets_of
        inflight = self._inflight
        statuses: list[int] = []
        records: list[LogRecord] = []
        groups: dict[tuple[str, ...], list[list[Any]]] = {}
        dup_waits: list[tuple[int, asyncio.Future[bool]]] = []
        for (table, key, op_id, delta, _attempt), dup in zip(ops, dups, strict=True):
            if dup:
                pending = inflight.get(op_id)
                if pending is not None:
                    dup_waits.append((len(statuses), pending))
                statuses.append(_DUPLICATE)
                continue
            p, n = apply_local(table, key, delta)
            statuses.append(_APPLIED)
            records.append(make_record(APPLY, op_id, table, key, delta, me, p, n, now))
            targets = targets_of(table, key)
            item = [op_id, table, key, me, p, n, delta, now]
            group = groups.get(targets)
            if group is None:
                groups[targets] = [item]
            else:
                group.append(item)
        self.metrics.duplicates += len(ops) - len(records)
        return statuses, records, groups, dup_waits

    def _targets_of(self, table: str, key: str) -> tuple[str, ...]:
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
        self.metrics.replicated_out += len(items) * len(targets)
        timeout = self.config.quorum_timeout
        others = quorum_future(remote, self.config.quorum - 1, timeout)
        done = quorum_future([own, others], 2, timeout)
        inflight = self._inflight
        for op in items:
            inflight[op[0]] = done

        def forget(_: asyncio.Future[bool]) -> None:
            for op in items:
                if inflight.get(op[0]) is done:
                    del inflight[op[0]]

        done.add_done_callback(forget)
        return done

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
            if self._targets_of(table, key) == targets:
                yield op_id

    # -- replica ---------------------------------------------------------------------------

    def on_replicate(self, items: list[list[Any]]) -> asyncio.Future[Any]:
        """Merged with the other REPLICATE frames of this loop turn; resolves once durable."""
        return self._replicas.submit(items)

    def _replicate_now(self, items: list[list[Any]]) -> asyncio.Future[None]:
        self.state.seen_or_add_many(items, 1, 0)  # learn the ids: dedup state stays in sync
        self.state.shards.merge_items(items)
        records = [make_record(REPLICA, op_id, table, key, delta, origin, p, n, ts)
                   for op_id, table, key, origin, p, n, delta, ts in items]
        self.metrics.replicated_in += len(items)
        return self.log.append_nowait(records)

    def on_repair(self, items: list[list[Any]]) -> asyncio.Future[None]:
        records = []
        now = self.clock()
        merge = self.state.shards.merge_pair
        for table, key, wire_entry in items:
            for origin, (p, n) in CounterEntry.from_wire(wire_entry).pairs.items():
                if merge(table, key, origin, p, n):
                    records.append(LogRecord(REPLICA, "", table, key, 0, origin, p, n, now))
        self.metrics.repairs_in += len(records)
        return self.log.append_nowait(records)

    def on_read(self, items: list[list[str]]) -> list[dict[str, list[int]]]:
        entry = self.state.shards.entry
        return [entry(table, key).to_wire() for table, key in items]

    def handle_peer(self, peer_id: str, kind: int, body: Any) -> Any:
        """Dispatch one inbound peer frame (the ``PeerProtocol`` handler)."""
        if kind == Kind.REPLICATE:
            return self.on_replicate(body)  # replies None once durable
        if kind == Kind.FORWARD:
            return self.lead(body)
        if kind == Kind.READ:
            return self.on_read(body)
        if kind == Kind.REPAIR:
            return self.on_repair(body)
        raise ValueError(f"unknown peer frame kind {kind}")

    # -- reads -----------------------------------------------------------------------------

    async def read(self, table: str, key: str, consistency: str) -> int:
        """Merge the entries of ``consistency`` many replicas; repair the stale ones seen."""
        return await read_counter(self, table, key, consistency)


if __name__ == "__main__":
    import sys

    from cluster.cli import main

    sys.exit(main())
