"""The node's wall clock (with the test-only injected offset) and what it knows of its peers'.

Every wall-clock read of a node goes through the one ``clock`` the ``Node`` is given. Tests and
the chaos driver's clock nemesis skew it with the environment variable ``IDC_CLOCK_OFFSET``
(seconds, may be negative, read once at start): the machine clock cannot be changed in CI.

``PeerClocks`` estimates each peer's offset from heartbeats, as NTP does with one exchange: a
PING leaves at our wall time ``t0``, the answer carries the peer's wall time ``tp`` and arrives
a round trip ``rtt`` later (measured on the monotonic clock), so the peer's clock is ahead of
ours by ``tp - (t0 + rtt / 2)``, give or take ``rtt / 2``. Of the last samples the one with the
shortest round trip is kept (Mills, RFC 5905 section 10: the clock filter). No I/O; both clocks
are arguments.

A step of our own wall clock (NTP stepping it, an operator setting it) voids every sample taken
before it: ``watch`` compares the wall clock with the monotonic one at each reading the node
makes before it leads, and at each sample; when their difference moved by more than a quarter
of the tolerance, the samples are dropped and the node refuses until a fresh one says where its
clock stands. Without it, the shortest-round-trip sample from before the step kept the node
counting by a clock seconds off for up to ``stale_after``.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

OFFSET_ENV = "IDC_CLOCK_OFFSET"


def injected_offset(environ: Mapping[str, str] | None = None) -> float:
    """The test-only clock offset (seconds) from ``IDC_CLOCK_OFFSET``; 0 when unset."""
    raw = (os.environ if environ is None else environ).get(OFFSET_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{OFFSET_ENV}: not a number of seconds: {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{OFFSET_ENV}: must be finite, got {raw!r}")
    return value


def offset_clock(offset: float, base: Callable[[], float] = time.time) -> Callable[[], float]:
    """``base`` moved by ``offset`` seconds (``base`` itself when the offset is 0)."""
    if offset == 0.0:
        return base
    return lambda: base() + offset


@dataclass(frozen=True, slots=True)
class Sample:
    offset: float  # the peer's clock minus ours, seconds
    rtt: float  # the round trip it was measured over, seconds
    at: float  # when it was taken (monotonic)


class PeerClocks:
    """The offset of each peer's wall clock to ours, and whether ours is the odd one out.

    A peer counts as *skewed* when its offset is beyond ``tolerance`` even at the edge of the
    measurement's error (``|offset| - rtt/2 > tolerance``). This node refuses to count while its
    clock disagrees with a strict majority of the peers it has fresh samples of (heard within
    ``stale_after``): then its own clock is the likely wrong one. A node with no fresh sample
    has no evidence and counts."""

    def __init__(self, tolerance: float, *, monotonic: Callable[[], float] = time.monotonic,
                 keep: int = 16, stale_after: float = 5.0) -> None:
        self.tolerance = tolerance
        self.monotonic = monotonic
        self.keep = keep
        self.stale_after = stale_after
        self._samples: dict[str, deque[Sample]] = {}
        self.step_tolerance = tolerance / 4.0
        self._base: float | None = None  # wall minus monotonic at the last reading
        self._stepped: float | None = None  # when our clock stepped, if no sample came since
        self.steps = 0
        # read on every request, so kept as a flag: ``update`` (each sample, each heartbeat
        # round) recomputes it and calls ``on_change`` when it flips
        self.refusing = False
        self.on_change: Callable[[bool], None] | None = None

    def sample(self, peer: str, sent_wall: float, rtt: float, peer_wall: float) -> Sample:
        """Record one exchange: sent at our ``sent_wall``, answered with ``peer_wall`` after
        ``rtt`` seconds."""
        rtt = max(0.0, rtt)
        now = self.monotonic()
        self.watch(sent_wall, now - rtt)
        s = Sample(peer_wall - (sent_wall + rtt / 2.0), rtt, now)
        q = self._samples.get(peer)
        if q is None:
            q = self._samples[peer] = deque(maxlen=self.keep)
        q.append(s)
        self.update()
        return s

    def watch(self, wall: float, mono: float) -> bool:
        """Our wall clock read at monotonic time ``mono``: True when it stepped since the last
        reading (then every sample is void, and ``refusing`` holds until a fresh one)."""
        base = wall - mono
        prev, self._base = self._base, base
        if prev is None or abs(base - prev) <= self.step_tolerance:
            return False
        self.steps += 1
        self._samples.clear()
        self._stepped = mono
        self.update()
        return True

    def best(self, peer: str) -> Sample | None:
        """The fresh sample of ``peer`` with the shortest round trip, if any."""
        q = self._samples.get(peer)
        if not q:
            return None
        cutoff = self.monotonic() - self.stale_after
        fresh = [s for s in q if s.at >= cutoff]
        return min(fresh, key=lambda s: s.rtt) if fresh else None

    def offsets(self) -> dict[str, float]:
        """Each peer's estimated offset (its clock minus ours, seconds), fresh samples only."""
        out = {}
        for peer in sorted(self._samples):
            s = self.best(peer)
            if s is not None:
                out[peer] = s.offset
        return out

    def skewed(self) -> list[str]:
        """Peers whose clock is surely further than ``tolerance`` from ours."""
        out = []
        for peer in sorted(self._samples):
            s = self.best(peer)
            if s is not None and abs(s.offset) - s.rtt / 2.0 > self.tolerance:
                out.append(peer)
        return out

    def update(self) -> bool:
        """``refusing``: True while a strict majority of the freshly measured peers are skewed
        from us, or our clock stepped and nobody was measured since (for ``stale_after`` at
        most: a node with no peer to measure counts again then)."""
        measured = sum(1 for p in self._samples if self.best(p) is not None)
        if measured or (self._stepped is not None
                        and self.monotonic() - self._stepped > self.stale_after):
            self._stepped = None  # measured since; or no peer to measure (alone): as before
        refusing = (measured > 0 and 2 * len(self.skewed()) > measured) or (
            self._stepped is not None)
        if refusing != self.refusing:
            self.refusing = refusing
            if self.on_change is not None:
                self.on_change(refusing)
        return refusing
