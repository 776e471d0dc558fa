"""Anti-entropy digests kept up to date in place: per table and replica group, ``BUCKETS``
64-bit sums of one hash per key, a tree of finer sums below them (``LEVELS``), and an index of
the keys by leaf.

A key's hash is MurmurHash3 (x64, fixed seed) of ``msgpack([key, origin-sorted pairs])`` of its
*visible* entry (``ShardStore.entry``); a bucket's digest is the sum of its keys' hashes mod
2**64. Sums are what make it incremental: a key that changes takes its old hash out of its
bucket and puts the new one in, so a digest costs O(buckets) to read instead of O(keys).

The owner (``ShardStore``) only ``mark``s a key whose visible entry may have changed, which costs
a set insert on the write path; ``flush`` rehashes the marked keys, each once however often it
changed, in bounded steps so a caller can yield between them. Until flushed, the sums are those
of the state as it was at the last flush.

**Groups.** A peer compares with us only the keys it also replicates. When every node holds
every key there is one group; otherwise ``group_of(table, key)`` (the key's replica set) splits
each table into groups, and a peer's digest is the sum over the groups it belongs to, which is
exact for any ring. Pure: no I/O, no clock; the entry hash comes in as a function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Hashable, Iterator
from typing import Any

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

HashOf = Callable[[str, str], "int | None"]
GroupOf = Callable[[str, str], Hashable]


def key_hash(table: str, key: str) -> int:
    """The key's 32-bit position: ``% BUCKETS`` its bucket, ``% LEAVES`` its leaf."""
    return mmh3.hash(f"{table}/{key}", SEED, signed=False)


def bucket_of(table: str, key: str) -> int:
    return key_hash(table, key) % BUCKETS


_pack = msgpack.Packer().pack  # one packer, reused: ``packb`` builds one a call
_hash64 = mmh3.hash64


def entry_hash(key: str, pairs: list[tuple[str, tuple[int, int]]]) -> int:
    """The hash of one key's entry; ``pairs`` sorted by origin, none of them (0, 0)."""
    return _hash64(_pack([key, pairs]), SEED, signed=False)[0]


class _Group:
    """One table's keys of one replica group: the bucket sums, the sums of every level below
    (``below[i - 1]``: node id at level i -> sum, nonzero only; a node's children are found by
    id, ``child % parent level == parent``), and each leaf's keys with their hash as one flat
    list ``[key, hash, key, hash, ...]``: a leaf holds a handful of keys (keys / LEAVES), for
    which a list costs a third of a dict and a scan is as quick as a lookup."""

    __slots__ = ("sums", "below", "leaves", "size")

    def __init__(self) -> None:
        self.sums = [0] * BUCKETS
        self.below: list[dict[int, int]] = [{} for _ in LEVELS[1:]]
        self.leaves: dict[int, list[Any]] = {}
        self.size = 0

    def add(self, pos: int, delta: int) -> None:
        """Add ``delta`` (mod 2**64) to every level's node holding position ``pos``."""
        b = pos % BUCKETS
        self.sums[b] = (self.sums[b] + delta) & MASK
        for sums, mod in zip(self.below, LEVELS[1:]):  # noqa: B905 - same length by build
            node = pos % mod
            s = (sums.get(node, 0) + delta) & MASK
            if s:
                sums[node] = s
            else:  # empty (or, 2**-64 likely, keys summing to 0: read as 0 anyway)
                sums.pop(node, None)


class Digests:
    """Bucket sums of entry hashes, per table and replica group, maintained from marks."""

    __slots__ = ("_dirty", "_tables", "group_of", "owner")

    def __init__(self, group_of: GroupOf | None = None, owner: object = None) -> None:
        self._dirty: dict[str, set[str]] = {}
        self._tables: dict[str, dict[Hashable, _Group]] = {}
        self.group_of = group_of  # None: one group, every peer replicates every key
        self.owner = owner  # who chose ``group_of`` (the ring): a caller's check to regroup

    def mark(self, table: str, key: str) -> None:
        """The key's visible entry may have changed: rehash it at the next ``flush``."""
        dirty = self._dirty.get(table)
        if dirty is None:
            dirty = self._dirty[table] = set()
        dirty.add(key)

    def mark_all(self, table: str, keys: Collection[str]) -> None:
        dirty = self._dirty.get(table)
        if dirty is None:
            self._dirty[table] = set(keys)
        else:
            dirty.update(keys)

    @property
    def pending(self) -> int:
        """Keys marked and not yet flushed."""
        return sum(len(keys) for keys in self._dirty.values())

    def flush(self, hash_of: HashOf, limit: int | None = None) -> int:
        """Rehash up to ``limit`` marked keys (all when None); how many stay marked.
        ``hash_of(table, key)`` is the hash of the key's visible entry, None when it is empty."""
        done = 0
        group_of = self.group_of
        for table in list(self._dirty):
            dirty = self._dirty[table]
            groups = self._tables.get(table)
            if groups is None:
                groups = self._tables[table] = {}
            while dirty and (limit is None or done < limit):
                key = dirty.pop()
                done += 1
                g = groups.get(gid := group_of(table, key) if group_of is not None else None)
                if g is None:
                    g = groups[gid] = _Group()
                self._rehash(g, table, key, hash_of(table, key))
            if not dirty:
                del self._dirty[table]
            if limit is not None and done >= limit:
                break
        return self.pending

    @staticmethod
    def _rehash(g: _Group, table: str, key: str, new: int | None) -> None:
        pos = key_hash(table, key)
        leaf = pos % LEAVES
        flat = g.leaves.get(leaf)
        i = -1
        if flat is not None:
            with contextlib.suppress(ValueError):  # keys are str, hashes int: never equal
                i = flat.index(key)
        if i < 0:
            if new is None:
                return
            if flat is None:
                g.leaves[leaf] = [key, new]
            else:
                flat += (key, new)
            g.size += 1
            g.add(pos, new)
            return
        assert flat is not None  # found in it
        old = flat[i + 1]
        if new is None:
            del flat[i:i + 2]
            if not flat:
                del g.leaves[leaf]
            g.size -= 1
            g.add(pos, -old)
        elif new != old:
            flat[i + 1] = new
            g.add(pos, new - old)

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
        for g in self._groups(table, peer):
            sums = g.below[level - 1]
            for parent in parents:
                for child in range(parent, mod, step):
                    s = sums.get(child)
                    if s:
                        out[child] = (out.get(child, 0) + s) & MASK
        return {child: s for child, s in out.items() if s}

    def key_hashes(self, table: str, leaves: Collection[int],
                   peer: str | None = None) -> dict[str, int]:
        """The last look, below the leaves: each indexed key of ``leaves`` with its hash."""
        out: dict[str, int] = {}
        for g in self._groups(table, peer):
            for leaf in leaves:
                flat = g.leaves.get(leaf)
                if flat:
                    out.update(zip(flat[0::2], flat[1::2], strict=True))
        return out

    def keys_in(self, table: str, buckets: Collection[int] = (), leaves: Collection[int] = (),
                peer: str | None = None) -> list[str]:
        """The indexed keys of ``table`` in ``buckets`` or in ``leaves``: only those are
        walked (a bucket through the levels below it)."""
        out: list[str] = []
        for g in self._groups(table, peer):
            wanted = set(leaves)
            for b in buckets:
                parents = [b]
                for sums, step, mod in zip(g.below, LEVELS, LEVELS[1:]):  # noqa: B905
                    parents = [c for p in parents for c in range(p, mod, step) if c in sums]
                wanted.update(parents)
            for leaf in wanted:
                flat = g.leaves.get(leaf)
                if flat:
                    out.extend(flat[0::2])
        return out

    def clear(self) -> None:
        self._dirty.clear()
        self._tables.clear()

    def indexed(self) -> int:
        """How many keys the index holds (keys with a nonempty visible entry, as flushed)."""
        return sum(g.size for groups in self._tables.values() for g in groups.values())
