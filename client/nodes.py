"""Which nodes the client knows and in which order to try them: state only, no I/O.

Coordinators rotate (any node coordinates, so load spreads), and a node that just failed moves
to the back of the order for ``failure_backoff_interval`` seconds. The cluster's window comes
from ``/v1/health`` answers (the smallest advertised), so retry deadlines stay inside it. So
does the ring (members, RF, vnodes): with it, ``leader_url`` names the node that leads a key,
computed with the nodes' own code (``idc_contract.ring``), so an op can skip the forwarding hop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from client.config import normalize_url
from idc_contract.ring import RING_HASH, Ring


class NodePool:
    def __init__(self, urls: Iterable[str], *, failure_backoff_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls: list[str] = list(dict.fromkeys(normalize_url(u) for u in urls))
        self.failure_backoff_interval = failure_backoff_interval
        self.clock = clock
        self.failed_at: dict[str, float] = {}
        self.node_ids: dict[str, str] = {}
        self.windows: dict[str, float] = {}
        self.skews: dict[str, float] = {}  # each node's clock tolerance (max_clock_skew)
        self.said = 0  # counts changes of ``windows`` and ``skews``: what is derived may be kept
        self.members: tuple[str, ...] = ()
        self.ring: Ring | None = None
        self._ring_spec: tuple[tuple[str, ...], int, int] | None = None
        self._url_of: dict[str, str] = {}  # node id -> the first URL that answered as it
        self._ring_version = -1  # the newest membership version an answer carried
        self._next = 0

    def add(self, url: str) -> bool:
        url = normalize_url(url)
        if url in self.urls:
            return False
        self.urls.append(url)
        return True

    def remove(self, url: str) -> bool:
        """Stop using ``url`` (its node left the cluster): it is no longer tried, and what it
        said (its id, its window) is forgotten. The last URL is kept: False, as for an
        unknown one."""
        url = normalize_url(url)
        if url not in self.urls or len(self.urls) == 1:
            return False
        self.urls.remove(url)
        self.failed_at.pop(url, None)
        self.windows.pop(url, None)
        self.skews.pop(url, None)
        self.said += 1
        node_id = self.node_ids.pop(url, None)
        if node_id is not None and self._url_of.get(node_id) == url:
            del self._url_of[node_id]
        return True

    def order(self, prefer: str | None = None) -> list[str]:
        """Every node once: ``prefer`` (a key's leader) first, the others rotated for load
        spreading; recently failed ones last."""
        n = len(self.urls)
        start = self._next % n
        self._next += 1
        rotated = self.urls[start:] + self.urls[:start]
        if prefer is not None and prefer in rotated:
            rotated.remove(prefer)
            rotated.insert(0, prefer)
        cutoff = self.clock() - self.failure_backoff_interval
        return sorted(rotated, key=lambda u: self.failed_at.get(u, -1.0) > cutoff)

    def leader_url(self, table: str, key: str) -> str | None:
        """The URL of the node that leads ``table``/``key`` (its first replica), once the ring
        and that node's id are known; None before (or when it is not one of ours)."""
        ring = self.ring
        if ring is None:
            return None
        return self._url_of.get(ring.preference_list(table, key)[0])

    def record(self, url: str, ok: bool) -> None:
        if ok:
            self.failed_at.pop(url, None)
        else:
            self.failed_at[url] = self.clock()

    def learn(self, url: str, health: Mapping[str, Any], *, discover: bool) -> list[str]:
        """Take in one /v1/health answer; returns node URLs newly discovered."""
        node_id = health.get("node")
        if isinstance(node_id, str):
            self.node_ids[url] = node_id
            self._url_of.setdefault(node_id, url)
        window = health.get("window_s")
        if isinstance(window, int | float) and window > 0:
            self.windows[url] = float(window)
            self.said += 1
        clock = health.get("clock")
        skew = clock.get("tolerance_s") if isinstance(clock, Mapping) else None
        if isinstance(skew, int | float) and skew >= 0:
            self.skews[url] = float(skew)
            self.said += 1
        members = health.get("members")
        if isinstance(members, list):
            self.members = tuple(str(m) for m in members)
            self._learn_ring(health)
        new: list[str] = []
        self._forget_departed(health.get("ring_version"), health.get("left"))
        addresses = health.get("addresses")
        if discover and isinstance(addresses, Mapping):
            # Nodes advertise client addresses as {"addresses": {id: "host:port"}} (every member
            # that has not left); the member ids alone cannot be dialled.
            for addr in addresses.values():
                if isinstance(addr, str) and self.add(addr):
                    new.append(normalize_url(addr))
        return new

    def _forget_departed(self, version: Any, left: Any) -> None:
        """Stop using the addresses of members that left the cluster (``left``: id -> the
        address it had), as an answer of the newest membership version seen says: a departed
        node's machine may be gone, and trying it would cost a connect timeout a turn. Only
        those exact addresses go (a load balancer's URL in front of them stays), never the last
        URL; a member that joins again is advertised, and discovered, again."""
        if not isinstance(version, int) or isinstance(version, bool) or \
                version < self._ring_version:
            return  # a node behind the membership: its list may be stale
        self._ring_version = version
        if isinstance(left, Mapping):
            for addr in left.values():
                if isinstance(addr, str):
                    self.remove(addr)

    def _learn_ring(self, health: Mapping[str, Any]) -> None:
        ring, rf = health.get("ring"), health.get("rf")
        if not (self.members and isinstance(ring, Mapping) and ring.get("hash") == RING_HASH
                and isinstance(ring.get("vnodes"), int) and isinstance(rf, int)):
            return  # a node that does not say how it places keys: no routing
        spec = (tuple(sorted(self.members)), ring["vnodes"], rf)
        if spec != self._ring_spec:
            try:
                self.ring = Ring(spec[0], vnodes=spec[1], rf=spec[2])
            except ValueError:
                return
            self._ring_spec = spec

    def window(self, assumed: float) -> float:
        return min(self.windows.values()) if self.windows else assumed

    def skew(self) -> float:
        """The largest clock tolerance the nodes advertise (0 before any says)."""
        return max(self.skews.values(), default=0.0)
