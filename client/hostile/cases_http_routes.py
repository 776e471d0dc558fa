"""HTTP junk at the read, scan, delete and table-settings routes: malformed multi-get bodies and
one read too many, scan queries with unknown parameters, bad limits, huge prefixes and forged
cursors, deletes without an op id or with junk in their query, deletes in a batch that carry a
delta or an unknown op kind, and table settings with a ttl that is not one.

Each is refused with a 4xx in the contract's error shape, and nothing is changed: a delete or
a batch that is refused leaves its counter (``victim``: written by the class with a valid add
first, in the table ``<table>_del``) at its value on every node, and a refused ``PUT`` leaves
the table's ttl (``<table>_ttl``, set by the class first) as it was."""

from __future__ import annotations

import base64
import json
from typing import Any

from client.hostile.context import Ctx, Target
from client.hostile.http_client import (
    counter_path,
    exchange,
    http_request,
    jdump,
    pack,
    post,
)
from client.hostile.outcome import Answer, Outcome, expect_reject
from client.hostile.registry import junk
from cluster.core.digests import LEAVES

TEN_YEARS_S = 10 * 365 * 86400  # the longest ttl a table takes


# -- helpers (the regression classes use them too) ----------------------------------------------


async def get(ctx: Ctx, t: Target, path: str) -> Answer:
    return await exchange(ctx, t, http_request(ctx, "GET", path, ctype=None))


async def delete(ctx: Ctx, t: Target, path: str) -> Answer:
    return await exchange(ctx, t, http_request(ctx, "DELETE", path, ctype=None))


async def put(ctx: Ctx, t: Target, path: str, body: bytes,
              ctype: str = "application/json") -> Answer:
    return await exchange(ctx, t, http_request(ctx, "PUT", path, body, ctype=ctype))


def del_table(ctx: Ctx) -> str:
    return ctx.table + "_del"


def ttl_table(ctx: Ctx) -> str:
    return ctx.table + "_ttl"


def body_of(ans: Answer) -> Any:
    try:
        return json.loads(ans.body) if ans.status == 200 else None
    except ValueError:
        return None


def _setup_failed(out: Outcome, what: str, ans: Answer) -> None:
    """A valid request of the class's own was not answered 200: its effect check is skipped
    (503 under load is legitimate), but a 500 is a failure."""
    out.notes.add(f"{what}: {ans.label}, its check skipped")
    if ans.status is not None and ans.status >= 500 and ans.status != 503:
        out.fail("5xx", what, ans.describe())


async def victim(ctx: Ctx, t: Target, out: Outcome, cls: str) -> tuple[str, int] | None:
    """A fresh counter of ``<table>_del`` raised by a valid add (2..999, recorded as a
    ``setup`` label, not a status), or None when that add was not acknowledged."""
    key = f"{ctx.run_id}-{cls}-{ctx.rng.randrange(10**9)}"[:128]
    delta = ctx.rng.randrange(2, 1000)
    ans = await post(ctx, t, counter_path(ctx, key, del_table(ctx)),
                     jdump({"op_id": ctx.op_id(cls), "delta": delta}))
    out.requests += 1
    out.seen[f"setup: {ans.label}"] += 1
    if ans.status != 200:
        _setup_failed(out, "the victim's add", ans)
        return None
    return key, delta


async def read_everywhere(ctx: Ctx, out: Outcome, table: str, key: str) -> dict[str, Any]:
    """The key's value read from every node at consistency=all (the answer's label where the
    body holds no value)."""
    values: dict[str, Any] = {}
    for x in ctx.targets:
        ans = await get(ctx, x, counter_path(ctx, key, table) + "?consistency=all")
        out.requests += 1
        got = body_of(ans)
        values[x.node_id] = got["value"] if isinstance(got, dict) and "value" in got \
            else ans.label
    return values


async def check_victim(ctx: Ctx, out: Outcome, found: tuple[str, int] | None,
                       what: str) -> None:
    """The victim still reads its value on every node: no refused request deleted it."""
    if found is None:
        return
    key, value = found
    values = await read_everywhere(ctx, out, del_table(ctx), key)
    if any(v != value for v in values.values()):
        out.fail("effect", f"victim after {what}", f"it was {value}, reads {values}")


def cursor(text: str) -> str:
    """``text`` as a scan hands its cursor out: URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


# -- POST /v1/read ------------------------------------------------------------------------------


@junk("read_malformed", "http")
async def read_malformed(ctx: Ctx, t: Target) -> Outcome:
    """Multi-get bodies of the wrong shape (bad_body), with bad names at reads[i] (bad_table,
    bad_key), bad consistency values, in JSON and msgpack."""
    out = Outcome()
    tb, k = ctx.table, ctx.junk_key("read_malformed")
    ok = {"table": tb, "key": k}
    shapes: list[Any] = [{}, [], None, 5, "reads", {"reads": {}}, {"reads": "x"},
                         {"reads": None}, {"reads": [5]}, {"reads": [[tb, k]]},
                         {"reads": [{"table": tb}]}, {"reads": [{"key": k}]},
                         {"reads": [ok, {**ok, "x": 1}]}, {"reads": [ok], "extra": 1},
                         {"read": [ok]}, {"reads": [ok], "ops": []}, {"reads": [{}]},
                         {"reads": [{"table": tb, "key": k, "consistency": "all"}]}]
    cases: list[tuple[str, bytes, str, tuple[str, ...]]] = [
        (f"body {json.dumps(b)[:40]}", jdump(b), "application/json", ("bad_body",))
        for b in shapes]
    cases += [("not JSON", b'{"reads": [', "application/json", ("bad_body",)),
              ("empty", b"", "application/json", ("bad_body",)),
              ("trailing", jdump({"reads": [ok]}) + b"x", "application/json", ("bad_body",)),
              ("truncated msgpack", pack({"reads": [ok]})[:-2], "application/msgpack",
               ("bad_body",)),
              ("msgpack bin map keys", pack({"reads": [{b"table": tb, b"key": k}]}),
               "application/msgpack", ("bad_body",)),
              ("deep reads", b'{"reads":' + b"[" * 5000 + b"]" * 5000 + b"}",
               "application/json", ("bad_body", "too_deep"))]
    for value, field in ((" a", "table"), ("a b", "table"), ("t" * 129, "table"), ("", "table"),
                         (5, "table"), (None, "table"), (["t"], "table"), ("é", "key"),
                         ("k/1", "key"), ("k" * 129, "key"), ("", "key"), (1.5, "key"),
                         ({"k": 1}, "key"), ("k\n", "key")):
        item = {**ok, field: value}
        cases.append((f"reads[1].{field}={str(value)[:16]!r}", jdump({"reads": [ok, item]}),
                      "application/json", (f"bad_{field}",)))
    cases.append(("msgpack bin table", pack({"reads": [{"table": tb.encode(), "key": k}]}),
                  "application/msgpack", ("bad_table",)))
    cases.append(("msgpack ext key", pack({"reads": [{"table": tb, "key": 0}]})[:-1]
                  + b"\xd4\x01\x01", "application/msgpack", ("bad_key",)))
    for value in ("ALL", "", "some", "one ", 1, True, ["all"], {"all": 1}, "quorum\u0000"):
        cases.append((f"consistency {value!r}", jdump({"reads": [ok], "consistency": value}),
                       "application/json", ("bad_consistency",)))
    for case, body, ctype, codes in cases:
        ans = await post(ctx, t, "/v1/read", body, ctype)
        out.requests += 1
        expect_reject(out, case, ans, (400,), codes)
    return out


@junk("read_too_many", "http")
async def read_too_many(ctx: Ctx, t: Target) -> Outcome:
    """One read more than max_reads, every one valid (400 too_many_reads, or 413 when the body
    is past max_body_bytes); exactly max_reads is answered, every junk counter 0."""
    out = Outcome()
    n = ctx.limits.max_reads
    reads = [{"table": ctx.table, "key": ctx.junk_key("read_too_many", i)} for i in range(n + 1)]
    for case, body, ctype in (("json", jdump({"reads": reads}), "application/json"),
                              ("msgpack", pack({"reads": reads}), "application/msgpack"),
                              ("json, consistency all",
                               jdump({"reads": reads, "consistency": "all"}),
                               "application/json")):
        if len(body) > ctx.limits.max_body_bytes:
            out.notes.add("reads bigger than max_body_bytes: 413 accepted")
        ans = await post(ctx, t, "/v1/read", body, ctype)
        out.requests += 1
        expect_reject(out, f"{case}: {n + 1} reads", ans, (400, 413),
                      ("too_many_reads", "body_too_large"))
    body = jdump({"reads": reads[:n]})
    if len(body) <= ctx.limits.max_body_bytes:
        ans = await post(ctx, t, "/v1/read", body)
        out.requests += 1
        out.seen[f"at the limit: {ans.label}"] += 1
        got = body_of(ans)
        if ans.status == 200:
            values = got.get("values") if isinstance(got, dict) else None
            if values != [0] * n:
                out.fail("effect", f"{n} reads", f"expected {n} zeros: {ans.describe()}")
        elif ans.status != 503:
            out.fail("status", f"{n} reads (the limit)", f"expected 200: {ans.describe()}")
    return out


# -- GET /v1/counters/{table} -------------------------------------------------------------------


@junk("scan_bad_query", "http")
async def scan_bad_query(ctx: Ctx, t: Target) -> Outcome:
    """Scan queries with unknown parameters (bad_query), limits that are not integers >= 1
    (bad_limit), prefixes that are not the start of a name, up to 5000 characters
    (bad_prefix), bad consistency values and table names."""
    out = Outcome()
    scan = f"/v1/counters/{ctx.table}"
    cases: list[tuple[str, str, tuple[int, ...], tuple[str, ...]]] = []
    for q in ("x=1", "prefx=a", "cursor=MTo1Oms", "offset=5", "limit=5&offset=1", "op_id=a:1",
              "consistency=all&foo", "table=junk", "PREFIX=a", "after=&x="):
        cases.append((f"?{q}", f"{scan}?{q}", (400,), ("bad_query",)))
    for q in ("0", "-1", "1.5", "abc", "0x10", "%205", "5%20", "1e3", "%2B5", "5%00",
              "9999999999999", "1" + "0" * 30, "00000000000001", "true", "[5]", "5,6"):
        cases.append((f"limit={q}", f"{scan}?limit={q}", (400,), ("bad_limit",)))
    for q in ("a%20b", "%C3%A9", "a" * 129, "a" * 5000, "a%2Fb", "%00", "a%0A", "%FF",
              "a*", "%25", "a%3Fb"):
        cases.append((f"prefix={q[:16]} ({len(q)})", f"{scan}?prefix={q}", (400,),
                      ("bad_prefix",)))
    cases.append(("prefix of 10000 chars", f"{scan}?prefix={'a' * 10_000}", (400, 414, 431),
                  ("bad_prefix", "bad_http")))
    for q in ("ALL", "", "some", "one%20", "%FF"):
        cases.append((f"consistency={q}", f"{scan}?consistency={q}", (400,),
                      ("bad_consistency",)))
    for name in ("a%20b", "%C3%A9", "t" * 129, "a%00b", "%FF%FE", "a%2Fb"):
        cases.append((f"table {name[:16]}", f"/v1/counters/{name}?limit=1", (400, 404),
                      ("bad_table", "not_found")))
    for case, path, statuses, codes in cases:
        ans = await get(ctx, t, path)
        out.requests += 1
        expect_reject(out, case, ans, statuses, codes)
    return out


@junk("scan_forged_cursors", "http")
async def scan_forged_cursors(ctx: Ctx, t: Target) -> Outcome:
    """Cursors no scan handed out: not base64, base64 of junk bytes or text, the wrong
    version, a leaf out of range, a key with bad characters, past 400 characters, and one of
    10 kB (400 bad_cursor; 400/414/431 for what does not fit the request line)."""
    out = Outcome()
    scan = f"/v1/counters/{ctx.table}"
    junk_bytes = base64.urlsafe_b64encode(bytes(ctx.rng.randrange(256) for _ in range(48)))
    forged = [
        ("not base64", "not-a-cursor!"), ("one char", "A"), ("stars", "****"),
        ("junk bytes", junk_bytes.decode().rstrip("=")),
        ("not UTF-8", base64.urlsafe_b64encode(b"1:5:\xff\xfe").decode().rstrip("=")),
        ("text", cursor("hello world")), ("no key", cursor("1:5")),
        ("no key, colon", cursor("1:5:")),
        ("version 2", cursor("2:5:k")), ("version 0", cursor("0:5:k")),
        ("no version", cursor(":5:k")),
        ("leaf = LEAVES", cursor(f"1:{LEAVES}:k")), ("leaf -1", cursor("1:-1:k")),
        ("leaf 2**64", cursor(f"1:{1 << 64}:k")),
        ("leaf of 280 digits", cursor("1:" + "9" * 280 + ":k")),
        ("leaf not a number", cursor("1:x:k")), ("leaf float", cursor("1:1.5:k")),
        ("key with a space", cursor("1:5:a b")), ("key é", cursor("1:5:é")),
        ("key 129 chars", cursor("1:5:" + "k" * 129)), ("key with a newline", cursor("1:5:k\n")),
        ("key with a slash", cursor("1:5:a/b")), ("key NUL", cursor("1:5:a\x00")),
        ("401 chars", cursor("1:5:" + "k" * 300)[:401]),
        ("percent junk", "%FF%FE%00"), ("NUL", "%00"),
    ]
    for case, value in forged:
        ans = await get(ctx, t, f"{scan}?after={value}")
        out.requests += 1
        expect_reject(out, f"cursor: {case}", ans, (400,), ("bad_cursor",))
    ans = await get(ctx, t, f"{scan}?after={'A' * 10_240}")
    out.requests += 1
    expect_reject(out, "cursor of 10 kB", ans, (400, 414, 431), ("bad_cursor", "bad_http"))
    ans = await get(ctx, t, f"{scan}?after={cursor('1:5:' + 'k' * 128) * 40}")
    out.requests += 1
    expect_reject(out, "a cursor 40 times over", ans, (400, 414, 431),
                  ("bad_cursor", "bad_http"))
    # a cursor as a scan hands it out is taken (the refusals above are not of every cursor)
    ans = await get(ctx, t, f"{scan}?limit=1&after={cursor(f'1:{LEAVES - 1}:zz')}")
    out.requests += 1
    out.seen[f"well-formed cursor: {ans.label}"] += 1
    if ans.status != 200 and ans.status != 503:
        out.fail("status", "a well-formed cursor", f"expected 200: {ans.describe()}")
    return out


# -- DELETE /v1/counters/{table}/{key} ----------------------------------------------------------


@junk("delete_bad_query", "http")
async def delete_bad_query(ctx: Ctx, t: Target) -> Outcome:
    """Deletes of a counter the class raised first: without an op id or with an empty, long or
    control-character one (bad_op_id), junk attempt, age_ms or ts_ms, unknown parameters
    (bad_query), too old (410), bad names. Afterwards the counter has its value everywhere."""
    out = Outcome()
    cls = "delete_bad_query"
    found = await victim(ctx, t, out, cls)
    key = found[0] if found else ctx.junk_key(cls)
    path = counter_path(ctx, key, del_table(ctx))
    n = ctx.limits.max_op_id_bytes
    cases: list[tuple[str, str, tuple[int, ...], tuple[str, ...]]] = [
        ("no query", "", (400,), ("bad_op_id",)),
        ("attempt only", "?attempt=1", (400,), ("bad_op_id",)),
        ("op_id=", "?op_id=", (400,), ("bad_op_id",)),
        ("op_id=&attempt=1", "?op_id=&attempt=1", (400,), ("bad_op_id",)),
        ("op_id too long", f"?op_id={'x' * (n + 1)}", (400,), ("bad_op_id",)),
        ("op_id too many bytes", f"?op_id={'%C3%A9' * (n // 2 + 1)}", (400,), ("bad_op_id",)),
    ]
    for raw in ("a%00b", "a%0Ab", "a%0D%0A", "%09", "a%1Fb", "a%7Fb"):
        cases.append((f"op_id {raw}", f"?op_id={raw}", (400,), ("bad_op_id",)))
    for name, values in (("attempt", ("x", "0", "-1", "1.5", "", "9" * 20, "%D9%A1", "1e3",
                                      "%2B1", "%201", "0x1")),
                         ("age_ms", ("-1", "x", "1.0", "9" * 20, "%EF%BC%95", "")),
                         ("ts_ms", ("x", "-5", "9" * 20, "1.5e12"))):
        for v in values:
            cases.append((f"{name}={v[:20]}", f"?op_id={ctx.op_id(cls)}&{name}={v}", (400,),
                          (f"bad_{name}",)))
    for extra in ("foo=1", "delta=1", "op=delete", "consistency=all", "table=x", "OP_ID=x",
                  "op_id2=x"):
        cases.append((f"unknown {extra}", f"?op_id={ctx.op_id(cls)}&{extra}", (400,),
                      ("bad_query",)))
    cases += [("age_ms 10**12 (too old)", f"?op_id={ctx.op_id(cls)}&age_ms={10**12}", (410,),
               ("op_expired",)),
              ("ts_ms 1 (1970)", f"?op_id={ctx.op_id(cls)}&ts_ms=1", (410,), ("op_expired",))]
    for case, query, statuses, codes in cases:
        ans = await delete(ctx, t, path + query)
        out.requests += 1
        expect_reject(out, case, ans, statuses, codes)
    for name_case, bad_path in (
            ("key 'a b'", counter_path(ctx, "a%20b", del_table(ctx))),
            ("key 129 chars", counter_path(ctx, "k" * 129, del_table(ctx))),
            ("key %FF", counter_path(ctx, "%FF", del_table(ctx))),
            ("table 'a b'", counter_path(ctx, key, "a%20b")),
            ("table é", counter_path(ctx, key, "%C3%A9"))):
        ans = await delete(ctx, t, f"{bad_path}?op_id={ctx.op_id(cls)}")
        out.requests += 1
        expect_reject(out, name_case, ans, (400, 404), ("bad_key", "bad_table", "not_found"))
    await check_victim(ctx, out, found, "refused deletes")
    return out


# -- POST /v1/batch with deletes ----------------------------------------------------------------


@junk("batch_delete_malformed", "http")
async def batch_delete_malformed(ctx: Ctx, t: Target) -> Outcome:
    """Batches holding a valid delete of a counter the class raised first, and one bad op:
    a delete with a delta (bad_delta), an op kind other than add or delete (bad_op), a delete
    without an op id, with junk attempt or age_ms, of a bad key. Each batch is refused whole:
    afterwards the counter has its value everywhere and the junk counters read 0."""
    out = Outcome()
    cls = "batch_delete_malformed"
    found = await victim(ctx, t, out, cls)
    vkey = found[0] if found else ctx.junk_key(cls)

    def victim_delete() -> dict[str, Any]:
        return {"table": del_table(ctx), "key": vkey, "op_id": ctx.op_id(cls), "op": "delete"}

    def junk_add(i: int) -> dict[str, Any]:
        return {"table": ctx.table, "key": ctx.junk_key(cls, i), "op_id": ctx.op_id(cls),
                "delta": 1}

    def junk_delete(i: int, **change: Any) -> dict[str, Any]:
        return {"table": ctx.table, "key": ctx.junk_key(cls, i), "op_id": ctx.op_id(cls),
                "op": "delete", **change}

    bad: list[tuple[str, dict[str, Any], str]] = [
        ("the victim's delete with delta 1", {**victim_delete(), "delta": 1}, "bad_delta"),
        ("the victim's delete with delta 0", {**victim_delete(), "delta": 0}, "bad_delta"),
        ("the victim's delete with delta null", {**victim_delete(), "delta": None}, "bad_delta"),
        ("the victim's delete with delta -5", {**victim_delete(), "delta": -5}, "bad_delta"),
        ("a delete with delta '1'", junk_delete(0, delta="1"), "bad_delta"),
        ("op 'incr'", {**junk_add(1), "op": "incr"}, "bad_op"),
        ("op 'DELETE'", junk_delete(0, op="DELETE"), "bad_op"),
        ("op 'remove'", junk_delete(0, op="remove"), "bad_op"),
        ("op ''", {**junk_add(1), "op": ""}, "bad_op"),
        ("op null", {**junk_add(1), "op": None}, "bad_op"),
        ("op 1", {**junk_add(1), "op": 1}, "bad_op"),
        ("op ['delete']", junk_delete(0, op=["delete"]), "bad_op"),
        ("op {'delete': 1}", junk_delete(0, op={"delete": 1}), "bad_op"),
        ("op 'delete ' (space)", junk_delete(0, op="delete "), "bad_op"),
        ("a delete without op_id", {k: v for k, v in junk_delete(0).items() if k != "op_id"},
         "bad_op_id"),
        ("a delete with op_id ''", junk_delete(0, op_id=""), "bad_op_id"),
        ("a delete with a NUL op_id", junk_delete(0, op_id="a\x00b"), "bad_op_id"),
        ("a delete with attempt 0", junk_delete(0, attempt=0), "bad_attempt"),
        ("a delete with attempt '2'", junk_delete(0, attempt="2"), "bad_attempt"),
        ("a delete with age_ms -1", junk_delete(0, age_ms=-1), "bad_age_ms"),
        ("a delete of key 'a b'", junk_delete(0, key="a b"), "bad_key"),
        ("a delete of no table", {k: v for k, v in junk_delete(0).items() if k != "table"},
         "bad_table"),
        ("an add with delta '1'", {**junk_add(1), "delta": "1"}, "bad_delta"),
    ]
    for n, (case, op, code) in enumerate(bad):
        ops: list[Any] = [victim_delete(), junk_add(0), junk_add(1)]
        pos = (0, 1, 3)[n % 3]
        if "victim" in case:  # the bad op is the victim's own delete
            ops[0] = op
            pos = 0
        else:
            ops.insert(pos, op)
        as_msgpack = n % 4 == 3
        body = pack({"ops": ops}) if as_msgpack else jdump({"ops": ops})
        ctype = "application/msgpack" if as_msgpack else "application/json"
        ans = await post(ctx, t, "/v1/batch", body, ctype)
        out.requests += 1
        label = f"{case} at ops[{pos}]{' (msgpack)' if as_msgpack else ''}"
        expect_reject(out, label, ans, (400,), (code,))
        err = ans.error_obj()
        if err is not None and f"ops[{pos}]" not in err["message"]:
            out.fail("code", label, f"message does not name ops[{pos}]: {err['message']!r}")
    ans = await post(ctx, t, "/v1/batch", pack({"ops": [{**victim_delete(), "op": b"delete"}]}),
                     "application/msgpack")
    out.requests += 1
    expect_reject(out, "msgpack op as bin b'delete'", ans, (400,), ("bad_op",))
    await check_victim(ctx, out, found, "refused batches")
    return out


# -- PUT /v1/tables/{table} ---------------------------------------------------------------------


async def ttl_on(ctx: Ctx, out: Outcome, t: Target, table: str) -> Any:
    """``table``'s ttl_s in ``t``'s GET /v1/tables ("absent", or the answer's label)."""
    ans = await get(ctx, t, "/v1/tables")
    out.requests += 1
    listing = body_of(ans)
    rows = listing.get("tables") if isinstance(listing, dict) else None
    if not isinstance(rows, list):
        return ans.label
    return next((r.get("ttl_s") for r in rows
                 if isinstance(r, dict) and r.get("name") == table), "absent")


@junk("table_bad_settings", "http")
async def table_bad_settings(ctx: Ctx, t: Target) -> Outcome:
    """Table settings with a ttl that is not a number of seconds in [1 s, 10 years] (NaN,
    infinities, booleans, strings, 0.5, 10 years + 1 s, 2**64, lists: bad_ttl), bodies of the
    wrong shape, a valid ttl beside an unknown field (bad_body), bad table names. The class
    sets ``<table>_ttl``'s ttl first; afterwards GET /v1/tables still shows it."""
    out = Outcome()
    table = ttl_table(ctx)
    path = f"/v1/tables/{table}"
    ttl = ctx.rng.randrange(TEN_YEARS_S // 2, TEN_YEARS_S)
    ans = await put(ctx, t, path, jdump({"ttl_s": ttl}))
    out.requests += 1
    out.seen[f"setup: {ans.label}"] += 1
    got = body_of(ans)
    set_ok = ans.status == 200 and isinstance(got, dict) and got.get("ttl_s") == ttl
    if ans.status == 200 and not set_ok:
        out.fail("effect", "the class's own PUT", f"expected ttl_s {ttl}: {ans.describe()}")
    elif ans.status != 200:
        _setup_failed(out, "the class's own PUT", ans)
    other = 60 if ttl != 60 else 61  # valid on its own: what a refused body must not set
    cases: list[tuple[str, bytes, str, tuple[str, ...]]] = []
    for token in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "true", "false", '"60"',
                  '""', "0", "0.5", "-1", "-0.0", "4.9e-324", str(TEN_YEARS_S + 1),
                  f"{TEN_YEARS_S}.001", "1e300", str(1 << 64), "[60]", '{"s":60}',
                  "[[[[[[[[[[60]]]]]]]]]]"):
        cases.append((f"ttl_s {token[:20]}", b'{"ttl_s":' + token.encode() + b"}",
                      "application/json", ("bad_ttl", "too_deep")))
    shapes: list[Any] = [{}, {"ttl": other}, {"ttl_s": other, "x": 1}, {"TTL_S": other},
                         {"ttl_s": other, "name": table}, [other], other, "ttl_s", None,
                         {"tables": [{"name": table, "ttl_s": other}]}]
    cases += [(f"body {json.dumps(b)[:30]}", jdump(b), "application/json", ("bad_body",))
              for b in shapes]
    cases += [("not JSON", b'{"ttl_s": 6', "application/json", ("bad_body",)),
              ("empty", b"", "application/json", ("bad_body",)),
              ("5000-digit ttl", b'{"ttl_s":1' + b"0" * 5000 + b"}", "application/json",
               ("bad_body", "bad_ttl")),
              ("JSON sent as msgpack", jdump({"ttl_s": other}), "application/msgpack",
               ("bad_body",)),
              ("msgpack sent as JSON", pack({"ttl_s": other}), "application/json",
               ("bad_body",)),
              ("msgpack ttl_s 2**64-1", pack({"ttl_s": (1 << 64) - 1}), "application/msgpack",
               ("bad_ttl",)),
              ("msgpack ttl_s bin", pack({"ttl_s": b"60"}), "application/msgpack",
               ("bad_ttl",)),
              ("msgpack ttl_s ext", b"\x81\xa5ttl_s\xd4\x01\x01", "application/msgpack",
               ("bad_ttl",)),
              ("msgpack bin key", pack({b"ttl_s": other}), "application/msgpack",
               ("bad_body",)),
              ("msgpack nested 100000", b"\x81\xa5ttl_s" + b"\x91" * 100_000 + b"\xc0",
               "application/msgpack", ("too_deep", "bad_ttl", "bad_body"))]
    for case, body, ctype, codes in cases:
        if len(body) > ctx.limits.max_body_bytes:
            continue
        ans = await put(ctx, t, path, body, ctype)
        out.requests += 1
        expect_reject(out, case, ans, (400,), codes)
    for name in ("a%20b", "t" * 129, "%C3%A9", "a%00", "%FF"):
        ans = await put(ctx, t, f"/v1/tables/{name}", jdump({"ttl_s": other}))
        out.requests += 1
        expect_reject(out, f"table {name[:16]}", ans, (400, 404), ("bad_table", "not_found"))
    if set_ok:
        here = await ttl_on(ctx, out, t, table)
        if here != ttl:
            out.fail("effect", "ttl after the refused PUTs", f"set {ttl}, now reads {here!r}")
    return out
