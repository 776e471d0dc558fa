"""Exactly-once across leaders, part two: in-doubt ops settled, published or withdrawn.

An op is *unpublished* from its APPLY until its quorum acked (then a PUBLISHED record is
appended, without waiting for it); it is *in doubt* once that quorum failed. In-doubt ops, and
the unpublished APPLYs a restarted node finds in its log (or snapshot), are settled by asking the
replicas (``HOLDS``, ``cluster.roles.checks``): if another leader applied the op, this node
withdraws its own application with a compensating delta on the op's own origin (a WITHDRAW record);
otherwise it publishes it (replicates it again). Until then the op's delta is hidden: nobody but
this node sees it (``ShardStore.hide``; docs/node.md "What is visible when").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from cluster.core.entry import LAST, floor_of
from cluster.core.ops import ITEM_OP_ID, ITEM_TS, Item, ItemFields
from cluster.core.shards import CounterEntry
from cluster.roles import checks
from cluster.roles.checks import (
    BUSY,
    CLAIM,
    FORGOT,
    HELD,
    IN_DOUBT,
    STAGED,
    WITHDRAWN,
    consume,
    release_claims,
)
from cluster.transport.wire import Kind
from cluster.wal import RecordKind, make_record, record_fields

if TYPE_CHECKING:
    from cluster.wal import DurableLog


class Node(checks.Node, Protocol):
    """What settling needs of its node: the checks' needs, plus the log and the leader's
    publication."""

    log: DurableLog
    settling: dict[tuple[str, str, str], asyncio.Future[None]]

    def clock(self) -> float: ...

    def release(self, op_ids: Iterable[str]) -> None: ...

    def replicate(self, targets: tuple[str, ...], items: list[ItemFields]
                  ) -> asyncio.Future[bool]: ...

    def targets_of(self, table: str, key: str) -> tuple[str, ...]: ...

log = logging.getLogger("cluster.settle")

WITHDRAW, REPLICA = int(RecordKind.WITHDRAW), int(RecordKind.REPLICA)

# -- in-doubt ops ---------------------------------------------------------------------------


def _covers(entry: CounterEntry, item: Item) -> bool:
    p, n = entry.pairs.get(item.origin, (0, 0))
    return p >= item.p and n >= item.n


async def settle_one(node: Node, fields: ItemFields) -> bool:
    """Settle the in-doubt op ``fields`` (an item, and the ops before it on its key); True once
    it is published or withdrawn."""
    item = Item.of(fields)
    if item.op_id not in node.pending:
        return True
    waiting = node.inflight.get(item.op_id)  # its quorum (or a publication) is under way
    if waiting is not None and await asyncio.shield(waiting):
        return True
    await settle_key(node, item.table, item.key, item.origin)
    return item.op_id not in node.pending


async def settle_key(node: Node, table: str, key: str, origin: str) -> None:
    """Settle the in-doubt ops of one key and origin, one pass at a time per key (a second
    caller waits for the pass under way)."""
    k = (table, key, origin)
    running = node.settling.get(k)
    if running is not None:
        await asyncio.shield(running)
        return
    done = node.settling[k] = asyncio.get_running_loop().create_future()
    try:
        await _settle_key(node, table, key, origin)
    finally:
        del node.settling[k]
        done.set_result(None)


async def _settle_key(node: Node, table: str, key: str, origin: str) -> None:
    """In the order they were applied, withdraw the ops another leader applied and publish
    the rest; stop at the first one that cannot be decided yet.

    A pair carries every earlier op of its origin on the key, so they are settled in order,
    and each publication sends the pair of exactly what is settled so far: the visible pair
    plus the ops being published. Nothing that may still be withdrawn ever leaves this node.
    """
    items = [Item.of(item) for item in node.state.unpublished(table, key, origin)]
    if not items or any(item.op_id in node.inflight for item in items):
        return  # empty, or a quorum is still being waited for: its outcome decides
    answers = await ask_holds_many(node, table, key, [item.op_id for item in items])
    run: list[Item] = []
    for i, item in enumerate(items):
        if item.op_id not in node.pending:
            return  # settled meanwhile by another path: ask again next time
        # a replica that gave no claim (FORGOT: it restarted lately) did not answer
        got = [(r, a[i], e) for r, a, e in answers if a[i][0] != FORGOT]
        verdict = _verdict(node, item, len(got), got)
        if verdict == "publish":
            run.append(item)
            continue
        if run and not await _publish(node, table, key, origin, run):
            return
        run = []
        if verdict == "withdraw":
            await withdraw(node, item, [entry for _r, _a, entry in answers])
        else:
            return  # undecided: the ops after it wait with it
    if run:
        await _publish(node, table, key, origin, run)


def _verdict(node: Node, item: Item, answered: int,
             answers: list[tuple[str, tuple[int, bool], CounterEntry]]) -> str:
    """"withdraw" when another leader applied the op: it applied it after a check, or holds
    the id without our pair (our replication never reached it), or holds it in doubt too and
    has the lower node id (so exactly one application stays); "publish" when enough replicas
    answered and none did; "wait" when a replica has another application or check of it open,
    or too few answered. A replica that withdrew its own copy deferred to another application,
    perhaps ours: the id it holds then says nothing about a third one.

    What the replicas remember of another application (its id, the claim and fence of its
    check) lasts the table's window. So an op in doubt for longer (``_past_memory``) is
    published only if a replica holds our pair of it (our replication reached it: it stands,
    and a duplicate may have been answered for it), and withdrawn once every replica answered
    without it: "not held" from a replica that may have forgotten proves nothing. A replica
    holding our copy staged (STAGED, W > 2) holds our pair of it, hidden: never a reason to
    withdraw, and a reason to publish."""
    # while a move is under way the member gaining the key was written to (and counted) too
    others = [r for r in node.ring.write_set(item.table, item.key) if r != node.id]
    extra = max(0, len(others) + 1 - node.ring.rf)
    if any(held == BUSY for _, (held, _), _ in answers):
        return "wait"
    me = node.id
    deferred = any(held == WITHDRAWN for _, (held, _), _ in answers)
    if any((held == IN_DOUBT and r < me) or (held == HELD and checked)
           or (held == HELD and not deferred and not _covers(entry, item))
           for r, (held, checked), entry in answers):
        return "withdraw"
    if _past_memory(node, item):
        if any(held == STAGED or _covers(entry, item) for _, (held, _), entry in answers):
            return "publish"
        return "withdraw" if answered >= len(others) else "wait"
    if answered < len(others) + 1 - node.config.quorum - extra:
        return "wait"  # a replica that applied it may be among the silent ones
    return "publish"


def _past_memory(node: Node, item: Item) -> bool:
    """The op is older than what a replica surely remembers of another application of it:
    the table's window, less the clock skew allowed between nodes."""
    left = checks.time_left(node, item.table, item.ts)
    return left is not None and left < 0


async def ask_holds_many(node: Node, table: str, key: str, op_ids: list[str]
                         ) -> list[tuple[str, list[tuple[int, bool]], CounterEntry]]:
    """``ask_holds`` for several ops of one key in one frame per replica (claiming each): per
    replica that answered in time, its answers in op order and the key's entry."""
    others = [r for r in node.ring.write_set(table, key) if r != node.id and r in node.links]
    futs = {r: node.links[r].call(Kind.HOLDS, [[table, key, op_id, CLAIM] for op_id in op_ids])
            for r in others}
    if futs:
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
    out = []
    for r, fut in futs.items():
        if not fut.done():
            fut.cancel()
        elif fut.exception() is None:
            got = fut.result()
            if len(got) != len(op_ids):
                continue
            out.append((r, [(int(held), bool(checked)) for held, checked, _ in got],
                        CounterEntry.from_wire(got[0][2]) if got else CounterEntry()))
    return out


async def _publish(node: Node, table: str, key: str, origin: str, run: list[Item]) -> bool:
    """Replicate in-doubt ops again, with the pair of everything settled up to them; True once
    a quorum holds them (they are visible then)."""
    p, n = node.state.shards.pair(table, key, origin)
    for item in run:
        if item.delta >= 0:
            p += item.delta
        else:
            n -= item.delta
    sent: list[ItemFields] = [item._replace(p=p, n=n) for item in run]
    targets = node.targets_of(table, key)
    # the origin's floor and the key's last change first: a replica that collected the key's
    # tombstone while the ops waited (in doubt longer than the rest of the grace) takes the
    # pairs with the floor they lie on, not bare above nothing (the simulator's seed 7064:
    # deleted counts shown again), as a withdrawal's compensation does
    shards = node.state.shards
    floors = {o: list(pair) for o in (floor_of(origin), LAST)
              if any(pair := shards.pair(table, key, o))}
    if floors and targets:
        entry = [[table, key, floors]]
        pushed = [node.links[t].call(Kind.REPAIR, entry) for t in targets]
        for fut in pushed:
            fut.add_done_callback(consume)
        await asyncio.wait(pushed, timeout=node.config.quorum_timeout)
    # The leader's own replicate: in flight meanwhile (a replica settling its own copy of the
    # op waits, BUSY, for this outcome, and so does a retry), published on success.
    ok = await node.replicate(targets, sent)
    if ok:
        node.metrics.published_late += len(sent)
        for item in run:
            # Say so when asked, like an op applied after a check: a replica that also holds it
            # in doubt (and deferred to this one, the lower id) must then withdraw, and the
            # entries anti-entropy merged meanwhile no longer tell the two applications apart.
            node.checked.add(item.op_id)
    return ok


async def withdraw(node: Node, item: Item, seen: Iterable[CounterEntry] = ()) -> None:
    """Cancel this node's application of an op another leader applied. It was never visible
    (its delta hidden, no later pair of its key carrying it), so the cancellation is a
    compensating delta on the op's own origin and key: the op's pair and its compensation
    become visible together, value-neutral. Logged (WITHDRAW) and pushed to the replicas.

    Visible here, that is: the replicas its first replication reached hold the op's pair, and
    a delete that read one of them floored it (docs/deletes.md). The delete removed the op
    then, and the compensation must not remove it a second time: when the op's origin has a
    floor (here, or in ``seen``, the replicas' entries) that covers the op's pair but not the
    compensation, the floor rises by the compensation too (``_floor_raised``), logged with the
    WITHDRAW record and pushed with the compensation.

    The WITHDRAW record is durable before the compensation is made or leaves this node: a
    compensation pushed before a crash that lost its record came back from the replicas (max-
    merged into our pair) while the op was found in doubt again and withdrawn a second time,
    compensated twice (the simulator's seed 6718, an acknowledged op lost)."""
    op_id, table, key, origin, delta = item.op_id, item.table, item.key, item.origin, item.delta
    if op_id not in node.pending:
        return
    p, n = node.state.shards.pair(table, key, origin, visible=False)
    if delta >= 0:
        n += delta
    else:
        p -= delta
    # the compensation: the op's own fields with the negated delta and the pair it leaves
    now = node.clock()
    floor = _floor_raised(node, item, (p, n), seen)
    recs = [make_record(*record_fields(WITHDRAW, op_id, table, key, origin, p, n, -delta, now))]
    if floor is not None:  # first: a torn tail may keep the floor without the WITHDRAW (the op
        # is then settled again, and the floor already covers its compensation), never the
        # WITHDRAW without the floor (the simulator's seed 3036: the delete's count taken twice)
        recs.insert(0, make_record(*record_fields(REPLICA, op_id, table, key, floor_of(origin),
                                                  *floor, 0, now)))
    await node.log.append_nowait(recs)
    if op_id not in node.pending:
        return
    if floor is not None:
        node.state.shards.merge_pair(table, key, floor_of(origin), *floor)
    node.state.shards.compensate(table, key, origin, delta)
    node.state.withdrawn[op_id] = node.clock()
    node.release([op_id])
    node.metrics.withdrawn += 1
    log.info("withdrew in-doubt op %s on %s/%s (applied by another leader)", op_id, table, key)
    # the compensated pair, with the origin's floor and the key's last change: a replica that
    # collected the key's tombstone meanwhile (an op in doubt for the whole grace) takes the
    # pair back with the floor it lies on, not bare above nothing (the simulator's seed 4287)
    shards = node.state.shards
    pairs = {o: list(pair) for o in (origin, floor_of(origin), LAST)
             if any(pair := shards.pair(table, key, o))}
    entry = [[table, key, pairs]]
    for t in node.targets_of(table, key):
        node.links[t].call(Kind.REPAIR, entry).add_done_callback(consume)
    release_claims(node, table, key, op_id)  # taken by the settling HOLDS; the op stands elsewhere


def _floor_raised(node: Node, item: Item, compensated: tuple[int, int],
                  seen: Iterable[CounterEntry]) -> tuple[int, int] | None:
    """The floor of the op's origin raised by its compensation, when a delete floored the op
    (the highest floor known, here or in ``seen``, covers the op's pair) before it could see the
    compensation (the floor does not cover ``compensated``, the pair the withdrawal leaves);
    None otherwise. Then above the floor lies exactly what lay there before: the compensation
    cancels, under the floor, an op the delete already removed."""
    f = floor_of(item.origin)
    fp, fn = node.state.shards.pair(item.table, item.key, f, visible=False)
    for entry in seen:
        sp, sn = entry.pairs.get(f, (0, 0))
        fp, fn = max(fp, sp), max(fn, sn)
    p, n = compensated
    if fp < item.p or fn < item.n or (fp >= p and fn >= n):
        return None
    if item.delta >= 0:
        return fp, min(n, fn + item.delta)
    return min(p, fp - item.delta), fn


async def settle_all(node: Node, min_age: float = 0.0) -> int:
    """One pass over the keys with in-doubt ops not currently waiting for their quorum (all
    keys at once, each key's ops in order); how many ops remain unpublished."""
    now = node.clock()
    if node.state.staged:  # staged copies published or withdrawn meanwhile: forgotten
        node.state.sweep_staged()
    keys = [k for k in node.state.unpublished_keys()
            if any(now - item[ITEM_TS] >= min_age and item[ITEM_OP_ID] not in node.inflight
                   for item in node.state.unpublished(*k))]
    if keys:
        await asyncio.gather(*(settle_key(node, *k) for k in keys))
    return len(node.pending)


async def settle_loop(node: Node, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await settle_all(node, min_age=node.config.quorum_timeout)
        except Exception as exc:  # noqa: BLE001 - a failed pass is retried at the next one
            log.warning("settling in-doubt ops failed: %r", exc)
