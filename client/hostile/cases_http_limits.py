"""HTTP junk past the limits and around the body: oversized bodies and batches, batches with
one bad op or the wrong shape, optional fields out of range, exotic msgpack types, wrong
methods, unknown routes, bad consistency values and bad bearer tokens (4xx, nothing applied)."""

from __future__ import annotations

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
    post_each,
)
from client.hostile.outcome import Outcome, expect_reject
from client.hostile.registry import junk


def _big_op(ctx: Ctx, cls: str, size: int) -> bytes:
    head = jdump(ctx.op(cls))[:-1] + b',"pad":"'
    return head + b"a" * max(0, size - len(head) - 2) + b'"}'


@junk("oversized_body", "http")
async def oversized_body(ctx: Ctx, t: Target) -> Outcome:
    """A valid op padded past max_body_bytes, with Content-Length (413, nothing applied)."""
    out = Outcome()
    body = _big_op(ctx, "oversized_body", ctx.limits.max_body_bytes + 1)
    for case, path in (("single", counter_path(ctx, ctx.junk_key("oversized_body"))),
                       ("batch", "/v1/batch")):
        ans = await post(ctx, t, path, body)
        out.requests += 1
        expect_reject(out, f"{case} {len(body)} bytes", ans, (413,), ("body_too_large",))
    return out


@junk("oversized_body_chunked", "http")
async def oversized_body_chunked(ctx: Ctx, t: Target) -> Outcome:
    """A valid op padded past max_body_bytes, chunked (no length announced): 413."""
    out = Outcome()
    body = _big_op(ctx, "oversized_body_chunked", ctx.limits.max_body_bytes + 1)
    for case, path in (("single", counter_path(ctx, ctx.junk_key("oversized_body_chunked"))),
                       ("batch", "/v1/batch")):
        ans = await exchange(ctx, t, http_request(ctx, "POST", path, body, chunked=True))
        out.requests += 1
        expect_reject(out, f"{case} chunked {len(body)} bytes", ans, (413,), ("body_too_large",))
    return out


def _batch_op(ctx: Ctx, cls: str, i: int) -> dict[str, Any]:
    return {"table": ctx.table, "key": ctx.junk_key(cls, i), "op_id": ctx.op_id(cls), "delta": 1}


@junk("batch_too_large", "http")
async def batch_too_large(ctx: Ctx, t: Target) -> Outcome:
    """One op more than max_batch_ops, every op valid (400 batch_too_large, none applied)."""
    out = Outcome()
    ops = [_batch_op(ctx, "batch_too_large", i) for i in range(ctx.limits.max_batch_ops + 1)]
    for case, body, ctype in (("json", jdump({"ops": ops}), "application/json"),
                              ("msgpack", pack({"ops": ops}), "application/msgpack")):
        if len(body) > ctx.limits.max_body_bytes:
            out.notes.add("batch bigger than max_body_bytes: 413 accepted")
        ans = await post(ctx, t, "/v1/batch", body, ctype)
        out.requests += 1
        expect_reject(out, f"{case} {len(ops)} ops", ans, (400, 413),
                      ("batch_too_large", "body_too_large"))
    return out


@junk("batch_one_bad_op", "http")
async def batch_one_bad_op(ctx: Ctx, t: Target) -> Outcome:
    """Valid ops with one bad op first, in the middle or last: the whole batch is refused."""
    out = Outcome()
    bad_ops: list[tuple[str, Any, str]] = [
        ("delta 2**63", {"delta": 1 << 63}, "bad_delta"),
        ("delta '1'", {"delta": "1"}, "bad_delta"),
        ("delta 1.5", {"delta": 1.5}, "bad_delta"),
        ("op_id ''", {"op_id": ""}, "bad_op_id"),
        ("op_id too long", {"op_id": "x" * (ctx.limits.max_op_id_bytes + 1)}, "bad_op_id"),
        ("table 'a b'", {"table": "a b"}, "bad_table"),
        ("key 129 chars", {"key": "k" * 129}, "bad_key"),
        ("no key", {"key": None}, "bad_key"),
        ("attempt 0", {"attempt": 0}, "bad_attempt"),
        ("not an object", None, "bad_body"),
        ("too deep", {"pad": [[[[[[[[[[1]]]]]]]]]]}, "too_deep"),
    ]
    for n, (case, change, code) in enumerate(bad_ops):
        ops: list[Any] = [_batch_op(ctx, "batch_one_bad_op", i) for i in range(4)]
        pos = (0, 2, 3)[n % 3]
        if change is None:
            ops[pos] = [1, 2, 3]
        else:
            ops[pos] = {**ops[pos], **change}
            if ops[pos].get("key") is None:
                del ops[pos]["key"]
        ctype = "application/json" if n % 2 == 0 else "application/msgpack"
        body = jdump({"ops": ops}) if n % 2 == 0 else pack({"ops": ops})
        ans = await post(ctx, t, "/v1/batch", body, ctype)
        out.requests += 1
        expect_reject(out, f"{case} at ops[{pos}]", ans, (400,), (code,))
        err = ans.error_obj()
        if err is not None and f"ops[{pos}]" not in err["message"] and code != "too_deep":
            out.fail("code", f"{case} at ops[{pos}]", f"message does not name ops[{pos}]: "
                     f"{err['message']!r}")
    return out


@junk("batch_malformed", "http")
async def batch_malformed(ctx: Ctx, t: Target) -> Outcome:
    """Batch bodies of the wrong shape: ops missing, not a list, holding non-objects."""
    bodies: list[Any] = [{}, [], {"ops": {}}, {"ops": "x"}, {"ops": None}, {"ops": [1, 2]},
                         {"ops": [[ctx.table, "k", "x:1", 1]]}, {"op": []}, "ops", 5]
    cases = [(f"batch {json.dumps(b)[:30]}", jdump(b), "application/json") for b in bodies]
    return await post_each(ctx, t, Outcome(), "batch_malformed", cases, (400,),
                           ("bad_body",), path="/v1/batch")


@junk("bad_optional_fields", "http")
async def bad_optional_fields(ctx: Ctx, t: Target) -> Outcome:
    """attempt, age_ms and ts_ms out of range or of the wrong type; ops far too old (410)."""
    out = Outcome()
    changes: list[tuple[str, dict[str, Any], tuple[int, ...], str]] = [
        ("attempt 0", {"attempt": 0}, (400,), "bad_attempt"),
        ("attempt -1", {"attempt": -1}, (400,), "bad_attempt"),
        ("attempt '2'", {"attempt": "2"}, (400,), "bad_attempt"),
        ("attempt 1.5", {"attempt": 1.5}, (400,), "bad_attempt"),
        ("attempt 2**64", {"attempt": 1 << 64}, (400,), "bad_attempt"),
        ("attempt true", {"attempt": True}, (400,), "bad_attempt"),
        ("age_ms -1", {"age_ms": -1}, (400,), "bad_age_ms"),
        ("age_ms '5'", {"age_ms": "5"}, (400,), "bad_age_ms"),
        ("age_ms 2**63", {"age_ms": 1 << 63}, (400,), "bad_age_ms"),
        ("ts_ms -5", {"ts_ms": -5}, (400,), "bad_ts_ms"),
        ("ts_ms 'x'", {"ts_ms": "x"}, (400,), "bad_ts_ms"),
        ("ts_ms 1.5", {"ts_ms": 1.5}, (400,), "bad_ts_ms"),
        ("age_ms 10**12 (too old)", {"age_ms": 10**12}, (410,), "op_expired"),
        ("ts_ms 1 (1970)", {"ts_ms": 1}, (410,), "op_expired"),
    ]
    for i, (case, change, statuses, code) in enumerate(changes):
        body = jdump(ctx.op("bad_optional_fields", **change))
        ans = await post(ctx, t, counter_path(ctx, ctx.junk_key("bad_optional_fields", i)), body)
        out.requests += 1
        expect_reject(out, case, ans, statuses, (code,))
    return out


@junk("msgpack_exotic", "http")
async def msgpack_exotic(ctx: Ctx, t: Target) -> Outcome:
    """msgpack ext types, timestamps, float32, nil, bin values where ints and strings belong."""
    oid = pack(ctx.op_id("msgpack_exotic"))
    head = b"\x82\xa5op_id" + oid + b"\xa5delta"
    deltas = [("ext", b"\xc7\x03\x05abc"), ("fixext", b"\xd4\x01\x01"),
              ("timestamp", b"\xd6\xff\x00\x00\x00\x01"), ("float32", b"\xca\x3f\x80\x00\x00"),
              ("nil", b"\xc0"), ("bin", b"\xc4\x01\x01"), ("u64 max", b"\xcf" + b"\xff" * 8),
              ("str", b"\xa11"), ("map", b"\x80"), ("array", b"\x90")]
    cases = [(f"delta {name}", head + value, "application/msgpack") for name, value in deltas]
    cases.append(("op_id ext", b"\x82\xa5op_id\xd4\x01\x01\xa5delta\x01", "application/msgpack"))
    cases.append(("op_id nil", b"\x82\xa5op_id\xc0\xa5delta\x01", "application/msgpack"))
    cases.append(("nil map key", b"\x82\xc0\x01\xa5delta\x01", "application/msgpack"))
    cases.append(("float map key", b"\x81\xca\x3f\x80\x00\x00\x01", "application/msgpack"))
    return await post_each(ctx, t, Outcome(), "msgpack_exotic", cases, (400,),
                           ("bad_delta", "bad_op_id", "bad_body"))


@junk("wrong_methods", "http")
async def wrong_methods(ctx: Ctx, t: Target) -> Outcome:
    """PUT/PATCH/OPTIONS/TRACE on a counter, GET on /v1/batch and /v1/read, POST on
    /v1/health, writes to a scan or the table list, GET or POST on a table's settings."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("wrong_methods"))
    body = jdump(ctx.op("wrong_methods"))
    reqs = [(m, key) for m in ("PUT", "PATCH", "OPTIONS", "TRACE")]
    reqs += [("GET", "/v1/batch"), ("PUT", "/v1/batch"), ("DELETE", "/v1/batch"),
             ("POST", "/v1/health"), ("POST", "/metrics"), ("DELETE", "/v1/health"),
             ("POST", "/v1/openapi.json")]
    scan, settings = f"/v1/counters/{ctx.table}", f"/v1/tables/{ctx.table}_ttl"
    reqs += [("POST", scan), ("PUT", scan), ("DELETE", scan), ("GET", "/v1/read"),
             ("PUT", "/v1/read"), ("DELETE", "/v1/read"), ("POST", "/v1/tables"),
             ("PUT", "/v1/tables"), ("DELETE", "/v1/tables"), ("GET", settings),
             ("POST", settings), ("DELETE", settings), ("PATCH", settings)]
    for method, path in reqs:
        ans = await exchange(ctx, t, http_request(ctx, method, path, body))
        out.requests += 1
        expect_reject(out, f"{method} {path}", ans, (404, 405), ("not_found",
                                                                  "method_not_allowed"))
    return out


@junk("unknown_routes", "http")
async def unknown_routes(ctx: Ctx, t: Target) -> Outcome:
    """Routes that do not exist: /, /v2/..., one segment short or long, traversal, 4000 chars."""
    out = Outcome()
    paths = ["/", "/v2/counters/junk/k", f"/v1/counters/{ctx.table}/", "/v1/counters",
             f"/v1/counters/{ctx.table}/k/extra", "/admin", "/.env", "/v1/health/x",
             "/%2e%2e/%2e%2e/etc/passwd", "/v1/read/x", "/v1/tables/x/y", "/v1/tables/",
             "/" + "a" * 4000, "/v1//counters//junk//k", "/V1/HEALTH", "/v1/batch/"]
    for path in paths:
        for method in ("GET", "POST"):
            ans = await exchange(ctx, t, http_request(ctx, method, path,
                                                      jdump(ctx.op("unknown_routes"))
                                                      if method == "POST" else b""))
            out.requests += 1
            expect_reject(out, f"{method} {path[:40]}", ans, (404, 405), ("not_found",
                                                                          "method_not_allowed"))
    return out


@junk("bad_consistency", "http")
async def bad_consistency(ctx: Ctx, t: Target) -> Outcome:
    """Reads with consistency values that are not one/quorum/all, or junk query strings."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("bad_consistency"))
    for q in ("ALL", "", "none", "quorum%00", "all%20", "%FF", "ONE", "x" * 3000, "1",
              "bad&consistency=all", "all;one", "%E2%80%AE"):
        ans = await exchange(ctx, t, http_request(ctx, "GET", f"{key}?consistency={q}",
                                                  ctype=None))
        out.requests += 1
        expect_reject(out, f"consistency={q[:20]}", ans, (400,), ("bad_consistency",))
    return out


@junk("bad_token", "http", needs_token=True)
async def bad_token(ctx: Ctx, t: Target) -> Outcome:
    """Valid ops with no bearer token, a wrong one, a prefix or extension of the right one,
    Basic auth, or the token in the query string (401 unauthorized, nothing applied)."""
    out = Outcome()
    right = ctx.token or ""
    headers: list[tuple[str, list[str]]] = [
        ("no Authorization", []), ("wrong token", ["Authorization: Bearer " + "w" * 32]),
        ("prefix of the token", ["Authorization: Bearer " + right[:-1]]),
        ("token + extra", ["Authorization: Bearer " + right + "x"]),
        ("token twice", ["Authorization: Bearer " + right + right]),
        ("Basic auth", ["Authorization: Basic aG9zdGlsZTpob3N0aWxl"]),
        ("empty Bearer", ["Authorization: Bearer "]), ("Bearer only", ["Authorization: Bearer"]),
        ("Token scheme", ["Authorization: Token " + right]),
        ("X-Api-Key", ["X-Api-Key: " + right]),
        ("wrong first of two", ["Authorization: Bearer " + "w" * 32,
                                "Authorization: Bearer " + right]),
    ]
    for i, (case, hdrs) in enumerate(headers):
        key = ctx.junk_key("bad_token", i)
        data = http_request(ctx, "POST", counter_path(ctx, key), jdump(ctx.op("bad_token")),
                            headers=hdrs, token=False)
        ans = await exchange(ctx, t, data)
        out.requests += 1
        expect_reject(out, case, ans, (401,), ("unauthorized",))
    data = http_request(ctx, "POST", counter_path(ctx, ctx.junk_key("bad_token"))
                        + f"?token={right}&access_token={right}", jdump(ctx.op("bad_token")),
                        token=False)
    ans = await exchange(ctx, t, data)
    out.requests += 1
    expect_reject(out, "token in the query string", ans, (401,), ("unauthorized",))
    for path in (f"{counter_path(ctx, ctx.junk_key('bad_token'))}?consistency=all", "/metrics"):
        ans = await exchange(ctx, t, http_request(ctx, "GET", path, ctype=None, token=False))
        out.requests += 1
        expect_reject(out, f"GET {path[:30]} without token", ans, (401,), ("unauthorized",))
    return out
