"""Consistent-hash ring with virtual nodes: the preference list of RF replicas of each key.

Pure and deterministic: tokens are MurmurHash3 (x64, fixed seed) of ``"<node>#<i>"`` and keys
hash ``"<table>/<key>"`` the same way, so every process with the same member list computes the
same preference lists. Adding a node moves only the keys whose arc it takes, about 1/N of them.

Part of the public contract: a node publishes its members, RF and vnodes (``/v1/health``), and
the SDK computes each key's leader with this same code to send an op straight to it (no
forwarding hop). The server's layers use it as ``cluster.core.ring``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Sequence

import mmh3

RING_SEED = 0x1DE0_C0DE
# how a node names this placement in /v1/health's "ring" (the SDK routes only when it matches)
RING_HASH = "murmur3_x64_128"

_digest = mmh3.mmh3_x64_128_utupledigest


def token(data: bytes) -> int:
    """64-bit ring position of ``data``."""
    return _digest(data, RING_SEED)[0]


class Ring:
    """Members on a ring of 2**64 positions, ``vnodes`` tokens each."""

    __slots__ = ("members", "vnodes", "rf", "_tokens", "_prefs", "_cache", "max_cache")

    def __init__(self, members: Iterable[str], *, vnodes: int = 256, rf: int = 3) -> None:
        names = sorted(set(members))
        if not names:
            raise ValueError("a ring needs at least one member")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        if rf < 1:
            raise ValueError(f"rf must be >= 1, got {rf}")
        self.members: tuple[str, ...] = tuple(names)
        self.vnodes = vnodes
        self.rf = min(rf, len(names))
        self._tokens, self._prefs = _build(self.members, vnodes, self.rf)
        # Hot keys skip even the bisect through a bounded cache (cleared whole when full: no
        # per-hit bookkeeping). Small: ~170 bytes an entry, and a key that is not hot gains
        # nothing from it (100,000 entries were ~17 MB a node, 17 bytes a counter at 1M).
        self._cache: dict[tuple[str, str], tuple[str, ...]] = {}
        self.max_cache = 8192

    @staticmethod
    def _walk(owners: Sequence[str], start: int, count: int) -> tuple[str, ...]:
        found: list[str] = []
        n = len(owners)
        for j in range(n):
            name = owners[(start + j) % n]
            if name not in found:
                found.append(name)
                if len(found) == count:
                    break
        return tuple(found)

    def _index(self, table: str, key: str) -> int:
        h = token(f"{table}/{key}".encode())
        i = bisect.bisect_left(self._tokens, h)
        return 0 if i == len(self._tokens) else i

    @property
    def tokens(self) -> list[int]:
        return self._tokens

    def owners_at(self, position: int) -> tuple[str, ...]:
        """The preference list of a key hashed to ``position`` (a 64-bit ring position)."""
        i = bisect.bisect_left(self._tokens, position)
        return self._prefs[0 if i == len(self._tokens) else i]

    def preference_list(self, table: str, key: str) -> tuple[str, ...]:
        """The key's RF distinct replicas, in ring order; the first is the leader when up."""
        prefs = self._cache.get((table, key))
        if prefs is None:
            prefs = self._prefs[self._index(table, key)]
            if len(self._cache) >= self.max_cache:
                self._cache.clear()
            self._cache[(table, key)] = prefs
        return prefs

    @property
    def replicates_everywhere(self) -> bool:
        """True when every member holds every key (rf == number of members)."""
        return self.rf == len(self.members)

    def leader(
        self, table: str, key: str, is_live: Callable[[str], bool] | None = None
    ) -> str | None:
        """First replica of the preference list for which ``is_live`` holds (all, by default)."""
        prefs = self._cache.get((table, key)) or self.preference_list(table, key)
        if is_live is None:
            return prefs[0]
        for name in prefs:
            if is_live(name):
                return name
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return (self.members, self.vnodes, self.rf) == (other.members, other.vnodes, other.rf)

    def __repr__(self) -> str:
        return f"Ring(members={list(self.members)}, vnodes={self.vnodes}, rf={self.rf})"


@functools.lru_cache(maxsize=16)
def _build(names: tuple[str, ...], vnodes: int, rf: int
           ) -> tuple[list[int], list[tuple[str, ...]]]:
    """The sorted tokens and, per token, its preference list: one walk per token at build
    time, so a lookup is a hash and a bisect. Cached (shared, never mutated): a node rebuilds
    the same ring at every start, and the simulator at every restart of every node."""
    points = sorted((token(f"{name}#{i}".encode()), name) for name in names for i in range(vnodes))
    owners = [name for _, name in points]
    return [t for t, _ in points], [Ring._walk(owners, i, rf) for i in range(len(owners))]
