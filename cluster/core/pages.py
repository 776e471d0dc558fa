"""Keys packed by page: how ``ShardStore`` holds a million counters in tens of bytes each.

A Python object per counter (a dict entry, the key's ``str``, a list of pairs, a set entry for
the digests' index) costs 300-450 bytes. A ``Page`` holds every key of one table that falls in
``SPAN`` consecutive digest leaves (``cluster.core.digests.LEAVES``; 4,096 pages a full table)
in flat buffers and no object per key:

    keys    bytes          b"\\0k0\\0k1\\0...\\0": key number i is the i-th name
    rows    array('Q')     per key, two words: its 32-bit key hash (``digests.key_hash``;
                           ``% LEAVES``: its leaf) << 32 | where its name starts in ``keys``;
                           its entry's digest hash as last flushed (0: not indexed)
    who     array('Q')     per (key, origin) entry, sorted: key number << 16 | origin number
    pn      array('Q')     per entry: P, N
    dirty   int            bit i: key i is to be hashed whole (a store new to its digests)

A key is found by scanning ``rows`` for its hash and comparing the name there (or, in Python,
one ``bytes.find`` of ``\\0name\\0`` and a count of the separators before it), an entry by
bisecting ``who``; both run in C over a few kilobytes. A key's hash, name offset and digest
hash share a row, so a located key touches four memory areas (the page, its row, its name,
its entry), not six (three arrays of their own cost ``bench.bench_inprocess`` 10%). A page's
fixed cost (346 bytes: the object and its buffers' headers) is shared by the keys of ``SPAN``
leaves, ~5 bytes a counter at 300k counters where a page a leaf cost ~126. The pages are also
the digest tree's index of keys by leaf (``ShardStore.leaf``). Snapshots keep a page a leaf
(``split``; ``join`` puts them back together), the layout every release reads. Counts are
unsigned 64-bit, the most the log, the wire and the snapshots carry (``cluster.core.ops``); a
key name may not contain NUL (the API's names never do).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Sequence

from cluster.core.digests import LEAVES

ORIGIN_BITS = 16
MAX_ORIGINS = 1 << ORIGIN_BITS
_LOW = MAX_ORIGINS - 1
SPAN_BITS = 4
SPAN = 1 << SPAN_BITS  # digest leaves a page
PAGES = LEAVES >> SPAN_BITS  # pages a full table
_SEP = b"\0"
_SWAP = sys.byteorder != "little"  # snapshots store the buffers little-endian
_LOW32 = (1 << 32) - 1


def _q(raw: bytes = b"") -> array[int]:
    a = array("Q")
    if raw:
        a.frombytes(raw)
        if _SWAP:
            a.byteswap()
    return a


def _raw(a: array[int]) -> bytes:
    if not _SWAP:
        return a.tobytes()
    b = array("Q", a)
    b.byteswap()
    return b.tobytes()


class Page:
    """The keys of one table in ``SPAN`` digest leaves, and their (origin, P, N) entries."""

    __slots__ = ("keys", "rows", "who", "pn", "dirty")

    def __init__(self) -> None:
        self.dirty = 0  # bit r: key r is to be hashed whole (a new digest index)
        self.keys = _SEP
        self.rows = _q()
        self.who = _q()
        self.pn = _q()

    def __len__(self) -> int:
        return len(self.rows) >> 1

    def find(self, name: bytes) -> int:
        """The key number of ``name``, -1 when the page does not hold it (the compiled twin
        scans the key hashes in ``rows`` instead: ``cluster/core/_store.pyx``)."""
        keys = self.keys
        i = keys.find(_SEP + name + _SEP)
        return -1 if i < 0 else keys.count(_SEP, 0, i)

    def add(self, name: bytes, h: int) -> int:
        """A new key (not in the page: ``find`` first) of key hash ``h``; its number."""
        if _SEP in name:
            raise ValueError("a key name may not contain NUL")
        self.rows.append(h << 32 | len(self.keys))
        self.rows.append(0)
        self.keys += name + _SEP
        return len(self) - 1

    def names(self) -> list[bytes]:
        """Every key's name, by key number."""
        return self.keys[1:-1].split(_SEP) if len(self.rows) else []

    def leaf(self, r: int) -> int:
        """Key ``r``'s digest leaf."""
        return (self.rows[2 * r] >> 32) % LEAVES

    def leaves(self) -> list[int]:
        """Every key's digest leaf, by key number."""
        return [(w >> 32) % LEAVES for w in self.rows[::2]]

    def digest(self, r: int) -> int:
        """Key ``r``'s digest hash as last flushed (0: not indexed)."""
        return self.rows[2 * r + 1]

    def set_digest(self, r: int, h: int) -> None:
        self.rows[2 * r + 1] = h

    def indexed(self, leaf: int) -> list[tuple[bytes, int]]:
        """The name and flushed digest hash of each key of digest ``leaf`` the digests index
        (hash not 0), by key number. ``cluster/core/_store.pyx`` has a compiled twin."""
        keys, rows = self.keys, self.rows
        out = []
        for i in range(0, len(rows), 2):
            w, d = rows[i], rows[i + 1]
            if d and (w >> 32) % LEAVES == leaf:
                at = w & _LOW32
                out.append((keys[at:keys.index(0, at)], d))
        return out

    def slot(self, r: int, o: int) -> int:
        """The index of key ``r``'s entry of origin ``o``; ``~j`` (negative) when it has none,
        ``j`` being where ``insert`` puts it."""
        w = (r << ORIGIN_BITS) | o
        who = self.who
        j = bisect_left(who, w)
        return j if j < len(who) and who[j] == w else ~j

    def insert(self, j: int, r: int, o: int) -> None:
        """A (0, 0) entry for key ``r`` and origin ``o`` at index ``j`` (``~slot``)."""
        self.who.insert(j, (r << ORIGIN_BITS) | o)
        self.pn[2 * j:2 * j] = _ZERO_PAIR

    def entries(self, r: int) -> Iterator[tuple[int, int, int]]:
        """``(origin, P, N)`` of each of key ``r``'s entries, by origin number."""
        who, pn = self.who, self.pn
        j = bisect_left(who, r << ORIGIN_BITS)
        end = len(who)
        while j < end:
            w = who[j]
            if w >> ORIGIN_BITS != r:
                return
            yield w & _LOW, pn[2 * j], pn[2 * j + 1]
            j += 1

    def drop(self, gone: Collection[int]) -> int:
        """Remove the keys numbered ``gone`` and their entries; the others are renumbered in
        order (their hashes and marks kept). How many of the removed keys were marked."""
        names, rows, old_pn = self.names(), self.rows, self.pn
        keep = [r for r in range(len(names)) if r not in gone]
        number = {r: i for i, r in enumerate(keep)}
        who, pn = _q(), _q()
        for j, w in enumerate(self.who):
            i = number.get(w >> ORIGIN_BITS)
            if i is not None:
                who.append((i << ORIGIN_BITS) | (w & _LOW))
                pn.append(old_pn[2 * j])
                pn.append(old_pn[2 * j + 1])
        dirty, marked = self.dirty, 0
        new, at = _q(), 1
        for i, r in enumerate(keep):
            if dirty >> r & 1:
                marked |= 1 << i
            new.append(rows[2 * r] >> 32 << 32 | at)
            new.append(rows[2 * r + 1])
            at += len(names[r]) + 1
        self.keys = _SEP + b"".join(names[r] + _SEP for r in keep)
        self.rows, self.who, self.pn = new, who, pn
        self.dirty = marked
        return dirty.bit_count() - marked.bit_count()

    def split(self) -> list[tuple[int, bytes, bytes, bytes]]:
        """What a snapshot keeps of the page: ``(leaf, keys, who, pn)`` of each digest leaf it
        holds keys of, in leaf order, as a page of one leaf has them (hashes are recomputed).
        ``cluster/core/_store.pyx`` has a compiled twin."""
        names, old_pn = self.names(), self.pn
        leaf_of = self.leaves()
        number: list[int] = []
        count: dict[int, int] = {}
        mine: dict[int, list[bytes]] = {}
        for r, lf in enumerate(leaf_of):  # each key's number in its leaf's part
            i = count.get(lf, 0)
            number.append(i)
            count[lf] = i + 1
            mine.setdefault(lf, []).append(names[r])
        whos = {lf: _q() for lf in count}
        pns = {lf: _q() for lf in count}
        for j, w in enumerate(self.who):
            r = w >> ORIGIN_BITS
            lf = leaf_of[r]
            whos[lf].append((number[r] << ORIGIN_BITS) | (w & _LOW))
            pns[lf].extend(old_pn[2 * j:2 * j + 2])
        return [(lf, _SEP + b"".join(name + _SEP for name in mine[lf]), _raw(whos[lf]),
                 _raw(pns[lf])) for lf in sorted(count)]

    @classmethod
    def join(cls, parts: Sequence[tuple[bytes, bytes, bytes]], key_hash: Callable[[bytes], int],
             number: int | None = None) -> Page:
        """A page from ``(keys, who, pn)`` of each of its leaves (``split``'s output, or the
        page a leaf of releases before pages spanned leaves); ``key_hash`` of a name is its
        32-bit key hash. With ``number``, a key of another page than that one is refused."""
        page = cls()
        names: list[bytes] = []
        who, pn = page.who, page.pn
        for keys, raw_who, raw_pn in parts:
            if not keys.startswith(_SEP) or not keys.endswith(_SEP) \
                    or len(raw_pn) != 2 * len(raw_who):
                raise ValueError("a page's keys are NUL-separated and it has one P, N per entry")
            mine = keys[1:-1].split(_SEP) if len(keys) > 1 else []
            part = _q(raw_who)
            if part and part[-1] >> ORIGIN_BITS >= len(mine):
                raise ValueError("a page's entry names a key it does not hold")
            base = len(names) << ORIGIN_BITS
            who.extend([w + base for w in part] if base else part)
            pn.frombytes(raw_pn)
            names += mine
        if _SWAP:
            pn.byteswap()
        page.keys = _SEP + b"".join(name + _SEP for name in names)
        rows, at = page.rows, 1
        for name in names:
            h = key_hash(name)
            if number is not None and h % LEAVES >> SPAN_BITS != number:
                raise ValueError("a page's record holds a key of another page")
            rows.append(h << 32 | at)
            rows.append(0)
            at += len(name) + 1
        page.dirty = (1 << len(names)) - 1
        return page

    def reset_hashes(self) -> None:
        """Forget the flushed hashes and mark every key (a new digest index adds them all)."""
        n = len(self)
        self.rows[1::2] = _q(bytes(8 * n))
        self.dirty = (1 << n) - 1


_ZERO_PAIR = _q(bytes(16))
