"""Counter shards: merge laws (hypothesis), value, round trips, the compact store."""

from __future__ import annotations

import itertools
import random

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from cluster.core.digests import LEAVES, key_hash
from cluster.core.shards import CounterEntry, ShardStore

origins = st.sampled_from(["n1", "n2", "n3", "n4"])
counts = st.integers(min_value=0, max_value=(1 << 64) - 1)
entries = st.dictionaries(origins, st.tuples(counts, counts), max_size=4).map(CounterEntry)


@given(entries, entries)
def test_merge_commutative(a: CounterEntry, b: CounterEntry) -> None:
    assert a.merge(b) == b.merge(a)


@given(entries, entries, entries)
def test_merge_associative(a: CounterEntry, b: CounterEntry, c: CounterEntry) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@given(entries, entries)
def test_merge_idempotent(a: CounterEntry, b: CounterEntry) -> None:
    ab = a.merge(b)
    assert a.merge(a) == a
    assert ab.merge(b) == ab
    assert ab.dominates(a) and ab.dominates(b)


@given(entries)
def test_round_trip(a: CounterEntry) -> None:
    assert CounterEntry.from_bytes(a.to_bytes()) == a
    assert CounterEntry.from_wire(a.to_wire()) == a


def test_value_is_sum_p_minus_sum_n() -> None:
    e = CounterEntry({"n1": (10, 3), "n2": (5, 0)})
    assert e.value() == 12


@given(st.lists(st.tuples(origins, st.integers(-1000, 1000)), max_size=50))
def test_store_replicas_converge_in_any_order(ops: list[tuple[str, int]]) -> None:
    """Each origin raises its own pair; replicas merging the pairs in any order agree."""
    leaders = {o: ShardStore(o) for o in ["n1", "n2", "n3", "n4"]}
    updates = []
    for origin, delta in ops:
        p, n = leaders[origin].apply_local("t", "k", delta)
        updates.append((origin, p, n))
    forward, backward = ShardStore("r1"), ShardStore("r2")
    for origin, p, n in updates:
        forward.merge_pair("t", "k", origin, p, n)
    for origin, p, n in reversed(updates + updates):
        backward.merge_pair("t", "k", origin, p, n)
    assert forward.value("t", "k") == backward.value("t", "k") == sum(d for _, d in ops)
    assert forward.entry("t", "k") == backward.entry("t", "k")


def test_store_snapshot_round_trip() -> None:
    s = ShardStore("n1")
    s.apply_local("t", "a", 5)
    s.apply_local("t", "a", -2)
    s.merge_pair("t", "a", "n2", 7, 1)
    s.merge_pair("u", "b", "n3", 1, 0)
    again = ShardStore.from_bytes(s.to_bytes(), "n1")
    assert again == s and again.value("t", "a") == 9 and again.keys == 2
    renamed = ShardStore.from_bytes(s.to_bytes(), "n9")
    assert renamed.entry("t", "a") == s.entry("t", "a")
    assert renamed.own_pair("t", "a") == (0, 0)


def test_merge_pair_reports_change() -> None:
    s = ShardStore("n1")
    assert s.merge_pair("t", "k", "n2", 3, 0)
    assert not s.merge_pair("t", "k", "n2", 2, 0)
    assert s.merge_entry("t", "k", CounterEntry({"n2": (3, 1)}))
    assert s.value("t", "k") == 2


# -- unpublished deltas (hidden) -------------------------------------------------------------

# One leader's life on one key: apply an op (hidden until settled), publish the oldest
# unsettled one, or withdraw it (compensate on its own origin, then unhide).
steps = st.lists(st.tuples(st.sampled_from(["apply", "publish", "withdraw"]),
                           st.integers(min_value=-5, max_value=5)), max_size=40)


@given(steps)
def test_visible_pair_only_grows_and_counts_exactly_the_published_ops(
        plan: list[tuple[str, int]]) -> None:
    s = ShardStore("n1@1")
    open_ops: list[int] = []
    published = 0
    last = (0, 0)
    for step, delta in plan:
        if step == "apply":
            s.apply_local("t", "k", delta)
            s.hide("t", "k", "n1@1", delta)
            open_ops.append(delta)
        elif open_ops:
            d = open_ops.pop(0)
            if step == "publish":
                published += d
            else:
                s.compensate("t", "k", "n1@1", d)
            s.unhide("t", "k", "n1@1", d)
        pair = s.pair("t", "k", "n1@1")
        assert pair[0] >= last[0] and pair[1] >= last[1]  # max-merge never loses a step
        last = pair
        assert s.value("t", "k") == s.entry("t", "k").value() == published
        assert s.own_pair("t", "k")[0] - s.own_pair("t", "k")[1] == published + sum(open_ops)
    if not open_ops:
        assert not s.has_hidden("t", "k")


def test_hidden_deltas_stay_out_of_the_entry_but_not_out_of_the_next_pair() -> None:
    s = ShardStore("n1@2")
    s.merge_pair("t", "k", "n2@1", 4, 0)
    assert s.apply_local("t", "k", 3) == (3, 0)
    s.hide("t", "k", "n1@2", 3)
    assert s.entry("t", "k") == CounterEntry({"n2@1": (4, 0)}) and s.value("t", "k") == 4
    assert s.apply_local("t", "k", 2) == (5, 0)  # the next op's pair is computed from 3
    s.hide("t", "k", "n1@2", 2)
    s.unhide("t", "k", "n1@2", 3)
    assert s.entry("t", "k").pairs["n1@2"] == (3, 0)
    assert s.compensate("t", "k", "n1@2", 2) == (5, 2)  # withdrawn: P and N grow together
    s.unhide("t", "k", "n1@2", 2)
    assert s.entry("t", "k").pairs["n1@2"] == (5, 2) and s.value("t", "k") == 7
    assert not s.has_hidden("t", "k")
    s.hide("t", "k", "n0@1", -4)  # an older origin's unpublished decrement
    s.compensate("t", "k", "n0@1", -4)
    assert s.pair("t", "k", "n0@1") == (4, 0) and s.pair("t", "k", "n0@1", visible=False) == (4, 0)


@given(st.lists(st.integers(-1000, 1000), max_size=20))
def test_apply_hidden_is_apply_then_hide(deltas: list[int]) -> None:
    """A leader's new op: the pair is raised, the visible entry and its hash are not."""
    a, b = ShardStore("n1"), ShardStore("n1")
    a.apply_local("t", "k", 7)
    b.apply_local("t", "k", 7)
    for d in deltas:
        assert a.apply_hidden("t", "k", d) == b.apply_local("t", "k", d)
        b.hide("t", "k", "n1", d)
    assert a.entry("t", "k") == b.entry("t", "k") == CounterEntry({"n1": (7, 0)})
    assert a.visible_hash("t", "k") == b.visible_hash("t", "k")
    assert a.digests.sums() == b.digests.sums()
    for d in deltas:
        a.unhide("t", "k", "n1", d)
        b.unhide("t", "k", "n1", d)
    assert a.entry("t", "k") == b.entry("t", "k") and a.digests.sums() == b.digests.sums()
    assert a.own_pair("t", "k") == b.own_pair("t", "k")


def _dense(n: int) -> ShardStore:
    """A table with several keys a page, and keys of several leaves in one page."""
    s = ShardStore("n1")
    for i in range(n):
        s.merge_pair("t", f"k{i}", "n2", i + 1, i % 3)
        if i % 4 == 0:
            s.apply_local("t", f"k{i}", -1)
    s.flush_digests()
    return s


def test_a_dense_table_scans_walks_and_indexes_by_leaf() -> None:
    """Pages hold many leaves: a scan still runs in (leaf, key) order with every key once, a
    walk (``lasts``) sees every key once, and a leaf's index holds exactly its keys."""
    n = 9000
    s = _dense(n)
    order = sorted((key_hash("t", f"k{i}") % LEAVES, f"k{i}") for i in range(n))
    got: list[tuple[int, str]] = []
    after = None
    while True:
        rows, after = s.scan("t", after, "", 7, 50)
        got += [(leaf, key) for leaf, key, _entry in rows]
        assert all(entry == s.entry("t", key) for _leaf, key, entry in rows)
        if after is None:
            break
    assert got == order
    seen: list[str] = []
    leaf: int | None = 0
    while leaf is not None:
        rows2, leaf = s.lasts("t", leaf, 100)
        seen += [key for key, _last in rows2]
    assert sorted(seen) == sorted(f"k{i}" for i in range(n))
    for leaf_no in {lf for lf, _key in order[:40]}:
        want = {key for lf, key in order if lf == leaf_no}
        assert {key for key, _h in s.leaf("t", leaf_no)} == want


def test_a_dense_table_drops_and_reloads_to_the_same_digests() -> None:
    n = 6000
    s = _dense(n)
    assert s.drop("t", [f"k{i}" for i in range(0, n, 2)]) == n // 2
    kept = _dense(0)
    for i in range(1, n, 2):
        kept.merge_pair("t", f"k{i}", "n2", i + 1, i % 3)
    assert s.keys == n // 2 and s.holds("t", "k1") and not s.holds("t", "k0")
    assert s.digests.sums() == kept.digests.sums()
    again = ShardStore.from_bytes(s.to_bytes(), "n1")
    again.flush_digests()
    assert again == s and again.keys == n // 2
    assert again.digests.sums() == s.digests.sums()


def test_a_snapshot_with_a_page_s_leaves_apart_loads() -> None:
    """Snapshots of a page a leaf (the layout before pages spanned leaves) hold a page's leaves
    in any order and any chunk: they load into the same store."""
    s = _dense(5000)
    records = [(t, *rec) for t, pages in s._tables.items() for page in pages.values()
               for rec in page.split()]
    random.Random(7).shuffle(records)
    chunks = [msgpack.packb([f for rec in records[i:i + 300] for f in rec])
              for i in range(0, len(records), 300)]
    tail = msgpack.packb({"own": "n1", "origins": s._origins, "staged": []})
    again = ShardStore.from_bytes(msgpack.packb({"chunks": [*chunks, tail]}), "n1")
    again.flush_digests()
    assert again == s and again.keys == s.keys == 5000
    assert again.digests.sums() == s.digests.sums()


def test_a_page_of_many_keys_reloads_with_every_key_in_the_digests() -> None:
    """A page of more keys than a machine word has bits (150, across its leaves) goes through a
    snapshot whole: every key marked for the digests, flushed to the digests the store had."""
    names = list(itertools.islice((f"k{i}" for i in itertools.count()
                                   if key_hash("t", f"k{i}") % LEAVES >> 4 == 5), 150))
    assert len(names) == 150
    s = ShardStore("n1")
    for i, key in enumerate(names):
        s.merge_pair("t", key, "n2", i + 1, 0)
    s.flush_digests()
    assert len(s._tables["t"]) == 1
    again = ShardStore.from_bytes(s.to_bytes(), "n1")
    assert again.digest_pending == 150
    assert again.flush_digests() == 0
    assert again.digests.sums() == s.digests.sums() and again.digests.indexed() == 150
    assert again == s
