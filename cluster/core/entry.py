"""One key's counter state: per origin, a (P, N) pair of G-counters (DESIGN "Counter state").

A node only raises its own pair; pairs learned from peers merge by element-wise max, so
re-delivering or replaying state never counts twice. The value is ``sum(P) - sum(N)``.
``CounterEntry`` is what reads, repairs, anti-entropy and the merge-law tests handle; the store
of many keys is ``cluster.core.shards.ShardStore``. Pure: no I/O, no clock.

**Deletes are observed removes** (docs/deletes.md). A delete records, for each origin ``o`` it
saw, the pair it saw as the pair of the *floor origin* ``"~" + o``; the value counts only what
lies above each floor: ``sum(max(0, P - FP) - max(0, N - FN))``. Floors are pairs like any
other, so they max-merge, replicate, repair, hint, snapshot and replay through every path pairs
already take, and an old pair arriving late lies under its floor: no resurrection. An
increment the delete did not see raises its pair above the floor and counts whole.

The pseudo-origin ``"~"`` (``LAST``) holds, as its P, the wall-clock milliseconds of the key's
last change (a write in a table with a ttl, or a delete): expiry and the collection of
tombstones are decided from it, the same way on every replica.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import msgpack

Pair = tuple[int, int]

FLOOR = "~"  # the floor of origin o is the pair of origin FLOOR + o; real origins never start so
LAST = FLOOR  # FLOOR + "" (no real origin is empty): P is the key's last change, ms


def floor_of(origin: str) -> str:
    return FLOOR + origin


def is_real(origin: str) -> bool:
    """A node's own origin (``n1@3``), not a floor or ``LAST``."""
    return not origin.startswith(FLOOR)


def value_of(pairs: Mapping[str, Pair]) -> int:
    """The value of one key's pairs (floors and ``LAST`` among them): what lies above each
    origin's floor. Without floors, ``sum(P) - sum(N)``."""
    total = 0
    floors = False
    for origin, (p, n) in pairs.items():
        if origin.startswith(FLOOR):
            floors = True
        else:
            total += p - n
    if not floors:
        return total
    total = 0
    for origin, (p, n) in pairs.items():
        if origin.startswith(FLOOR):
            continue
        fp, fn = pairs.get(FLOOR + origin, (0, 0))
        total += max(0, p - fp) - max(0, n - fn)
    return total


# ``value_of`` an entry's wire form (``CounterEntry.to_wire``: origin -> [P, N]) with no
# ``CounterEntry`` built, as a read that holds its entries so answers: a [P, N] list unpacks
# as the pair does (the same function, typed for lists)
wire_value = cast(Callable[[Mapping[str, list[int]]], int], value_of)


def is_live(pairs: Mapping[str, Pair]) -> bool:
    """True when some origin's pair lies above its floor: the counter exists (it was written
    since its last delete, even if its value is 0). A key holding only floors is a tombstone."""
    for origin, (p, n) in pairs.items():
        if origin.startswith(FLOOR):
            continue
        fp, fn = pairs.get(FLOOR + origin, (0, 0))
        if p > fp or n > fn:
            return True
    return False


def last_change_ms(pairs: Mapping[str, Pair]) -> int:
    """The key's last change (``LAST``'s P), 0 when it carries none."""
    return pairs.get(LAST, (0, 0))[0]


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
        """What lies above the floors (module docstring)."""
        return value_of(self._pn)

    def live(self) -> bool:
        return is_live(self._pn)

    def last_change_ms(self) -> int:
        return last_change_ms(self._pn)

    def collectable(self, now_ms: int, grace_ms: int) -> bool:
        """A tombstone (nothing above its floors) whose last change is ``grace_ms`` old: a node
        drops it (``cluster.roles.expiry``) and never takes it back from a peer."""
        last = last_change_ms(self._pn)
        return bool(last) and last + grace_ms <= now_ms and not is_live(self._pn)

    def floors(self, now_ms: int) -> dict[str, Pair]:
        """The pairs a delete that saw this entry at ``now_ms`` writes: every origin's pair as
        the floor of that origin (floors it holds already included), and ``LAST`` at
        ``now_ms``."""
        out: dict[str, Pair] = {}
        for origin, pair in self._pn.items():
            if origin == LAST:
                continue
            name = origin if origin.startswith(FLOOR) else FLOOR + origin
            mine = out.get(name, (0, 0))
            out[name] = (max(mine[0], pair[0]), max(mine[1], pair[1]))
        out[LAST] = (max(now_ms, last_change_ms(self._pn)), 0)
        return out

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
