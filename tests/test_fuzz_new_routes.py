"""Hostile input, bounded fuzzing of the read, scan and delete routes' checks: ``check_reads``
(POST /v1/read), ``query_op`` (DELETE's query), ``check_limit`` and ``check_prefix`` (a scan's
query) in ``cluster.edge.validate``, and ``decode_cursor`` in ``cluster.roles.scans``.

Each either returns what the documented rules allow, unchanged, or raises ``BadRequest`` with a
400 and the route's code; nothing else escapes (a ValueError there is a 500). The checks below
restate the rules independently of the code under test (``test_fuzz_inputs.py`` does the same
for op bodies and batches).

Bugs these found, fixed: ``check_limit`` raised ValueError (500) for digits ``int()`` refuses
("²", "①") and for 4300+ digits, and took non-ASCII digits ("١٠" as 10); ``decode_cursor`` took
cursors no scan hands out (a leaf " 5", "+5", "05", "0_5" or "٥", padding or characters outside
the base64 alphabet, which the decoder skips); ``query_op`` took an op id holding U+FFFD, which
is what the query's decoding makes of bytes that are not UTF-8 (%FF and %FE became one op id);
``check_op`` took ``"op": "delete"`` in the add route's body.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cluster.core.digests import LEAVES
from cluster.core.errors import BadRequest
from cluster.edge.validate import (
    check_limit,
    check_op,
    check_prefix,
    check_reads,
    decode_body,
    query_op,
)
from cluster.roles.scans import decode_cursor, encode_cursor

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

I64_MAX = (1 << 63) - 1
NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")  # the contract's, restated
CONSISTENCIES = ("one", "quorum", "all")
MAX_READS, MAX_OP_ID, STALE_MS, SKEW_MS, NOW = 6, 24, 500, 1000, 1_700_000_000.0
ASCII_DIGITS = set("0123456789")

good_names = st.sampled_from(["t", "k1", "user:42", "a.b-c_d", "x" * 128, "Z", "0", "-", "."])
bad_names = st.sampled_from(["", " ", "a b", "é", "x" * 129, "t/k", "k\n", "\x00", "\ufffd",
                             "٥", "a\u200bb", "k?", "%41"])
any_text = st.text(max_size=12)
names = st.one_of(good_names, bad_names, any_text)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), any_text,
                    st.binary(max_size=4))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.one_of(st.sampled_from(["table", "key", "reads",
                                                                   "consistency"]), any_text),
                                        c, max_size=3), max_leaves=8)


# ================================================================ POST /v1/read: check_reads


@st.composite
def read_items(draw: st.DrawFn) -> Any:
    """Mostly a valid {"table", "key"} item; sometimes a field spoilt, missing or added."""
    item: dict[str, Any] = {"table": draw(good_names), "key": draw(good_names)}
    how = draw(st.sampled_from(["ok"] * 6 + ["table", "key", "drop", "extra", "value"]))
    if how in ("table", "key"):
        item[how] = draw(st.one_of(names, values))
    elif how == "drop":
        del item[draw(st.sampled_from(["table", "key"]))]
    elif how == "extra":
        item[draw(st.sampled_from(["consistency", "op_id", "x", "Table"]))] = draw(values)
    elif how == "value":
        return draw(values)
    return item


consistency_values = st.one_of(st.sampled_from([*CONSISTENCIES, "ALL", "", "one ", None]),
                               values)
read_bodies = st.one_of(
    st.fixed_dictionaries({"reads": st.lists(read_items(), max_size=MAX_READS + 2)},
                          optional={"consistency": consistency_values}),
    st.fixed_dictionaries({"reads": st.lists(read_items(), max_size=MAX_READS + 2)},
                          optional={"consistency": consistency_values, "extra": values,
                                    "ops": values}),
    values,
)


def check_read_body(body: Any) -> None:
    try:
        reads, consistency = check_reads(body, max_reads=MAX_READS)
    except BadRequest as exc:
        assert exc.status == 400
        assert exc.code in ("bad_body", "bad_table", "bad_key", "bad_consistency",
                            "too_many_reads"), exc.code
        event(f"check_reads: {exc.code}")
        return
    event(f"check_reads: accepted {min(len(reads), 2)}+")
    assert isinstance(body, dict) and set(body) <= {"reads", "consistency"}
    assert isinstance(body["reads"], list) and len(body["reads"]) <= MAX_READS
    assert len(reads) == len(body["reads"])
    for (table, key), item in zip(reads, body["reads"], strict=True):
        assert isinstance(item, dict) and set(item) == {"table", "key"}
        assert (table, key) == (item["table"], item["key"])
        assert type(table) is str and NAME_RE.fullmatch(table)
        assert type(key) is str and NAME_RE.fullmatch(key)
    given_c = body.get("consistency")
    assert consistency == ("quorum" if given_c is None else given_c)
    assert consistency in CONSISTENCIES


def encode(body: Any, as_msgpack: bool) -> bytes:
    try:
        return msgpack.packb(body) if as_msgpack else json.dumps(body).encode()
    except (OverflowError, ValueError, TypeError):  # past 64 bits, 4300 digits, bytes in JSON
        assume(False)
        raise AssertionError("unreachable") from None


@FUZZ
@given(body=read_bodies, as_msgpack=st.booleans())
def test_check_reads_gives_reads_or_bad_request(body: Any, as_msgpack: bool) -> None:
    check_read_body(body)
    raw = encode(body, as_msgpack)
    try:
        decoded = decode_body(raw, "application/msgpack" if as_msgpack else "application/json")
    except BadRequest as exc:
        assert exc.status == 400
        return
    check_read_body(decoded)


@FUZZ
@given(raw=st.binary(max_size=120), as_msgpack=st.booleans())
def test_check_reads_of_random_bytes(raw: bytes, as_msgpack: bool) -> None:
    try:
        body = decode_body(raw, "application/msgpack" if as_msgpack else "application/json")
    except BadRequest:
        return
    check_read_body(body)


def test_check_reads_edges() -> None:
    item = {"table": "t", "key": "k"}
    assert check_reads({"reads": [item] * MAX_READS}, max_reads=MAX_READS)[1] == "quorum"
    assert check_reads({"reads": []}, max_reads=MAX_READS) == ([], "quorum")
    assert check_reads({"reads": [item], "consistency": None}, max_reads=1)[1] == "quorum"
    for body, code in (({"reads": [item] * (MAX_READS + 1)}, "too_many_reads"),
                       ({"reads": [item], "consistency": ["all"]}, "bad_consistency"),
                       ({"reads": [item, {"table": "t", "key": b"k"}]}, "bad_key"),
                       ({"reads": [{"table": "t", "key": "k", "op": "x"}]}, "bad_body"),
                       ({"reads": [item], "Consistency": "all"}, "bad_body")):
        with pytest.raises(BadRequest) as info:
            check_reads(body, max_reads=MAX_READS)
        assert info.value.code == code


# ================================================================ DELETE's query: query_op

PARAMS = ("op_id", "attempt", "age_ms", "ts_ms")
digits = st.one_of(st.integers(0, I64_MAX + 10).map(str), st.sampled_from(
    ["0", "1", "2", "00", "0" * 19 + "1", "9" * 19, "9" * 20, "", " 1", "+1", "-1", "1.5", "1e3",
     "٥", "²", "５", "0x1", "1_000", "1\n"]))
op_ids = st.one_of(st.text(max_size=MAX_OP_ID + 2), st.sampled_from(
    ["", "a:1", "\ufffd", "a\ufffdb", "a\x00b", "\n", "a\x7f", "é" * (MAX_OP_ID // 2 + 1),
     "x" * MAX_OP_ID, "x" * (MAX_OP_ID + 1)]))


@st.composite
def queries(draw: st.DrawFn) -> dict[str, str]:
    q: dict[str, str] = {}
    if draw(st.integers(0, 9)):
        q["op_id"] = draw(op_ids)
    for name in PARAMS[1:]:
        if draw(st.booleans()):
            q[name] = draw(digits)
    if not draw(st.integers(0, 5)):
        q[draw(st.sampled_from(["delta", "op", "OP_ID", "consistency", "x", ""]))] = draw(
            any_text)
    return q


def _clock() -> float:
    return NOW


@FUZZ
@given(query=queries())
def test_query_op_gives_a_delete_or_bad_request(query: dict[str, str]) -> None:
    try:
        op = query_op(query, "t", "k", max_op_id_bytes=MAX_OP_ID, max_clock_skew_ms=SKEW_MS,
                      stale_after_ms=STALE_MS, clock=_clock)
    except BadRequest as exc:
        assert exc.status == 400
        assert exc.code in ("bad_op_id", "bad_attempt", "bad_age_ms", "bad_ts_ms",
                            "bad_query"), exc.code
        event(f"query_op: {exc.code}")
        return
    event("query_op: accepted")
    assert set(query) <= set(PARAMS)
    table, key, op_id, delta, attempt, age_ms = op
    assert (table, key, delta) == ("t", "k", None)  # a delete
    given_id = query["op_id"]
    assert op_id == given_id and op_id
    assert len(op_id.encode("utf-8")) <= MAX_OP_ID
    assert not re.search(r"[\x00-\x1f\x7f\ufffd]", op_id)
    for name in PARAMS[1:]:
        if name in query:
            v = query[name]
            assert set(v) <= ASCII_DIGITS and 0 < len(v) <= 19 and int(v) <= I64_MAX
    given_attempt = int(query.get("attempt", "1"))
    assert given_attempt >= 1 and attempt in (given_attempt, max(given_attempt, 2))
    assert 0 <= age_ms <= I64_MAX and age_ms >= int(query.get("age_ms", "0"))


def test_query_op_refuses_the_decodings_replacement_character() -> None:
    kw: dict[str, Any] = {"max_op_id_bytes": 256, "max_clock_skew_ms": SKEW_MS,
                          "stale_after_ms": STALE_MS, "clock": _clock}
    for op_id in ("\ufffd", "c:\ufffd", "\ufffd\ufffd\ufffd"):  # %FF, a cut sequence, %ED%A0%80
        with pytest.raises(BadRequest) as info:
            query_op({"op_id": op_id}, "t", "k", **kw)
        assert info.value.code == "bad_op_id"
    assert query_op({"op_id": "c:é"}, "t", "k", **kw)[2] == "c:é"


def test_a_delete_is_not_the_add_routes_op() -> None:
    with pytest.raises(BadRequest) as info:
        check_op({"op_id": "a:1", "op": "delete"}, "t", "k", max_op_id_bytes=64)
    assert info.value.code == "bad_op"
    assert check_op({"op_id": "a:1", "op": "delete"}, "t", "k", max_op_id_bytes=64,
                    deletes=True)[3] is None
    assert check_op({"op_id": "a:1", "op": "add", "delta": 2}, "t", "k",
                    max_op_id_bytes=64)[3] == 2


# ================================================================ a scan's query


limit_values = st.one_of(
    st.none(), st.text(max_size=14), st.integers(-5, 10**14).map(str),
    st.sampled_from(["", "0", "00", "01", "1" * 12, "1" * 13, "9" * 5000, "0" * 4400 + "1",
                     "²", "①", "١٠", "５", "७", " 5", "5 ", "+5", "-5", "5.0", "1e3", "0x10",
                     "1_0"]))


@FUZZ
@given(value=limit_values)
def test_check_limit_gives_a_limit_or_bad_request(value: str | None) -> None:
    try:
        got = check_limit(value, default=100, most=1000)
    except BadRequest as exc:
        assert exc.status == 400 and exc.code == "bad_limit"
        event("check_limit: refused")
        return
    event("check_limit: accepted")
    if not value:
        assert got == 100
        return
    assert set(value) <= ASCII_DIGITS and len(value) <= 12 and int(value) >= 1
    assert got == min(int(value), 1000)


prefix_values = st.one_of(st.none(), names, st.text(max_size=140),
                          st.text(alphabet="ab:_.-09", min_size=100, max_size=140),
                          st.sampled_from(["a" * 128, "a" * 129, "a" * 5000, "%", "a*"]))


@FUZZ
@given(value=prefix_values)
def test_check_prefix_gives_a_prefix_or_bad_request(value: str | None) -> None:
    try:
        got = check_prefix(value)
    except BadRequest as exc:
        assert exc.status == 400 and exc.code == "bad_prefix"
        return
    if not value:
        assert got == ""
    else:
        assert got == value and NAME_RE.fullmatch(value) and len(value) <= 128


# ================================================================ scans.decode_cursor


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


positions = st.tuples(st.integers(0, LEAVES - 1),
                      st.from_regex(r"[A-Za-z0-9_.:\-]{1,128}", fullmatch=True))


@st.composite
def tampered(draw: st.DrawFn) -> str:
    """A cursor as a scan hands it out, then changed where and how hypothesis picks."""
    c = list(encode_cursor(draw(positions)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(c)))
        how = draw(st.sampled_from(["insert", "drop", "replace", "pad"]))
        char = draw(st.sampled_from(list("Aa0-_+/=.! %é\n") + [draw(st.characters())]))
        if how == "insert" or (how == "replace" and at == len(c)):
            c.insert(at, char)
        elif how == "replace":
            c[at] = char
        elif how == "drop" and at < len(c):
            del c[at]
        else:
            c.append("=")
    return "".join(c)


leaf_texts = st.one_of(st.integers(-3, LEAVES + 3).map(str), st.sampled_from(
    [" 5", "5 ", "+5", "05", "0_5", "٥", "५", "5.0", "", "x", str(1 << 64), "9" * 280]))
written = st.builds(lambda v, leaf, key: f"{v}:{leaf}:{key}",
                    st.sampled_from(["1", "2", "0", "", "01", " 1"]), leaf_texts,
                    st.one_of(good_names, bad_names, any_text))
cursors = st.one_of(
    st.none(), st.just(""), st.text(max_size=60),
    positions.map(encode_cursor),
    tampered(),
    written.map(lambda s: b64(s.encode())),
    written.map(lambda s: b64(s.encode()) + "=="),
    st.binary(max_size=64).map(b64),
    st.binary(min_size=300, max_size=320).map(b64),
    st.sampled_from(["A" * 10_240, "A" * 401, b64(b"1:5:\xff\xfe"), "****", "%FF"]),
)


@FUZZ
@given(value=cursors)
def test_decode_cursor_takes_only_what_a_scan_hands_out(value: str | None) -> None:
    try:
        got = decode_cursor(value)
    except BadRequest as exc:
        assert exc.status == 400 and exc.code == "bad_cursor"
        event("decode_cursor: refused")
        return
    if not value:
        assert got is None
        return
    event("decode_cursor: accepted")
    assert got is not None
    leaf, key = got
    assert type(leaf) is int and 0 <= leaf < LEAVES
    assert type(key) is str and NAME_RE.fullmatch(key)
    assert encode_cursor(got) == value  # exactly as a scan would have handed it out
    assert base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)) == f"1:{leaf}:{key}".encode()


@FUZZ
@given(pos=positions)
def test_a_cursor_round_trips(pos: tuple[int, str]) -> None:
    c = encode_cursor(pos)
    assert decode_cursor(c) == pos
    assert len(c) <= 400 and re.fullmatch(r"[A-Za-z0-9_\-]+", c)
