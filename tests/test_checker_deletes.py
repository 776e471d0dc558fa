"""The checker on deletes, multi-gets and scans: valid histories (the contract's
observed-remove rule), tampered ones it must flag, and a linearizable model whose histories it
must always accept."""

from __future__ import annotations

import random
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from client.chaos.workload import scan_prefix
from client.checker import NEVER, _KeyOps, check, reachable_sums


def ev(t: str, p: Any, f: str, v: Any = None, **kw: Any) -> dict[str, Any]:
    return {"type": t, "process": p, "f": f, "value": v, **kw}


def add(p: Any, d: int, t: str = "ok", key: str = "t/k") -> list[dict[str, Any]]:
    return [ev("invoke", p, "add", d, key=key), ev(t, p, "add", d, key=key)]


def delete(p: Any, t: str = "ok", key: str = "t/k") -> list[dict[str, Any]]:
    return [ev("invoke", p, "delete", key=key), ev(t, p, "delete", key=key)]


def read(p: Any, v: int, key: str = "t/k", **kw: Any) -> list[dict[str, Any]]:
    return [ev("invoke", p, "read", key=key, **kw), ev("ok", p, "read", v, key=key, **kw)]


def scan(p: Any, pairs: list[tuple[str, int]], table: str = "t", prefix: str = ""
         ) -> list[dict[str, Any]]:
    return [ev("invoke", p, "scan", table=table, prefix=prefix),
            ev("ok", p, "scan", [list(x) for x in pairs], table=table, prefix=prefix)]


def finals(values: dict[str, int], key: str = "t/k") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node, v in values.items():
        out += [ev("invoke", f"final-{node}", "final-read", key=key, node=node),
                ev("ok", f"final-{node}", "final-read", v, key=key, node=node)]
    return out


def allowed(h: list[dict[str, Any]], values: range) -> list[int]:
    """The values a read appended at the end of ``h`` may show."""
    return [v for v in values if check(h + read(99, v)).valid]


# -- valid histories ----------------------------------------------------------------------------


def test_delete_then_adds_then_read_counts_from_zero() -> None:
    h = add(0, 5) + add(0, 2) + delete(0) + add(0, 3) + add(0, -1)
    assert allowed(h, range(-5, 15)) == [2]
    rep = check(h + read(1, 2) + finals({"n1": 2, "n2": 2}), nodes=["n1", "n2"])
    assert rep.valid, rep.problems
    assert (rep.deletes, rep.deletes_ok, rep.deletes_indeterminate, rep.deletes_failed) == (
        1, 1, 0, 0)
    assert rep.finals[0].deletes == 1 and rep.finals[0].ranges == [(2, 2)]


def test_indeterminate_delete_either_took_effect_or_not() -> None:
    h = add(0, 5) + delete(1, "info") + add(2, 2)
    got = allowed(h, range(-3, 12))
    assert 7 in got and 2 in got  # never applied; applied before the 2
    assert 0 in got  # applied after the 2 was invoked: the 2 was concurrent with it
    assert 5 not in got and 9 not in got
    for v in (7, 2, 0):
        assert check(h + finals({"n1": v, "n2": v})).valid
    assert not check(h + finals({"n1": 5})).valid


def test_a_never_completed_delete_counts_as_indeterminate() -> None:
    h = add(0, 5) + [ev("invoke", 1, "delete", key="t/k")]
    rep = check(h + read(2, 0))
    assert rep.valid and rep.deletes_indeterminate == 1
    assert check(h + read(2, 5)).valid


def test_failed_delete_never_takes_effect() -> None:
    h = add(0, 5) + delete(1, "fail") + add(0, 1)
    assert allowed(h, range(-2, 10)) == [6]
    assert check(h + read(2, 6)).to_dict()["deletes_failed"] == 1


def test_add_concurrent_with_a_delete_is_kept_or_removed_whole() -> None:
    h = add(0, 5) + [ev("invoke", 1, "delete", key="t/k"), ev("invoke", 0, "add", 3, key="t/k"),
                     ev("ok", 0, "add", 3, key="t/k"), ev("ok", 1, "delete", key="t/k")]
    assert allowed(h, range(-2, 12)) == [0, 1, 2, 3]  # the hull of {0, 3}: see the docstring
    for v in (0, 3):
        assert check(h + finals({"n1": v, "n2": v})).valid
    for v in (1, 5, 8):  # not whole, or the add acknowledged before the delete survived
        assert not check(h + finals({"n1": v})).valid


def test_read_concurrent_with_a_delete_may_see_either_side() -> None:
    h = add(0, 5) + [ev("invoke", 2, "read", key="t/k"), ev("invoke", 1, "delete", key="t/k"),
                     ev("ok", 1, "delete", key="t/k")]
    for v in (5, 0):
        assert check(h + [ev("ok", 2, "read", v, key="t/k")]).valid
    assert not check(h + [ev("ok", 2, "read", 3, key="t/k")]).valid


def test_two_deletes_the_later_one_bounds_the_read() -> None:
    h = add(0, 1) + delete(0) + add(0, 10) + delete(0) + add(0, 100)
    assert allowed(h, range(-5, 120)) == [100]


def test_keys_without_deletes_keep_the_walk() -> None:
    h = add(0, 3, key="t/a") + delete(1, key="t/b") + read(2, 3, key="t/a")
    rep = check(h, keep_reads=True)
    assert rep.valid and rep.all_reads[0].ranges == ()


# -- tampered histories -------------------------------------------------------------------------


def test_resurrected_increment_is_flagged() -> None:
    h = add(0, 5) + delete(1) + add(0, 1) + read(2, 6)
    rep = check(h)
    assert not rep.valid
    assert [(r.value, r.ranges) for r in rep.read_errors] == [(6, ((1, 1),))]
    assert "outside" in rep.problems[0]
    h = add(0, 5) + delete(1) + add(0, 1) + finals({"n1": 6, "n2": 6})
    rep = check(h)
    assert not rep.valid and rep.over_count == 5


def test_delete_applied_twice_is_flagged() -> None:
    # a second application of the delete (a retry taken for new) removed the 3, which was
    # invoked after the delete was acknowledged
    h = add(0, 5) + delete(1) + add(0, 3) + read(2, 0)
    rep = check(h)
    assert not rep.valid and rep.read_errors[0].ranges == ((3, 3),)
    assert check(add(0, 5) + delete(1) + add(0, 3) + finals({"n1": 0})).under_count == 3


def test_resurrection_after_an_indeterminate_delete_of_later_adds_is_still_caught() -> None:
    h = add(0, 5) + delete(1, "info") + delete(2) + add(0, 1) + read(3, 6)
    assert not check(h).valid


def test_scan_that_skips_an_existing_key_is_flagged() -> None:
    h = add(0, 2, key="t/a") + add(0, 3, key="t/b") + add(0, 4, key="u/c")
    assert check(h + scan(1, [("t/a", 2), ("t/b", 3)])).valid
    rep = check(h + scan(1, [("t/a", 2)]))
    assert not rep.valid
    assert [(s.kind, s.key) for s in rep.scan_errors] == [("skipped", "t/b")]
    assert any("scan skipped key" in p for p in rep.problems)
    assert check(h + scan(1, [("t/a", 2)], prefix="a")).valid  # b is outside the prefix


def test_scan_that_repeats_a_key_is_flagged() -> None:
    h = add(0, 2, key="t/a") + add(0, 3, key="t/b")
    rep = check(h + scan(1, [("t/a", 2), ("t/b", 3), ("t/a", 2)]))
    assert not rep.valid
    assert [(s.kind, s.key) for s in rep.scan_errors] == [("repeated", "t/a")]


def test_scan_values_keys_outside_and_phantoms() -> None:
    h = add(0, 2, key="t/a") + add(0, 3, key="t/b") + delete(0, key="t/b")
    assert check(h + scan(1, [("t/a", 2)])).valid  # b deleted: not returned
    rep = check(h + scan(1, [("t/a", 2), ("t/b", 0)]))
    assert [s.kind for s in rep.scan_errors] == ["phantom"]
    rep = check(h + scan(1, [("t/a", 9)]))
    assert [(r.source, r.value) for r in rep.read_errors] == [("scan", 9)]
    rep = check(h + scan(1, [("t/a", 2), ("u/x", 1)]))
    assert [s.kind for s in rep.scan_errors] == ["outside"]


def test_scan_need_not_return_a_key_written_or_deleted_meanwhile() -> None:
    h = add(0, 2, key="t/a") + [ev("invoke", 1, "scan", table="t", prefix="")]
    h += add(0, 3, key="t/b") + delete(2, key="t/a")
    assert check(h + [ev("ok", 1, "scan", [], table="t", prefix="")]).valid
    assert check(h + [ev("ok", 1, "scan", [["t/a", 2], ["t/b", 3]], table="t",
                         prefix="")]).valid


def test_scan_need_not_return_a_key_whose_value_may_be_zero() -> None:
    h = add(0, 2, key="t/a") + add(0, -2, key="t/a")
    assert check(h + scan(1, [])).valid
    assert check(h + scan(1, [("t/a", 0)])).valid


def test_multiget_values_are_judged_as_reads() -> None:
    h = add(0, 2, key="t/a") + delete(0, key="t/b") + add(0, 3, key="t/b")
    mg = [ev("invoke", 1, "multiget", keys=["t/a", "t/b", "t/c"])]
    rep = check(h + mg + [ev("ok", 1, "multiget", [2, 3, 0], keys=["t/a", "t/b", "t/c"])])
    assert rep.valid and rep.multigets == 1 and rep.multiget_values == 3
    rep = check(h + mg + [ev("ok", 1, "multiget", [2, 0, 0], keys=["t/a", "t/b", "t/c"])])
    assert [(r.key, r.source) for r in rep.read_errors] == [("t/b", "multiget")]
    assert "1 multiget" in rep.problems[0]
    rep = check(h + mg + [ev("ok", 1, "multiget", [2, 0], keys=["t/a", "t/b", "t/c"])])
    assert not rep.valid and rep.malformed


def test_reads_at_consistency_one_are_counted_not_judged() -> None:
    h = add(0, 5) + delete(1) + read(2, 5, consistency="one")
    h += [ev("invoke", 3, "scan", table="t", prefix="", consistency="one"),
          ev("ok", 3, "scan", [["t/k", 5]], table="t", prefix="", consistency="one")]
    rep = check(h)
    assert rep.valid and rep.reads_unjudged == 2


def test_report_dict_carries_the_new_fields() -> None:
    rep = check(add(0, 2, key="t/a") + add(0, 2, key="t/b") + scan(1, [("t/a", 2)]))
    d = rep.to_dict()
    assert d["valid"] is False and d["scans"] == 1
    assert d["scan_errors"][0]["kind"] == "skipped"


# -- the delete-aware bounds against brute force ------------------------------------------------


@st.composite
def key_ops(draw: st.DrawFn) -> tuple[_KeyOps, int, int]:
    n = draw(st.integers(8, 40))
    ops = _KeyOps()
    spans = []
    for _ in range(draw(st.integers(0, 8))):
        i = draw(st.integers(0, n - 1))
        spans.append(("add", i, draw(st.one_of(st.integers(i + 1, n + 1), st.just(NEVER))),
                      draw(st.integers(-4, 6))))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, n - 1))
        spans.append(("del", i, draw(st.one_of(st.integers(i + 1, n + 1), st.just(NEVER))), 0))
    used: set[int] = set()
    for kind, i, a, d in sorted(spans, key=lambda x: x[1]):
        if i in used or a in used:  # one event an index
            continue
        used |= {i, a}
        if kind == "add":
            ops.add_inv.append(i)
            ops.add_ack.append(a)
            ops.add_delta.append(d)
        else:
            ops.del_inv.append(i)
            ops.del_ack.append(a)
    s = draw(st.integers(0, n + 2).filter(lambda x: x not in used))
    e = draw(st.integers(s + 1, n + 3).filter(lambda x: x not in used))
    ops.freeze()
    return ops, s, e


@settings(max_examples=300, deadline=None)
@given(key_ops())
def test_hull_matches_brute_force(case: tuple[_KeyOps, int, int]) -> None:
    ops, s, e = case
    for inv, m in ops.candidates(s, e):
        base, unc = 0, []
        for i, a, d in zip(ops.add_inv, ops.add_ack, ops.add_delta, strict=True):
            if i < e and not a < inv:
                if a < s and i > m:
                    base += d
                else:
                    unc.append(d)
        b, neg, pos = ops.hull(s, e, inv, m)
        assert (b + neg, b + pos) == (base + sum(min(d, 0) for d in unc),
                                      base + sum(max(d, 0) for d in unc))
    exact = ops.exact(s, e)[0]
    hull = ops.ranges(s, e)
    assert {v for lo, hi in exact for v in range(lo, hi + 1)} <= {
        v for lo, hi in hull for v in range(lo, hi + 1)}


def contract_values(ops: _KeyOps, s: int, e: int) -> set[int]:
    """The contract's allowed values for a read over [s, e], by brute force: for every set E of
    deletes that bind it (every one acknowledged before s, any invoked before e), each add
    counts for certain, never, or either way, independently of the others."""
    must = [j for j, a in enumerate(ops.del_ack) if a < s]
    may = [j for j, i in enumerate(ops.del_inv) if i < e and j not in must]
    out: set[int] = set()
    for bits in range(1 << len(may)):
        binding = must + [j for b, j in enumerate(may) if bits >> b & 1]
        base, unc = 0, []
        for i, a, d in zip(ops.add_inv, ops.add_ack, ops.add_delta, strict=True):
            if i > e or any(a < ops.del_inv[j] for j in binding):
                continue  # never seen, or removed for certain
            if a < s and all(i > ops.del_ack[j] for j in binding):
                base += d
            else:
                unc.append(d)
        ranges, _ = reachable_sums(base, unc)
        out |= {v for lo, hi in ranges for v in range(lo, hi + 1)}
    return out


@settings(max_examples=400, deadline=None)
@given(key_ops())
def test_exact_values_are_the_contracts(case: tuple[_KeyOps, int, int]) -> None:
    """Trying only the last-invoked binding delete (with every delete invoked before it taken
    as binding too) loses nothing and adds nothing."""
    ops, s, e = case
    exact = {v for lo, hi in ops.exact(s, e)[0] for v in range(lo, hi + 1)}
    assert contract_values(ops, s, e) == exact


# -- a linearizable model's histories are always valid ------------------------------------------


class Model:
    """A linearizable counter store: every op takes effect at one instant between its
    invocation and its completion (an info op: at any later instant, or never); a delete sets
    the counter to 0 and makes it not exist until its next add."""

    def __init__(self, keys: list[str]) -> None:
        self.value = dict.fromkeys(keys, 0)
        self.exists = dict.fromkeys(keys, False)

    def apply(self, op: dict[str, Any]) -> Any:
        f = op["f"]
        if f == "add":
            self.value[op["key"]] += op["value"]
            self.exists[op["key"]] = True
        elif f == "delete":
            self.value[op["key"]] = 0
            self.exists[op["key"]] = False
        elif f == "read":
            return self.value[op["key"]]
        elif f == "multiget":
            return [self.value[k] for k in op["keys"]]
        elif f == "scan":
            want = f"{op['table']}/{op['prefix']}"
            return [[k, self.value[k]] for k in sorted(self.value)
                    if self.exists[k] and k.startswith(want)]
        return None


def model_history(seed: int, steps: int, processes: int = 4,
                  keys: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    names = [f"t/k{i}" for i in range(keys)]
    bare = sorted(n[2:] for n in names)
    model = Model(names)
    h: list[dict[str, Any]] = []
    pid = list(range(processes))
    state: list[tuple[dict[str, Any], bool, Any] | None] = [None] * processes
    floating: list[dict[str, Any]] = []  # info ops not applied yet: later, or never

    def step(slot: int) -> None:
        cur = state[slot]
        if cur is None:
            f = rng.choices(["add", "delete", "read", "multiget", "scan"], [6, 1, 2, 1, 1])[0]
            op: dict[str, Any] = {"f": f, "process": pid[slot]}
            if f == "add":
                op.update(key=rng.choice(names), value=rng.choice([-2, -1, 1, 2, 3, 5]))
            elif f in ("delete", "read"):
                op.update(key=rng.choice(names), value=None)
            elif f == "multiget":
                op.update(keys=rng.sample(names, rng.randint(1, min(keys, 5))), value=None)
            else:
                op.update(table="t", prefix=scan_prefix(bare, rng, 100), value=None)
            h.append({**op, "type": "invoke"})
            state[slot] = (op, False, None)
        elif not cur[1]:
            op = cur[0]
            if op["f"] in ("add", "delete") and rng.random() < 0.2:  # ends before it applies
                if rng.random() < 0.5:
                    h.append({**op, "type": "fail"})
                else:
                    h.append({**op, "type": "info"})
                    floating.append(op)
                    pid[slot] += processes
                state[slot] = None
            else:
                state[slot] = (op, True, model.apply(op))
        else:
            op, _, got = cur
            if op["f"] in ("add", "delete") and rng.random() < 0.1:
                h.append({**op, "type": "info"})  # applied, but the client never learned it
                pid[slot] += processes
            else:
                h.append({**op, "type": "ok", **({"value": got} if got is not None else {})})
            state[slot] = None

    for _ in range(steps):
        if floating and rng.random() < 0.05:
            model.apply(floating.pop(rng.randrange(len(floating))))
        step(rng.randrange(processes))
    for slot in range(processes):
        while state[slot] is not None:
            step(slot)
    for op in floating:
        if rng.random() < 0.5:
            model.apply(op)
    for k in names:
        for node in ("n1", "n2"):
            h += [ev("invoke", f"final-{node}", "final-read", key=k, node=node),
                  ev("ok", f"final-{node}", "final-read", model.value[k], key=k, node=node)]
    return h


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 120))
def test_linearizable_model_histories_are_valid(seed: int, steps: int) -> None:
    h = model_history(seed, steps)
    rep = check(h, nodes=["n1", "n2"])
    assert rep.valid, rep.problems


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.integers(20, 120))
def test_model_histories_with_a_final_value_changed_are_invalid(seed: int, steps: int) -> None:
    h = model_history(seed, steps, keys=1)
    rep = check(h, nodes=["n1", "n2"])
    ranges = rep.finals[0].ranges
    # a value just outside every allowed range, on both nodes (still converged)
    bad = ranges[-1][1] + 1
    for e in h:
        if e["f"] == "final-read" and e["type"] == "ok":
            e["value"] = bad
    assert not check(h, nodes=["n1", "n2"]).valid


def test_a_large_history_checks_in_seconds() -> None:
    h = model_history(7, 40_000, processes=16, keys=3000)
    started = time.process_time()
    rep = check(h, nodes=["n1", "n2"])
    assert rep.valid, rep.problems
    assert rep.deletes > 500 and rep.scans > 500 and rep.multigets > 500
    assert time.process_time() - started < 60  # ~100k ops over ~3000 keys: a few seconds


def test_reachable_sums_still_exported() -> None:
    assert reachable_sums(0, [1]) == ([(0, 1)], False)


# -- expiry (check(ttl=...)) --------------------------------------------------------------------

TTL = {"t": 3.0}


def at(t: float, events: list[dict[str, Any]], step: float = 0.1) -> list[dict[str, Any]]:
    """``events`` timed from ``t``, ``step`` apart."""
    return [{**e, "time": round(t + j * step, 6)} for j, e in enumerate(events)]


def expiring(h: list[dict[str, Any]], **kw: Any) -> Any:
    return check(h, ttl=TTL, margin=1.0, **kw)


def test_a_key_quiet_for_longer_than_ttl_and_margin_must_read_zero() -> None:
    h = at(0, add(0, 5))  # acknowledged at 0.1
    assert expiring(h + at(10, read(1, 0))).valid
    rep = expiring(h + at(10, read(1, 5)))
    assert not rep.valid and rep.expired_reads == 1
    assert rep.read_errors[0].expired and "expired (must read 0)" in rep.problems[0]
    # a multi-get's and a scan's values too
    mg = [ev("invoke", 1, "multiget", keys=["t/k"]), ev("ok", 1, "multiget", [5], keys=["t/k"])]
    assert not expiring(h + at(10, mg)).valid
    assert not expiring(h + at(10, scan(1, [("t/k", 5)]))).valid
    assert expiring(h + at(10, scan(1, []))).valid
    # another table, or no ttl at all: the old rules (5 it must be)
    assert not check(h + at(10, read(1, 0))).valid
    assert not check(h + at(10, read(1, 0)), ttl={"u": 3.0}, margin=1.0).valid


def test_near_the_boundary_either_value_and_before_it_no_expiry() -> None:
    h = at(0, add(0, 5))
    for t in (2.5, 3.5, 4.0):  # from ack + ttl - margin (the may rule) to ack + ttl + margin
        assert expiring(h + at(t, read(1, 5))).valid, t
        assert expiring(h + at(t, read(1, 0))).valid, t
    assert not expiring(h + at(1.5, read(1, 0))).valid  # too young to have expired
    assert not expiring(h + at(4.2, read(1, 5))).valid


def test_a_write_after_expiry_counts_from_zero_and_expires_again() -> None:
    h = at(0, add(0, 5)) + at(10, read(1, 0)) + at(11, add(0, 2))
    got = [v for v in range(-1, 10) if expiring(h + at(12, read(1, v))).valid]
    assert 2 in got and 0 in got  # expired, then the 2 (or the 2 not seen)
    assert 7 in got  # a node's clock that had not seen the ttl pass: nothing deleted
    assert not expiring(h + at(20, read(1, 2))).valid
    rep = expiring(h + at(20, read(1, 0)) + at(30, finals({"n1": 0, "n2": 0})),
                   nodes=["n1", "n2"])
    assert rep.valid and rep.finals[0].expired and rep.finals[0].ranges == [(0, 0)]
    rep = expiring(h + at(30, finals({"n1": 0, "n2": 2})), nodes=["n1", "n2"])
    assert not rep.valid and rep.finals[0].over_count == 2


def test_an_add_in_flight_keeps_the_key_from_being_judged_expired() -> None:
    h = at(0, add(0, 5)) + at(1, [ev("invoke", 1, "add", 3, key="t/k"),
                                  ev("info", 1, "add", 3, key="t/k")])
    for v in (0, 5, 8):  # the 3 may still be applied, any time
        assert expiring(h + at(20, read(2, v))).valid
    # applied no later than 2 s after its invocation: settled by 3, expired by 7
    assert expiring(h + at(20, read(2, 0)), in_flight=2.0).valid
    assert not expiring(h + at(20, read(2, 8)), in_flight=2.0).valid
    assert expiring(h + at(6, read(2, 8)), in_flight=2.0).valid


def test_deletes_and_expiry_together() -> None:
    h = at(0, add(0, 5)) + at(1, delete(1)) + at(2, add(0, 2))
    assert not expiring(h + at(3, read(2, 7))).valid  # the delete still binds it
    assert expiring(h + at(3, read(2, 2))).valid
    assert expiring(h + at(20, read(2, 0))).valid
    assert not expiring(h + at(20, read(2, 2))).valid


def test_expiry_needs_event_times() -> None:
    import pytest

    with pytest.raises(ValueError, match="time"):
        check(add(0, 5) + read(1, 5), ttl=TTL)


class ExpiringModel(Model):
    """``Model`` with a ttl: an op at time ``now`` sees the key expired once ``now`` is ttl past
    its last change, as judged by a clock off by up to ``margin`` (drawn for each op); an add
    to an expired key starts it from 0."""

    def __init__(self, keys: list[str], ttl: float, margin: float, rng: random.Random) -> None:
        super().__init__(keys)
        self.ttl, self.margin, self.rng, self.now = ttl, margin, rng, 0.0
        self.last = dict.fromkeys(keys, 0.0)

    def expired(self, key: str) -> bool:
        skew = self.rng.uniform(-self.margin, self.margin)
        return self.exists[key] and self.now + skew - self.last[key] >= self.ttl

    def apply(self, op: dict[str, Any]) -> Any:
        f = op["f"]
        if f == "read":
            return 0 if self.expired(op["key"]) else self.value[op["key"]]
        if f == "add" and self.expired(op["key"]):
            self.value[op["key"]] = 0
        if f in ("add", "delete"):
            self.last[op["key"]] = self.now
        return super().apply(op)


def expiring_history(seed: int, steps: int, processes: int = 3) -> list[dict[str, Any]]:
    """Adds, deletes and reads on two keys, steps of up to 0.3 s and now and then a pause of
    2.5-4 s (about the ttl); each op applied at one instant between its invocation and its
    completion, half of them at once."""
    rng = random.Random(seed)
    names = ["t/a", "t/b"]
    model = ExpiringModel(names, 3.0, 0.5, rng)
    h: list[dict[str, Any]] = []
    open_ops: dict[int, tuple[dict[str, Any], bool, Any]] = {}
    for _ in range(steps):
        model.now += rng.uniform(0, 0.3) if rng.random() < 0.85 else rng.uniform(2.5, 4.0)
        p = rng.randrange(processes)
        cur = open_ops.get(p)
        if cur is None:
            f = rng.choices(["add", "delete", "read"], [5, 1, 3])[0]
            op = {"f": f, "process": p, "key": rng.choice(names),
                  "value": rng.choice([1, 2, -1, 5]) if f == "add" else None}
            h.append({**op, "type": "invoke", "time": model.now})
            now = rng.random() < 0.5  # applied at once (at its invocation's instant)
            open_ops[p] = (op, now, model.apply(op) if now else None)
        elif not cur[1]:
            open_ops[p] = (cur[0], True, model.apply(cur[0]))
        else:
            op, _, got = open_ops.pop(p)
            h.append({**op, "type": "ok", "time": model.now,
                      **({"value": got} if got is not None else {})})
    return h


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 150))
def test_histories_of_a_store_with_expiry_are_valid(seed: int, steps: int) -> None:
    h = expiring_history(seed, steps)
    rep = check(h, ttl={"t": 3.0}, margin=0.5)
    assert rep.valid, rep.problems


def test_a_margin_below_the_clocks_disagreement_is_caught_by_the_model() -> None:
    """The model's clocks disagree by up to 0.5 s: judged with no margin, some of its histories
    fail (so the model does reach the boundary the margin is for)."""
    assert any(not check(expiring_history(seed, 150), ttl={"t": 3.0}, margin=0.0).valid
               for seed in range(80, 250))
