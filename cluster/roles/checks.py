"""Exactly-once across leaders, part one: retries checked on the replicas, made atomic by claims.

DESIGN.md "The hard cases". A leader that may not be the only one to have seen an op (a retry,
``attempt`` > 1; a failover leader; any leader within a window after it saw a peer down) asks
the key's other replicas whether they hold the op id (``HOLDS``) before applying it; a replica
that does makes the answer "duplicate", and the leader learns the id and the key's entry. Ops
applied through this check are remembered exactly for the window (``checked``), so a node that
later finds the same op in doubt can tell "another leader applied it" from "my own replication
reached you" (``cluster.roles.settle``).

**Claims: two checks of one op never both pass** (``cluster.roles.claims``). Asking and then
applying is not atomic, so a replica that answers "not held" also *claims* the op for the asker
(``Claims``): until the asker's application arrives or the window passes, it answers any other
asker BUSY. A checker claims the op at home first (a HOLDS that finds it checking the same op
answers BUSY), needs the claim of a majority of the key's replicas counting itself
(``claims_needed``), and applies only within ``lease`` of sending its ``HOLDS``: after a pause
longer than that its answers are stale and the op answers 503 (the claims it got outlive its
lease, so no other check passed meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from operator import itemgetter
from typing import Any, Protocol

from cluster.core.ops import ITEM_ORIGIN, ItemFields, Op
from cluster.core.shards import CounterEntry
from cluster.roles.admission import needs_check
from cluster.roles.claims import Claims
from cluster.roles.host import Host
from cluster.transport.wire import Kind, Status


class Node(Host, Protocol):
    """What the checks need of their node."""
    claims: Claims
    checked: Checked

    @property
    def pending(self) -> dict[str, ItemFields]: ...

    @property
    def inflight(self) -> dict[str, asyncio.Future[bool]]: ...

    @property
    def leases(self) -> dict[str, float]: ...

    def recently_degraded(self) -> bool: ...

    def monotonic(self) -> float: ...

    def clock(self) -> float: ...

    def lead_plain(self, ops: Sequence[Op], limits: list[float] | None = None
                   ) -> asyncio.Future[list[int]]: ...

    def learn(self, table: str, key: str, op_id: str, entry: CounterEntry
              ) -> asyncio.Future[None]: ...

# leads ops a check let through, each with the monotonic time after which it must not apply
Lead = Callable[[list[Op], list[float]], Awaitable[list[int]]]

log = logging.getLogger("cluster.checks")

_TABLE = itemgetter(0)  # an ``Op``'s table
_APPLIED, _DUPLICATE, _UNAVAILABLE, _EXPIRED = (int(Status.APPLIED), int(Status.DUPLICATE),
                                                int(Status.UNAVAILABLE), int(Status.EXPIRED))
# HOLDS answers: in the dedup; applied there and not yet on a quorum (its quorum failed);
# applied there and withdrawn; undecided there (claimed by another checker, or its own
# application still waiting for its quorum): ask again later; no claim given, since the
# replica restarted within a claim's life and may have promised the op before (``Claims``)
HELD, IN_DOUBT, WITHDRAWN, BUSY, FORGOT = 1, 2, 3, 4, 5
# and (write quorum above 2) this node holds the asker's own staged copy of the op, hidden
# until published: to its leader, "your copy reached me" (the op may stand); to anyone else
# it answers BUSY, since that application is still open (``NodeState.staged``)
STAGED = 6
# HOLDS request modes (the item's fourth field): only ask; ask and claim; release a claim
QUERY, CLAIM, RELEASE = 0, 1, 2
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


def claim_life(node: Node, table: str) -> float:
    """A claim lasts the op's window: after it, any retry of the op is refused as expired."""
    return max(node.config.window, node.state.window(table))


def lease(node: Node, table: str) -> float:
    """How long after sending its HOLDS a checker may still apply: well inside the claims'
    life, so an application delayed after it (its frames stuck in a paused process) is still
    covered by the claims on the other replicas."""
    return min(2 * node.config.quorum_timeout, claim_life(node, table) / 2)


def claims_needed(node: Node, table: str | None = None, key: str | None = None) -> int:
    """Other replicas whose claim a check needs: a majority of the key's replicas with this
    node (two checks then share a replica, which claims the op for one of them only), and at
    least RF - W (any W replicas that acked the op intersect them); plus one for each member
    gaining the key in a move under way. Then, as without a move, at most RF - 1 - that many
    of the others are not heard, so a copy of an op in doubt elsewhere is found unless it is
    only in its own leader: a leader writes to the gaining members too, and without their
    claims a check would pass on the old set alone while a gainer held such a copy; anti-
    entropy then spread that copy's pair to the replicas, which hid from the leader's settling
    that another node had applied the op, and both applications stood (the simulator's seed
    3075: a join, partitions and crashes, an op counted twice)."""
    rf = node.ring.rf
    extra = 0 if table is None or key is None else max(0, len(_write_set(node, table, key)) - rf)
    return max(rf - node.config.quorum, rf // 2) + extra


def write_sets(ring: Any) -> Callable[[str, str], tuple[str, ...]]:
    """A key's replicas, and while a move is under way the members gaining it
    (``cluster.core.membership.Placement.write_set``; a plain ring has no moves)."""
    return getattr(ring, "write_set", ring.preference_list)


def _write_set(node: Node, table: str, key: str) -> tuple[str, ...]:
    return write_sets(node.ring)(table, key)


async def ask_holds(node: Node, table: str, key: str, op_id: str, born: float | None
                    ) -> list[tuple[str, int, bool, CounterEntry]]:
    """Ask the key's other replicas about ``op_id`` and claim it there (see ``Claims``): the
    answers of those that answered in time, as (node, HELD/IN_DOUBT/WITHDRAWN/BUSY/FORGOT/0,
    applied it after a check, entry of the key); 0 is a claim. ``born``: when the op was
    first sent, if known (a replica that restarted since then cannot have promised it).
    While a move is under way, the members gaining the key are asked too (``_write_set``)."""
    others = [r for r in _write_set(node, table, key) if r != node.id and r in node.links]
    item = [table, key, op_id, CLAIM] if born is None else [table, key, op_id, CLAIM, born]
    futs = {r: node.links[r].call(Kind.HOLDS, [item]) for r in others}
    if futs:  # with rf = 1 there is nobody to ask
        await asyncio.wait(futs.values(), timeout=node.config.quorum_timeout)
    out = []
    for r, fut in futs.items():
        if not fut.done():
            fut.cancel()
        elif fut.exception() is None:
            held, checked, entry = fut.result()[0]
            out.append((r, int(held), bool(checked), CounterEntry.from_wire(entry)))
    return out


def release_claims(node: Node, table: str, key: str, op_id: str) -> None:
    """A check that will not apply the op gives back the claims it took (best effort: they
    expire anyway)."""
    node.claims.release(op_id, node.id)
    for r in node.ring.preference_list(table, key):
        if r != node.id:
            node.links[r].call(Kind.HOLDS, [[table, key, op_id, RELEASE]]).add_done_callback(
                consume)


def on_holds(node: Node, items: list[list[Any]], peer: str = "?") -> list[list[Any]]:
    """Answer ``HOLDS`` from ``peer``: IN_DOUBT when this node applied the op and its quorum
    failed (settled later), BUSY when that quorum is still being waited for or another node
    holds a claim on the op, WITHDRAWN, HELD when the id is in the dedup (or this node applied
    it after a check), else 0 (and, asked with CLAIM, the op is claimed for ``peer``; FORGOT
    instead shortly after a restart); STAGED when this node holds ``peer``'s own copy of the op
    staged (hidden until published, W > 2), BUSY when it holds another leader's; whether this
    node applied it after a check; the key's entry (so the asker learns what the op
    contributed)."""
    out = []
    pending, inflight, claims = node.pending, node.inflight, node.claims
    for item in items:
        table, key, op_id = item[0], item[1], item[2]
        mode = item[3] if len(item) > 3 else QUERY
        born = item[4] if len(item) > 4 else None
        staged = node.state.staged_open(op_id) if node.state.staged else None
        if op_id in pending:
            held = BUSY if op_id in inflight else IN_DOUBT
        elif staged is not None:  # another leader's copy, hidden here until published
            held = STAGED if staged[ITEM_ORIGIN].partition("@")[0] == peer else BUSY
        elif op_id in node.state.withdrawn:
            held = WITHDRAWN
        elif op_id in node.checked or op_id.encode() in node.state.dedup(table):
            held = HELD  # applied here (after a check: remembered past the dedup's forgetting)
        elif mode == CLAIM:
            if claims.fence(op_id) is None and claims.forgets(born):
                held = FORGOT  # may have been promised to another checker before a restart
            else:
                held = 0 if claims.take(op_id, peer, claim_life(node, table)) else BUSY
        else:
            if mode == RELEASE:
                claims.release(op_id, peer)
            held = 0
        out.append([held, op_id in node.checked, node.state.shards.entry(table, key).to_wire()])
    return out


async def lead_checked(node: Node, ops: list[Op], births: Sequence[float] | None = None,
                       lead: Lead | None = None) -> list[int]:
    """Lead a batch in which some ops need the cross-replica check (see ``needs_check``);
    ``births``: when the client first sent each op (wall clock; unknown when not given).
    ``lead``: what leads the ops let through, with each op's time limit (deletes); by default
    ``node.lead_plain``, whose admission also reads the checks' leases."""
    statuses = [_UNAVAILABLE] * len(ops)
    plain: list[int] = []
    checks = []
    idx_checked: list[int] = []
    degraded = node.recently_degraded()
    suspected = node.state.suspected if node.state.pulled else None
    for i, op in enumerate(ops):
        table, _key, op_id, _delta, _attempt = op
        if needs_check(op, degraded, suspected) and op_id.encode() not in node.state.dedup(table):
            idx_checked.append(i)
            checks.append(_check_one(node, op, None if births is None else births[i]))
        else:
            plain.append(i)
    results = await asyncio.gather(*checks)
    limits = (birth_limits(node, ops, births) if births is not None
              else [math.inf] * len(ops))
    to_lead = list(plain)
    for i, (res, deadline) in zip(idx_checked, results, strict=True):
        if res is None:
            to_lead.append(i)
            _table, _key, op_id, _delta, _attempt = ops[i]
            if lead is None:
                node.leases[op_id] = deadline  # the apply checks it (Admission._claimed)
            limits[i] = min(limits[i], deadline)
        else:
            statuses[i] = res
    if to_lead:
        led = await (lead or node.lead_plain)([ops[i] for i in to_lead],
                                               [limits[i] for i in to_lead])
        for i, s in zip(to_lead, led, strict=True):
            statuses[i] = s
            if s == _APPLIED and i in idx_checked:
                _table, _key, op_id, _delta, _attempt = ops[i]
                node.checked.add(op_id)
    return statuses


def birth_limits(node: Node, ops: Sequence[Op], births: Sequence[float]) -> list[float]:
    """For each op, the monotonic time after which its leader must not apply it: the end of
    its window counted from its birth, less ``max_clock_skew`` (``time_left``); no limit for a
    table that remembers nothing. Any earlier application of the op came after its birth, so
    the replicas' dedup remembers it at least until then; a copy that waits longer (behind an
    unpublished op on its key, behind a check, in a paused node) would be applied as new."""
    offset = node.monotonic() - node.clock() - node.config.max_clock_skew
    window_of = node.state.window
    tables = set(map(_TABLE, ops))
    if len(tables) == 1:  # the common batch: one window, no lookup an op
        one = window_of(tables.pop())
        if one <= 0:
            return [math.inf] * len(ops)
        return [born + one + offset for born in births]
    windows: dict[str, float] = {}
    out: list[float] = []
    for (table, _key, _op_id, _delta, _attempt), born in zip(ops, births, strict=True):
        window = windows.get(table)
        if window is None:
            window = windows[table] = window_of(table)
        out.append(born + window + offset if window > 0 else math.inf)
    return out


def time_left(node: Node, table: str, born: float) -> float | None:
    """Seconds until an op ``born`` then is older than the replicas surely remember (the
    table's window, less the clock skew between this node and the one that stamped the
    birth); None for a strategy that remembers nothing (``none``, window 0): no limit."""
    window = node.state.window(table)
    if window <= 0:
        return None
    return born + window - node.config.max_clock_skew - node.clock()


async def _check_one(node: Node, op: Op, born: float | None = None
                     ) -> tuple[int | None, float]:
    """(DUPLICATE when a replica holds the op (learned here), UNAVAILABLE when another
    application or check of it is open or too few replicas claimed it, EXPIRED when it is
    older than the replicas' memory, None when the op may be applied; the monotonic time until
    which it may be).

    What the replicas remember of another application of the op (its id, its check's claims)
    lasts the table's window from that application, which came after the op was ``born``. So
    the check is worth something only while the op is younger than the window (less the clock
    skew between this node and the one that stamped the birth); an op applied later might be
    a second application nobody remembers (a retry that sat in a paused node's socket buffer
    past its window). The lease is cut short to that limit too."""
    table, key, op_id, _delta, _attempt = op  # unpacked: a caller's plain tuple works too
    node.metrics.retry_checks += 1
    sent = node.monotonic()
    deadline = sent + lease(node, table)
    left = None if born is None else time_left(node, table, born)
    if left is not None:
        if left <= 0:
            node.metrics.expired += 1
            return _EXPIRED, deadline
        deadline = min(deadline, sent + left)
    if not node.claims.take(op_id, node.id, claim_life(node, table)):
        return _UNAVAILABLE, deadline  # another node is checking it: retry decides later
    # a replica that gave no claim (FORGOT: it restarted lately) said nothing
    answers = [a for a in await ask_holds(node, table, key, op_id, born) if a[1] != FORGOT]
    if any(held in (IN_DOUBT, BUSY) or held == STAGED and op_id not in node.pending
           for _, held, _, _ in answers):
        # another leader's application (or check) is still open: retry decides later. So is
        # a copy of this node's own staged there that it does not hold unpublished: a former
        # incarnation's, whose APPLY record a crash lost (sim seed 231). Hidden everywhere and
        # never published, it was answered "duplicate" as held: an acknowledged add lost.
        release_claims(node, table, key, op_id)
        return _UNAVAILABLE, deadline
    # WITHDRAWN says the asked node cancelled its own application, not that another stands
    # (an op past its window that no replica held is withdrawn too): no claim, no evidence
    answers = [a for a in answers if a[1] != WITHDRAWN]
    for _, held, _, entry in answers:
        if held:
            release_claims(node, table, key, op_id)
            if op_id in node.pending:
                # this node applied the op while the check waited (two copies of one request,
                # checked side by side; sim seed 6121): its own application decides. The
                # replicas' copies prove nothing here: this node hides the op until its quorum
                # acks, so "their entries cover this node's" does not show it (confirm_duplicates
                # is for ops not unpublished here).
                own = node.inflight.get(op_id)  # shielded: it is the leader's quorum wait
                if own is None or not await asyncio.shield(own):  # in doubt, or quorum failed
                    return _UNAVAILABLE, deadline
                node.metrics.duplicates += 1
                return _DUPLICATE, deadline
            await node.learn(table, key, op_id, entry)
            if not (await confirm_duplicates(node, [(table, key, op_id)]))[0]:
                return _UNAVAILABLE, deadline
            node.metrics.duplicates += 1
            return _DUPLICATE, deadline
    # Shortly after a restart this node's own claim proves nothing (it may have promised the
    # op to another checker before): the others' claims must then make the majority alone.
    if len(answers) < claims_needed(node, table, key) + node.claims.forgets(born):
        release_claims(node, table, key, op_id)
        return _UNAVAILABLE, deadline
    return None, deadline


async def confirm_duplicates(node: Node, ops: Sequence[tuple[str, str, str]]) -> list[bool]:
    """Whether each op (table, key, op id), found in this node's dedup and not unpublished
    here, may be answered "duplicate": only once its application is visible on W replicas, so
    that every quorum read after the answer counts it.

    The dedup says the op ran, not that anyone but this node shows it: this node may hold a
    replica's copy of an op whose leader still hides it (its quorum's acks lost: the leader does
    not know it stands), or have learned it from such a copy. So the key's other replicas are
    asked (``HOLDS``, query only): one that has its own application of the op open (IN_DOUBT,
    BUSY) makes the answer 503 (the client's retry comes back after it is settled); each one
    whose entry covers this node's shows the op; when fewer than W do, this node's entry is
    pushed to the others that answered (``REPAIR``, acked once in their log) and each ack
    counts. An op this node withdrew (another leader's application stands) is confirmed once
    every other replica answered and none has it open. It answers as soon as every op is
    decided (W replicas show it, or its application is open somewhere), or after
    ``quorum_timeout`` per round. W = 1: this node's
    own log is the quorum, nobody is asked."""
    w = node.config.quorum
    if w <= 1:
        return [True] * len(ops)  # this node's own log is the quorum
    if node.state.staged and any(node.state.staged_open(op_id) is not None
                                 for _t, _k, op_id in ops):
        # this node holds another leader's staged copy of the op: its application is still
        # open (that leader publishes or withdraws it), and it shows nothing of it here
        open_here = [node.state.staged_open(op_id) is not None for _t, _k, op_id in ops]
        rest = [op for op, o in zip(ops, open_here, strict=True) if not o]
        confirmed = iter(await confirm_duplicates(node, rest) if rest else [])
        return [False if o else next(confirmed) for o in open_here]
    by_replica: dict[str, list[int]] = {}
    others = [0] * len(ops)
    for i, (table, key, _op_id) in enumerate(ops):
        for r in node.ring.preference_list(table, key):
            if r != node.id:
                by_replica.setdefault(r, []).append(i)
                others[i] += 1
    entry, withdrawn = node.state.shards.entry, node.state.withdrawn
    mine = [None if op_id in withdrawn else entry(table, key) for table, key, op_id in ops]
    timeout = node.config.quorum_timeout
    futs = {r: node.links[r].call(Kind.HOLDS, [[*ops[i], QUERY] for i in idx])
            for r, idx in by_replica.items()}

    def answers() -> list[list[tuple[str, int, CounterEntry]]]:
        out: list[list[tuple[str, int, CounterEntry]]] = [[] for _ in ops]
        for r, fut in futs.items():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                got = fut.result()
                if len(got) == len(by_replica[r]):
                    for i, (held, _checked, e) in zip(by_replica[r], got, strict=True):
                        out[i].append((r, int(held), CounterEntry.from_wire(e)))
        return out

    def open_elsewhere(i: int, got: list[tuple[str, int, CounterEntry]]) -> bool:
        # STAGED: that replica holds a copy of an application of this node's id hidden. If this
        # node published it, its entry is above that replica's, which missed the publication.
        # If not (a former incarnation's copy, its APPLY record lost in a crash), this node
        # learned the id without the op, the replica's entry covers this node's, and the op is
        # open, shown nowhere (sim seed 231: answered "duplicate", an acknowledged add lost).
        ours = mine[i]
        return any(held in (IN_DOUBT, BUSY)
                   or held == STAGED and (ours is None or e.dominates(ours))
                   for _, held, e in got)

    def shows(i: int, got: list[tuple[str, int, CounterEntry]]) -> int:
        """Replicas that surely show op ``i``: this node (its entry covers the op) and each
        whose entry covers this node's. For an op this node withdrew, the application that
        stands is another replica's: once every other replica answered, none has it open and
        one holds it, it is published (on W replicas), else nothing is sure. A withdrawal
        alone proves no other application: an op settled past its window is withdrawn when
        no replica holds it at all (``settle._verdict``)."""
        ours = mine[i]
        if ours is None:
            return w if (len(got) >= others[i] and not open_elsewhere(i, got)
                         and any(held == HELD for _, held, _ in got)) else 0
        return 1 + sum(e.dominates(ours) for _, _, e in got)

    def decided() -> bool:
        return all(open_elsewhere(i, got) or shows(i, got) >= w
                   for i, got in enumerate(answers()))

    await _until(list(futs.values()), timeout, decided)
    got_all = answers()
    out = [False] * len(ops)
    need = [0] * len(ops)
    push: dict[str, list[int]] = {}
    for i, got in enumerate(got_all):
        if open_elsewhere(i, got):
            continue  # its application is still open there: not visible yet
        have = shows(i, got)
        if have >= w:
            out[i] = True
            continue
        ours = mine[i]
        lacking = [] if ours is None else [r for r, _, e in got if not e.dominates(ours)]
        if have + len(lacking) >= w:
            need[i] = w - have
            for r in lacking:
                push.setdefault(r, []).append(i)
    if push:
        acks = {r: node.links[r].call(Kind.REPAIR, [[ops[i][0], ops[i][1],
                                                     entry(ops[i][0], ops[i][1]).to_wire()]
                                                    for i in idx])
                for r, idx in push.items()}

        def acked(r: str) -> bool:
            fut = acks[r]
            return fut.done() and not fut.cancelled() and fut.exception() is None

        def counted(i: int) -> int:
            return sum(acked(r) for r, idx in push.items() if i in idx)

        pushed = {i for idx in push.values() for i in idx}
        await _until(list(acks.values()), timeout,
                     lambda: all(counted(i) >= need[i] for i in pushed))
        for i in pushed:
            out[i] = counted(i) >= need[i]
    unconfirmed = out.count(False)
    if unconfirmed:
        node.metrics.unconfirmed_duplicates += unconfirmed
    return out


async def _until(futs: list[asyncio.Future[Any]], timeout: float,
                 enough: Callable[[], bool]) -> None:
    """Wait until ``enough()`` holds, every future is done, or ``timeout`` passed; then cancel
    what is still pending."""
    pending = set(futs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending and not enough():
        left = deadline - loop.time()
        if left <= 0:
            break
        _done, pending = await asyncio.wait(pending, timeout=left,
                                            return_when=asyncio.FIRST_COMPLETED)
    for fut in pending:
        fut.cancel()


def consume(fut: asyncio.Future[Any]) -> None:
    """Done callback of a best-effort call: its failure is expected, not an error to log."""
    if not fut.cancelled():
        fut.exception()
