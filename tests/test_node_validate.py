"""Input validation: the batch fast path agrees with the full per-op check."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.errors import BadRequest
from cluster.edge.routes import _RESULTS, batch_results
from cluster.edge.validate import check_batch, check_name, check_op

names = st.sampled_from(["t", "k1", "user:42", "a.b-c_d", "", "bad name", "é", "x" * 129])
values = st.one_of(st.integers(-(2**64), 2**64), st.booleans(), st.floats(), st.text(max_size=3),
                   st.none())
ops = st.fixed_dictionaries(
    {"table": names, "key": names, "op_id": st.one_of(st.text(max_size=70), values),
     "delta": values},
    optional={"attempt": values, "age_ms": values, "extra": values})


def reference(op: dict[str, Any]) -> tuple[Any, ...]:
    table = check_name(op.get("table"), "table")
    key = check_name(op.get("key"), "key")
    return check_op(op, table, key, max_op_id_bytes=64)


@given(st.lists(ops, max_size=6))
def test_batch_fast_path_matches_the_full_check(batch: list[dict[str, Any]]) -> None:
    expected: list[tuple[Any, ...]] = []
    bad_index = None
    for i, op in enumerate(batch):
        try:
            expected.append(reference(op))
        except BadRequest:
            bad_index = i
            break
    if bad_index is None:
        assert check_batch({"ops": batch}, max_ops=100, max_op_id_bytes=64) == expected
    else:
        with pytest.raises(BadRequest, match=rf"ops\[{bad_index}\]"):
            check_batch({"ops": batch}, max_ops=100, max_op_id_bytes=64)


def test_multibyte_op_id_counts_bytes() -> None:
    op = {"table": "t", "key": "k", "op_id": "é" * 40, "delta": 1}  # 80 bytes
    with pytest.raises(BadRequest, match="op_id"):
        check_batch({"ops": [op]}, max_ops=10, max_op_id_bytes=64)
    op["op_id"] = "é" * 32
    assert check_batch({"ops": [op]}, max_ops=10, max_op_id_bytes=64)[0][2] == "é" * 32


def test_an_op_older_than_the_stale_limit_is_checked_as_a_retry() -> None:
    """A request that waited (in a paused node's socket, in the network) past half the failure
    timeout may have been retried at a replica that took over: it must go as a retry."""
    import time as _time

    now_ms = int(_time.time() * 1000)
    fresh = {"op_id": "c:1", "delta": 1, "age_ms": 3, "ts_ms": now_ms - 3}
    waited = {"op_id": "c:2", "delta": 1, "age_ms": 3, "ts_ms": now_ms - 2500}
    kw = {"max_op_id_bytes": 256, "max_clock_skew_ms": 1000, "stale_after_ms": 500}
    assert check_op(fresh, "t", "k", **kw)[4] == 1
    checked = check_op(waited, "t", "k", **kw)
    assert checked[4] == 2, "a stale first attempt must be checked on the replicas"
    assert 1400 <= checked[5] <= 1600, "expiry still subtracts the allowed clock skew"
    batch = check_batch({"ops": [dict(waited, table="t", key="k")]}, max_ops=10, **kw)
    assert batch[0][4] == 2
    assert check_op(fresh, "t", "k", max_op_id_bytes=256)[4] == 1


@settings(deadline=None, max_examples=40)  # lists of 65k results: no per-example deadline
@given(st.lists(st.sampled_from(sorted(_RESULTS)), max_size=40),
       st.sampled_from([0, 15, 16, 65535, 65536]))
def test_a_batch_answer_is_the_results_of_its_statuses(statuses: list[int], pad: int) -> None:
    """``batch_results`` joins each status's encoding made once; it must be what encoding the
    list of result objects gives, in both formats, across msgpack's array header sizes."""
    statuses = statuses + [statuses[0] if statuses else min(_RESULTS)] * pad
    want = {"results": [_RESULTS[s] for s in statuses]}
    assert batch_results(statuses, True) == msgpack.packb(want)
    assert json.loads(batch_results(statuses, False)) == want
