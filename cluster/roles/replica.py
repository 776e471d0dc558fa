"""The replica's side of the write path: merge a leader's ops, refuse fenced copies, repair, read.

A replica (its REPLICATE frames of one loop turn merged into one batch) inserts every op id into
its own dedup (that is how the dedup state of the replicas stays in step), max-merges the pairs,
logs REPLICA records and acks once durable. The items stay the lists msgpack decodes (an
``Item``'s fields, ``cluster.core.ops``: converting each would cost more than the merge). A copy
of an op claimed here for another leader is refused (``_fenced``): the frame's reply is False
and its sender settles the op.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from cluster.core.batch_kernel import oldest_ts
from cluster.core.entry import is_real
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import ITEM_OP_ID, Item, ItemFields
from cluster.core.shards import CounterEntry
from cluster.roles.batching import TickBatcher
from cluster.roles.state import NodeState
from cluster.wal import DurableLog, LogRecord, RecordKind, record_fields

log = logging.getLogger("cluster.replica")

REPLICA, STAGED = int(RecordKind.REPLICA), int(RecordKind.STAGED)


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


def _covered(have: tuple[int, int], p: int, n: int) -> bool:
    return have[0] >= p and have[1] >= n


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


class Replica:
    """The replica role of one node: collaborators are its state, log, claims and metrics."""

    def __init__(self, state: NodeState, log: DurableLog, claims: Any, metrics: NodeMetrics,
                 *, clock: Callable[[], float]) -> None:
        self.state, self.log, self.claims, self.metrics = state, log, claims, metrics
        self.clock = clock
        self.batcher: TickBatcher[ItemFields] = TickBatcher(self._replicate_now)
        self.stage_batcher: TickBatcher[ItemFields] = TickBatcher(self._stage_now)

    def on_replicate(self, items: list[ItemFields]) -> asyncio.Future[Any]:
        """Merged with the other REPLICATE frames of this loop turn; resolves once durable:
        None, or False when some of the frame's ops were refused (``_fenced``)."""
        merged = self.batcher.submit(items)
        done = merged.get_loop().create_future()
        merged.add_done_callback(functools.partial(_frame_reply, done))
        return done

    def on_stage(self, items: list[ItemFields]) -> asyncio.Future[Any]:
        """A STAGE frame (write quorum above 2): as ``on_replicate``, but each op's pair is
        merged hidden (``NodeState.stage_items``) and logged as STAGED: nobody sees it here
        until a visible pair of its origin covers it (its leader's publication)."""
        merged = self.stage_batcher.submit(items)
        done = merged.get_loop().create_future()
        merged.add_done_callback(functools.partial(_frame_reply, done))
        return done

    def _replicate_now(self, items: list[ItemFields]) -> asyncio.Future[Any]:
        return self._merge_now(items, staged=False)

    def _stage_now(self, items: list[ItemFields]) -> asyncio.Future[Any]:
        return self._merge_now(items, staged=True)

    def _merge_now(self, items: list[ItemFields], *, staged: bool) -> asyncio.Future[Any]:
        claims = self.claims
        flags = (self._fenced(items) if claims or claims.amnesiac() or self._late(items)
                 else None)
        if flags is not None:
            items = [item for item, ok in zip(items, flags, strict=True) if ok]
        state = self.state
        # learn the ids: dedup state stays in sync (a publication's ops staged here: learned)
        state.seen_or_add_items(state.published_staged(items) if not staged and state.staged
                                else items)
        if claims:  # the application arrived: the dedup answers for these ops now
            for item in items:
                claims.applied(item[ITEM_OP_ID])
        if not staged:
            hidden, plain = [], items
            state.shards.merge_visible_items(items)
        elif all(is_real(origin) for origin in {item[3] for item in items}):
            hidden, plain = items, []
            state.stage_items(items)
        else:  # a floor item (``Leader._restart``) carries no delta of the op: visible as ever
            hidden = [item for item in items if is_real(item[3])]
            plain = [item for item in items if not is_real(item[3])]
            state.stage_items(hidden)
            state.shards.merge_visible_items(plain)
        self.state.touch(items)
        self.metrics.replicated_in += len(items)
        if not items:
            durable = self.log.append_nowait([])
        elif not hidden:
            durable = self.log.append_columns_nowait(
                *record_fields(REPLICA, *zip(*plain, strict=True)))
        else:
            if plain:
                self.log.append_columns_nowait(*record_fields(REPLICA, *zip(*plain, strict=True)))
            durable = self.log.append_columns_nowait(
                *record_fields(STAGED, *zip(*hidden, strict=True)))
        if flags is None:
            return durable
        out: asyncio.Future[Any] = durable.get_loop().create_future()
        durable.add_done_callback(functools.partial(_with_flags, out, flags))
        return out

    def _oldest_allowed(self, table: str) -> float:
        """The leader's clock at the apply (the item's ``ts``) before which a copy of an op
        new here may have outlived the fences that would refuse it: the table's window less
        the clock skew, before now. -inf for a table that remembers nothing."""
        window = self.state.window(table)
        if window <= 0:
            return -math.inf
        return self.clock() - window + self.state.config.max_clock_skew

    def _late(self, items: list[ItemFields]) -> bool:
        """Some item was applied by its leader longer ago than the shortest window allows."""
        if not items:
            return False
        windows = [d.window for d in self.state.dedups.values() if d.window > 0]
        shortest = min(windows, default=self.state.config.window)
        oldest = oldest_ts(items)
        return oldest < self.clock() - shortest + self.state.config.max_clock_skew

    def _fenced(self, items: list[ItemFields]) -> list[bool] | None:
        """Per item, False for a copy of an op claimed here for (or applied by) another node
        than its origin's: a leader that was cut off or paused while a replica that took over
        applied the op after a check. Merging it would count the op twice, so the copy is
        refused, and so is every later item of the same key and origin in the frame (its pair
        carries the refused delta). None when nothing is refused.

        Also a first copy of an op (not in the dedup here, not claimed for its leader) that its
        leader applied longer ago than the window less the clock skew: the fence another
        application left here lasts the window, so it may be gone. A leader frozen between its
        apply and its send (SIGSTOP, a stolen VM) wakes and sends such copies; merged, they
        would reach a quorum beside the retry another leader applied meanwhile. Its leader
        settles the op instead (a publication goes with fresh claims, taken for it here)."""
        fence = self.claims.fence
        # shortly after a restart, a copy applied before it may be one fenced before the crash
        stale = self.claims.forgot_before if self.claims.amnesiac() else 0.0
        oldest: dict[str, float] = {}
        flags: list[bool] | None = None
        cut: set[tuple[str, str, str]] = set()
        for i, (op_id, table, key, origin, p, n, _delta, ts) in enumerate(items):
            if not is_real(origin):
                # a floor or LAST item carries no delta of the op: a delete's, or the floor a
                # leader's pair starts again at (``Leader._restart``); refused for the op's
                # claim, as "~n5@2" is not "n5", it left the pair above an old floor (the
                # simulator's seed 5043: -4 read on a replica)
                continue
            k = (table, key, origin)
            if k not in cut:
                holder = fence(op_id)
                if holder is None:
                    limit = oldest.get(table)
                    if limit is None:
                        limit = oldest[table] = self._oldest_allowed(table)
                    if ts >= stale and (ts >= limit or _covered(self.state.shards.pair(
                            table, key, origin, visible=False), p, n)):
                        continue  # new enough, or nothing new here (a late publication)
                    holder = ("a check before this node's restart" if ts < stale
                              else "nobody: older than the window, its fences may be gone")
                elif holder == origin.partition("@")[0]:
                    continue
                cut.add(k)
                log.info("refused %s's copy of op %s: claimed for %s", origin, op_id, holder)
            if flags is None:
                flags = [True] * len(items)
            flags[i] = False
        if flags is not None:
            self.metrics.fenced += flags.count(False)
        return flags

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]:
        """Merge entries (read repair, anti-entropy, a move's hand-off) and log what they
        raised. A tombstone past its grace for a key this node does not hold is left out: this
        node collected it (or never needed it), and taking it back from a replica that has not
        collected it yet would only have the two trade it until both have."""
        records = []
        now = self.clock()
        shards = self.state.shards
        merge, holds = shards.merge_pair, shards.holds
        now_ms, grace_ms = int(now * 1000), int(self.state.config.tombstone_grace * 1000)
        for table, key, wire_entry in items:
            entry = CounterEntry.from_wire(wire_entry)
            if not holds(table, key) and entry.collectable(now_ms, grace_ms):
                continue
            for origin, (p, n) in entry.pairs.items():
                if merge(table, key, origin, p, n):
                    records.append(LogRecord(REPLICA, op_id, table, key, 0, origin, p, n, now))
        self.metrics.repairs_in += len(records)
        return self.log.append_nowait(records)

    def shareable(self, items: list[ItemFields]) -> list[ItemFields]:
        """REPLICATE items queued earlier (hints), as they may be sent now: ops still
        unpublished or withdrawn left out, and each pair the visible one of its key and origin
        (never less than the item's own once it is published)."""
        pending, withdrawn, pair = self.state.pending, self.state.withdrawn, self.state.shards.pair
        out: list[ItemFields] = []
        for op_id, table, key, origin, _p, _n, delta, ts in items:
            if op_id in pending or op_id in withdrawn:
                continue
            p, n = pair(table, key, origin)
            out.append(Item(op_id, table, key, origin, p, n, delta, ts))
        return out

    def learn(self, table: str, key: str, op_id: str, entry: CounterEntry
              ) -> asyncio.Future[None]:
        """A replica holds ``op_id``: remember it and merge the key's entry (the future of its
        log append)."""
        self.state.dedup(table).seen_or_add(op_id.encode())
        self.claims.drop(op_id)
        return self.on_repair([[table, key, entry.to_wire()]], op_id)
