"""Failure detection: heartbeats over the peer links and a phi-accrual detector per peer.

Hayashibara et al.'s phi accrual detector, in the exponential form Cassandra uses: with the
mean interval between heartbeats ``mu`` (floored), a silence of ``t`` seconds gives
``phi = t / mu * log10(e)``, the minus log10 of the probability that a heartbeat is still on its
way. A peer is live while phi stays under ``phi_threshold`` and it was heard from within
``failure_timeout``, and it said it is ready (a restarting node settles its in-doubt ops before
it leads anything). Pure apart from the clock passed in; ``Heartbeats`` does the sending.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cluster.roles import protocol
from cluster.transport.wire import SPEAKS, Kind

if TYPE_CHECKING:
    from cluster.core.clock import PeerClocks
    from cluster.core.membership import Membership
    from cluster.transport.peer import PeerLink


class Node(Protocol):
    """What the heartbeat loop needs of its node."""

    links: dict[str, PeerLink]
    ready: bool
    clocks: PeerClocks
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    membership: Membership
    peer_speaks: dict[str, tuple[int, int]]

    def saw_ring(self, peer: str, version: Any) -> None: ...

log = logging.getLogger("cluster.failure")

_LOG10_E = math.log10(math.e)


class PhiDetector:
    """Arrival history of one peer's heartbeats; ``phi(now)`` says how suspicious silence is."""

    __slots__ = ("floor", "last", "intervals", "ready", "heard", "_mean", "live_until")

    def __init__(self, now: float, floor: float, window: int = 100) -> None:
        self.floor = floor
        self.last = now  # a fresh detector trusts the peer, as if it had just heard from it
        self.intervals: deque[float] = deque(maxlen=window)
        self.ready = True
        self.heard = False
        self._mean = floor
        self.live_until = math.inf  # ``FailureDetector`` sets it (``silent_after``)

    def heartbeat(self, now: float, ready: bool = True) -> None:
        if self.heard:
            self.intervals.append(now - self.last)
            # kept, not summed at each ``phi``: routing asks ``is_live`` for every op
            self._mean = max(sum(self.intervals) / len(self.intervals), self.floor)
        self.last = now
        self.ready = ready
        self.heard = True

    def mean(self) -> float:
        return self._mean

    def phi(self, now: float) -> float:
        return max(0.0, now - self.last) / self.mean() * _LOG10_E

    def silent_after(self, timeout: float, threshold: float) -> float:
        """When this peer stops being live without another heartbeat: silence reaches
        ``timeout``, or phi reaches ``threshold`` (``phi < threshold`` while ``now - last <
        threshold * mean / log10(e)``), whichever comes first."""
        return self.last + min(timeout, threshold * self.mean() / _LOG10_E)


class FailureDetector:
    """One ``PhiDetector`` per peer plus the thresholds; ``is_live`` is the node's predicate."""

    def __init__(self, peers: list[str], *, interval: float, threshold: float, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.threshold = threshold
        self.timeout = timeout
        now = clock()
        # The floor keeps a burst of fast heartbeats from making one slow one look fatal.
        self._floor = max(interval, timeout / threshold / _LOG10_E)
        self.peers = {p: self._fresh(now) for p in peers}
        self.on_change: Callable[[str, bool], None] | None = None
        self._live = dict.fromkeys(peers, True)

    def _fresh(self, now: float) -> PhiDetector:
        return self._rearm(PhiDetector(now, floor=self._floor))

    def _rearm(self, d: PhiDetector) -> PhiDetector:
        """``d`` heard from (or new): when it stops being live (``is_live``)."""
        d.live_until = d.silent_after(self.timeout, self.threshold)
        return d

    def add(self, peer: str) -> None:
        """A new member (elastic membership): trusted until its heartbeats say otherwise."""
        if peer not in self.peers:
            self.peers[peer] = self._fresh(self.clock())
            self._live[peer] = True

    def remove(self, peer: str) -> None:
        self.peers.pop(peer, None)
        self._live.pop(peer, None)

    def heartbeat(self, peer: str, ready: bool = True) -> None:
        d = self.peers.get(peer)
        if d is not None:
            d.heartbeat(self.clock(), ready)
            self._rearm(d)
            self._update(peer)

    def is_live(self, peer: str) -> bool:
        """Ready, heard within ``timeout``, and phi under ``threshold``: the last two folded
        into one time at each heartbeat (``silent_after``), since routing asks for every op."""
        d = self.peers.get(peer)
        if d is None:
            return True  # this node itself
        return d.ready and self.clock() < d.live_until

    def _update(self, peer: str) -> None:
        live = self.is_live(peer)
        if live != self._live.get(peer):
            self._live[peer] = live
            log.info("peer %s is %s", peer, "up" if live else "down")
            if self.on_change is not None:
                self.on_change(peer, live)

    def check_all(self) -> None:
        for peer in self.peers:
            self._update(peer)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        now = self.clock()
        return {p: {"live": self.is_live(p), "phi": round(d.phi(now), 3),
                    "silent_s": round(now - d.last, 3)} for p, d in self.peers.items()}


async def heartbeat_loop(node: Node, detector: FailureDetector, interval: float) -> None:
    """Every ``interval``: ping every peer; each answer is a heartbeat (with the peer's ready
    flag). A ping answered late still counts: arrival times are what phi measures. A ping
    carries our wall clock and its answer the peer's (``t``): one sample of the peer's clock
    offset each (``cluster.core.clock.PeerClocks``)."""

    def answered(peer: str, sent_wall: float, sent_mono: float,
                 fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        body = fut.result()  # this call's slice of the reply: one answer per item sent
        if isinstance(body, list) and len(body) == 1:
            body = body[0]
        if not isinstance(body, dict):
            detector.heartbeat(peer)
            return
        node.saw_ring(peer, body.get("ring"))
        protocol.saw(node, peer, body.get("speaks"))
        peer_wall = body.get("t")
        if isinstance(peer_wall, float | int) and not isinstance(peer_wall, bool):
            node.clocks.sample(peer, sent_wall, node.monotonic() - sent_mono, float(peer_wall))
        # Only a peer refusing for its clock is taken as not ready: honouring "ready" itself
        # (false while a peer recovers) makes every peer look down for a heartbeat after each
        # start, which the rest of the node does not expect yet (see docs/node.md, "Clocks").
        detector.heartbeat(peer, not body.get("clock_skew", False))

    while True:
        for peer, link in node.links.items():
            sent_wall, sent_mono = node.clock(), node.monotonic()
            fut = link.call(Kind.PING, [{"ready": node.ready, "t": sent_wall,
                                         "ring": node.membership.version,
                                         "speaks": list(SPEAKS)}], probe=True)
            fut.add_done_callback(functools.partial(answered, peer, sent_wall, sent_mono))
        detector.check_all()
        node.clocks.update()  # samples go stale when a peer goes quiet
        await asyncio.sleep(interval)
