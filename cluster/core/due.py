"""When keys become due for expiry or collection: a coarse time wheel of (table, key).

A key of a table with a ttl is due ``ttl`` after its last change (``cluster.core.entry.LAST``)
to be deleted by time by its leader; a tombstone is due ``tombstone_grace`` after its last
change (the delete's time) to be collected (``cluster.roles.expiry``). Both are decided from the
key's last change, so the index holds each key once, at ``last + delay(table)``, where the delay
is a lower bound of both (``min(ttl, grace)`` in a table with a ttl, ``grace`` in one without);
the sweep looks at a key when that time has come and decides from its state then: expire it,
collect it, or put it back at the time it is really due.

Entries are lazy. The store tells ``raised`` whenever a key's last change rises (a write in a
table with a ttl, a delete, a repair); a key already waiting in a bucket that has not come due
yet is left there (a counter written a thousand times a second costs one entry, not a thousand),
and when that bucket comes due the sweep finds the key's later last change and puts it back at
its new time (``add``). The invariant that makes the skip safe: every key whose
``last + delay`` lies after ``cursor`` (the last bucket taken from) has an entry waiting, or is
in the sweep's hands, which looks at it afresh. A key may sit in the wheel more than once (a
key told of without its former last change, a walk); the copies that land in one bucket are
looked at once (``take``).

Memory: one bucket (``res_ms``, 1 s) holds, per table, the keys' UTF-8 names separated by NUL
in one ``bytearray``: a key's entry costs its name's length plus one byte, no Python object per
key (a ``str`` would cost 50 bytes more; the store keeps names packed too). Key names never
contain NUL (``cluster.core.pages``).

Pure: no I/O, no clock (times are arguments, in ms).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

_SEP = b"\0"


class DueIndex:
    """(table, key) by the bucket of the time it becomes due (``res_ms`` wide).

    ``delays``: table -> ms from a key's last change to its index time; tables not named use
    ``default`` (None: ``raised`` indexes nothing, as before the sweep configured the index).
    ``cursor``: the last bucket ``take`` took from (or passed, empty); an entry for a time at or
    before it goes to the bucket ``cursor`` itself (overdue: taken by the next ``take``).
    """

    __slots__ = ("res", "cursor", "delays", "default", "settings", "entries", "building",
                 "build_all", "_buckets", "_heap")

    def __init__(self, res_ms: int = 1000) -> None:
        if res_ms < 1:
            raise ValueError(f"res_ms must be >= 1, got {res_ms}")
        self.res = res_ms
        self.cursor = -1
        self.delays: dict[str, int] = {}
        self.default: int | None = None
        # what the delays were derived from (the sweep compares its own against it)
        self.settings: dict[str, tuple[int, int]] = {}
        self.entries = 0  # entries held, copies included
        # tables whose keys the sweep is to index by a walk (table -> the next digest leaf);
        # ``build_all``: every table the store holds (a new store, a bulk load)
        self.building: dict[str, int] = {}
        self.build_all = True
        self._buckets: dict[int, dict[str, bytearray]] = {}
        self._heap: list[int] = []  # the buckets' numbers

    def __len__(self) -> int:
        return self.entries

    def bucket(self, at_ms: int) -> int:
        return at_ms // self.res

    def configure(self, settings: Mapping[str, tuple[int, int]], default: int) -> list[str]:
        """Set the delays: ``settings`` maps a table to (its delay, anything else its keys'
        times depend on, e.g. when its ttl was set); ``default`` is every other table's delay.
        The tables whose settings changed (named in the old or the new ones) lose their
        entries and are to be walked again (``building``): the invariant does not hold for
        them any more; they are returned, sorted. A new default starts the index over."""
        if self.default is not None and default != self.default:
            self.clear()
            changed: list[str] = []
        else:
            changed = sorted(t for t in set(settings) | set(self.settings)
                             if settings.get(t) != self.settings.get(t))
        self.settings = dict(settings)
        self.delays = {t: s[0] for t, s in settings.items()}
        self.default = default
        for table in changed:
            self.purge(table)
            self.building[table] = 0
        return changed

    def delay(self, table: str) -> int:
        d = self.delays.get(table)
        if d is not None:
            return d
        return self.default if self.default is not None else 0

    def raised(self, table: str, key: str, old_ms: int, new_ms: int) -> None:
        """The key's last change rose from ``old_ms`` (0: none; -1: not known) to ``new_ms``:
        index it at ``new_ms + delay``, unless an entry made for its former last change is
        still waiting (the module docstring's invariant), which the sweep will move."""
        default = self.default
        if default is None:
            return
        d = self.delays.get(table, default)
        if old_ms > 0 and (old_ms + d) // self.res > self.cursor:
            return
        self.add(table, key, new_ms + d)

    def add(self, table: str, key: str, at_ms: int) -> None:
        """An entry for the key at ``at_ms`` (at the next ``take`` if that is past)."""
        b = at_ms // self.res
        if b < self.cursor:
            b = self.cursor
        tables = self._buckets.get(b)
        if tables is None:
            tables = self._buckets[b] = {}
            heapq.heappush(self._heap, b)
        names = tables.get(table)
        if names is None:
            tables[table] = bytearray(key.encode() + _SEP)
        else:
            names += key.encode()
            names += _SEP
        self.entries += 1

    def add_many(self, table: str, keys: Iterable[tuple[str, int]]) -> None:
        """``add`` of each (key, at_ms)."""
        for key, at_ms in keys:
            self.add(table, key, at_ms)

    def take(self, now_ms: int, limit: int) -> list[tuple[str, list[str]]]:
        """Remove and return the entries of the buckets that have ended by ``now_ms`` (each key
        of one is due by then), earliest first, about ``limit`` keys at most: (table, keys)
        pairs, each key once. ``cursor`` moves to the last bucket taken from (a bucket the
        limit stopped in counts: a key raised there is indexed again, its entry may be in the
        caller's hands), and to the bucket before ``now_ms``'s once none is left before it."""
        last = now_ms // self.res - 1
        heap, buckets = self._heap, self._buckets
        out: dict[str, dict[bytes, None]] = {}
        room = limit
        while heap and heap[0] <= last and room > 0:
            b = heap[0]
            if b > self.cursor:
                self.cursor = b
            tables = buckets[b]
            for table in list(tables):
                names = tables[table]
                raw = bytes(names[:-1]).split(_SEP)
                split = list(dict.fromkeys(raw))  # each key once
                if len(split) > room:
                    keep, split = split[room:], split[:room]
                    tables[table] = bytearray(_SEP.join(keep) + _SEP)
                    self.entries -= len(raw) - len(keep)
                else:
                    del tables[table]
                    self.entries -= len(raw)
                room -= len(split)
                got = out.get(table)
                if got is None:
                    out[table] = dict.fromkeys(split)
                else:
                    got.update(dict.fromkeys(split))
                if room <= 0:
                    break
            if tables:
                break  # the limit stopped inside this bucket: the rest stays for the next take
            heapq.heappop(heap)
            del buckets[b]
        if (not heap or heap[0] > last) and last > self.cursor:
            self.cursor = last
        return [(table, [name.decode() for name in names]) for table, names in out.items()]

    def ready(self, now_ms: int) -> bool:
        """Some entry is due by ``now_ms`` (``take`` would return it)."""
        return bool(self._heap) and self._heap[0] <= now_ms // self.res - 1

    def next_due_ms(self) -> int | None:
        """When the earliest bucket ends (its keys are all due then), None when empty."""
        return (self._heap[0] + 1) * self.res if self._heap else None

    def purge(self, table: str) -> int:
        """Forget every entry of ``table``; how many there were."""
        gone = 0
        for b in list(self._buckets):
            names = self._buckets[b].pop(table, None)
            if names is not None:
                gone += names.count(_SEP)
        self.entries -= gone
        self._prune()
        return gone

    def clear(self) -> None:
        """Forget every entry; every table is to be walked again."""
        self._buckets.clear()
        self._heap.clear()
        self.entries = 0
        self.building.clear()
        self.build_all = True

    def _prune(self) -> None:
        empty = [b for b, tables in self._buckets.items() if not tables]
        if empty:
            for b in empty:
                del self._buckets[b]
            self._heap = sorted(self._buckets)

    def nbytes(self) -> int:
        """The names' bytes held (what the entries cost beyond a few objects per bucket)."""
        return sum(len(n) for tables in self._buckets.values() for n in tables.values())

    def keys_at(self, table: str, at_ms: int) -> list[str]:
        """The keys waiting in the bucket of ``at_ms`` for ``table`` (tests)."""
        names = self._buckets.get(at_ms // self.res, {}).get(table)
        return [] if names is None else [n.decode() for n in bytes(names[:-1]).split(_SEP)]


__all__ = ["DueIndex"]
