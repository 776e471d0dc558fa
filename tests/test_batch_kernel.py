"""The compiled batch loops (``cluster/core/_batch.pyx``) give the reference's answers
(``cluster.core.batch_kernel.PYTHON``): the same results, the same containers after, and the
same exception types, on hypothesis programs. Skipped, saying so, where the module is not built
or is switched off (``IDC_BATCH_KERNEL=0``); the Python functions run in every test elsewhere.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core import batch_kernel

ROOT = Path(__file__).resolve().parents[1]
C = batch_kernel._MODULE
PY = batch_kernel.PYTHON

pytestmark = pytest.mark.skipif(
    C is None, reason=f"the compiled batch kernel is not in use: {batch_kernel.REASON}")

NAMES = ("t", "likes", "k", "k2", "x.y:z")
INT64 = 2**63


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What a call gave: its result, or the type of what it raised."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # the two must raise the same types
        return "raised", type(exc)


# -- the edge's check ---------------------------------------------------------------------------

ids = st.one_of(st.text(max_size=10), st.text(alphabet=st.characters(max_codepoint=0x80),
                                              max_size=10))
deltas = st.one_of(st.integers(min_value=-INT64 - 2, max_value=INT64 + 2),
                   st.sampled_from([-INT64, INT64 - 1, INT64, -INT64 - 1, 0]), st.booleans(),
                   st.floats(allow_nan=False), st.none(), st.text(max_size=2))
names = st.one_of(st.sampled_from(NAMES + ("unknown", "")), st.integers(), st.none())
good_op = st.fixed_dictionaries({"table": names, "key": names, "op_id": ids, "delta": deltas})
odd_op = st.one_of(
    st.fixed_dictionaries({"table": names, "key": names, "op_id": ids, "delta": deltas,
                           "ts_ms": st.integers()}),
    st.fixed_dictionaries({"table": names, "key": names, "op_id": ids}),
    st.lists(st.integers(), max_size=4), st.none(), st.text(max_size=3))


counts = st.one_of(st.integers(min_value=-2, max_value=10_000),
                   st.sampled_from([INT64 - 1, INT64, -INT64]), st.booleans(), st.none(),
                   st.floats(allow_nan=False, max_value=1e4, min_value=-1e4))
sdk_op = st.fixed_dictionaries(
    {"table": names, "key": names, "op_id": ids, "delta": deltas},
    optional={"attempt": counts, "age_ms": counts, "ts_ms": counts, "op": st.just("delete")})
clock = st.tuples(st.integers(min_value=0, max_value=20_000), st.integers(0, 2_000),
                  st.one_of(st.none(), st.integers(0, 10_000)))


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(st.one_of(good_op, odd_op, sdk_op), max_size=12),
       most=st.integers(min_value=0, max_value=12), at=clock)
def test_the_edge_check_agrees(ops: list[Any], most: int, at: tuple[int, int, int | None]
                               ) -> None:
    known = set(NAMES)
    assert _outcome(C.fast_checked, ops, known, most, *at) == _outcome(
        PY["fast_checked"], ops, known, most, *at)


def test_the_edge_check_takes_the_common_shape_only() -> None:
    """What the fast check lets through, and what it leaves to the full one (None)."""
    ops = [{"table": "t", "key": "k", "op_id": "c:1", "delta": -5},
           {"table": "t", "key": "k", "op_id": "c:\t1", "delta": 1},  # not printable
           {"table": "t", "key": "k", "op_id": "ü:1", "delta": 1},  # not ASCII
           {"table": "t", "key": "k", "op_id": "c:1", "delta": True},  # bool is not int here
           {"table": "t", "key": "k", "op_id": "c:1", "delta": 2**63},  # past int64
           {"table": "t", "key": "new", "op_id": "c:1", "delta": 1},  # a name not seen yet
           {"table": "t", "key": "k", "op_id": "c:123456789", "delta": 1}]  # too long
    for fn in (C.fast_checked, PY["fast_checked"]):
        assert fn(ops, {"t", "k"}, 8) == [("t", "k", "c:1", -5, 1, 0)] + [None] * 6



def test_the_edge_check_takes_what_the_sdk_sends() -> None:
    """An op with attempt, age_ms and ts_ms (any of them): checked in the fast pass, with the
    full check's meaning; an unknown field or a bad value still goes to the full check."""
    sdk = {"table": "t", "key": "k", "op_id": "c:1", "delta": 2}
    ops = [{**sdk, "attempt": 1, "age_ms": 3, "ts_ms": 9_000},  # ts says 1,000 ms: age 0 after skew
           {**sdk, "attempt": 1, "age_ms": 3, "ts_ms": 5_000},  # 5,000 ms, less 1,000 of skew
           {**sdk, "attempt": 3},
           {**sdk, "age_ms": 8_000},  # older than stale_after_ms: counted as a retry
           {**sdk, "attempt": 0},
           {**sdk, "age_ms": -1},
           {**sdk, "ts_ms": True},
           {**sdk, "attempt": None},
           {**sdk, "age_ms": 1, "extra": 1},
           {**sdk, "op": "delete"}]
    for fn in (C.fast_checked, PY["fast_checked"]):
        assert fn(ops, {"t", "k"}, 8, 10_000, 1_000, 7_000) == [
            ("t", "k", "c:1", 2, 1, 3), ("t", "k", "c:1", 2, 1, 4_000),
            ("t", "k", "c:1", 2, 3, 0), ("t", "k", "c:1", 2, 2, 8_000)] + [None] * 6


@settings(max_examples=300, deadline=None)
@given(op=sdk_op, at=clock)
def test_the_fast_edge_check_means_what_the_full_one_does(
        op: dict[str, Any], at: tuple[int, int, int | None]) -> None:
    """Whatever the fast pass lets through, the full check (``cluster.edge.validate``) gives
    the same checked op for, on the same clock."""
    from cluster.edge.validate import _check_batch_op

    now_ms, skew_ms, stale_after_ms = at
    for fn in (C.fast_checked, PY["fast_checked"]):
        (fast,) = fn([op], set(NAMES), 8, now_ms, skew_ms, stale_after_ms)
        if fast is not None:
            assert fast == _check_batch_op(op, 0, 8, skew_ms, stale_after_ms, 8,
                                           lambda: (now_ms + 0.5) / 1000)


# -- the leader's items, hold and release -------------------------------------------------------

ops_st = st.lists(st.tuples(st.sampled_from(("t", "u")), st.sampled_from(("a", "b", "c")),
                            st.sampled_from([f"op{i}" for i in range(8)]),
                            st.integers(min_value=-3, max_value=3), st.integers(1, 2)),
                  max_size=10)


def _targets(table: str, key: str) -> tuple[str, ...]:
    return ("n2",) if key == "a" else ("n2", "n3") if table == "t" else ("n3",)


@settings(max_examples=300, deadline=None)
@given(ops=ops_st, data=st.data())
def test_new_items_agree(ops: list[tuple[Any, ...]], data: Any) -> None:
    dups = data.draw(st.lists(st.booleans(), min_size=len(ops), max_size=len(ops)))
    got = C.new_items(ops, dups, "n1@1", 12.5, _targets)
    want = PY["new_items"](ops, dups, "n1@1", 12.5, _targets)
    assert got == want
    applied, groups, _dups = got
    # each group holds the very items of ``applied`` (the caller fills in P and N once)
    assert {id(i) for g in groups.values() for i in g} == {id(i) for i in applied}


@settings(max_examples=300, deadline=None)
@given(ops=ops_st)
def test_routing_groups_agree(ops: list[tuple[Any, ...]]) -> None:
    """Ops grouped by leader alike, the leader asked once per preference list."""
    asked: list[list[tuple[str, str]]] = [[], []]

    def leader_of(side: int) -> Any:
        def of(table: str, key: str, is_live: Any) -> str | None:
            asked[side].append((table, key))
            return None if key == "c" and is_live("x") else _targets(table, key)[0]
        return of

    cached = {("t", "a"): ("n2",), ("u", "b"): ()}  # an empty list is no list: asked again
    got = C.by_leader(ops, cached, _targets, leader_of(0), lambda n: True)
    want = PY["by_leader"](ops, cached, _targets, leader_of(1), lambda n: True)
    assert list(got.items()) == list(want.items())
    assert asked[0] == asked[1]
    assert len(asked[0]) == len({_targets(t, k) for t, k, *_rest in ops})


@settings(max_examples=300, deadline=None)
@given(program=st.lists(st.one_of(
    st.tuples(st.just("hold"), st.lists(st.tuples(
        st.sampled_from([f"op{i}" for i in range(10)]), st.sampled_from(("t", "u")),
        st.sampled_from(("a", "b")), st.sampled_from(("n1@1", "n2@1"))), max_size=5)),
    st.tuples(st.just("release"), st.lists(st.sampled_from([f"op{i}" for i in range(12)]),
                                           max_size=6))), max_size=12))
def test_hold_and_release_agree(program: list[tuple[str, list[Any]]]) -> None:
    """Any sequence of holds and releases leaves the same ``pending`` and ``by_key`` (in the
    same order), and releases answer the same items."""
    sides = [(C, {}, {}), (None, {}, {})]
    for step, args in program:
        answers = []
        for mod, pending, by_key in sides:
            if step == "hold":
                items = [[op_id, t, k, o, 1, 0, 1, 0.0] for op_id, t, k, o in args]
                fn = mod.hold_items if mod is not None else PY["hold_items"]
                answers.append(_outcome(fn, pending, by_key, items))
            else:
                fn = mod.release_ids if mod is not None else PY["release_ids"]
                answers.append(_outcome(fn, pending, by_key, list(args)))
        assert answers[0] == answers[1]
        (_c, p1, b1), (_p, p2, b2) = sides
        assert list(p1.items()) == list(p2.items())
        assert [(k, list(v)) for k, v in b1.items()] == [(k, list(v)) for k, v in b2.items()]
        assert all(b1.values())  # a key with no unpublished op is gone


# -- a replica's op ids -------------------------------------------------------------------------

items_st = st.lists(st.lists(st.one_of(st.text(max_size=4), st.integers(), st.floats(
    allow_nan=False)), min_size=8, max_size=8), max_size=8)


@settings(max_examples=300, deadline=None)
@given(items=items_st)
def test_replica_loops_agree(items: list[list[Any]]) -> None:
    before = copy.deepcopy(items)
    for args in ((items, 1, 0), (items, 0, 1)):
        assert _outcome(C.encoded_ids, *args) == _outcome(PY["encoded_ids"], *args)
    ttl = frozenset({"t", "0"})
    assert _outcome(C.needs_touch, items, ttl, "~last") == _outcome(PY["needs_touch"], items,
                                                                     ttl, "~last")
    assert _outcome(C.oldest_ts, items) == _outcome(PY["oldest_ts"], items)
    assert items == before


def test_encoded_ids_say_one_table_or_none() -> None:
    items = [["a", "t", "k", "n1", 0, 0, 1, 1.0], ["b", "t", "k", "n1", 0, 0, 1, 0.5]]
    for fn in (C.encoded_ids, PY["encoded_ids"]):
        assert fn(items, 1, 0) == ([b"a", b"b"], "t")
        assert fn(items + [["c", "u", "k", "n1", 0, 0, 1, 2.0]], 1, 0)[1] is None
        assert fn([], 1, 0) == ([], None)
    for fn in (C.oldest_ts, PY["oldest_ts"]):
        assert fn(items) == 0.5


def test_switched_off_runs_the_reference() -> None:
    """``IDC_BATCH_KERNEL=0`` makes a process run the Python functions, and says why."""
    out = subprocess.run(
        [sys.executable, "-c", "from cluster.core import batch_kernel as b; "
         "print(b.KERNEL, b.REASON, b.release_ids is b.PYTHON['release_ids'])"],
        cwd=ROOT, env={**os.environ, "IDC_BATCH_KERNEL": "0"}, capture_output=True, text=True,
        check=True)
    assert out.stdout.split()[0] == "python"
    assert "IDC_BATCH_KERNEL=0" in out.stdout
    assert out.stdout.split()[-1] == "True"
