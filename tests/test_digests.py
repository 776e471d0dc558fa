"""Incremental anti-entropy digests (``cluster.core.digests`` kept by ``ShardStore``) equal the
digests recomputed from scratch, the way anti-entropy computed them before, after any sequence
of applies, replica merges, repairs, hide/unhide/compensate, snapshots and partial flushes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import mmh3
import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cluster.core.digests import BUCKETS, LEAVES, LEVELS, Digests, key_hash
from cluster.core.ring import Ring
from cluster.core.shards import CounterEntry, ShardStore

_SEED = 0x5EED_AE  # the hash definition, written out again here: a from-scratch digest
_MASK = (1 << 64) - 1


def _position(table: str, key: str) -> int:
    return mmh3.hash(f"{table}/{key}", _SEED, signed=False)


def _old_hash(store: ShardStore, table: str, key: str) -> int:
    """The key's hash by definition, from its entry: the sum of a MurmurHash3 per pair."""
    return sum(int(mmh3.hash64(msgpack.packb([key, o, p, n]), _SEED, signed=False)[0])
               for o, (p, n) in store.entry(table, key).pairs.items()) & _MASK


def scratch(store: ShardStore, keep: Callable[[str, str], bool] = lambda t, k: True,
            ) -> tuple[dict[str, list[int]], dict[str, dict[int, dict[int, int]]]]:
    """Bucket digests by a full pass over every key (the old ``digests``), and the sums of
    every level of the tree below them (table -> level -> id -> sum, nonzero only)."""
    sums: dict[str, list[int]] = {}
    levels: dict[str, dict[int, dict[int, int]]] = {}
    for table in list(store.tables()):
        for key in list(store.keys_of(table)):
            if not store.entry(table, key).pairs or not keep(table, key):
                continue
            h = _old_hash(store, table, key)
            pos = _position(table, key)
            d = sums.setdefault(table, [0] * BUCKETS)
            d[pos % BUCKETS] = (d[pos % BUCKETS] + h) & _MASK
            for level, mod in enumerate(LEVELS[1:], 1):
                lv = levels.setdefault(table, {}).setdefault(level, {})
                lv[pos % mod] = (lv.get(pos % mod, 0) + h) & _MASK
    return sums, {t: {lv: {i: s for i, s in ids.items() if s} for lv, ids in by.items()}
                  for t, by in levels.items()}


def tree(d: Digests, table: str, peer: str | None = None) -> dict[int, dict[int, int]]:
    """Every level below the buckets, read top-down through ``children``."""
    out: dict[int, dict[int, int]] = {}
    parents = list(range(BUCKETS))
    for level in range(1, len(LEVELS)):
        out[level] = d.children(table, level, parents, peer)
        parents = list(out[level])
    return out


tables = st.sampled_from(["t", "u"])
# k0..k2 fall in leaves of their own; s* share one leaf (page) in table "t": a drop renumbers
SAME_PAGE = ["s2104", "s5641", "s7553", "s10458"]
keys = st.sampled_from(["k0", "k1", "k2", *SAME_PAGE])
origins = st.sampled_from(["n1", "n2", "n3"])
deltas = st.integers(-50, 50)
counts = st.integers(0, 200)

steps = st.one_of(
    st.tuples(st.just("apply"), tables, keys, deltas),
    st.tuples(st.just("apply_hidden"), tables, keys, deltas),
    st.tuples(st.just("merge_pair"), tables, keys, origins, counts, counts),
    st.tuples(st.just("merge_items"), st.lists(st.tuples(tables, keys, origins, counts, counts),
                                               max_size=5)),
    st.tuples(st.just("merge_entry"), tables, keys,
              st.dictionaries(origins, st.tuples(counts, counts), max_size=3)),
    st.tuples(st.just("hide"), tables, keys, origins, deltas),
    st.tuples(st.just("unhide"), tables, keys, origins, deltas),
    st.tuples(st.just("compensate"), tables, keys, origins, deltas),
    st.tuples(st.just("clear_hidden")),
    st.tuples(st.just("flush"), st.none() | st.integers(0, 3)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("drop"), tables, st.lists(keys, max_size=3)),
)


def run(store: ShardStore, ops: list[tuple[Any, ...]]) -> ShardStore:
    for op in ops:
        name, args = op[0], op[1:]
        if name == "apply":
            store.apply_local(*args)
        elif name == "merge_items":
            store.merge_items([["id", t, k, o, p, n, 0, 0.0] for t, k, o, p, n in args[0]])
        elif name == "merge_entry":
            store.merge_entry(args[0], args[1], CounterEntry(args[2]))
        elif name == "clear_hidden":
            store.clear_hidden()
        elif name == "flush":
            store.flush_digests(args[0])
        elif name == "drop":  # a key with a hidden delta stays; the others go, entries and all
            table, gone = args
            held = set(store.keys_of(table))
            kept = {k for k in gone if store.has_hidden(table, k)}
            before = {k: store.entry(table, k) for k in held}
            dropped = store.drop(table, gone)
            assert dropped == len((set(gone) & held) - kept)
            assert set(store.keys_of(table)) == held - (set(gone) - kept)
            for k in set(store.keys_of(table)):
                assert store.entry(table, k) == before[k]
            assert store.keys == sum(len(list(store.keys_of(t))) for t in store.tables())
        elif name == "snapshot":  # a reload: every loaded row is marked, to be rehashed
            hidden = copy.deepcopy(store._hidden)  # as set_pending rebuilds them (marks again)
            store = ShardStore.from_bytes(store.to_bytes(), store.own)
            store._hidden = hidden
        else:
            getattr(store, name)(*args)
    return store


@settings(max_examples=500, deadline=None)
@given(st.lists(steps, max_size=40))
# every change after a flush, so a change that forgets to mark its key shows
@example([("apply", "t", "k1", 5), ("flush", None), ("hide", "t", "k1", "n1", 3)])
@example([("apply", "t", "k1", 5), ("hide", "t", "k1", "n1", 3), ("flush", None),
          ("unhide", "t", "k1", "n1", 3)])
@example([("apply", "t", "k1", 5), ("hide", "t", "k1", "n1", 3), ("flush", None),
          ("clear_hidden",)])
@example([("apply", "t", "k1", 5), ("flush", None), ("compensate", "t", "k1", "n1", 5)])
@example([("merge_pair", "t", "k1", "n2", 3, 1), ("flush", None),
          ("merge_items", [("t", "k1", "n2", 4, 1), ("t", "k2", "n3", 0, 2)])])
@example([("flush", None), ("merge_entry", "t", "k1", {"n2": (1, 1)}), ("flush", 0),
          ("snapshot",), ("flush", 1)])
# an unhide of a delta never hidden (the store clamps a hidden part at 0: it only subtracts)
@example([("apply", "u", "k0", 0), ("hide", "u", "k0", "n2", 1), ("unhide", "u", "k0", "n2", -1)])
@example([("apply_hidden", "u", "k1", 1), ("unhide", "u", "k1", "n1", -1)])
# keys dropped from a page that holds others, with marks pending and after a flush
@example([("merge_pair", "t", "s2104", "n2", 3, 1), ("apply", "t", "s5641", 2),
          ("merge_pair", "t", "s7553", "n3", 1, 0), ("flush", None), ("snapshot",),
          ("drop", "t", ["s5641"]), ("flush", 1), ("drop", "t", ["s2104", "k0"])])
def test_incremental_digests_equal_a_full_pass(ops: list[tuple[Any, ...]]) -> None:
    store = run(ShardStore("n1"), ops)
    assert store.flush_digests() == 0
    sums, leaves = scratch(store)
    assert {t: s for t, s in store.digests.sums().items() if any(s)} == \
        {t: s for t, s in sums.items() if any(s)}
    for table in store.tables():
        got = tree(store.digests, table)
        assert {lv: ids for lv, ids in got.items() if ids} == leaves.get(table, {})
        # below the leaves: every key with a visible entry, with its hash
        assert store.digests.key_hashes(table, list(got[len(LEVELS) - 1])) == {
            k: _old_hash(store, table, k) for k in store.keys_of(table)
            if store.entry(table, k).pairs}
        # the index: a bucket's keys are exactly the keys with a visible entry in it
        for b in range(BUCKETS):
            want = {k for k in store.keys_of(table)
                    if store.entry(table, k).pairs and _position(table, k) % BUCKETS == b}
            assert set(store.digests.keys_in(table, [b])) == want


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, max_size=40), st.sampled_from(["n1", "n2", "n3", "n4"]))
def test_grouped_digests_equal_a_full_pass_over_the_keys_a_peer_shares(
        ops: list[tuple[Any, ...]], peer: str) -> None:
    """RF 2 of 4: a peer's digest covers only the keys it also replicates, in any order of
    grouping (grouped before the changes, or regrouped after them)."""
    ring = Ring(["n1", "n2", "n3", "n4"], rf=2, vnodes=8)

    def group_of(t: str, k: str) -> frozenset[str]:
        return frozenset(ring.preference_list(t, k))

    half = len(ops) // 2
    store = ShardStore("n1")
    store.group_digests(ring, group_of)
    store = run(store, ops[:half])
    if store.digests.owner is not ring:  # a snapshot made a new store: regroup it
        store.group_digests(ring, group_of)
    store = run(store, ops[half:])
    if store.digests.owner is not ring:
        store.group_digests(ring, group_of)
    store.flush_digests()
    sums, leaves = scratch(store, lambda t, k: peer in ring.preference_list(t, k))
    assert {t: s for t, s in store.digests.sums(peer).items() if any(s)} == \
        {t: s for t, s in sums.items() if any(s)}
    for table in store.tables():
        got = tree(store.digests, table, peer)
        assert {lv: ids for lv, ids in got.items() if ids} == leaves.get(table, {})


def test_levels_narrow_a_difference_down_to_a_few_keys() -> None:
    """Two stores of 5000 keys that differ in one: one bucket differs, then one node at each
    level below it, down to one leaf, whose keys are a handful, not the bucket's ~80."""
    a, b = ShardStore("n1"), ShardStore("n2")
    for i in range(5000):
        a.merge_pair("t", f"k{i}", "n3", i + 1, 0)
        b.merge_pair("t", f"k{i}", "n3", i + 1, 0)
    b.merge_pair("t", "k77", "n3", 10_000, 0)
    a.flush_digests(), b.flush_digests()
    da, db = a.digests.sums()["t"], b.digests.sums()["t"]
    buckets = differ = [i for i in range(BUCKETS) if da[i] != db[i]]
    assert differ == [_position("t", "k77") % BUCKETS]
    for level in range(1, len(LEVELS)):
        la, lb = a.digests.children("t", level, differ), b.digests.children("t", level, differ)
        differ = [i for i in set(la) | set(lb) if la.get(i) != lb.get(i)]
        assert differ == [_position("t", "k77") % LEVELS[level]]
        assert len(la) <= LEVELS[level] // LEVELS[level - 1]  # one parent's children only
    leaves = differ
    assert leaves == [_position("t", "k77") % LEAVES]
    assert "k77" in a.digests.keys_in("t", leaves=leaves)
    assert len(a.digests.keys_in("t", leaves=leaves)) < 5
    assert len(a.digests.keys_in("t", buckets=buckets)) > 40


def test_writes_move_the_digests_and_only_a_loaded_store_is_hashed_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A write moves its key's hash by its pair's difference (no rehash of the entry, nothing
    left for a round to do); a loaded store hashes every key once, in steps; then an idle flush
    hashes nothing."""
    store = ShardStore("n1")
    for i in range(1000):
        store.apply_local("t", f"k{i}", 1)
    assert store.digest_pending == 0 and store.digests.indexed() == 1000
    loaded = ShardStore.from_bytes(store.to_bytes(), "n1")
    assert loaded.digest_pending == 1000
    assert loaded.flush_digests(300) <= 700  # whole pages: at least 300 keys done
    assert loaded.flush_digests() == 0
    assert loaded.digests.sums() == store.digests.sums()
    calls = []
    hash_of = ShardStore._hash

    def counting(self: ShardStore, t: str, k: str, *rest: Any) -> int:
        calls.append(k)
        return hash_of(self, t, k, *rest)

    monkeypatch.setattr(ShardStore, "_hash", counting)
    assert loaded.flush_digests() == 0 and calls == []
    loaded.apply_local("t", "k5", 1)
    loaded.merge_pair("t", "k6", "n2", 4, 0)
    assert loaded.flush_digests() == 0 and calls == []
    assert loaded.digests.sums() == scratch(loaded)[0]


def test_a_hidden_delta_is_not_in_the_digest() -> None:
    """apply + hide leaves the visible entry, hence the digest, as it was; unhide shows it."""
    store = ShardStore("n1")
    store.apply_local("t", "k", 5)
    store.flush_digests()
    before = store.digests.sums()
    store.apply_local("t", "k", 3)
    store.hide("t", "k", "n1", 3)
    store.flush_digests()
    assert store.digests.sums() == before
    store.unhide("t", "k", "n1", 3)
    store.flush_digests()
    assert store.digests.sums() != before
    assert store.digests.sums() == scratch(store)[0]


def test_one_group_costs_nothing_to_choose() -> None:
    store = ShardStore("n1")
    store.apply_local("t", "k", 1)
    store.flush_digests()
    kept = store.digests
    store.group_digests("ring", None)
    assert store.digests is kept and store.digests.owner == "ring"
    assert store.digest_pending == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(steps, max_size=20), st.lists(steps, max_size=20))
def test_a_bulk_load_ends_with_the_digests_of_a_full_pass(before: list[tuple[Any, ...]],
                                                         during: list[tuple[Any, ...]]) -> None:
    """Changes made while ``loading`` (a log replay) move no hash; the pass after catches up."""
    store = run(ShardStore("n1"), before)
    with store.loading():
        store = run(store, [op for op in during if op[0] not in ("snapshot", "flush")])
    assert store.flush_digests() == 0
    assert {t: s for t, s in store.digests.sums().items() if any(s)} == \
        {t: s for t, s in scratch(store)[0].items() if any(s)}


def test_the_same_page_keys_share_a_page() -> None:
    """What the drop examples above rely on: renumbering happens only in a shared page."""
    assert len({key_hash("t", k) % LEAVES for k in SAME_PAGE}) == 1
    store = ShardStore("n1")
    for k in SAME_PAGE:
        store.apply_local("t", k, 1)
    store.merge_pair("t", SAME_PAGE[2], "n2", 7, 3)
    assert store.drop("t", SAME_PAGE[:2]) == 2
    assert sorted(store.keys_of("t")) == sorted(SAME_PAGE[2:])
    assert store.value("t", SAME_PAGE[2]) == 1 + 7 - 3 and store.value("t", SAME_PAGE[3]) == 1
    assert store.drop("t", SAME_PAGE) == 2 and store.keys == 0 and not list(store.tables())
