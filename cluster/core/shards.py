"""Counter state as per-origin shards: a PN-counter of G-counters (DESIGN "Counter state").

Each replica keeps, per (table, key), one ``(P, N)`` pair per origin node. A node only raises its
own pair; pairs learned from peers merge by element-wise max, so re-delivering or replaying
state never counts twice. The value is ``sum(P) - sum(N)``. Pure: no I/O, no clock.

``CounterEntry`` is the full state of one key (reads, repairs, tests of the merge laws);
``ShardStore`` holds many keys compactly: one flat list ``[P0, N0, P1, N1, ...]`` per key,
indexed by a per-store origin number, which costs far less memory than a dict per key.

**Hidden deltas.** A leader raises its own pair when it applies an op, before the op is on a
quorum. Until then the op is unpublished and must be invisible to everyone else (it may yet be
withdrawn, because another leader applied it). The store keeps, per key and origin, the sum of
such deltas (``hide``/``unhide``); ``entry`` and ``value`` (what reads, repairs, anti-entropy and
peers see) subtract them, while ``own_pair`` and the rows themselves stay the local truth that
the next op's pair is computed from. A visible pair only ever grows: a delta is hidden as it is
applied and unhidden once it is published, or once a compensation cancels it (``compensate``).

**Digests.** Every method that may change a key's visible entry marks the key in ``digests``
(``cluster.core.digests``: anti-entropy's bucket sums, rehashed from the marks), so a digest
never needs a pass over the whole store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import msgpack

from cluster.core.digests import Digests, GroupOf, entry_hash
from cluster.core.ops import ItemFields

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


class ShardStore:
    """Every key's entry on one node; ``own`` is the origin this node raises."""

    __slots__ = ("own", "_origins", "_index", "_tables", "keys", "_hidden", "digests")

    def __init__(self, own: str) -> None:
        self.own = own
        self._origins: list[str] = []
        self._index: dict[str, int] = {}
        self._tables: dict[str, dict[str, list[int]]] = {}
        # (table, key) -> origin -> [P, N] applied here but not published (module docstring)
        self._hidden: dict[tuple[str, str], dict[str, list[int]]] = {}
        self.keys = 0
        self.digests = Digests()
        self._origin(own)  # index 0: apply_local touches row[0] and row[1] only

    def _origin(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self._origins)
            self._origins.append(name)
        return i

    def _row(self, table: str, key: str, width: int) -> list[int]:
        rows = self._tables.get(table)
        if rows is None:
            rows = self._tables[table] = {}
        row = rows.get(key)
        if row is None:
            row = rows[key] = [0] * width
            self.keys += 1
        elif len(row) < width:
            row.extend([0] * (width - len(row)))
        return row

    def apply_local(self, table: str, key: str, delta: int) -> Pair:
        """Raise this node's own pair by ``delta`` (N for a negative delta); the new pair."""
        rows = self._tables.get(table)
        if rows is None:
            rows = self._tables[table] = {}
        row = rows.get(key)
        if row is None:
            row = rows[key] = [0, 0]
            self.keys += 1
        if delta >= 0:
            row[0] += delta
        else:
            row[1] -= delta
        self.digests.mark(table, key)
        return row[0], row[1]

    def merge_pair(self, table: str, key: str, origin: str, p: int, n: int) -> bool:
        """Max-merge one origin's pair; True when it raised anything."""
        i = 2 * self._origin(origin)
        row = self._row(table, key, i + 2)
        changed = False
        if p > row[i]:
            row[i] = p
            changed = True
        if n > row[i + 1]:
            row[i + 1] = n
            changed = True
        if changed:
            self.digests.mark(table, key)
        return changed

    def merge_items(self, items: Sequence[ItemFields]) -> None:
        """``merge_pair`` for a replication batch of items (``cluster.core.ops.Item``'s fields,
        lists off the wire), with the lookups hoisted out of the loop."""
        tables, index, mark = self._tables, self._index, self.digests.mark
        for _op_id, table, key, origin, p, n, _delta, _ts in items:
            i = index.get(origin)
            if i is None:
                i = self._origin(origin)
            i *= 2
            rows = tables.get(table)
            if rows is None:
                rows = tables[table] = {}
            row = rows.get(key)
            if row is None:
                row = rows[key] = [0] * (i + 2)
                self.keys += 1
            elif len(row) < i + 2:
                row.extend([0] * (i + 2 - len(row)))
            if p > row[i]:
                row[i] = p
                if n > row[i + 1]:
                    row[i + 1] = n
                mark(table, key)
            elif n > row[i + 1]:
                row[i + 1] = n
                mark(table, key)

    def own_pair(self, table: str, key: str) -> Pair:
        """This node's own pair as applied here (hidden deltas included)."""
        row = self._tables.get(table, {}).get(key)
        return (row[0], row[1]) if row else (0, 0)

    def hide(self, table: str, key: str, origin: str, delta: int) -> None:
        """``delta``, applied to ``origin``'s pair, is not published: keep it out of sight."""
        by_origin = self._hidden.get((table, key))
        if by_origin is None:
            by_origin = self._hidden[(table, key)] = {}
        pn = by_origin.get(origin)
        if pn is None:
            pn = by_origin[origin] = [0, 0]
        if delta >= 0:
            pn[0] += delta
        else:
            pn[1] -= delta
        self.digests.mark(table, key)

    def unhide(self, table: str, key: str, origin: str, delta: int) -> None:
        """``delta`` is published (or compensated): it is part of the visible pair again."""
        by_origin = self._hidden.get((table, key))
        if by_origin is None:
            return
        pn = by_origin.get(origin)
        if pn is None:
            return
        if delta >= 0:
            pn[0] -= delta
        else:
            pn[1] += delta
        self.digests.mark(table, key)
        if pn[0] <= 0 and pn[1] <= 0:
            del by_origin[origin]
            if not by_origin:
                del self._hidden[(table, key)]

    def clear_hidden(self) -> None:
        for table, key in self._hidden:
            self.digests.mark(table, key)
        self._hidden.clear()

    def has_hidden(self, table: str, key: str) -> bool:
        return (table, key) in self._hidden

    def compensate(self, table: str, key: str, origin: str, delta: int) -> Pair:
        """Cancel an applied ``delta`` of ``origin`` by raising the pair's other side by as
        much (P and N only grow); the new pair."""
        i = 2 * self._origin(origin)
        row = self._row(table, key, i + 2)
        if delta >= 0:
            row[i + 1] += delta
        else:
            row[i] -= delta
        self.digests.mark(table, key)
        return row[i], row[i + 1]

    def pair(self, table: str, key: str, origin: str, *, visible: bool = True) -> Pair:
        """``origin``'s pair of one key: as others may see it, or as applied here."""
        row = self._tables.get(table, {}).get(key)
        i = self._index.get(origin)
        if not row or i is None or 2 * i >= len(row):
            return (0, 0)
        p, n = row[2 * i], row[2 * i + 1]
        if visible:
            hid = self._hidden.get((table, key), {}).get(origin)
            if hid is not None:
                p, n = max(0, p - hid[0]), max(0, n - hid[1])
        return p, n

    def entry(self, table: str, key: str) -> CounterEntry:
        """The key's entry as others may see it: unpublished deltas left out."""
        row = self._tables.get(table, {}).get(key)
        if not row:
            return CounterEntry()
        origins = self._origins
        pairs = {origins[j // 2]: (row[j], row[j + 1]) for j in range(0, len(row), 2)}
        hidden = self._hidden.get((table, key))
        if hidden:
            for origin, (hp, hn) in hidden.items():
                p, n = pairs.get(origin, (0, 0))
                pairs[origin] = (max(0, p - hp), max(0, n - hn))
        return CounterEntry(pairs)

    def merge_entry(self, table: str, key: str, entry: CounterEntry) -> bool:
        changed = False
        for origin, (p, n) in entry.pairs.items():
            changed = self.merge_pair(table, key, origin, p, n) or changed
        return changed

    def value(self, table: str, key: str) -> int:
        """The visible value (unpublished deltas left out)."""
        if (table, key) in self._hidden:
            return self.entry(table, key).value()
        row = self._tables.get(table, {}).get(key)
        return sum(row[0::2]) - sum(row[1::2]) if row else 0

    def visible_hash(self, table: str, key: str) -> int | None:
        """``cluster.core.digests.entry_hash`` of ``entry(table, key)``, None when it is empty;
        built from the row directly (no ``CounterEntry``): it runs once per changed key."""
        row = self._tables.get(table, {}).get(key)
        if not row:
            return None
        origins = self._origins
        hidden = self._hidden.get((table, key))
        if hidden is None:
            pairs = [(origins[j >> 1], (row[j], row[j + 1])) for j in range(0, len(row), 2)
                     if row[j] or row[j + 1]]
        else:
            pn = {origins[j >> 1]: (row[j], row[j + 1]) for j in range(0, len(row), 2)}
            for origin, (hp, hn) in hidden.items():
                p, n = pn.get(origin, (0, 0))
                pn[origin] = (max(0, p - hp), max(0, n - hn))
            pairs = [(o, pair) for o, pair in pn.items() if pair[0] or pair[1]]
        if not pairs:
            return None
        pairs.sort()
        return entry_hash(key, pairs)

    def flush_digests(self, limit: int | None = None) -> int:
        """Bring ``digests`` up to date for at most ``limit`` changed keys; how many remain."""
        return self.digests.flush(self.visible_hash, limit)

    def group_digests(self, owner: object, group_of: GroupOf | None) -> None:
        """Split the digests by replica group (``Digests``); a new grouping rehashes every key
        at the next flushes, the same one (or one group as before) costs nothing."""
        d = self.digests
        if group_of is None and d.group_of is None:
            d.owner = owner
            return
        self.digests = Digests(group_of, owner)
        for table, rows in self._tables.items():
            self.digests.mark_all(table, rows)

    def tables(self) -> Iterator[str]:
        return iter(self._tables)

    def keys_of(self, table: str) -> Iterator[str]:
        return iter(self._tables.get(table, {}))

    def to_bytes(self) -> bytes:
        return msgpack.packb({"own": self.own, "origins": self._origins, "tables": self._tables})

    @classmethod
    def from_bytes(cls, data: bytes, own: str) -> ShardStore:
        """Load a snapshot; ``own`` may differ from the snapshot's (a renamed data dir)."""
        blob = msgpack.unpackb(data, strict_map_key=True)
        store = cls(own)
        origins: list[str] = blob["origins"]
        tables: dict[str, dict[str, list[int]]] = blob["tables"]
        if own not in origins:  # a new incarnation: shift every row to put ``own`` first
            origins = [own, *origins]
            for rows in tables.values():
                for row in rows.values():
                    row[:0] = (0, 0)
        if origins[0] == own:
            store._origins = list(origins)
            store._index = {name: i for i, name in enumerate(origins)}
            store._tables = tables
            store.keys = sum(len(rows) for rows in tables.values())
            for table, rows in tables.items():
                store.digests.mark_all(table, rows)
            return store
        for table, rows in tables.items():
            for key, row in rows.items():
                for j in range(0, len(row), 2):
                    if row[j] or row[j + 1]:
                        store.merge_pair(table, key, origins[j // 2], row[j], row[j + 1])
        return store

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardStore):
            return NotImplemented
        mine = {(t, k) for t, rows in self._tables.items() for k in rows}
        theirs = {(t, k) for t, rows in other._tables.items() for k in rows}
        return mine == theirs and all(self.entry(t, k) == other.entry(t, k) for t, k in mine)

    __hash__ = None  # type: ignore[assignment]
