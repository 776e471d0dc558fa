"""Keys packed by page: how ``ShardStore`` holds a million counters in tens of bytes each.

A Python object per counter (a dict entry, the key's ``str``, a list of pairs, a set entry for
the digests' index) costs 300-450 bytes. A ``Page`` holds every key of one table that falls in
one digest leaf (``cluster.core.digests.LEAVES``: about keys / 65,536 of them) in four flat
buffers and no object per key:

    keys    bytes          b"\\0k0\\0k1\\0...\\0": key number i is the i-th name
    hashes  array('Q')     per key: its entry's digest hash as last flushed (0: not indexed)
    who     array('Q')     per (key, origin) entry, sorted: key number << 16 | origin number
    pn      array('Q')     per entry: P, N
    dirty   int            bit i: key i is to be hashed whole (a store new to its digests)

A key is found with one ``bytes.find`` of ``\\0name\\0`` and a count of the separators before it,
an entry by bisecting ``who``; both run in C over a few hundred bytes. The names of a page are
also the digest tree's index of keys by leaf, so anti-entropy's last look reads a page instead
of a second index. Counts are unsigned 64-bit, the most the log, the wire and the snapshots
carry (``cluster.core.ops``); a key name may not contain NUL (the API's names never do).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterator

ORIGIN_BITS = 16
MAX_ORIGINS = 1 << ORIGIN_BITS
_LOW = MAX_ORIGINS - 1
_SEP = b"\0"
_SWAP = sys.byteorder != "little"  # snapshots store the buffers little-endian


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
    """The keys of one table in one leaf, and their (origin, P, N) entries."""

    __slots__ = ("keys", "hashes", "who", "pn", "dirty")

    def __init__(self) -> None:
        self.dirty = 0  # bit r: key r is to be hashed whole (a new digest index)
        self.keys = _SEP
        self.hashes = _q()
        self.who = _q()
        self.pn = _q()

    def __len__(self) -> int:
        return len(self.hashes)

    def find(self, name: bytes) -> int:
        """The key number of ``name``, -1 when the page does not hold it."""
        keys = self.keys
        i = keys.find(_SEP + name + _SEP)
        return -1 if i < 0 else keys.count(_SEP, 0, i)

    def add(self, name: bytes) -> int:
        """A new key (not in the page: ``find`` first); its number."""
        if _SEP in name:
            raise ValueError("a key name may not contain NUL")
        self.keys += name + _SEP
        self.hashes.append(0)
        return len(self.hashes) - 1

    def names(self) -> list[bytes]:
        """Every key's name, by key number."""
        return self.keys[1:-1].split(_SEP) if len(self.hashes) else []

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
        names = self.names()
        keep = [r for r in range(len(names)) if r not in gone]
        number = {r: i for i, r in enumerate(keep)}
        who, pn, old_pn = _q(), _q(), self.pn
        for j, w in enumerate(self.who):
            i = number.get(w >> ORIGIN_BITS)
            if i is not None:
                who.append((i << ORIGIN_BITS) | (w & _LOW))
                pn.append(old_pn[2 * j])
                pn.append(old_pn[2 * j + 1])
        dirty, marked = self.dirty, 0
        for i, r in enumerate(keep):
            if dirty >> r & 1:
                marked |= 1 << i
        self.keys = _SEP + b"".join(names[r] + _SEP for r in keep)
        self.hashes = array("Q", [self.hashes[r] for r in keep])
        self.who, self.pn = who, pn
        self.dirty = marked
        return dirty.bit_count() - marked.bit_count()

    def dump(self) -> list[bytes]:
        """What a snapshot keeps of the page: its names and entries (hashes are recomputed)."""
        return [self.keys, _raw(self.who), _raw(self.pn)]

    @classmethod
    def load(cls, keys: bytes, who: bytes, pn: bytes) -> Page:
        if not keys.startswith(_SEP) or not keys.endswith(_SEP) or len(pn) != 2 * len(who):
            raise ValueError("a page's keys are NUL-separated and it has one P, N per entry")
        page = cls()
        page.keys = keys
        page.hashes = _q(bytes(8 * (keys.count(_SEP) - 1)))
        page.who, page.pn = _q(who), _q(pn)
        page.reset_hashes()
        if any(w >> ORIGIN_BITS >= len(page.hashes) for w in page.who[-1:]):
            raise ValueError("a page's entry names a key it does not hold")
        return page

    def reset_hashes(self) -> None:
        """Forget the flushed hashes and mark every key (a new digest index adds them all)."""
        self.hashes = _q(bytes(8 * len(self.hashes)))
        self.dirty = (1 << len(self.hashes)) - 1


_ZERO_PAIR = _q(bytes(16))
