"""The coordinator: route each op to its key's leader, one FORWARD frame per leader.

Any node coordinates. It looks up each op's preference list on the ring and groups the ops by
leader, the first live member of the list. Ops it leads itself run in process; each other leader
gets one FORWARD frame with all of its ops, each stamped with its *birth*: the wall-clock time
the client first sent it, as the edge worked it out from ``ts_ms``/``age_ms`` (this node's clock
when the client sent neither). A leader that finds a stamp older than half the failure timeout
treats the op as a retry (``unstamped``), and the retry's check refuses an op older than the
table's window (``checks``): however long the frame waited on the way, in a paused leader's
socket buffer say, no op is applied once the replicas may have forgotten another application of
it. A FORWARD whose leader is unreachable is re-routed once to the next live replica, as
retries (the failed leader may have applied them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from cluster.core.batch_kernel import by_leader
from cluster.core.config import NodeConfig
from cluster.core.errors import PeerError, Unavailable
from cluster.core.membership import Placement
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import Op
from cluster.transport.peer import PeerLink
from cluster.transport.wire import Kind, Status

log = logging.getLogger("cluster.coordinator")

_UNAVAILABLE = int(Status.UNAVAILABLE)
_STAMP = len(Op._fields)  # a FORWARD item's stamp, after the op's fields


def _stamped(ops: Sequence[Op], births: Sequence[float]) -> list[list[Any]]:
    """FORWARD items: an ``Op``'s five fields, then its birth (wall clock, ms)."""
    return [[*op, int(born * 1000)] for op, born in zip(ops, births, strict=True)]


def unstamped(body: list[list[Any]], stale_after_ms: int, now: float | None = None
              ) -> tuple[list[Op], list[float]]:
    """Ops of a FORWARD frame and their births (seconds). One born more than
    ``stale_after_ms`` ago (it waited in a paused leader's socket buffer, say) goes as a retry:
    another replica may have taken over and applied it meanwhile, so it is checked there first
    (and refused there if older than its window, ``checks``). Items without the stamp are taken
    as born now. ``now``: the leader's wall clock (seconds; ``time.time()`` when not given)."""
    now_s = time.time() if now is None else now
    now_ms = int(now_s * 1000)
    out: list[Op] = []
    births: list[float] = []
    for item in body:
        table, key, op_id, delta, attempt = item[:_STAMP]
        if len(item) > _STAMP:
            born_ms = item[_STAMP]
            if now_ms - born_ms > stale_after_ms:
                attempt = max(attempt, 2)
            births.append(born_ms / 1000.0)
        else:
            births.append(now_s)
        out.append(Op(table, key, op_id, delta, attempt))
    return out, births


class Coordinator:
    """Routes ops; ``lead`` runs the ones this node leads, ``is_live`` is read at each call
    (the node swaps in its failure detector once heartbeats run)."""

    def __init__(self, node_id: str, config: NodeConfig, ring: Placement,
                 links: dict[str, PeerLink], metrics: NodeMetrics, *,
                 lead: Callable[[Sequence[Op], Sequence[float] | None], Any],
                 is_live: Callable[[], Callable[[str], bool]],
                 clock: Callable[[], float] = time.time,
                 lead_deletes: Callable[[Sequence[Op], Sequence[float] | None], Any]
                 | None = None) -> None:
        self.id, self.config, self.ring, self.links, self.metrics = (node_id, config, ring,
                                                                      links, metrics)
        self._lead = lead
        self._lead_deletes = lead_deletes
        self._is_live = is_live
        self.clock = clock

    async def submit(self, ops: Sequence[Op], births: Sequence[float] | None = None
                     ) -> list[int]:
        """Route every op to its leader (one FORWARD frame per leader); statuses in op order.
        ``births``: when each op was first sent (wall clock, seconds; now when not given)."""
        return await self._route(ops, births, self._lead, Kind.FORWARD)

    async def submit_deletes(self, ops: Sequence[Op], births: Sequence[float] | None = None
                             ) -> list[int]:
        """Route deletes to their keys' leaders as ``submit`` routes adds (DELETE frames)."""
        assert self._lead_deletes is not None
        return await self._route(ops, births, self._lead_deletes, Kind.DELETE)

    async def _route(self, ops: Sequence[Op], births: Sequence[float] | None,
                     lead: Callable[[Sequence[Op], Sequence[float] | None], Any], kind: Kind
                     ) -> list[int]:
        me = self.id
        if births is None:
            births = [self.clock()] * len(ops)
        # keys with one preference list have one leader: asked once a call for each of the
        # few lists, not once an op (``is_live`` is a call per member it tries)
        ring = self.ring
        groups = by_leader(ops, ring.cached_prefs, ring.preference_list, ring.leader,
                           self._is_live())
        if len(groups) == 1:  # one op, or one leader for all (what the SDK sends): no split
            leader = next(iter(groups))
            return await (lead(ops, births) if leader == me
                          else self._forward(leader, list(ops), births, lead, kind))
        out = [_UNAVAILABLE] * len(ops)
        waits = []
        for leader, idx in groups.items():
            sub, born = [ops[i] for i in idx], [births[i] for i in idx]
            waits.append(lead(sub, born) if leader == me
                         else self._forward(leader, sub, born, lead, kind))
        for idx, statuses in zip(groups.values(), await asyncio.gather(*waits), strict=True):
            for i, s in zip(idx, statuses, strict=True):
                out[i] = s
        return out

    async def _forward(self, leader: str | None, ops: list[Op], births: Sequence[float],
                       lead: Callable[[Sequence[Op], Sequence[float] | None], Any],
                       kind: Kind) -> list[int]:
        if leader is None:
            return [_UNAVAILABLE] * len(ops)
        self.metrics.forwarded += len(ops)
        fut = self.links[leader].call(kind, _stamped(ops, births))
        # a delete reads a quorum before it writes one: it may take two quorum waits
        timeout = self.config.quorum_timeout * (1.5 if kind == Kind.FORWARD else 2.5)
        try:
            statuses = await asyncio.wait_for(fut, timeout)
        except PeerError as exc:  # the leader is unreachable: the next live replica leads
            log.info("forward to %s failed, re-routing: %r", leader, exc)
            return await self._reroute(leader, ops, births, lead, kind)
        except (TimeoutError, Unavailable) as exc:
            log.warning("forward to %s failed: %r", leader, exc)
            return [_UNAVAILABLE] * len(ops)
        if len(statuses) != len(ops):
            return [_UNAVAILABLE] * len(ops)
        return statuses

    async def _reroute(self, failed: str, ops: list[Op], births: Sequence[float],
                       lead: Callable[[Sequence[Op], Sequence[float] | None], Any],
                       kind: Kind) -> list[int]:
        """Lead or forward (once) to the next live replica. The failed leader may have applied
        some of the ops, so they go as retries (attempt >= 2): checked on the replicas first."""
        is_live = self._is_live()
        out = [_UNAVAILABLE] * len(ops)
        groups: dict[str | None, list[int]] = {}
        for i, (table, key, _op_id, _delta, _attempt) in enumerate(ops):
            leader = self.ring.leader(table, key, lambda n: n != failed and is_live(n))
            groups.setdefault(leader, []).append(i)
        for leader, idx in groups.items():
            sub = [Op(t, k, o, d, max(a, 2)) for t, k, o, d, a in (ops[i] for i in idx)]
            born = [births[i] for i in idx]
            if leader is None:
                continue
            if leader == self.id:
                res = await lead(sub, born)
            else:
                try:
                    call = self.links[leader].call(kind, _stamped(sub, born))
                    res = await asyncio.wait_for(call, self.config.quorum_timeout * 1.5)
                except (TimeoutError, Unavailable):
                    continue
            for i, st in zip(idx, res, strict=True):
                out[i] = st
        return out
