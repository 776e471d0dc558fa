"""Which nodes the client knows and in which order to try them: state only, no I/O.

Coordinators rotate (any node coordinates, so load spreads), and a node that just failed moves
to the back of the order for ``failure_backoff_interval`` seconds. The cluster's window comes
from ``/v1/health`` answers (the smallest advertised), so retry deadlines stay inside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from client.config import normalize_url


class NodePool:
    def __init__(self, urls: Iterable[str], *, failure_backoff_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls: list[str] = list(dict.fromkeys(normalize_url(u) for u in urls))
        self.failure_backoff_interval = failure_backoff_interval
        self.clock = clock
        self.failed_at: dict[str, float] = {}
        self.node_ids: dict[str, str] = {}
        self.windows: dict[str, float] = {}
        self.members: tuple[str, ...] = ()
        self._next = 0

    def add(self, url: str) -> bool:
        url = normalize_url(url)
        if url in self.urls:
            return False
        self.urls.append(url)
        return True

    def order(self) -> list[str]:
        """Every node once: rotated for load spreading, recently failed ones last."""
        n = len(self.urls)
        start = self._next % n
        self._next += 1
        rotated = self.urls[start:] + self.urls[:start]
        cutoff = self.clock() - self.failure_backoff_interval
        return sorted(rotated, key=lambda u: self.failed_at.get(u, -1.0) > cutoff)

    def record(self, url: str, ok: bool) -> None:
        if ok:
            self.failed_at.pop(url, None)
        else:
            self.failed_at[url] = self.clock()

    def learn(self, url: str, health: Mapping[str, Any], *, discover: bool) -> list[str]:
        """Take in one /v1/health answer; returns node URLs newly discovered."""
        if isinstance(health.get("node"), str):
            self.node_ids[url] = health["node"]
        window = health.get("window_s")
        if isinstance(window, int | float) and window > 0:
            self.windows[url] = float(window)
        members = health.get("members")
        if isinstance(members, list):
            self.members = tuple(str(m) for m in members)
        new: list[str] = []
        if discover:
            # Nodes may advertise client addresses as {"addresses": {id: "host:port"}}; the
            # member ids alone cannot be dialled.
            addresses = health.get("addresses")
            if isinstance(addresses, Mapping):
                for addr in addresses.values():
                    if isinstance(addr, str) and self.add(addr):
                        new.append(normalize_url(addr))
        return new

    def window(self, assumed: float) -> float:
        return min(self.windows.values()) if self.windows else assumed
