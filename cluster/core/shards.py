"""Counter state as per-origin shards: a PN-counter of G-counters (DESIGN "Counter state").

Each replica keeps, per (table, key), one ``(P, N)`` pair per origin node. A node only raises its
own pair; pairs learned from peers merge by element-wise max, so re-delivering or replaying
state never counts twice. The value is ``sum(P) - sum(N)``. Pure: no I/O, no clock.

``CounterEntry`` (``cluster.core.entry``, re-exported here) is the full state of one key;
``ShardStore`` holds many keys compactly, with no Python object per key: each table's keys are
packed into one ``cluster.core.pages.Page`` per 16 digest leaves (names in one ``bytes``, key
hashes, entries and counts in arrays, origins numbered per store): ~62 bytes a counter against
~300 for a list per key in a dict (1M counters, one origin each, RSS of a process loading them).

**Hidden deltas.** A leader raises its own pair when it applies an op, before the op is on a
quorum. Until then the op is unpublished and must be invisible to everyone else (it may yet be
withdrawn, because another leader applied it). The store keeps, per key and origin, the sum of
such deltas (``hide``/``unhide``); ``entry`` and ``value`` (what reads, repairs, anti-entropy and
peers see) subtract them, while ``own_pair`` and the rows themselves stay the local truth that
the next op's pair is computed from. A visible pair only ever grows: a delta is hidden as it is
applied and unhidden once it is published, or once a compensation cancels it (``compensate``).

**Staged copies.** With a write quorum above 2, a replica that merged a leader's new op is not
yet a quorum, so it must not show it either: the op may yet be withdrawn, because another leader
applied it after a check that missed this replica. Such a copy is *staged* (``stage``): the pair
as applied here rises, the visible pair does not, and the difference is kept in the same hidden
parts (the origin marked in ``_staged``). It stays hidden until a visible pair of its origin
covers it: the leader's publication (a REPLICATE of the same pair once its quorum is known), a
withdrawal's compensation, a repair. A visible pair of a staged origin raises the visible pair
to it (``_merge_staged``: what anyone shows is published or settled), so staged copies need no
bookkeeping of their own to be settled. Snapshots keep the visible pair of each staged origin
(``staged_visible``); the log keeps STAGED records apart from REPLICA ones.

**Digests.** Every method that changes a key's visible entry moves the key's hash (kept in its
page) by the changed pair's difference and tells ``digests`` (``cluster.core.digests``:
anti-entropy's bucket sums), so a digest never needs a pass over the whole store. A store new
to its digests (a snapshot loaded, a regrouping) marks every key (a bit of its page) and
``flush_digests`` hashes them whole, in steps. The pages are also the digests' index of keys by
leaf.

**When keys come due.** ``due`` (``cluster.core.due``) indexes keys by when they become due for
expiry or collection, from their last change (``LAST``): ``merge_pair`` tells it whenever a
key's last change rises, ``noted_last`` when one rose where no Python runs (the compiled
``merge_items``). A new store, or one after a bulk load, is indexed whole by the sweep's walk
(``lasts``), so its index starts empty and ``loading`` suspends it.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import msgpack

from cluster.core import shard_snapshot
from cluster.core.digests import (
    LEAVES,
    MASK,
    Digests,
    GroupOf,
    entry_hash,
    pair_hash,
)
from cluster.core.due import DueIndex
from cluster.core.entry import FLOOR, CounterEntry, Pair, value_of
from cluster.core.ops import ItemFields
from cluster.core.pages import MAX_ORIGINS, ORIGIN_BITS, PAGES, SPAN_BITS, Page
from cluster.core.store_kernel import FIND, INDEXED, KEY_HASH, install

_U64_MAX = (1 << 64) - 1

Wire = dict[str, list[int]]  # one key's entry as READ answers carry it (``CounterEntry.to_wire``)
_ORIGIN_MASK = MAX_ORIGINS - 1  # a page's ``who``: key number << ORIGIN_BITS | origin number


class ShardStore:
    """Every key's entry on one node; ``own`` is the origin this node raises.

    Keys live in ``cluster.core.pages.Page``s, one per table and ``SPAN`` digest leaves; origins are
    numbered per store (``_origins``), at most ``MAX_ORIGINS``."""

    __slots__ = ("own", "_own", "_origins", "_index", "_tables", "keys", "_hidden", "_staged",
                 "digests", "_dirty", "_pending", "_tracking", "due")

    def __init__(self, own: str) -> None:
        self.own = own
        self._origins: list[str] = []
        self._index: dict[str, int] = {}
        self._tables: dict[str, dict[int, Page]] = {}  # table -> page number -> page
        # (table, key) -> origin -> [P, N] applied here but not published (module docstring)
        self._hidden: dict[tuple[str, str], dict[str, list[int]]] = {}
        # (table, key) -> the origins whose hidden part in ``_hidden`` is a *staged* copy: a
        # replica's copy of another leader's op that is not known to be on a quorum (W > 2;
        # module docstring, "Staged copies"). Empty unless some write quorum is above 2.
        self._staged: dict[tuple[str, str], set[str]] = {}
        self.keys = 0
        self.digests = Digests(self)
        # pages with keys not yet hashed into the digests (``Page.dirty`` says which keys)
        self._dirty: dict[tuple[str, int], Page] = {}
        self._pending = 0  # keys marked in them
        self._tracking = True  # False while ``loading``: no hash moves, one whole pass after
        self.due = DueIndex()  # keys by when they come due (module docstring)
        self._own = self._origin(own)

    def _origin(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            if len(self._origins) >= MAX_ORIGINS:
                raise ValueError(f"more than {MAX_ORIGINS} origins in one store")
            i = self._index[name] = len(self._origins)
            self._origins.append(name)
        return i

    def last_incarnation(self, node_id: str) -> int:
        """The highest incarnation ``n`` of the origins ``<node_id>@<n>`` this store holds
        pairs of (0: none): what a node that lost its disk must start above."""
        prefix = node_id + "@"
        return max((int(o[len(prefix):]) for o in self._origins
                    if o.startswith(prefix) and o[len(prefix):].isdigit()), default=0)

    def _find(self, table: str, key: str) -> tuple[Page, int, int] | None:
        """The key's page, number in it and leaf; None when the store does not hold it."""
        pages = self._tables.get(table)
        if pages is None:
            return None
        h = KEY_HASH(table, key)
        page = pages.get(h % LEAVES >> SPAN_BITS)
        if page is None:
            return None
        r = FIND(page, key.encode(), h)
        return None if r < 0 else (page, r, h % LEAVES)

    def _applied(self, table: str, key: str, origin: str
                 ) -> tuple[Page, int, int, int, int] | None:
        """The key's page, number and leaf, and ``origin``'s pair as applied here; None when
        the store holds no entry of that origin for the key."""
        found, o = self._find(table, key), self._index.get(origin)
        if found is None or o is None:
            return None
        page, r, leaf = found
        j = page.slot(r, o)
        if j < 0:
            return None
        return page, r, leaf, page.pn[2 * j], page.pn[2 * j + 1]

    def _slot(self, table: str, key: str, o: int) -> tuple[Page, int, int, int]:
        """The page, entry index, key number and leaf of the key's pair of origin number
        ``o``, created (as (0, 0)) if missing."""
        pages = self._tables.get(table)
        if pages is None:
            pages = self._tables[table] = {}
        h = KEY_HASH(table, key)
        leaf = h % LEAVES
        page = pages.get(leaf >> SPAN_BITS)
        if page is None:
            page = pages[leaf >> SPAN_BITS] = Page()
        name = key.encode()
        r = FIND(page, name, h)
        if r < 0:
            r = page.add(name, h)
            self.keys += 1
        j = page.slot(r, o)
        if j < 0:
            j = ~j
            page.insert(j, r, o)
        return page, j, r, leaf

    def _moved(self, table: str, key: str, page: Page, r: int, leaf: int, origin: str,
               p0: int, n0: int, p1: int, n1: int) -> None:
        """``origin``'s pair of the key, as applied here, went from (p0, n0) to (p1, n1): move
        its visible pair (hidden deltas left out) in the key's hash and the digests."""
        if not self._tracking:
            return
        if self._hidden:
            hid = self._hidden.get((table, key))
            if hid is not None and (h := hid.get(origin)) is not None:
                p0, n0 = max(0, p0 - h[0]), max(0, n0 - h[1])
                p1, n1 = max(0, p1 - h[0]), max(0, n1 - h[1])
        self._move(table, key, page, r, leaf, origin, p0, n0, p1, n1)

    def _move(self, table: str, key: str, page: Page, r: int, leaf: int, origin: str,
              p0: int, n0: int, p1: int, n1: int) -> None:
        """``origin``'s visible pair went from (p0, n0) to (p1, n1): the key's hash, and the
        digests, move by the difference of the pair's two hashes."""
        if p0 != p1 or n0 != n1:
            old = page.digest(r)
            new = (old + pair_hash(key, origin, p1, n1) - pair_hash(key, origin, p0, n0)) & MASK
            page.set_digest(r, new)
            self.digests.update(table, key, leaf, old, new)

    def apply_local(self, table: str, key: str, delta: int) -> Pair:
        """Raise this node's own pair by ``delta`` (N for a negative delta); the new pair."""
        page, j, r, leaf = self._slot(table, key, self._own)
        pn = page.pn
        p, n = pn[2 * j], pn[2 * j + 1]
        if delta >= 0:
            pn[2 * j] = p + delta
        else:
            pn[2 * j + 1] = n - delta
        self._moved(table, key, page, r, leaf, self.own, p, n, pn[2 * j], pn[2 * j + 1])
        return pn[2 * j], pn[2 * j + 1]

    def apply_hidden(self, table: str, key: str, delta: int) -> Pair:
        """``apply_local`` and ``hide`` of the same delta at once (a leader's new op): the
        visible entry, hence every hash, stays as it was. The new pair."""
        page, j, _r, _leaf = self._slot(table, key, self._own)
        pn = page.pn
        by_origin = self._hidden.get((table, key))
        if by_origin is None:
            by_origin = self._hidden[(table, key)] = {}
        hid = by_origin.get(self.own)
        if hid is None:
            hid = by_origin[self.own] = [0, 0]
        if delta >= 0:
            pn[2 * j] += delta
            hid[0] += delta
        else:
            pn[2 * j + 1] -= delta
            hid[1] -= delta
        return pn[2 * j], pn[2 * j + 1]

    def apply_hidden_items(self, items: list[list[Any]]) -> None:
        """``apply_hidden`` of each item's delta, in order (a leader's new ops, as
        ``cluster.core.ops`` item lists of this store's origin): the item's P and N become the
        pair it raised the own entry to. One call a batch: the compiled twin looks the store up
        once, not once an op."""
        for item in items:
            if len(item) != 8:
                raise ValueError(f"an item has 8 fields, not {len(item)}")
            item[4], item[5] = self.apply_hidden(item[1], item[2], item[6])

    def merge_pair(self, table: str, key: str, origin: str, p: int, n: int) -> bool:
        """Max-merge one origin's pair; True when it raised anything. A visible pair: where
        the origin has a staged copy here, what is visible rises to it (``_merge_staged``)."""
        if self._staged:
            staged = self._staged.get((table, key))
            if staged is not None and origin in staged:
                return self._merge_staged(table, key, origin, p, n)
        page, j, r, leaf = self._slot(table, key, self._origin(origin))
        pn = page.pn
        p0, n0 = pn[2 * j], pn[2 * j + 1]
        if p <= p0 and n <= n0:
            return False
        p, n = max(p, p0), max(n, n0)
        pn[2 * j], pn[2 * j + 1] = p, n
        self._moved(table, key, page, r, leaf, origin, p0, n0, p, n)
        if origin == FLOOR and p > p0 and self._tracking:  # LAST: the key's last change rose
            self.due.raised(table, key, p0, p)
        return True

    # -- staged copies (a replica's copy of an op not known to be on a quorum: W > 2) --------

    def stage(self, table: str, key: str, origin: str, p: int, n: int) -> bool:
        """Max-merge ``origin``'s pair as a *staged* copy: the pair as applied here rises, what
        is visible does not (the rise is hidden until a visible pair covers it: a publication,
        a withdrawal's compensation, a repair). True when it raised anything."""
        if type(p) is not int or type(n) is not int or not (0 <= p <= MASK and 0 <= n <= MASK):
            raise ValueError(f"P and N are integers in [0, 2**64), got ({p!r}, {n!r})")
        page, j, _r, _leaf = self._slot(table, key, self._origin(origin))
        pn = page.pn
        p0, n0 = pn[2 * j], pn[2 * j + 1]
        if p <= p0 and n <= n0:
            return False
        k = (table, key)
        by_origin = self._hidden.get(k)
        if by_origin is None:
            by_origin = self._hidden[k] = {}
        hid = by_origin.get(origin)
        if hid is None:
            hid = by_origin[origin] = [0, 0]
        staged = self._staged.get(k)
        if staged is None:
            staged = self._staged[k] = set()
        staged.add(origin)
        vp, vn = max(0, p0 - hid[0]), max(0, n0 - hid[1])  # visible: stays as it is
        p1, n1 = max(p, p0), max(n, n0)
        pn[2 * j], pn[2 * j + 1] = p1, n1
        hid[0], hid[1] = p1 - vp, n1 - vn
        return True

    def stage_items(self, items: Sequence[ItemFields]) -> None:
        """``stage`` of each item's pair (a STAGE frame's items)."""
        stage = self.stage
        for item in items:
            if len(item) != 8:
                raise ValueError(f"an item has 8 fields, not {len(item)}")
            stage(item[1], item[2], item[3], item[4], item[5])

    def _merge_staged(self, table: str, key: str, origin: str, p: int, n: int) -> bool:
        """A visible pair of an origin with a staged copy here: the pair as applied rises to
        it, and so does what is visible (pairs seen anywhere are published or settled: docs/
        node.md "What is visible when"); what the visible pair now covers is no longer hidden.
        None when the origin's hidden part is gone (``unhide``): staged no more."""
        k = (table, key)
        by_origin = self._hidden.get(k)
        hid = by_origin.get(origin) if by_origin is not None else None
        if by_origin is None or hid is None:
            marks = self._staged[k]
            marks.discard(origin)
            if not marks:
                del self._staged[k]
            return self.merge_pair(table, key, origin, p, n)
        page, j, r, leaf = self._slot(table, key, self._origin(origin))
        pn = page.pn
        p0, n0 = pn[2 * j], pn[2 * j + 1]
        vp0, vn0 = max(0, p0 - hid[0]), max(0, n0 - hid[1])
        vp1, vn1 = max(vp0, p), max(vn0, n)
        p1, n1 = max(p0, p), max(n0, n)
        if (p1, n1, vp1, vn1) == (p0, n0, vp0, vn0):
            return False
        pn[2 * j], pn[2 * j + 1] = p1, n1
        hid[0], hid[1] = p1 - vp1, n1 - vn1
        if hid[0] == 0 and hid[1] == 0:
            del by_origin[origin]
            if not by_origin:
                del self._hidden[k]
            marks = self._staged[k]
            marks.discard(origin)
            if not marks:
                del self._staged[k]
        if self._tracking:
            self._move(table, key, page, r, leaf, origin, vp0, vn0, vp1, vn1)
        return True

    def merge_visible_items(self, items: Sequence[ItemFields]) -> None:
        """``merge_items`` of visible pairs (REPLICATE items); where some origin of a key has a
        staged copy here, its items raise its visible pair (``_merge_staged``). With no staged
        copy anywhere (W <= 2 always) it is ``merge_items`` as is."""
        staged = self._staged
        if not staged:
            self.merge_items(items)
            return
        index, slot, moved = self._index, self._slot, self._moved
        for item in items:
            if len(item) != 8:
                raise ValueError(f"an item has 8 fields, not {len(item)}")
            _op_id, table, key, origin, p, n, _delta, _ts = item
            if type(p) is not int or type(n) is not int or not (0 <= p <= MASK and 0 <= n <= MASK):
                raise ValueError(f"P and N are integers in [0, 2**64), got ({p!r}, {n!r})")
            o = index.get(origin)
            if o is None:
                o = self._origin(origin)
            marks = staged.get((table, key))
            if marks is not None and origin in marks:
                by_origin = self._hidden.get((table, key))
                if by_origin is not None and origin in by_origin:
                    self._merge_staged(table, key, origin, p, n)
                    continue
                marks.discard(origin)  # its hidden part is gone (unhidden): staged no more
                if not marks:
                    del staged[(table, key)]
            page, j, r, leaf = slot(table, key, o)
            pn = page.pn
            j *= 2
            p0, n0 = pn[j], pn[j + 1]
            if p > p0 or n > n0:
                p, n = max(p, p0), max(n, n0)
                pn[j], pn[j + 1] = p, n
                moved(table, key, page, r, leaf, origin, p0, n0, p, n)

    def covers(self, table: str, key: str, origin: str, p: int, n: int) -> bool:
        """``origin``'s visible pair of the key is at least (p, n)."""
        vp, vn = self.pair(table, key, origin)
        return vp >= p and vn >= n

    def has_staged(self) -> bool:
        return bool(self._staged)

    def staged_visible(self) -> list[list[Any]]:
        """Every (table, key, origin) with a staged copy here, with its visible pair: what a
        snapshot keeps of them (``shard_snapshot``), besides the pairs as applied."""
        out: list[list[Any]] = []
        for (table, key), origins in self._staged.items():
            for origin in origins:
                vp, vn = self.pair(table, key, origin)
                out.append([table, key, origin, vp, vn])
        return out

    def load_staged(self, rows: Iterable[Sequence[Any]]) -> None:
        """Staged copies back from a snapshot (``staged_visible``'s rows): each origin's pair
        as applied is at least its visible one, and the rest of it is hidden."""
        for table, key, origin, vp, vn in rows:
            page, j, _r, _leaf = self._slot(table, key, self._origin(origin))
            pn = page.pn
            p, n = max(pn[2 * j], vp), max(pn[2 * j + 1], vn)
            pn[2 * j], pn[2 * j + 1] = p, n
            if (p, n) == (vp, vn):
                continue
            self._hidden.setdefault((table, key), {})[origin] = [p - vp, n - vn]
            self._staged.setdefault((table, key), set()).add(origin)

    def noted_last(self, table: str, key: str, last_ms: int) -> None:
        """The key's last change was merged up to ``last_ms`` where ``merge_pair`` did not see
        it rise (the compiled ``merge_items``): tell ``due``, the former one unknown."""
        if self._tracking:
            self.due.raised(table, key, -1, last_ms)

    def merge_items(self, items: Sequence[ItemFields]) -> None:
        """``merge_pair`` for a replication batch of items (``cluster.core.ops.Item``'s fields,
        lists off the wire), with the lookups hoisted out of the loop."""
        index, slot, moved = self._index, self._slot, self._moved
        for _op_id, table, key, origin, p, n, _delta, _ts in items:
            if type(p) is not int or type(n) is not int or not (0 <= p <= MASK and 0 <= n <= MASK):
                raise ValueError(f"P and N are integers in [0, 2**64), got ({p!r}, {n!r})")
            o = index.get(origin)
            if o is None:
                o = self._origin(origin)
            page, j, r, leaf = slot(table, key, o)
            pn = page.pn
            j *= 2
            p0, n0 = pn[j], pn[j + 1]
            if p > p0 or n > n0:
                if p < p0:
                    p = p0
                if n < n0:
                    n = n0
                pn[j], pn[j + 1] = p, n
                moved(table, key, page, r, leaf, origin, p0, n0, p, n)

    def drop(self, table: str, keys: Iterable[str]) -> int:
        """Forget ``keys`` of ``table`` (a node that no longer replicates them, once their
        replicas hold them: ``cluster.roles.shed``); a key with a hidden delta of its own
        origins is kept, as its op is still in doubt, while other leaders' staged copies go
        with the key (their leaders publish them on the key's replicas, which this node no
        longer is). They leave the digests too. How many keys were dropped."""
        pages = self._tables.get(table)
        if pages is None:
            return 0
        gone: dict[int, dict[int, str]] = {}  # page number -> key number -> name
        for key in keys:
            k = (table, key)
            hidden = self._hidden.get(k)
            if hidden is not None:
                if set(hidden) - self._staged.get(k, set()):
                    continue  # a delta of an op in doubt here
                del self._hidden[k]
                self._staged.pop(k, None)
            found = self._find(table, key)
            if found is not None:
                gone.setdefault(found[2] >> SPAN_BITS, {})[found[1]] = key
        for at, names in gone.items():
            page = pages[at]
            if self._tracking:
                for r, key in names.items():
                    if page.digest(r):
                        self.digests.update(table, key, page.leaf(r), page.digest(r), 0)
            self._pending -= page.drop(names)
            self.keys -= len(names)
            if not len(page):
                del pages[at]
            if not page.dirty:
                self._dirty.pop((table, at), None)
        if not pages:
            del self._tables[table]
        return sum(map(len, gone.values()))

    def own_pair(self, table: str, key: str) -> Pair:
        """This node's own pair as applied here (hidden deltas included)."""
        return self.pair(table, key, self.own, visible=False)

    def _rehide(self, table: str, key: str, origin: str, before: tuple[int, int],
                after: tuple[int, int]) -> None:
        """The hidden part of ``origin``'s pair went from ``before`` to ``after``: its visible
        pair moved with it (the pair as applied here did not)."""
        if not self._tracking:
            return
        found = self._applied(table, key, origin)
        if found is None:
            return  # nothing applied: (0, 0) visible either way
        page, r, leaf, p, n = found
        p0, n0 = max(0, p - before[0]), max(0, n - before[1])
        p1, n1 = max(0, p - after[0]), max(0, n - after[1])
        self._move(table, key, page, r, leaf, origin, p0, n0, p1, n1)

    def hide(self, table: str, key: str, origin: str, delta: int) -> None:
        """``delta``, applied to ``origin``'s pair, is not published: keep it out of sight."""
        by_origin = self._hidden.get((table, key))
        if by_origin is None:
            by_origin = self._hidden[(table, key)] = {}
        pn = by_origin.get(origin)
        before = (pn[0], pn[1]) if pn is not None else (0, 0)
        after = (before[0] + delta, before[1]) if delta >= 0 else (before[0], before[1] - delta)
        if max(after) > _U64_MAX:  # a hidden part is part of its pair, which never passes it
            if not by_origin:  # (the compiled unhide takes counts as 64-bit words)
                del self._hidden[(table, key)]
            raise OverflowError(f"hidden part of {table}/{key} for {origin} past 2^64 - 1")
        if pn is None:
            pn = by_origin[origin] = [0, 0]
        pn[0], pn[1] = after
        self._rehide(table, key, origin, before, after)

    def unhide(self, table: str, key: str, origin: str, delta: int) -> None:
        """``delta`` is published (or compensated): it is part of the visible pair again."""
        by_origin = self._hidden.get((table, key))
        if by_origin is None:
            return
        pn = by_origin.get(origin)
        if pn is None:
            return
        before = (pn[0], pn[1])
        if delta >= 0:
            pn[0] = max(0, pn[0] - delta)  # never below 0: a hidden part only ever subtracts
        else:
            pn[1] = max(0, pn[1] + delta)
        after = (pn[0], pn[1])
        if pn[0] == 0 and pn[1] == 0:
            del by_origin[origin]
            if not by_origin:
                del self._hidden[(table, key)]
            after = (0, 0)
        self._rehide(table, key, origin, before, after)

    def unhide_items(self, items: Iterable[ItemFields]) -> None:
        """``unhide`` of each item's delta for its origin, in order (ops published or
        withdrawn together)."""
        for item in items:
            if len(item) != 8:
                raise ValueError(f"an item has 8 fields, not {len(item)}")
            self.unhide(item[1], item[2], item[3], item[6])

    def clear_hidden(self) -> None:
        """Forget the hidden deltas of this node's own unpublished ops (their owner rebuilds
        them: ``NodeState.set_pending``); staged copies stay hidden."""
        hidden, self._hidden = self._hidden, {}
        for (table, key), by_origin in hidden.items():
            staged = self._staged.get((table, key), ())
            for origin, (hp, hn) in by_origin.items():
                if origin in staged:
                    self._hidden.setdefault((table, key), {})[origin] = [hp, hn]
                else:
                    self._rehide(table, key, origin, (hp, hn), (0, 0))

    def has_hidden(self, table: str, key: str) -> bool:
        return (table, key) in self._hidden

    def compensate(self, table: str, key: str, origin: str, delta: int) -> Pair:
        """Cancel an applied ``delta`` of ``origin`` by raising the pair's other side by as
        much (P and N only grow); the new pair."""
        page, j, r, leaf = self._slot(table, key, self._origin(origin))
        pn = page.pn
        p, n = pn[2 * j], pn[2 * j + 1]
        if delta >= 0:
            pn[2 * j + 1] = n + delta
        else:
            pn[2 * j] = p - delta
        self._moved(table, key, page, r, leaf, origin, p, n, pn[2 * j], pn[2 * j + 1])
        return pn[2 * j], pn[2 * j + 1]

    def pair(self, table: str, key: str, origin: str, *, visible: bool = True) -> Pair:
        """``origin``'s pair of one key: as others may see it, or as applied here."""
        found = self._applied(table, key, origin)
        if found is None:
            return (0, 0)
        p, n = found[3], found[4]
        if visible:
            hid = self._hidden.get((table, key), {}).get(origin)
            if hid is not None:
                p, n = max(0, p - hid[0]), max(0, n - hid[1])
        return p, n

    def _pairs(self, table: str, key: str, page: Page, r: int) -> dict[str, Pair]:
        """The key's visible pairs, (0, 0) ones included."""
        origins = self._origins
        pairs = {origins[o]: (p, n) for o, p, n in page.entries(r)}
        hidden = self._hidden.get((table, key))
        if hidden:
            for origin, (hp, hn) in hidden.items():
                p, n = pairs.get(origin, (0, 0))
                pairs[origin] = (max(0, p - hp), max(0, n - hn))
        return pairs

    def entry(self, table: str, key: str) -> CounterEntry:
        """The key's entry as others may see it: unpublished deltas left out."""
        found = self._find(table, key)
        if found is None:
            return CounterEntry()
        return CounterEntry(self._pairs(table, key, found[0], found[1]))

    def wires(self, keys: Sequence[Sequence[str]]) -> list[Wire]:
        """Each (table, key)'s entry as others may see it (``entry``: unpublished deltas left
        out), in its wire form (``CounterEntry.to_wire``), read off its page's arrays with no
        ``CounterEntry`` built: a replica's answer to a READ frame, and a reader's own copy."""
        find, hidden, origins = self._find, self._hidden, self._origins
        out: list[Wire] = []
        for table, key in keys:
            found = find(table, key)
            if found is None:
                out.append({})
                continue
            page, r, _leaf = found
            if hidden and (table, key) in hidden:  # an op led here, not on a quorum yet
                out.append({o: [p, n] for o, (p, n) in self._pairs(table, key, page, r).items()
                            if p or n})
                continue
            # the key's entries are who[j:end] (key number << ORIGIN_BITS | origin number),
            # their pairs pn[2j:2end]; a plain loop, cheaper than a comprehension for a pair or two
            who, pn = page.who, page.pn
            j = bisect_left(who, r << ORIGIN_BITS) if r else 0  # the page's first key: at 0
            wire = {}
            for i in range(j, bisect_left(who, (r + 1) << ORIGIN_BITS, j)):
                p, n = pn[2 * i], pn[2 * i + 1]
                if p or n:
                    wire[origins[who[i] & _ORIGIN_MASK]] = [p, n]
            out.append(wire)
        return out

    def merge_entry(self, table: str, key: str, entry: CounterEntry) -> bool:
        changed = False
        for origin, (p, n) in entry.pairs.items():
            changed = self.merge_pair(table, key, origin, p, n) or changed
        return changed

    def value(self, table: str, key: str) -> int:
        """The visible value (unpublished deltas left out, what lies above the floors)."""
        found = self._find(table, key)
        if found is None:
            return 0
        return value_of(self._pairs(table, key, found[0], found[1]))

    def _hash(self, table: str, key: str, page: Page, r: int) -> int:
        """``cluster.core.digests.entry_hash`` of the key's visible entry, 0 when it is empty."""
        return entry_hash(key, self._pairs(table, key, page, r).items())

    def visible_hash(self, table: str, key: str) -> int | None:
        """The digest hash of ``entry(table, key)``, None when it is empty."""
        found = self._find(table, key)
        return (self._hash(table, key, found[0], found[1]) or None) if found else None

    # -- the digests' index (``cluster.core.digests.Index``) -----------------------------------

    def leaf(self, table: str, leaf: int) -> list[tuple[str, int]]:
        page = self._tables.get(table, {}).get(leaf >> SPAN_BITS)
        if page is None:
            return []
        return [(name.decode(), h) for name, h in INDEXED(page, leaf)]

    def flush_digests(self, limit: int | None = None) -> int:
        """Hash the marked keys whole into ``digests``, page by page, until at least ``limit``
        keys are done (all when None); how many marked keys remain."""
        done = 0
        dirty = self._dirty
        while dirty and (limit is None or done < limit):
            (table, _at), page = dirty.popitem()
            bits, page.dirty = page.dirty, 0
            self._pending -= bits.bit_count()
            names, leaves = page.names(), page.leaves()
            while bits:
                low = bits & -bits
                r = low.bit_length() - 1
                bits ^= low
                self._rehash(table, names[r].decode(), page, r, leaves[r])
                done += 1
        return self._pending

    @property
    def digest_pending(self) -> int:
        """Keys marked and not yet hashed into the digests."""
        return self._pending

    def _rehash(self, table: str, key: str, page: Page, r: int, leaf: int) -> None:
        new = self._hash(table, key, page, r)
        old = page.digest(r)
        if new != old:
            page.set_digest(r, new)
            self.digests.update(table, key, leaf, old, new)

    def group_digests(self, owner: object, group_of: GroupOf | None) -> None:
        """Split the digests by replica group (``Digests``); a new grouping rehashes every key
        at the next flushes, the same one (or one group as before) costs nothing."""
        d = self.digests
        if group_of is None and d.group_of is None:
            d.owner = owner
            return
        self.digests = Digests(self, group_of, owner)
        self._index_all()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """A bulk load (a log replay): no hash moves meanwhile, every key hashed whole after,
        in steps (``flush_digests``), so a restarted node is READY sooner (a merge costs ~40%
        less; a key replayed many times is hashed once)."""
        self._tracking = False
        try:
            yield
        finally:
            self._tracking = True
            self.due.clear()  # indexed whole by the sweep's walk, as a new store is
            d = self.digests
            self.digests = Digests(self, d.group_of, d.owner)
            self._index_all()

    def _index_all(self) -> None:
        """Every key is new to the digests: forget the flushed hashes, mark every key."""
        self._dirty.clear()
        self._pending = 0
        for table, pages in self._tables.items():
            for at, page in pages.items():
                page.reset_hashes()
                if page.dirty:
                    self._dirty[(table, at)] = page
                    self._pending += len(page)

    def tables(self) -> Iterator[str]:
        return iter(self._tables)

    def holds(self, table: str, key: str) -> bool:
        """This store holds some pair of the key."""
        return self._find(table, key) is not None

    def has_floors(self) -> bool:
        """Some key here holds a floor or a last change (a delete or a ttl was ever seen)."""
        return any(o.startswith(FLOOR) for o in self._origins)

    def scan(self, table: str, after: tuple[int, str] | None, prefix: str, limit: int,
             budget: int) -> tuple[list[tuple[int, str, CounterEntry]], tuple[int, str] | None]:
        """The table's keys after position ``after`` in (leaf, key) order (a scan's order: the
        same on every node, whatever it holds), those starting with ``prefix``, at most
        ``limit`` of them with their visible entries; and the position up to which the answer
        is complete (None: to the end). At most ``budget`` keys are looked at, so a rare
        prefix costs a bounded step, not a pass over the table."""
        pages = self._tables.get(table)
        out: list[tuple[int, str, CounterEntry]] = []
        if not pages:
            return out, None
        first, last = (0, "") if after is None else after
        looked = 0
        want = prefix.encode()
        for _at, page in _pages_from(pages, first >> SPAN_BITS):
            rows = sorted(zip(page.leaves(), page.names(), strict=True))
            start = 0 if after is None else bisect_right(rows, (first, last.encode()))
            for leaf, name in rows[start:]:
                looked += 1
                if name.startswith(want):
                    key = name.decode()
                    out.append((leaf, key, self.entry(table, key)))
                    if len(out) >= limit:
                        return out, (leaf, key)
                if looked >= budget:
                    return out, (leaf, name.decode())
        return out, None

    def due_entry(self, table: str, key: str, due: Callable[[int], bool]
                  ) -> tuple[int, CounterEntry | None] | None:
        """The key's last change (``LAST``'s P, ms; 0: none) and, when ``due(last)`` says it
        is due, its visible entry (``entry``), from one lookup; None when the store does not
        hold it."""
        found = self._find(table, key)
        if found is None:
            return None
        page, r, _leaf = found
        last = _last_at(page, r, self._index.get(FLOOR))
        if not due(last):
            return last, None
        return last, CounterEntry(self._pairs(table, key, page, r))

    def lasts(self, table: str, leaf: int, budget: int
              ) -> tuple[list[tuple[str, int]], int | None]:
        """Every key of ``table`` in the pages from digest leaf ``leaf`` on, with its last
        change (as ``due_entry``), whole pages until at least ``budget`` keys; and the leaf to
        go on from (None: the table's end). The walk that indexes a store in ``due``: no entry
        is built, a key costs a lookup in its page's arrays."""
        pages = self._tables.get(table)
        out: list[tuple[str, int]] = []
        if not pages:
            return out, None
        o = self._index.get(FLOOR)
        for at, page in _pages_from(pages, leaf >> SPAN_BITS):
            leaves = page.leaves()
            out.extend((name.decode(), _last_at(page, r, o))
                       for r, name in enumerate(page.names()) if leaves[r] >= leaf)
            if len(out) >= budget:
                return out, (at + 1) << SPAN_BITS if at + 1 < PAGES else None
        return out, None

    def keys_of(self, table: str) -> Iterator[str]:
        for page in list(self._tables.get(table, {}).values()):
            for name in page.names():
                yield name.decode()

    # -- snapshots (``cluster.core.shard_snapshot``) ------------------------------------------

    def dump_chunks(self, pages_per_chunk: int = 256) -> Iterator[bytes]:
        """The store as msgpack chunks, a caller running other code between them."""
        return shard_snapshot.dump_chunks(self, pages_per_chunk)

    def to_bytes(self) -> bytes:
        return msgpack.packb({"chunks": list(self.dump_chunks())})

    @classmethod
    def from_bytes(cls, data: bytes, own: str) -> ShardStore:
        """Load a snapshot; ``own`` may differ from the snapshot's (a new incarnation)."""
        store: ShardStore = shard_snapshot.load(cls, data, own)
        return store

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardStore):
            return NotImplemented
        mine = {(t, k) for t in self.tables() for k in self.keys_of(t)}
        theirs = {(t, k) for t in other.tables() for k in other.keys_of(t)}
        return mine == theirs and all(self.entry(t, k) == other.entry(t, k) for t, k in mine)

    __hash__ = None  # type: ignore[assignment]


install(ShardStore)  # the compiled merge_items, apply_hidden and unhide, when built (store_kernel)

__all__ = ["CounterEntry", "Pair", "ShardStore"]


def _pages_from(pages: dict[int, Page], first: int) -> Iterator[tuple[int, Page]]:
    """A table's pages from page number ``first`` on, in order (so in leaf order). A table
    with few pages: only those it has; a dense one: the walk, which stops where its caller
    does."""
    if len(pages) * 16 < PAGES:
        for at in sorted(at for at in pages if at >= first):
            yield at, pages[at]
        return
    for at in range(first, PAGES):
        page = pages.get(at)
        if page is not None:
            yield at, page


def _last_at(page: Page, r: int, o: int | None) -> int:
    """Key number ``r``'s last change in ``page`` (the P of ``LAST``, whose origin number is
    ``o``; None: the store has none), ms; 0 when it has none."""
    if o is None:
        return 0
    j = page.slot(r, o)
    return page.pn[2 * j] if j >= 0 else 0
