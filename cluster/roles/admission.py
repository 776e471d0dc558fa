"""Admission: every rule that decides whether an op may be applied now, each written once.

An op meets them at two points of the write path, because what each rule needs lives there:

- **At the edge** (``cluster.edge.http_api``, and a FORWARD frame at its leader): *expiry* (older
  than the table's window: 410 ``op_expired``, never applied) and *staleness* (older than
  ``stale_after_ms``: it counts as a retry, since a replica may have taken over meanwhile).
- **At the leader, before the apply** (``Admission.before_apply``, no await until the apply):
  *the check* (a retry, or any op while this node was recently degraded, is first checked on
  the other replicas: ``needs_check``, ``cluster.roles.checks``), *claims* (an op claimed here for
  another node's check answers 503), *time limits* (an op whose check passed longer ago than
  its lease, or that is older than its window less the clock skew, answers 503: it waited, or
  this node was paused, in between), and *overflow* (an op that would take
  this node's own pair past 2^64 - 1 answers ``counter_overflow``, unless it is a duplicate).

The verdict per op is a status to answer with, or none: apply it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from cluster.core.ops import Op
from cluster.transport.wire import Status
from idc_contract import U64_MAX

if TYPE_CHECKING:
    from cluster.core.config import NodeConfig
    from cluster.core.metrics import NodeMetrics
    from cluster.roles.state import NodeState

log = logging.getLogger("cluster.admission")

_DUPLICATE, _UNAVAILABLE = int(Status.DUPLICATE), int(Status.UNAVAILABLE)
_OVERFLOW = int(Status.OVERFLOW)
_DELTA, _ATTEMPT = itemgetter(3), itemgetter(4)  # an ``Op``'s fields, for C-level passes
# Below this, an entry plus a batch's deltas (their absolute sum also below it) cannot pass
# U64_MAX, so the common case skips the op-by-op overflow check.
SAFE_ENTRY = 1 << 62


def stale_after_ms(config: NodeConfig) -> int:
    """Half the time it takes to declare a leader down: an op older than this may have been
    retried at a replica that took over, so it is checked there first."""
    return int(config.failure_timeout * 500)


def expired(window_s: float, age_ms: int) -> bool:
    """Older than the table's window; a strategy with no window (``none``) never refuses."""
    return age_ms > 0 and window_s > 0 and age_ms > window_s * 1000.0


def needs_check(op: Op, degraded: bool,
                suspected: Callable[[str, str], bool] | None = None) -> bool:
    """A retry, or any op while this node saw a peer down (or restarted) within the window: it
    may lead a key only because the primary is down, or be a primary that was cut off or
    paused while another replica led its keys (a copy held in its socket buffer would
    otherwise be applied a second time). Also an op whose id a replica's dedup held when this
    node started (``suspected``: ``NodeState.suspected``, while it has pulled state)."""
    table, _key, op_id, _delta, attempt = op  # unpacked: a plain tuple works too
    return attempt > 1 or degraded or (suspected is not None and suspected(table, op_id))


def any_needs_check(ops: Sequence[Op], degraded: bool,
                    suspected: Callable[[str, str], bool] | None = None) -> bool:
    """``needs_check`` of some op of the batch; without ``suspected``, one pass in C over the
    attempts (no Python call an op)."""
    if not ops:
        return False
    if degraded:
        return True
    if suspected is None:
        return max(map(_ATTEMPT, ops)) > 1
    return any(needs_check(op, degraded, suspected) for op in ops)


class Admission:
    """The leader's admission step (claims, leases, overflow) over a batch."""

    def __init__(self, config: NodeConfig, state: NodeState, claims: Any,
                 leases: dict[str, float], metrics: NodeMetrics, *,
                 release_claims: Callable[[str, str, str], None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.id = config.node_id
        self.monotonic = monotonic
        self.state, self.claims, self.leases, self.metrics = state, claims, leases, metrics
        self._release_claims = release_claims
        self.near_limit = False  # an own entry passed SAFE_ENTRY: check batches op by op

    def before_apply(self, ops: Sequence[Op], limits: Sequence[float] | None = None
                     ) -> dict[int, int]:
        """index -> the status of each op that must not be applied now; the others apply.
        ``limits``: per op, the monotonic time after which it must not be applied."""
        if limits is not None and limits and min(limits) < self.monotonic():
            refused = self._claimed(ops, limits)
        elif self.leases or self.claims:
            refused = self._claimed(ops, None)
        else:
            refused = {}
        if self.near_limit or sum(map(abs, map(_DELTA, ops))) >= SAFE_ENTRY:
            refused.update(self._overflowing(ops, refused))
        return refused

    def _claimed(self, ops: Sequence[Op], limits: Sequence[float] | None) -> dict[int, int]:
        """Ops past their time limit (their check passed too long ago: this node was paused
        since; or older than their window allows), claimed here for another node's check:
        index -> 503. An op let through by a check, within its limit, applies now.

        Each copy of an op is judged by its own limit: a copy refused here does not make a
        copy beside it, in the same batch or waiting for its key, exempt (seen in chaos at a
        2 s window: one copy's lease was taken by the other, applied after the dedup forgot
        the op's first application)."""
        refused: dict[int, int] = {}
        now = self.monotonic()
        leases, claims, me = self.leases, self.claims, self.id
        for i, (table, key, op_id, _delta, _attempt) in enumerate(ops):
            checked = leases.pop(op_id, None) if leases else None
            limit = math.inf if limits is None else limits[i]
            if checked is not None and checked < limit:
                limit = checked
            if now > limit:
                refused[i] = _UNAVAILABLE
                log.info("op %s past its time limit by %.3f s: not applied", op_id, now - limit)
                if checked is not None:  # the check's claims: given back
                    self._release_claims(table, key, op_id)
                continue
            if checked is not None:
                claims.applied(op_id)  # applied now: the dedup answers for it
                continue
            if claims:
                holder = claims.holder(op_id)
                if holder is not None and holder != me:
                    refused[i] = _UNAVAILABLE
        self.metrics.unavailable += len(refused)
        return refused

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
            if total[side] + abs(delta) > U64_MAX:
                refused[i] = _DUPLICATE if op_id.encode() in dedup(table) else _OVERFLOW
            else:
                total[side] += abs(delta)
        self.metrics.overflows += sum(1 for s in refused.values() if s == _OVERFLOW)
        return refused
