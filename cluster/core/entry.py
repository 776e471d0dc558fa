"""One key's counter state: per origin, a (P, N) pair of G-counters (DESIGN "Counter state").

A node only raises its own pair; pairs learned from peers merge by element-wise max, so
re-delivering or replaying state never counts twice. The value is ``sum(P) - sum(N)``.
``CounterEntry`` is what reads, repairs, anti-entropy and the merge-law tests handle; the store
of many keys is ``cluster.core.shards.ShardStore``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgpack

Pair = tuple[int, int]


class CounterEntry:
    """Mapping origin -> (P, N) for one key; immutable once built, ``merge`` returns a new one."""

    __slots__ = ("_pn",)

    def __init__(self, pn: Mapping[str, Pair] | None = None) -> None:
        clean: dict[str, Pair] = {}
        for origin, (p, n) in (pn or {}).items():
            if p < 0 or n < 0:
                raise ValueError(f"P and N must be >= 0, got {origin}=({p}, {n})")
            if p or n:
                clean[origin] = (int(p), int(n))
        self._pn = clean

    @property
    def pairs(self) -> Mapping[str, Pair]:
        return self._pn

    def merge(self, other: CounterEntry) -> CounterEntry:
        """Element-wise max per origin: commutative, associative, idempotent."""
        out = dict(self._pn)
        for origin, (p, n) in other._pn.items():
            mine = out.get(origin)
            out[origin] = (p, n) if mine is None else (max(mine[0], p), max(mine[1], n))
        entry = CounterEntry()
        entry._pn = out
        return entry

    def value(self) -> int:
        return sum(p for p, _ in self._pn.values()) - sum(n for _, n in self._pn.values())

    def dominates(self, other: CounterEntry) -> bool:
        """True when merging ``other`` into self would change nothing."""
        for origin, (p, n) in other._pn.items():
            mine = self._pn.get(origin, (0, 0))
            if p > mine[0] or n > mine[1]:
                return False
        return True

    def to_wire(self) -> dict[str, list[int]]:
        return {origin: [p, n] for origin, (p, n) in self._pn.items()}

    @classmethod
    def from_wire(cls, data: object) -> CounterEntry:
        if not isinstance(data, dict):
            raise ValueError(f"a counter entry maps origin -> [P, N], not {type(data).__name__}")
        pn: dict[str, Pair] = {}
        for origin, pair in data.items():
            if not isinstance(origin, str) or not isinstance(pair, list | tuple) or len(pair) != 2:
                raise ValueError("a counter entry is a map origin -> [P, N]")
            p, n = pair
            if type(p) is not int or type(n) is not int:
                raise ValueError("P and N must be integers")
            pn[origin] = (p, n)
        return cls(pn)

    def to_bytes(self) -> bytes:
        return msgpack.packb(self.to_wire())

    @classmethod
    def from_bytes(cls, data: bytes) -> CounterEntry:
        return cls.from_wire(msgpack.unpackb(data, strict_map_key=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CounterEntry):
            return NotImplemented
        return self._pn == other._pn

    def __hash__(self) -> int:
        return hash(frozenset(self._pn.items()))

    def __repr__(self) -> str:
        return f"CounterEntry({self._pn!r})"
