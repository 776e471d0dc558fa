"""The compiled store methods (``cluster/core/_store.pyx``: ``merge_items``, ``apply_hidden``,
``unhide``, ``stage_items``, ``merge_visible_items``) and the Python ones they replace give the
same state, digests and errors: the same pages byte for byte, hidden deltas, digest sums at
every level, answers and exception types, for any sequence of operations interleaved with the
Python-only methods around them.

``ShardStore`` runs the compiled methods (``store_kernel.install``) and ``Reference`` the Python
ones (``store_kernel.PYTHON``). The module is skipped, saying so, where the kernel is not built or
is switched off (``IDC_STORE_KERNEL=0``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core import digests, store_kernel
from cluster.core.digests import BUCKETS, LEAVES
from cluster.core.pages import Page
from cluster.core.shards import ShardStore

ROOT = Path(__file__).resolve().parents[1]
KERNEL = store_kernel._KERNEL_MODULE

pytestmark = pytest.mark.skipif(
    KERNEL is None, reason=f"the compiled store kernel is not in use: {store_kernel.REASON}")


class Reference(ShardStore):
    """A ``ShardStore`` on the Python methods."""

    __slots__ = ()


for _name in store_kernel.METHODS:
    setattr(Reference, _name, store_kernel.PYTHON[_name])

U64 = 2**64 - 1
OWN = "n1@1"
ORIGINS = (OWN, "n2@1", "n3@1")
PEERS = ("n1", "n2", "n3")
TABLES = ("likes", "views")
# Keys of one page of "likes" (the same digest leaf): "a" with one it starts and one it ends
# (a name found as part of another would be the wrong key), "" with a non-ASCII one, and a long
# one (over the kernel's 512 stack bytes of a hashed message); then a few keys alone in a page.
SHARED = (("a", "a48828", "126670a"), ("", "é64747", "x" * 600 + "57625"))
KEYS = (*SHARED[0], *SHARED[1], "b", "likes/post-7", "ü-€-𝄞")
NUL_KEY = "a\0b"  # refused by the pages: the same ValueError from both


def parity(table: str, key: str) -> tuple[str, str]:
    """A deterministic replica grouping for ``group_digests``."""
    return ("n1", "n2") if len(key) % 2 else ("n1", "n3")


def test_shared_keys_share_a_page() -> None:
    for keys in SHARED:
        assert len({digests.key_hash("likes", k) % LEAVES for k in keys}) == 1


def test_kernel_is_bound() -> None:
    assert store_kernel.KERNEL == "c"
    for name in store_kernel.METHODS:
        assert getattr(ShardStore, name) is getattr(KERNEL, name)
        assert getattr(Reference, name) is store_kernel.PYTHON[name]
    assert ShardStore.merge_items is not store_kernel.PYTHON["merge_items"]


def test_switch_off_by_environment() -> None:
    code = ("from cluster.core import store_kernel as k; from cluster.core.shards import "
            "ShardStore as S; print(k.KERNEL, all(getattr(S, m) is k.PYTHON[m] "
            "for m in k.METHODS), k.REASON)")
    env = {**os.environ, "IDC_STORE_KERNEL": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["python", "True", "switched", "off", "(IDC_STORE_KERNEL=0)"]


# -- the hashes --------------------------------------------------------------------------------

# short names and long ones (non-ASCII: up to ~2,800 UTF-8 bytes), past the 512 stack bytes
names = st.text(max_size=40) | st.text(min_size=200, max_size=700)
EDGES = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, U64)
counts = st.integers(0, U64) | st.sampled_from(EDGES)


@settings(max_examples=300, deadline=None)
@given(table=names, key=names)
def test_key_hash(table: str, key: str) -> None:
    assert KERNEL.key_hash(table, key) == digests.key_hash(table, key)


@settings(max_examples=300, deadline=None)
@given(key=names, origin=names, p=counts, n=counts)
def test_pair_hash(key: str, origin: str, p: int, n: int) -> None:
    assert KERNEL.pair_hash(key, origin, p, n) == digests.pair_hash(key, origin, p, n)


@pytest.mark.parametrize("name", ["x" * 31, "x" * 32, "x" * 255, "x" * 256, "€" * 21846,
                                  "x" * 65535, "x" * 65536, "€" * 30000])
def test_hashes_of_every_msgpack_str_size(name: str) -> None:
    """fixstr, str8, str16 and str32 headers (over 65,535 UTF-8 bytes)."""
    assert KERNEL.key_hash(name, name) == digests.key_hash(name, name)
    for p, n in ((1, 0), (0, U64), (2**32, 7)):
        assert KERNEL.pair_hash(name, "n1@1", p, n) == digests.pair_hash(name, "n1@1", p, n)
        assert KERNEL.pair_hash("k", name, p, n) == digests.pair_hash("k", name, p, n)


# -- programs ----------------------------------------------------------------------------------

table = st.sampled_from(TABLES)
key = st.sampled_from(KEYS)
origin = st.sampled_from(ORIGINS)
delta = st.integers(-1000, 1000) | st.just(0)


@st.composite
def count(draw: st.DrawFn) -> int:
    """Mostly small counts (merges that raise a pair and merges that don't), some at the top of
    the range (a later apply may overflow), rarely one past it (a merge refuses it)."""
    r = draw(st.integers(0, 199))  # shrinks toward small counts; away from the ends (drawn
    if r in (101, 102):  # more often), so these are as rare as they read
        return draw(st.sampled_from([U64 + 1, 2**70]))
    if 110 <= r < 140:
        return draw(st.integers(U64 - 1500, U64))
    return draw(st.integers(0, 40))


@st.composite
def item(draw: st.DrawFn) -> list[Any]:
    """One replicated item's fields; rarely a NUL key (refused: its counts in range, as the
    two methods check an item's fields in another order) or a field short."""
    r = draw(st.integers(0, 99))  # as in ``count``
    k = NUL_KEY if r == 51 else draw(key)
    p, n = (draw(st.integers(0, 40)), draw(st.integers(0, 40))) if k == NUL_KEY else (
        draw(count()), draw(count()))
    fields = [draw(st.integers(0, 2**40)), draw(table), k, draw(origin), p, n, draw(delta),
              draw(st.integers(0, 2**40))]
    return fields[:7] if r == 52 else fields


# ``hidden``: the i-th (modulo) (table, key, origin) with a hidden delta, picked as the step runs
# (the same in both stores, whose hidden deltas are compared after every step)
hidden = st.integers(0, 20)
kernel_steps = st.one_of(
    st.tuples(st.just("merge_items"), st.lists(item(), min_size=1, max_size=5)),
    st.tuples(st.just("merge_hidden"), hidden, count(), count()),
    st.tuples(st.just("apply_hidden"), table, key, delta),
    st.tuples(st.just("unhide"), table, key, origin, delta),
    st.tuples(st.just("unhide_hidden"), hidden, delta),
    st.tuples(st.just("hide"), table, key, origin, delta),
    st.tuples(st.just("apply_hidden_items"), st.lists(st.tuples(table, key, delta), max_size=5)),
    st.tuples(st.just("unhide_items"), st.lists(st.tuples(hidden, delta), max_size=5)),
    st.tuples(st.just("stage_items"), st.lists(item(), min_size=1, max_size=5)),
    st.tuples(st.just("merge_visible_items"), st.lists(item(), min_size=1, max_size=5)),
)
steps = st.one_of(
    kernel_steps,
    st.tuples(st.just("apply_local"), table, key, delta),
    st.tuples(st.just("compensate"), table, key, origin, delta),
    st.tuples(st.just("merge_pair"), table, key, origin, st.integers(0, 40), st.integers(0, 40)),
    st.tuples(st.just("drop"), table, st.lists(key, max_size=4)),
    st.tuples(st.just("clear_hidden")),
    st.tuples(st.just("flush_digests"), st.none() | st.integers(1, 3)),
    st.tuples(st.just("group_digests"), st.sampled_from(["ring", None]),
              st.sampled_from([parity, None])),
    st.tuples(st.just("loading"), st.lists(kernel_steps, max_size=4)),
)


def run(store: ShardStore, step: tuple[Any, ...]) -> Any:
    name, *args = step
    if name in ("merge_hidden", "unhide_hidden"):
        held = sorted((t, k, o) for (t, k), by in store._hidden.items() for o in by)
        t, k, o = held[args[0] % len(held)] if held else ("likes", "a", OWN)
        if name == "unhide_hidden":
            return store.unhide(t, k, o, args[1])
        return store.merge_items([[0, t, k, o, args[1], args[2], 0, 0]])
    if name == "apply_hidden_items":  # the pairs it wrote into the items are compared too
        items = [[0, t, k, OWN, 0, 0, d, 0] for t, k, d in args[0]]
        store.apply_hidden_items(items)
        return items
    if name == "unhide_items":  # each picked as unhide_hidden picks, before any is unhidden
        held = sorted((t, k, o) for (t, k), by in store._hidden.items() for o in by)
        picks = [held[i % len(held)] if held else ("likes", "a", OWN) for i, _d in args[0]]
        return store.unhide_items([[0, t, k, o, 0, 0, d, 0]
                                   for (t, k, o), (_i, d) in zip(picks, args[0], strict=True)])
    if name == "loading":
        with store.loading():
            return [run(store, sub) for sub in args[0]]
    if name == "drop":
        return store.drop(args[0], iter(args[1]))
    return getattr(store, name)(*args)


def outcome(store: ShardStore, step: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", run(store, step)
    except Exception as exc:  # the type is compared
        return "raised", type(exc)


def groups(store: ShardStore) -> dict[str, dict[Hashable, tuple[Any, ...]]]:
    return {t: {gid: (g.sums, g.below, g.size) for gid, g in by.items()}
            for t, by in store.digests._tables.items()}


def pages(store: ShardStore) -> dict[str, dict[int, tuple[Any, ...]]]:
    return {t: {at: (p.keys, p.rows.tobytes(), p.who.tobytes(), p.pn.tobytes(), p.dirty)
                for at, p in by.items()} for t, by in store._tables.items()}


def view(store: ShardStore) -> dict[str, Any]:
    """Everything observable of a store, and its insides."""
    held = {(t, k) for t in store.tables() for k in store.keys_of(t)} | set(store._hidden)
    d = store.digests
    return {
        "store": (store.keys, store._origins, store._index, store._own, store._tracking,
                  store.digest_pending, list(store._dirty)),
        "pages": pages(store),
        "hidden": store._hidden,
        "staged": store._staged,
        "keys": {(t, k): (store.entry(t, k), store.own_pair(t, k), store.value(t, k),
                          store.has_hidden(t, k), store.visible_hash(t, k),
                          [(store.pair(t, k, o, visible=False), store.pair(t, k, o))
                           for o in ORIGINS])
                 for t, k in held},
        "groups": groups(store),
        "digests": (d.group_of, d.owner, d.sums(), [d.sums(peer) for peer in PEERS],
                    d.checksums(), d.indexed()),
    }


def tree(store: ShardStore) -> dict[tuple[str, str | None], list[dict[int, int]]]:
    """The digest tree below the buckets as anti-entropy reads it: every level-1 node, then the
    level-2 nodes under the nonzero ones, per peer."""
    out = {}
    for t in store.digests.tables():
        for peer in (None, *PEERS):
            one = store.digests.children(t, 1, range(BUCKETS), peer)
            out[t, peer] = [one, store.digests.children(t, 2, list(one), peer)]
    return out


@settings(max_examples=200, deadline=None)
@given(program=st.lists(steps, min_size=10, max_size=60))
def test_kernel_and_python_methods_agree(program: list[tuple[Any, ...]]) -> None:
    c, r = ShardStore(OWN), Reference(OWN)
    for step in program:
        got = outcome(c, step)
        assert got == outcome(r, step), step
        assert view(c) == view(r), step
    assert tree(c) == tree(r)


def test_a_hidden_part_past_the_top_is_refused_by_both() -> None:
    """A staged copy's hidden part near 2^64 - 1 and a further hidden delta on it: the compiled
    unhide takes counts as 64-bit words and raised where the Python one went on with a larger
    integer (found by the program test). ``hide`` refuses it, for both, with nothing changed: a
    hidden part is part of its pair, which never passes 2^64 - 1."""
    program = [
        ("stage_items", [[0, "views", "a48828", "n1@1", 0, 39, 0, 0],
                         [0, "views", "a", "n1@1", U64 - 1500, 0, 0, 0],
                         [0, "views", "126670a", "n3@1", U64 - 260, 0, 0, 0]]),
        ("hide", "views", "126670a", "n3@1", 574),
        ("hide", "views", "new", "n3@1", U64 + 1),
        ("unhide_hidden", 20, 0),
    ]
    c, r = ShardStore(OWN), Reference(OWN)
    for step in program:
        got = outcome(c, step)
        assert got == outcome(r, step), step
        assert view(c) == view(r), step
    assert outcome(c, program[1]) == ("raised", OverflowError)
    assert ("views", "new") not in c._hidden


@pytest.mark.parametrize("key, p, n", [("a", -1, 5), ("a", 3.0, 2), ("a", True, 2),
                                       ("a", 3, U64 + 1), (NUL_KEY, U64 + 1, 0)])
def test_items_off_the_domain(key: str, p: Any, n: Any) -> None:
    """A count that is not an integer in [0, 2**64) (negative, a float, a bool, too large) is
    refused by both with ValueError before anything is stored, whatever else the item holds.
    (Before the check, the Python method kept the old count for a negative one, hashed True as
    msgpack's true, and stored P of an item whose N was too large without moving its hash.)"""
    c, r = ShardStore(OWN), Reference(OWN)
    step = ("merge_items", [[0, "likes", key, "n2@1", p, n, 0, 0]])
    assert outcome(c, step) == outcome(r, step) == ("raised", ValueError)
    assert view(c) == view(r) == view(Reference(OWN))


def test_the_kernel_reads_a_page_s_fields_where_python_keeps_them() -> None:
    """The compiled store reads ``Page``'s slots by their offsets (no ``getattr`` a key): the
    check ``store_kernel`` makes before it uses the kernel holds on this Python, and a page
    whose fields changed since (a key added, an entry inserted) reads back the same objects."""
    assert KERNEL._fields_agree()
    store = ShardStore(OWN)
    store.merge_items([["op", "likes", "a", "n2@1", 3, 1, 2, 0.0]])
    assert store.pair("likes", "a", "n2@1") == (3, 1)


# -- a page's lookup and its snapshot records (``Page.find``, ``Page.split``) ----------------

page_names = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"z")), unique=True,
                      max_size=40) | st.lists(st.binary(min_size=2, max_size=6), min_size=64,
                                              max_size=130, unique=True).map(
    lambda names: list(dict.fromkeys(b.replace(b"\0", b"z") for b in names)))


def small_hash(name: bytes) -> int:
    """A key hash with many collisions (a page's lookup must compare the names), keys in every
    one of the 16 leaves of one page (0x300 to 0x30f) and some hashes above a leaf's."""
    return (len(name) * 7 + sum(name)) % 5 * LEAVES + 0x300 + len(name) % 16


def page_of(names: list[bytes], entries: list[tuple[int, int, int, int]]) -> Page:
    page = Page()
    for name in names:
        page.add(name, small_hash(name))
    for r, o, p, n in entries:
        if r < len(names):
            j = page.slot(r, o)
            if j < 0:
                page.insert(~j, r, o)
                j = ~j
            page.pn[2 * j], page.pn[2 * j + 1] = p, n
    return page


page_entries = st.lists(st.tuples(st.integers(0, 129), st.integers(0, 5), counts, counts),
                        max_size=80)


@settings(max_examples=300, deadline=None)
@given(names=page_names, entries=page_entries, probes=page_names)
def test_find_and_split_agree_with_python(names: list[bytes], entries: list[Any],
                                          probes: list[bytes]) -> None:
    page = page_of(names, entries)
    for name in (*names, *probes):
        assert KERNEL.find(page, name, small_hash(name)) == page.find(name)
    assert KERNEL.split(page) == page.split()
    for leaf in range(0x2ff, 0x311):
        for r in range(len(page)):
            page.set_digest(r, (r * 7919) % 3)
        assert KERNEL.indexed(page, leaf) == page.indexed(leaf)
        assert [name for name, _h in page.indexed(leaf)] == [
            name for r, name in enumerate(page.names())
            if page.digest(r) and small_hash(name) % LEAVES == leaf]


@settings(max_examples=200, deadline=None)
@given(names=page_names, entries=page_entries)
def test_a_page_split_by_leaf_joins_back(names: list[bytes], entries: list[Any]) -> None:
    """A snapshot keeps a page as a record a leaf (the layout of releases with a page a leaf)
    and joins them back: the same keys, each with the same entries; the leaves in order, each
    record holding exactly its leaf's keys."""
    page = page_of(names, entries)
    parts = page.split()
    assert [leaf for leaf, *_ in parts] == sorted({small_hash(n) % LEAVES for n in names})
    for leaf, keys, _who, _pn in parts:
        assert all(small_hash(n) % LEAVES == leaf for n in keys[1:-1].split(b"\0"))
    back = Page.join([part[1:] for part in parts], small_hash)
    assert sorted(back.names()) == sorted(names)
    for name in names:
        r, s = page.find(name), back.find(name)
        assert list(back.entries(s)) == list(page.entries(r))
        assert back.rows[2 * s] >> 32 == small_hash(name)
        assert back.keys.startswith(name + b"\0", back.rows[2 * s] & 0xFFFFFFFF)
    assert back.dirty == (1 << len(names)) - 1 and not any(back.rows[1::2])
    records = [part[1:] for part in parts]
    assert fields(KERNEL.join(records, "likes")) == fields(store_kernel._join(records, "likes"))


def fields(page: Page) -> tuple[Any, ...]:
    return (page.keys, page.rows.tobytes(), page.who.tobytes(), page.pn.tobytes(), page.dirty)


@pytest.mark.parametrize("records", [
    [(b"a\0", b"", b"")], [(b"\0a", b"", b"")], [(b"", b"", b"")],
    [(b"\0a\0", bytes(8), bytes(8))], [(b"\0a\0", bytes(7), bytes(14))],
    [(b"\0a\0", (1 << 16).to_bytes(8, "little"), bytes(16))],
    [(b"\0a\0", bytes(8), bytes(16)), (b"\0b\0", (1 << 16).to_bytes(8, "little"), bytes(16))],
])
def test_a_malformed_snapshot_record_is_refused_by_both(records: list[Any]) -> None:
    for join in (KERNEL.join, store_kernel._join):
        with pytest.raises(ValueError):
            join(records, "likes")


def test_a_record_with_a_key_of_another_page_is_refused_by_both() -> None:
    """A snapshot's records joined into page ``n`` may hold only keys of page ``n``."""
    page = Page()
    page.add(b"a", digests.key_hash("likes", "a"))
    number = page.leaf(0) >> 4
    records = [record[1:] for record in page.split()]
    for join in (KERNEL.join, store_kernel._join):
        assert join(records, "likes", number).names() == [b"a"]
        with pytest.raises(ValueError, match="another page"):
            join(records, "likes", (number + 1) % 4096)
