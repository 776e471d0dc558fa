"""Exactly-once across leaders: retries checked on the replicas, in-doubt ops settled.

DESIGN.md "The hard cases". A leader that may not be the only one to have seen an op (a retry,
``attempt`` > 1; a failover leader; any leader within a window after it saw a peer down) asks
the key's other replicas whether they hold the op id (``HOLDS``) before applying it; a replica
that does makes the answer "duplicate", and the leader learns the id and the key's entry. Ops
applied through this check are remembered exactly for the window (``checked``), so a node that
later finds the same op in doubt can tell "another leader applied it" from "my own replication
reached you".

An op is *in doubt* from its APPLY until its quorum acked (then a PUBLISHED record is appended,
without waiting for it). Ops whose quorum failed, and the unpublished APPLYs a restarted node
finds in its log (or snapshot), are settled by asking the replicas: if another leader applied
the op, this node withdraws its own application with a compensating entry from its current
origin (a WITHDRAW record); otherwise it publishes it (replicates it again). Compensating
instead of lowering the old pair: every later op of that origin on the key carries the op's
delta inside its pair, and replicas merge by max, so a lowered pair would be raised again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cluster.quorum import quorum_future
from cluster.records import make_record
from cluster.shards import CounterEntry
from cluster.wal import RecordKind
from cluster.wire import Kind, Status

if TYPE_CHECKING:
    from cluster.node import Node, Op

log = logging.getLogger("cluster.recovery")

PUBLISHED, WITHDRAW, APPLY = (int(RecordKind.PUBLISHED), int(RecordKind.WITHDRAW),
                              int(RecordKind.APPLY))
_APPLIED, _DUPLICATE, _UNAVAILABLE = (int(Status.APPLIED), int(Status.DUPLICATE),
                                      int(Status.UNAVAILABLE))
# HOLDS answers: in the dedup; applied there and not yet on a quorum; applied there and withdrawn
HELD, IN_DOUBT, WITHDRAWN = 1, 2, 3
MAX_CHECKED = 1_000_000  # exact ids applied through the check, kept for the window


class Checked:
    """op id -> time, for ops this node applied after a cross-replica check (bounded, timed)."""

    def __init__(self, window: float, clock: Any = time.time) -> None:
        self.window, self.clock = window, clock
        self._ids: OrderedDict[str, float] = OrderedDict()

    def add(self, op_id: str) -> None:
        now = self.clock()
        self._ids[op_id] = now
        ids = self._ids
        while ids and (len(ids) > MAX_CHECKED or next(iter(ids.values())) < now - 2 * self.window):
            ids.popitem(last=False)

    def __contains__(self, op_id: str) -> bool:
        return op_id in self._ids


def needs_check(node: Node, op: Op) -> bool:
    """A retry, or any op while this node saw a peer down (or restarted) within the window: it
    may lead a key only because the primary is down, or be a primary that was cut off or
    paused while another replica led its keys (a copy held in its socket buffer would
    otherwise be applied a second time)."""
    return op[4] > 1 or node.recently_degraded()


async def ask_holds(node: Node, table: str, key: str, op_id: str
                    ) -> tuple[int, list[tuple[str, int, bool, CounterEntry]]]:
    """Ask the key's other replicas about ``op_id``: (replicas that answered, their answers
    as (node, HELD/IN_DOUBT/0, applied it after a check, entry of the key))."""
    others = [r for r in node.ring.preference_list(table, key) if r != node.id]
    futs = {r: node.links[r].call(Kind.HOLDS, [[table, key, op_id]]) for r in others}
    await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
    out = []
    for r, fut in futs.items():
        if not fut.done():
            fut.cancel()
        elif fut.exception() is None:
            held, checked, entry = fut.result()[0]
            out.append((r, int(held), bool(checked), CounterEntry.from_wire(entry)))
    return len(out), out


def on_holds(node: Node, items: list[list[Any]]) -> list[list[Any]]:
    """Answer ``HOLDS``: IN_DOUBT when this node applied the op and it is not yet on a quorum
    (its outcome is not decided), HELD when the id is in the dedup, else 0; whether this node
    applied it after a check; the key's entry (so the asker learns what the op contributed)."""
    out = []
    pending = node.pending
    for table, key, op_id in items:
        held = (IN_DOUBT if op_id in pending else WITHDRAWN if op_id in node.state.withdrawn
                else HELD if op_id.encode() in node.state.dedup(table) else 0)
        out.append([held, op_id in node.checked, node.state.shards.entry(table, key).to_wire()])
    return out


async def lead_checked(node: Node, ops: list[Op]) -> list[int]:
    """Lead a batch in which some ops need the cross-replica check (see ``needs_check``)."""
    statuses = [_UNAVAILABLE] * len(ops)
    plain: list[int] = []
    checks = []
    idx_checked: list[int] = []
    for i, op in enumerate(ops):
        if needs_check(node, op) and op[2].encode() not in node.state.dedup(op[0]):
            idx_checked.append(i)
            checks.append(_check_one(node, op))
        else:
            plain.append(i)
    results = await asyncio.gather(*checks)
    to_lead = list(plain)
    for i, res in zip(idx_checked, results, strict=True):
        if res is None:
            to_lead.append(i)
        else:
            statuses[i] = res
    if to_lead:
        led = await node.lead_plain([ops[i] for i in to_lead])
        for i, s in zip(to_lead, led, strict=True):
            statuses[i] = s
            if s == _APPLIED and i in idx_checked:
                node.checked.add(ops[i][2])
    return statuses


async def _check_one(node: Node, op: Op) -> int | None:
    """DUPLICATE when a replica holds the op (learned here), UNAVAILABLE when too few replicas
    answered to be sure, None when the op may be applied."""
    table, key, op_id = op[0], op[1], op[2]
    node.metrics.retry_checks += 1
    answered, answers = await ask_holds(node, table, key, op_id)
    if any(held == IN_DOUBT for _, held, _, _ in answers):
        return _UNAVAILABLE  # another leader's application is still open: retry decides later
    for _, held, _, entry in answers:
        if held:
            node.learn(table, key, op_id, entry)
            node.metrics.duplicates += 1
            return _DUPLICATE
    # Any W replicas that acked the op intersect this node plus RF - W others that answered.
    if answered < node.ring.rf - node.config.quorum:
        return _UNAVAILABLE
    return None


# -- in-doubt ops ---------------------------------------------------------------------------


def _covers(entry: CounterEntry, item: Sequence[Any]) -> bool:
    p, n = entry.pairs.get(item[3], (0, 0))
    return p >= item[4] and n >= item[5]


async def settle(node: Node, items: list[list[Any]]) -> list[bool]:
    """Settle in-doubt ops (``[op_id, table, key, origin, p, n, delta, ts]`` each): withdraw
    those another leader applied, publish the rest. True for each op settled."""
    results = await asyncio.gather(*(settle_one(node, item) for item in items))
    return list(results)


async def settle_one(node: Node, item: list[Any]) -> bool:
    op_id, table, key = item[0], item[1], item[2]
    if op_id not in node.pending:
        return True
    answered, answers = await ask_holds(node, table, key, op_id)
    if op_id not in node.pending:
        return True
    # Another leader applied it: it applied it after a check, or holds the id without our pair
    # (our replication never reached it), or holds it in doubt too; then the higher node id
    # withdraws and the lower one publishes, so exactly one application stays.
    # A replica that withdrew its own copy deferred to another application, perhaps ours: the
    # id it holds then says nothing about a third one.
    me = node.id
    deferred = any(held == WITHDRAWN for _, held, _, _ in answers)
    other = any((held == IN_DOUBT and r < me) or (held == HELD and checked)
                or (held == HELD and not deferred and not _covers(entry, item))
                for r, held, checked, entry in answers)
    if other:
        await withdraw(node, item)
        return True
    if answered < node.ring.rf - node.config.quorum:
        return False  # a replica that applied it may be among the silent ones
    targets = node.targets_of(table, key)
    remote = [node.links[t].call(Kind.REPLICATE, [item]) for t in targets]
    ok = await quorum_future(remote, node.config.quorum - 1, node.config.quorum_timeout)
    if ok and node.pending.pop(op_id, None) is not None:
        node.published([item])
        node.metrics.published_late += 1
    return ok


async def withdraw(node: Node, item: list[Any]) -> None:
    """Cancel this node's application of an op another leader applied: a compensating delta
    on this node's current origin, logged (WITHDRAW) and pushed to the replicas."""
    op_id, table, key, delta = item[0], item[1], item[2], item[6]
    if node.pending.pop(op_id, None) is None:
        return
    node.state.withdrawn[op_id] = node.clock()
    p, n = node.state.shards.apply_local(table, key, -delta)
    rec = make_record(WITHDRAW, op_id, table, key, -delta, node.origin, p, n, node.clock())
    node.metrics.withdrawn += 1
    log.info("withdrew in-doubt op %s on %s/%s (applied by another leader)", op_id, table, key)
    entry = [[table, key, {node.origin: [p, n]}]]
    for t in node.targets_of(table, key):
        node.links[t].call(Kind.REPAIR, entry).add_done_callback(_consume)
    await node.log.append_nowait([rec])


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


async def settle_all(node: Node, min_age: float = 0.0) -> int:
    """One pass over the in-doubt ops not currently waiting for their quorum; how many remain."""
    now = node.clock()
    items = [item for op_id, item in list(node.pending.items())
             if op_id not in node.inflight and now - item[7] >= min_age]
    if items:
        await settle(node, items)
    return len(node.pending)


async def settle_loop(node: Node, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await settle_all(node, min_age=node.config.quorum_timeout)
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the next one
            log.warning("settling in-doubt ops failed: %r", exc)
