"""Counter shards: merge laws (hypothesis), value, round trips, the compact store."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cluster.shards import CounterEntry, ShardStore

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
