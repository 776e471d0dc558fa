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

**Claims: two checks of one op never both pass.** Asking and then applying is not atomic: a
leader that was paused (or cut off) while another replica took over its keys resumes with
copies of ops that the other replica is checking at that very moment; each answers the other's
``HOLDS`` "not held" before applying its own copy, both pass, and the op counts twice (what the
pause nemesis found). So a replica that answers "not held" also *claims* the op for the asker
(``Claims``): until the asker's application arrives (its REPLICATE) or the window passes, it
answers any other asker BUSY, and it applies no copy of the op itself. A checker claims the op
at home first (a HOLDS that finds it checking the same op answers BUSY), needs the claim of a
majority of the key's replicas counting itself, and applies only within ``lease`` of sending
its ``HOLDS``: after a pause longer than that its answers are stale and the op answers 503
(the claims it got outlive its lease, so no other check passed meanwhile). A claim that
outlives its holder's application (a REPLICATE lost, the holder paused right after applying)
keeps the others out until the window is over, when any retry of the op is refused as
expired anyway.
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
# HOLDS answers: in the dedup; applied there and not yet on a quorum (its quorum failed);
# applied there and withdrawn; undecided there (claimed by another checker, or its own
# application still waiting for its quorum): ask again later
HELD, IN_DOUBT, WITHDRAWN, BUSY = 1, 2, 3, 4
# HOLDS request modes (the item's fourth field): only ask; ask and claim; release a claim
QUERY, CLAIM, RELEASE = 0, 1, 2
MAX_CHECKED = 1_000_000  # exact ids applied through the check, kept for the window
MAX_CLAIMS = 1_000_000


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


class Claims:
    """op id -> (node, expiry on the monotonic clock, applied): this node promised ``node``
    that no other check of the op passes here (and that it applies no copy itself) until the
    promise expires. Once ``node``'s application arrives the dedup answers for the op, and the
    claim stays only as a *fence*: a copy of the op from any other leader (a REPLICATE that a
    partition or a pause held back) is refused, so it never becomes visible here next to the
    application that stands. Bounded: the oldest claims go first."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._c: OrderedDict[str, tuple[str, float, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._c)

    def __bool__(self) -> bool:
        """Any live claim or fence (expired ones at the front are dropped first: the write
        path asks this before every batch, and checks claims only when there are some)."""
        c = self._c
        if c:
            now = self.clock()
            while c and next(iter(c.values()))[1] <= now:
                c.popitem(last=False)
        return bool(c)

    def _live(self, op_id: str) -> tuple[str, float, bool] | None:
        got = self._c.get(op_id)
        if got is not None and got[1] <= self.clock():
            del self._c[op_id]
            return None
        return got

    def holder(self, op_id: str) -> str | None:
        """The node holding a live claim on ``op_id`` whose application has not arrived yet."""
        got = self._live(op_id)
        return got[0] if got is not None and not got[2] else None

    def fence(self, op_id: str) -> str | None:
        """The node the op is promised to (claimed, or applied after its claim), or None: a
        copy of the op applied by any other node must not be merged here."""
        got = self._live(op_id)
        return got[0] if got is not None else None

    def take(self, op_id: str, node: str, life: float) -> bool:
        """Claim ``op_id`` for ``node`` (or renew its claim); False when another node holds it."""
        got = self._live(op_id)
        if got is not None and got[0] != node:
            return False
        now = self.clock()
        c = self._c
        c[op_id] = (node, now + life, got is not None and got[2])
        c.move_to_end(op_id)
        while c and (len(c) > MAX_CLAIMS or next(iter(c.values()))[1] <= now):
            c.popitem(last=False)
        return True

    def release(self, op_id: str, node: str) -> None:
        got = self._c.get(op_id)
        if got is not None and got[0] == node and not got[2]:
            del self._c[op_id]

    def applied(self, op_id: str) -> None:
        """The holder's application arrived (or was made here): the dedup answers for the op
        from now on; the claim stays as a fence until it expires."""
        got = self._c.get(op_id)
        if got is not None and not got[2]:
            self._c[op_id] = (got[0], got[1], True)

    def drop(self, op_id: str) -> None:
        """Forget the claim (the op is known to be held elsewhere)."""
        self._c.pop(op_id, None)


def claim_life(node: Node, table: str) -> float:
    """A claim lasts the op's window: after it, any retry of the op is refused as expired."""
    return max(node.config.window, node.state.window(table))


def lease(node: Node, table: str) -> float:
    """How long after sending its HOLDS a checker may still apply: well inside the claims'
    life, so an application delayed after it (its frames stuck in a paused process) is still
    covered by the claims on the other replicas."""
    return min(2 * node.config.quorum_timeout, claim_life(node, table) / 2)


def claims_needed(node: Node) -> int:
    """Other replicas whose claim a check needs: a majority of the key's replicas with this
    node (two checks then share a replica, which claims the op for one of them only), and at
    least RF - W (any W replicas that acked the op intersect them)."""
    rf = node.ring.rf
    return max(rf - node.config.quorum, rf // 2)


def needs_check(node: Node, op: Op) -> bool:
    """A retry, or any op while this node saw a peer down (or restarted) within the window: it
    may lead a key only because the primary is down, or be a primary that was cut off or
    paused while another replica led its keys (a copy held in its socket buffer would
    otherwise be applied a second time)."""
    return op[4] > 1 or node.recently_degraded()


async def ask_holds(node: Node, table: str, key: str, op_id: str, mode: int = CLAIM
                    ) -> tuple[int, list[tuple[str, int, bool, CounterEntry]]]:
    """Ask the key's other replicas about ``op_id`` (and claim it there, see ``Claims``):
    (replicas that answered, their answers as (node, HELD/IN_DOUBT/WITHDRAWN/BUSY/0, applied
    it after a check, entry of the key)). 0 from a replica asked with CLAIM is its claim."""
    others = [r for r in node.ring.preference_list(table, key) if r != node.id]
    futs = {r: node.links[r].call(Kind.HOLDS, [[table, key, op_id, mode]]) for r in others}
    if futs:  # with rf = 1 there is nobody to ask
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
    out = []
    for r, fut in futs.items():
        if not fut.done():
            fut.cancel()
        elif fut.exception() is None:
            held, checked, entry = fut.result()[0]
            out.append((r, int(held), bool(checked), CounterEntry.from_wire(entry)))
    return len(out), out


def release_claims(node: Node, table: str, key: str, op_id: str) -> None:
    """A check that will not apply the op gives back the claims it took (best effort: they
    expire anyway)."""
    node.claims.release(op_id, node.id)
    for r in node.ring.preference_list(table, key):
        if r != node.id:
            node.links[r].call(Kind.HOLDS, [[table, key, op_id, RELEASE]]).add_done_callback(
                _consume)


def on_holds(node: Node, items: list[list[Any]], peer: str = "?") -> list[list[Any]]:
    """Answer ``HOLDS`` from ``peer``: IN_DOUBT when this node applied the op and its quorum
    failed (settled later), BUSY when that quorum is still being waited for or another node
    holds a claim on the op, WITHDRAWN, HELD when the id is in the dedup, else 0 (and, asked
    with CLAIM, the op is claimed for ``peer``); whether this node applied it after a check;
    the key's entry (so the asker learns what the op contributed)."""
    out = []
    pending, inflight, claims = node.pending, node.inflight, node.claims
    for item in items:
        table, key, op_id = item[0], item[1], item[2]
        mode = item[3] if len(item) > 3 else QUERY
        if op_id in pending:
            held = BUSY if op_id in inflight else IN_DOUBT
        elif op_id in node.state.withdrawn:
            held = WITHDRAWN
        elif op_id.encode() in node.state.dedup(table):
            held = HELD
        elif mode == CLAIM:
            held = 0 if claims.take(op_id, peer, claim_life(node, table)) else BUSY
        else:
            if mode == RELEASE:
                claims.release(op_id, peer)
            held = 0
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
    for i, (res, deadline) in zip(idx_checked, results, strict=True):
        if res is None:
            to_lead.append(i)
            node.leases[ops[i][2]] = deadline  # the apply checks it (Node._refused)
        else:
            statuses[i] = res
    if to_lead:
        led = await node.lead_plain([ops[i] for i in to_lead])
        for i, s in zip(to_lead, led, strict=True):
            statuses[i] = s
            if s == _APPLIED and i in idx_checked:
                node.checked.add(ops[i][2])
    return statuses


async def _check_one(node: Node, op: Op) -> tuple[int | None, float]:
    """(DUPLICATE when a replica holds the op (learned here), UNAVAILABLE when another
    application or check of it is open or too few replicas claimed it, None when the op may be
    applied; the monotonic time until which it may be)."""
    table, key, op_id = op[0], op[1], op[2]
    node.metrics.retry_checks += 1
    sent = time.monotonic()
    deadline = sent + lease(node, table)
    if not node.claims.take(op_id, node.id, claim_life(node, table)):
        return _UNAVAILABLE, deadline  # another node is checking it: retry decides later
    answered, answers = await ask_holds(node, table, key, op_id)
    if any(held in (IN_DOUBT, BUSY) for _, held, _, _ in answers):
        # another leader's application (or check) is still open: retry decides later
        release_claims(node, table, key, op_id)
        return _UNAVAILABLE, deadline
    for _, held, _, entry in answers:
        if held:
            release_claims(node, table, key, op_id)
            node.learn(table, key, op_id, entry)
            node.metrics.duplicates += 1
            return _DUPLICATE, deadline
    if answered < claims_needed(node):
        release_claims(node, table, key, op_id)
        return _UNAVAILABLE, deadline
    return None, deadline


# -- in-doubt ops ---------------------------------------------------------------------------


def _covers(entry: CounterEntry, item: Sequence[Any]) -> bool:
    p, n = entry.pairs.get(item[3], (0, 0))
    return p >= item[4] and n >= item[5]


async def settle_one(node: Node, item: list[Any]) -> bool:
    """Settle the in-doubt op ``item`` (and the ops before it on its key); True once it is
    published or withdrawn."""
    if item[0] not in node.pending:
        return True
    waiting = node.inflight.get(item[0])  # its quorum (or a publication) is under way
    if waiting is not None and await asyncio.shield(waiting):
        return True
    await settle_key(node, item[1], item[2], item[3])
    return item[0] not in node.pending


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
    items = node.state.unpublished(table, key, origin)
    if not items or any(item[0] in node.inflight for item in items):
        return  # empty, or a quorum is still being waited for: its outcome decides
    answered, answers = await ask_holds_many(node, table, key, [item[0] for item in items])
    run: list[list[Any]] = []
    for i, item in enumerate(items):
        if item[0] not in node.pending:
            return  # settled meanwhile by another path: ask again next time
        verdict = _verdict(node, item, answered, [(r, a[i], e) for r, a, e in answers])
        if verdict == "publish":
            run.append(item)
            continue
        if run and not await _publish(node, table, key, origin, run):
            return
        run = []
        if verdict == "withdraw":
            await withdraw(node, item)
        else:
            return  # undecided: the ops after it wait with it
    if run:
        await _publish(node, table, key, origin, run)


def _verdict(node: Node, item: list[Any], answered: int,
             answers: list[tuple[str, tuple[int, bool], CounterEntry]]) -> str:
    """"withdraw" when another leader applied the op: it applied it after a check, or holds
    the id without our pair (our replication never reached it), or holds it in doubt too and
    has the lower node id (so exactly one application stays); "publish" when enough replicas
    answered and none did; "wait" when a replica has another application or check of it open,
    or too few answered. A replica that withdrew its own copy deferred to another application,
    perhaps ours: the id it holds then says nothing about a third one."""
    if any(held == BUSY for _, (held, _), _ in answers):
        return "wait"
    me = node.id
    deferred = any(held == WITHDRAWN for _, (held, _), _ in answers)
    if any((held == IN_DOUBT and r < me) or (held == HELD and checked)
           or (held == HELD and not deferred and not _covers(entry, item))
           for r, (held, checked), entry in answers):
        return "withdraw"
    if answered < node.ring.rf - node.config.quorum:
        return "wait"  # a replica that applied it may be among the silent ones
    return "publish"


async def ask_holds_many(node: Node, table: str, key: str, op_ids: list[str]
                         ) -> tuple[int, list[tuple[str, list[tuple[int, bool]], CounterEntry]]]:
    """``ask_holds`` for several ops of one key in one frame per replica (claiming each):
    (replicas that answered, per replica its answers in op order and the key's entry)."""
    others = [r for r in node.ring.preference_list(table, key) if r != node.id]
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
    return len(out), out


async def _publish(node: Node, table: str, key: str, origin: str,
                   run: list[list[Any]]) -> bool:
    """Replicate in-doubt ops again, with the pair of everything settled up to them; True once
    a quorum holds them (they are visible then)."""
    p, n = node.state.shards.pair(table, key, origin)
    for item in run:
        if item[6] >= 0:
            p += item[6]
        else:
            n -= item[6]
    sent = [[item[0], table, key, origin, p, n, item[6], item[7]] for item in run]
    targets = node.targets_of(table, key)
    remote = [node.links[t].call(Kind.REPLICATE, sent) for t in targets]
    done = quorum_future(remote, node.config.quorum - 1, node.config.quorum_timeout)
    # In flight meanwhile: a replica settling its own copy of the op waits (BUSY) for this
    # outcome instead of taking the op for merely in doubt here, and a retry waits for it too.
    inflight = node.inflight
    for item in run:
        inflight.setdefault(item[0], done)
    try:
        ok = await done
    finally:
        for item in run:
            if inflight.get(item[0]) is done:
                del inflight[item[0]]
    if ok:
        live = [item for item in run if item[0] in node.pending]
        node.release([item[0] for item in live])
        node.published(live)
        node.metrics.published_late += len(live)
        for item in live:
            # Say so when asked, like an op applied after a check: a replica that also holds it
            # in doubt (and deferred to this one, the lower id) must then withdraw, and the
            # entries anti-entropy merged meanwhile no longer tell the two applications apart.
            node.checked.add(item[0])
    return ok


async def withdraw(node: Node, item: list[Any]) -> None:
    """Cancel this node's application of an op another leader applied. It was never visible
    (its delta hidden, no later pair of its key carrying it), so the cancellation is a
    compensating delta on the op's own origin and key: the op's pair and its compensation
    become visible together, value-neutral. Logged (WITHDRAW) and pushed to the replicas."""
    op_id, table, key, origin, delta = item[0], item[1], item[2], item[3], item[6]
    if op_id not in node.pending:
        return
    p, n = node.state.shards.compensate(table, key, origin, delta)
    node.state.withdrawn[op_id] = node.clock()
    node.release([op_id])
    rec = make_record(WITHDRAW, op_id, table, key, -delta, origin, p, n, node.clock())
    node.metrics.withdrawn += 1
    log.info("withdrew in-doubt op %s on %s/%s (applied by another leader)", op_id, table, key)
    entry = [[table, key, {origin: list(node.state.shards.pair(table, key, origin))}]]
    for t in node.targets_of(table, key):
        node.links[t].call(Kind.REPAIR, entry).add_done_callback(_consume)
    release_claims(node, table, key, op_id)  # taken by the settling HOLDS; the op stands elsewhere
    await node.log.append_nowait([rec])


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


async def settle_all(node: Node, min_age: float = 0.0) -> int:
    """One pass over the keys with in-doubt ops not currently waiting for their quorum (all
    keys at once, each key's ops in order); how many ops remain unpublished."""
    now = node.clock()
    keys = [k for k in node.state.unpublished_keys()
            if any(now - item[7] >= min_age and item[0] not in node.inflight
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
