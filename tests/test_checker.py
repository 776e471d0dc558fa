"""The counter checker: Jepsen's own examples (jepsen/test/jepsen/checker_test.clj, counter-test),
the final-read extension, and histories that must fail."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from client.checker import check, distance, reachable_sums


def inv(p: Any, f: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    return {"type": "invoke", "process": p, "f": f, "value": v, **kw}


def ok(p: Any, f: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    return {"type": "ok", "process": p, "f": f, "value": v, **kw}


def fail(p: Any, f: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    return {"type": "fail", "process": p, "f": f, "value": v, **kw}


def info(p: Any, f: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    return {"type": "info", "process": p, "f": f, "value": v, **kw}


def triples(history: list[dict[str, Any]]) -> tuple[bool, list[list[int]], list[list[int]]]:
    rep = check(history, keep_reads=True)
    return (rep.valid, [[r.lower, r.value, r.upper] for r in rep.all_reads],
            [[r.lower, r.value, r.upper] for r in rep.read_errors])


# -- Jepsen's counter-test, one case each -----------------------------------------------------


def test_jepsen_empty() -> None:
    assert triples([]) == (True, [], [])


def test_jepsen_initial_read() -> None:
    assert triples([inv(0, "read"), ok(0, "read", 0)]) == (True, [[0, 0, 0]], [])


def test_jepsen_ignore_failed_ops() -> None:
    h = [inv(0, "add", 1), fail(0, "add", 1), inv(0, "read"), ok(0, "read", 0)]
    assert triples(h) == (True, [[0, 0, 0]], [])


def test_jepsen_initial_invalid_read() -> None:
    assert triples([inv(0, "read"), ok(0, "read", 1)]) == (False, [[0, 1, 0]], [[0, 1, 0]])


def test_jepsen_interleaved_concurrent_reads_and_writes() -> None:
    h = [inv(0, "read"), inv(1, "add", 1), inv(2, "read"), inv(3, "add", 2), inv(4, "read"),
         inv(5, "add", 4), inv(6, "read"), inv(7, "add", 8), inv(8, "read"),
         ok(0, "read", 6), ok(1, "add", 1), ok(2, "read", 0), ok(3, "add", 2), ok(4, "read", 3),
         ok(5, "add", 4), ok(6, "read", 100), ok(7, "add", 8), ok(8, "read", 15)]
    assert triples(h) == (False, [[0, 6, 15], [0, 0, 15], [0, 3, 15], [0, 100, 15], [0, 15, 15]],
                          [[0, 100, 15]])


def test_jepsen_rolling_reads_and_writes() -> None:
    h = [inv(0, "read"), inv(1, "add", 1), ok(0, "read", 0), inv(0, "read"), ok(1, "add", 1),
         inv(1, "add", 2), ok(0, "read", 3), inv(0, "read"), ok(1, "add", 2), ok(0, "read", 5)]
    assert triples(h) == (False, [[0, 0, 1], [0, 3, 3], [1, 5, 3]], [[1, 5, 3]])


# -- decrements, info ops, final reads ----------------------------------------------------------


def test_decrements_move_the_other_bound() -> None:
    h = [inv(0, "add", 5), ok(0, "add", 5), inv(0, "add", -2), inv(1, "read"),
         ok(1, "read", 3), ok(0, "add", -2), inv(1, "read"), ok(1, "read", 3)]
    valid, reads, _ = triples(h)
    assert valid and reads == [[3, 3, 5], [3, 3, 3]]


def test_read_concurrent_with_an_acknowledged_decrement() -> None:
    # found by a chaos run: the decrement lowers upper while the read is open, and the read
    # saw the value after it; lower at invocation (96) is above upper at completion (92)
    h = [inv(0, "add", 96), ok(0, "add", 96), inv(1, "read"), inv(0, "add", -4),
         ok(0, "add", -4), ok(1, "read", 92)]
    valid, reads, _ = triples(h)
    assert valid and reads == [[92, 92, 96]]
    h[-1] = ok(1, "read", 97)
    assert not triples(h)[0]


def finals(key: str, values: dict[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node, v in values.items():
        out += [inv(f"final-{node}", "final-read", key=key, node=node),
                ok(f"final-{node}", "final-read", v, key=key, node=node)]
    return out


def adds(key: str, spec: list[tuple[str, int]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, (t, d) in enumerate(spec):
        out += [inv(i, "add", d, key=key), {"type": t, "process": i, "f": "add", "value": d,
                                            "key": key}]
    return out


def test_final_read_equal_to_acknowledged_plus_subset_of_info_passes() -> None:
    h = adds("k", [("ok", 1), ("ok", 1), ("info", 1), ("info", 5), ("fail", 7)])
    for v in (2, 3, 7, 8):
        rep = check(h + finals("k", {"n1": v, "n2": v}), nodes=["n1", "n2"])
        assert rep.valid, (v, rep.problems)
        assert (rep.ops, rep.acknowledged, rep.indeterminate, rep.failed) == (5, 2, 2, 1)


def test_over_count_fails() -> None:
    h = adds("k", [("ok", 1), ("ok", 1), ("info", 1)]) + finals("k", {"n1": 4})
    rep = check(h)
    assert not rep.valid
    assert rep.over_count == 1 and rep.under_count == 0
    assert any("over-count" in p for p in rep.problems)


def test_value_in_a_gap_of_the_reachable_sums_fails() -> None:
    h = adds("k", [("ok", 1), ("info", 10)]) + finals("k", {"n1": 5})
    rep = check(h)
    assert not rep.valid
    assert rep.finals[0].ranges == [(1, 1), (11, 11)]


def test_lost_acknowledged_add_fails() -> None:
    h = adds("k", [("ok", 1), ("ok", 1), ("ok", 1)]) + finals("k", {"n1": 2, "n2": 2})
    rep = check(h)
    assert not rep.valid and rep.under_count == 1
    assert any("under-count" in p for p in rep.problems)


def test_divergent_final_reads_fail() -> None:
    h = adds("k", [("ok", 1), ("info", 1)]) + finals("k", {"n1": 1, "n2": 2})
    rep = check(h)
    assert not rep.valid
    assert not rep.finals[0].converged and rep.over_count == 0 and rep.under_count == 0
    assert any("diverge" in p for p in rep.problems)


def test_missing_final_read_fails() -> None:
    h = adds("k", [("ok", 1)]) + finals("k", {"n1": 1})
    assert not check(h, nodes=["n1", "n2"]).valid
    failed = [inv("final-n2", "final-read", key="k", node="n2"),
              fail("final-n2", "final-read", key="k", node="n2")]
    assert not check(h + failed).valid


def test_never_completed_add_counts_as_indeterminate() -> None:
    h = [inv(0, "add", 1, key="k"), inv(1, "add", 1, key="k"), ok(1, "add", 1, key="k")]
    h += finals("k", {"n1": 2})
    rep = check(h)
    assert rep.valid and rep.never_completed == 1 and rep.indeterminate == 1


def test_keys_are_independent() -> None:
    h = adds("a", [("ok", 1)]) + adds("b", [("ok", 2)])
    h += finals("a", {"n1": 1}) + finals("b", {"n1": 1})
    rep = check(h)
    assert not rep.valid and rep.keys == 2
    assert [f.valid for f in rep.finals] == [True, False]


def test_retries_and_duplicates_are_counted() -> None:
    h = [inv(0, "add", 1, key="k"), ok(0, "add", 1, key="k", attempts=3, duplicate=True)]
    rep = check(h + finals("k", {"n1": 1}))
    assert rep.valid and rep.retries == 2 and rep.duplicates_absorbed == 1
    assert rep.to_dict()["valid"] is True


# -- reachable sums -----------------------------------------------------------------------------


def test_reachable_sums_examples() -> None:
    assert reachable_sums(0, []) == ([(0, 0)], False)
    assert reachable_sums(3, [1, 1, 1]) == ([(3, 6)], False)
    assert reachable_sums(0, [-1, 1]) == ([(-1, 1)], False)
    assert reachable_sums(0, [5, 5]) == ([(0, 0), (5, 5), (10, 10)], False)
    assert distance(12, [(0, 0), (10, 10)]) == 2
    assert distance(-3, [(0, 0), (10, 10)]) == -3
    assert distance(10, [(0, 0), (10, 10)]) == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(-50, 50), st.lists(st.integers(-6, 6), max_size=9))
def test_reachable_sums_match_brute_force(base: int, deltas: list[int]) -> None:
    want = {base}
    for d in deltas:
        want |= {s + d for s in want}
    ranges, approx = reachable_sums(base, deltas)
    got = {v for lo, hi in ranges for v in range(lo, hi + 1)}
    assert not approx and got == want
