"""Anti-entropy digests kept up to date in place: per table and replica group, ``BUCKETS``
64-bit sums of one hash per key and a tree of finer sums below them (``LEVELS``). The keys of
each leaf, with their hashes, are read from the owner (``Index``: ``ShardStore``'s pages), and
so is each leaf's sum, when asked for.

A key's hash is the sum mod 2**64 of one MurmurHash3 (x64, fixed seed) per pair of its
*visible* entry (``ShardStore.entry``), of ``msgpack([key, origin, P, N])``; a bucket's digest
is the sum of its keys' hashes. Sums are what make it incremental: a pair that changes moves
its key's hash, and every level above it, by the difference of its own two hashes, so a write
costs two MurmurHash3 calls and a digest costs O(buckets) to read instead of O(keys).

The owner (``ShardStore``) gives every change of a key's hash to ``Digests.update`` as it writes.
Only a store that is new to its digests (loaded from a snapshot, or regrouped) has keys left to
hash whole, which its ``flush_digests`` does in bounded steps so a caller can yield between
them; until then those keys are missing from the sums.

**Groups.** A peer compares with us only the keys it also replicates. When every node holds
every key there is one group; otherwise ``group_of(table, key)`` (the key's replica set) splits
each table into groups, and a peer's digest is the sum over the groups it belongs to, which is
exact for any ring. Pure: no I/O, no clock.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from typing import Protocol

import mmh3
import msgpack

BUCKETS = 64
# The tree below the buckets: each level splits every node of the one above into LEVELS[i] /
# LEVELS[i - 1] children by the key's position modulo LEVELS[i] (each a multiple of the one
# above, so a child's id modulo the parent level is its parent). A difference is narrowed down
# level by level, sending only the children of the nodes that still differ, so a repair sends
# about (keys / LEAVES) entries per differing key, and the tree costs 64 digests a differing
# bucket rather than a bucket's worth of leaves.
LEVELS = (BUCKETS, 4096, 65536)
LEAVES = LEVELS[-1]
SEED = 0x5EED_AE
MASK = (1 << 64) - 1

GroupOf = Callable[[str, str], Hashable]


def key_hash(table: str, key: str) -> int:
    """The key's 32-bit position: ``% BUCKETS`` its bucket, ``% LEAVES`` its leaf."""
    return mmh3.hash(f"{table}/{key}", SEED, signed=False)


def bucket_of(table: str, key: str) -> int:
    return key_hash(table, key) % BUCKETS


_pack = msgpack.Packer().pack  # one packer, reused: ``packb`` builds one a call
_hash64 = mmh3.hash64


def pair_hash(key: str, origin: str, p: int, n: int) -> int:
    """One visible pair's share of its key's hash; 0 for (0, 0), which is no pair at all."""
    return _hash64(_pack((key, origin, p, n)), SEED, signed=False)[0] if p or n else 0


def entry_hash(key: str, pairs: Iterable[tuple[str, tuple[int, int]]]) -> int:
    """The hash of one key's entry: the sum of its pairs' ``pair_hash`` mod 2**64 (0: empty).
    A sum, so a change of one pair moves it by that pair's difference: the store keeps every
    key's hash, and the digests, up to date as it writes, with no rehash of the whole entry."""
    return sum(pair_hash(key, o, p, n) for o, (p, n) in pairs) & MASK


class _Group:
    """One table's keys of one replica group: the bucket sums, the sums of the levels between
    the buckets and the leaves (``below[i - 1]``: an ``array('Q')`` of level i's sums by node
    id; a node's children are found by id, ``child % parent level == parent``), and how many
    keys are indexed. An array, not a dict of the nonzero sums: a write adds to it in place
    (the compiled store with no Python int made), and a full one is 32 KB, not ~300.
    A leaf's sum is not kept: it is read from the owner's page of that leaf
    (``Index``), which holds the leaf's keys and their hashes, when anti-entropy asks for it;
    that spares every write a dict of up to ``LEAVES`` sums per group (~5 MB when full)."""

    __slots__ = ("sums", "below", "size")

    def __init__(self) -> None:
        self.sums = [0] * BUCKETS
        self.below: list[array[int]] = [array("Q", bytes(8 * mod)) for mod in LEVELS[1:-1]]
        self.size = 0

    def add(self, pos: int, delta: int) -> None:
        """Add ``delta`` (mod 2**64) to every kept level's node holding position ``pos``."""
        b = pos % BUCKETS
        self.sums[b] = (self.sums[b] + delta) & MASK
        for sums, mod in zip(self.below, LEVELS[1:-1]):  # noqa: B905 - same length by build
            node = pos % mod
            sums[node] = (sums[node] + delta) & MASK


class Index(Protocol):
    """What the digests need of their owner (``ShardStore``): the keys of a leaf, with the
    hashes last given to ``Digests.update``. The owner also tracks which keys changed and
    rehashes them (``ShardStore.flush_digests``), since it knows where each key lives."""

    def leaf(self, table: str, leaf: int) -> list[tuple[str, int]]: ...


class Digests:
    """Bucket sums of entry hashes, per table and replica group, as the owner updates them."""

    __slots__ = ("_tables", "group_of", "owner", "index")

    def __init__(self, index: Index, group_of: GroupOf | None = None,
                 owner: object = None) -> None:
        self.index = index
        self._tables: dict[str, dict[Hashable, _Group]] = {}
        self.group_of = group_of  # None: one group, every peer replicates every key
        self.owner = owner  # who chose ``group_of`` (the ring): a caller's check to regroup

    def update(self, table: str, key: str, leaf: int, old: int, new: int) -> None:
        """Key ``key`` of ``leaf`` went from hash ``old`` to ``new`` (0: not indexed)."""
        groups = self._tables.get(table)
        if groups is None:
            groups = self._tables[table] = {}
        gid = self.group_of(table, key) if self.group_of is not None else None
        g = groups.get(gid)
        if g is None:
            g = groups[gid] = _Group()
        g.size += (new != 0) - (old != 0)
        g.add(leaf, new - old)

    def _groups(self, table: str, peer: str | None) -> Iterator[_Group]:
        for gid, g in self._tables.get(table, {}).items():
            if gid is None or peer is None or peer in gid:  # type: ignore[operator]
                yield g

    def tables(self) -> list[str]:
        return list(self._tables)

    def sums(self, peer: str | None = None) -> dict[str, list[int]]:
        """Per table with keys, the ``BUCKETS`` digests of the keys ``peer`` also replicates
        (every key when None); marked keys count as they were at the last ``flush``."""
        out: dict[str, list[int]] = {}
        for table in self._tables:
            total: list[int] | None = None
            for g in self._groups(table, peer):
                if not g.size:
                    continue
                total = list(g.sums) if total is None else [
                    (a + b) & MASK for a, b in zip(total, g.sums, strict=True)]
            if total is not None:
                out[table] = total
        return out

    def checksums(self) -> dict[str, int]:
        """Per table, the sum of all its digests (every group): one number to compare."""
        return {t: sum(sums) & MASK for t, sums in self.sums().items()}

    def children(self, table: str, level: int, parents: Collection[int],
                 peer: str | None = None) -> dict[int, int]:
        """The nonzero sums at ``level`` (1 .. len(LEVELS) - 1) under ``parents`` (ids at
        ``level - 1``) of ``table``, over the keys ``peer`` also replicates."""
        step, mod = LEVELS[level - 1], LEVELS[level]
        out: dict[int, int] = {}
        if level == len(LEVELS) - 1:  # the leaves: summed from their pages
            for parent in parents:
                for leaf in range(parent, mod, step):
                    total = sum(h for key, h in self.index.leaf(table, leaf)
                                if self._shared(table, key, peer)) & MASK
                    if total:
                        out[leaf] = total
            return out
        for g in self._groups(table, peer):
            sums = g.below[level - 1]
            for parent in parents:
                for child in range(parent, mod, step):
                    s = sums[child]
                    if s:
                        out[child] = (out.get(child, 0) + s) & MASK
        return {child: s for child, s in out.items() if s}

    def _shared(self, table: str, key: str, peer: str | None) -> bool:
        return self.group_of is None or peer is None or peer in self.group_of(table, key)  # type: ignore[operator]

    def key_hashes(self, table: str, leaves: Collection[int],
                   peer: str | None = None) -> dict[str, int]:
        """The last look, below the leaves: each indexed key of ``leaves`` with its hash."""
        out: dict[str, int] = {}
        for leaf in leaves:
            for key, h in self.index.leaf(table, leaf):
                if self._shared(table, key, peer):
                    out[key] = h
        return out

    def keys_in(self, table: str, buckets: Collection[int] = (), leaves: Collection[int] = (),
                peer: str | None = None) -> list[str]:
        """The indexed keys of ``table`` in ``buckets`` or in ``leaves``: only those leaves are
        read (a bucket's are every ``BUCKETS``-th)."""
        wanted = set(leaves)
        for b in buckets:
            wanted.update(range(b, LEAVES, BUCKETS))
        return [key for leaf in sorted(wanted) for key, _h in self.index.leaf(table, leaf)
                if self._shared(table, key, peer)]

    def clear(self) -> None:
        self._tables.clear()

    def indexed(self) -> int:
        """How many keys the index holds (keys with a nonempty visible entry, as flushed)."""
        return sum(g.size for groups in self._tables.values() for g in groups.values())
