"""HTTP junk in the body: not JSON or msgpack, the wrong content type, empty, numbers outside
signed 64-bit, deltas and op ids of the wrong type, invalid UTF-8, bad table and key names,
nesting past the limit. Each is refused with a 400 in the contract's error shape."""

from __future__ import annotations

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


@junk("invalid_json", "http")
async def invalid_json(ctx: Ctx, t: Target) -> Outcome:
    """Bodies that are not JSON, or JSON that is not an op object (400 bad_body)."""
    oid = ctx.op_id("invalid_json")
    bodies = [b"{nope", f'{{"op_id":"{oid}","delta":1'.encode(),
              f'{{"op_id":"{oid}","delta":1}}}}'.encode(),
              f'{{"op_id":"{oid}","delta":1}} trailing'.encode(),
              f"{{'op_id':'{oid}','delta':1}}".encode(), f'{{"op_id":"{oid}","delta":01}}'.encode(),
              f'{{"op_id":"{oid}","delta":1,}}'.encode(), b"[1,2]", b'"a string"', b"null",
              b"42", b"\x00\x01\x02\x03", b"{" * 3 + b"}" * 2]
    cases = [(f"json {b[:24]!r}", b, "application/json") for b in bodies]
    out = await post_each(ctx, t, Outcome(), "invalid_json", cases, (400,), ("bad_body",))
    ans = await post(ctx, t, "/v1/batch", b'{"ops": [', "application/json")
    out.requests += 1
    expect_reject(out, "batch {\"ops\": [", ans, (400,), ("bad_body",))
    return out


@junk("invalid_msgpack", "http")
async def invalid_msgpack(ctx: Ctx, t: Target) -> Outcome:
    """Bodies that are not msgpack, truncated, with trailing bytes or impossible lengths."""
    good = pack(ctx.op("invalid_msgpack"))
    bodies = [b"\xc1", b"\xc1\xc1\xc1", good[:-3], good + b"\x00", b"\x82\xa5op_id",
              b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
              b"\x81\x01\x02", pack([1, 2]), pack(None), b"\xd4"]
    cases = [(f"msgpack {b[:16]!r}", b, "application/msgpack") for b in bodies]
    out = await post_each(ctx, t, Outcome(), "invalid_msgpack", cases, (400,), ("bad_body",))
    ans = await post(ctx, t, "/v1/batch", b"\x81\xa3ops\xdc\xff", "application/msgpack")
    out.requests += 1
    expect_reject(out, "batch truncated", ans, (400,), ("bad_body",))
    return out


@junk("wrong_content_type", "http")
async def wrong_content_type(ctx: Ctx, t: Target) -> Outcome:
    """JSON sent as msgpack and msgpack sent as JSON (any type but msgpack means JSON)."""
    op = ctx.op("wrong_content_type")
    cases = [("json as application/msgpack", jdump(op), "application/msgpack"),
             ("json as application/x-msgpack", jdump(op), "application/x-msgpack"),
             ("msgpack as application/json", pack(op), "application/json"),
             ("msgpack as text/plain", pack(op), "text/plain"),
             ("msgpack, no content type", pack(op), "")]
    return await post_each(ctx, t, Outcome(), "wrong_content_type",
                           [(c, b, ct) for c, b, ct in cases], (400,), ("bad_body",))


@junk("empty_body", "http")
async def empty_body(ctx: Ctx, t: Target) -> Outcome:
    """Empty bodies, with Content-Length 0 or none, JSON and msgpack, single and batch."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("empty_body"))
    reqs = [("single CL 0", http_request(ctx, "POST", key, b"")),
            ("single msgpack CL 0", http_request(ctx, "POST", key, b"",
                                                 ctype="application/msgpack")),
            ("single no CL", http_request(ctx, "POST", key, b"", length=None).replace(
                b"Content-Length: 0\r\n", b"")),
            ("batch CL 0", http_request(ctx, "POST", "/v1/batch", b"")),
            ("single chunked empty", http_request(ctx, "POST", key, b"", chunked=True))]
    for case, data in reqs:
        ans = await exchange(ctx, t, data)
        out.requests += 1
        expect_reject(out, case, ans, (400,), ("bad_body",))
    return out


@junk("huge_numbers", "http")
async def huge_numbers(ctx: Ctx, t: Target) -> Outcome:
    """Deltas outside signed 64-bit, floats, NaN/Infinity tokens, bools, 5000-digit ints."""
    tokens = [str(1 << 63), str(-(1 << 63) - 1), str(1 << 64), "1" + "0" * 100,
              "-1" + "0" * 100, "1.5", "1.0", "1e2", "-0.0", "1e308", "1e400", "NaN",
              "Infinity", "-Infinity", "true", "false", "9" * 5000]
    cases = []
    for tok in tokens:
        oid = ctx.op_id("huge_numbers")
        cases.append((f"delta {tok[:24]}", f'{{"op_id":"{oid}","delta":{tok}}}'.encode(),
                      "application/json"))
    for value in ((1 << 64) - 1, 1 << 63, 1.0, float("nan"), float("inf"), True):
        cases.append((f"msgpack delta {value!r}",
                      pack({"op_id": ctx.op_id("huge_numbers"), "delta": value}),
                      "application/msgpack"))
    return await post_each(ctx, t, Outcome(), "huge_numbers", cases, (400,),
                           ("bad_delta", "bad_body"))


@junk("string_deltas", "http")
async def string_deltas(ctx: Ctx, t: Target) -> Outcome:
    """Deltas that are strings, null, lists or maps, or missing."""
    cases = []
    for value in ("1", "0x10", "", "1e3", " 1", "١", None, [], [1], {}, {"n": 1}):
        cases.append((f"delta {value!r}", jdump({"op_id": ctx.op_id("string_deltas"),
                                                  "delta": value}), "application/json"))
    cases.append(("no delta", jdump({"op_id": ctx.op_id("string_deltas")}), "application/json"))
    return await post_each(ctx, t, Outcome(), "string_deltas", cases, (400,), ("bad_delta",))


@junk("bad_op_ids", "http")
async def bad_op_ids(ctx: Ctx, t: Target) -> Outcome:
    """Op ids missing, empty, not strings, or longer than max_op_id_bytes (chars or bytes)."""
    n = ctx.limits.max_op_id_bytes
    values: list[Any] = ["", 5, None, [], {}, True, 1.5, "x" * (n + 1), "\U0001F600" * (n // 4 + 1),
                         "é" * (n // 2 + 1), "x" * 100_000 if ctx.limits.max_body_bytes > 200_000
                         else "x" * (n * 4)]
    cases = [(f"op_id {str(v)[:20]!r}", jdump({"op_id": v, "delta": 1}), "application/json")
             for v in values]
    cases.append(("no op_id", b'{"delta":1}', "application/json"))
    cases.append(("msgpack bin op_id", pack({"op_id": b"bytes:1", "delta": 1}),
                  "application/msgpack"))
    cases.append(("msgpack bin keys", pack({b"op_id": "k:1", b"delta": 1}),
                  "application/msgpack"))
    return await post_each(ctx, t, Outcome(), "bad_op_ids", cases, (400,), ("bad_op_id",))


@junk("bad_encodings", "http")
async def bad_encodings(ctx: Ctx, t: Target) -> Outcome:
    """Invalid UTF-8 in bodies: latin-1, overlong forms, encoded surrogates, cut sequences."""
    raw_ids = [b"\xff\xfe", b"caf\xe9", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80", b"\x80"]
    # (UTF-8-encoded surrogates, b"\xed\xa0\x80", are in op_id_lone_surrogate: Python's json
    # decodes bytes with surrogatepass, so in JSON they arrive as a lone surrogate)
    cases = [(f"json op_id {r!r}", b'{"op_id":"' + r + b'","delta":1}', "application/json")
             for r in raw_ids]
    cases += [(f"msgpack op_id {r!r}", b"\x82\xa5op_id" + bytes([0xa0 | len(r)]) + r
               + b"\xa5delta\x01", "application/msgpack") for r in (b"\xed\xa0\x80",)]
    cases += [(f"msgpack op_id {r!r}", b"\x82\xa5op_id" + bytes([0xa0 | len(r)]) + r
               + b"\xa5delta\x01", "application/msgpack") for r in raw_ids]
    cases.append(("json key not utf-8", b'{"op_\xff":"x:1","delta":1}', "application/json"))
    return await post_each(ctx, t, Outcome(), "bad_encodings", cases, (400,), ("bad_body",))


@junk("bad_names", "http")
async def bad_names(ctx: Ctx, t: Target) -> Outcome:
    """Table and key names with spaces, unicode, 129 chars, ..%2F traversal, NUL, %FF."""
    out = Outcome()
    good = ctx.junk_key("bad_names")
    long = "k" * 129
    keys = ["a%20b", "%C3%A9", long, "..%2F..%2Fmetrics", "..%2f..%2fv1%2fhealth", "a%00b",
            "%FF%FE", "a%09b", "a%2Fb", "a+b%0D%0A", "%E2%80%AE"]
    tables = ["bad%20table", "t" * 129, "%C3%A9", "..%2F.."]
    paths = [f"/v1/counters/{ctx.table}/{k}" for k in keys]
    paths += [f"/v1/counters/{tb}/{good}" for tb in tables]
    body = jdump(ctx.op("bad_names"))
    for p in paths:
        for method in ("POST", "GET"):
            ans = await exchange(ctx, t, http_request(ctx, method, p, body if method == "POST"
                                                      else b""))
            out.requests += 1
            expect_reject(out, f"{method} {p[:60]}", ans, (400, 404),
                          ("bad_table", "bad_key", "not_found"))
    for table, key in ((ctx.table, "a b"), (ctx.table, "é"), (ctx.table, long), ("", good),
                       ("t/../x", good), (ctx.table, "")):
        batch = {"ops": [{"table": table, "key": key, "op_id": ctx.op_id("bad_names"),
                          "delta": 1}]}
        ans = await post(ctx, t, "/v1/batch", jdump(batch))
        out.requests += 1
        expect_reject(out, f"batch table={table[:10]!r} key={key[:10]!r}", ans, (400,),
                      ("bad_table", "bad_key"))
    return out


def _nest_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _nest_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def _max_depth(ctx: Ctx) -> int:
    """The deepest nesting that fits in the body limit."""
    return max(16, min(100_000, (ctx.limits.max_body_bytes - 200) // 2))


@junk("deep_nesting_json", "http")
async def deep_nesting_json(ctx: Ctx, t: Target) -> Outcome:
    """JSON nested one past the limit, 64, 1000 and as deep as the body limit allows."""
    lim = ctx.limits.max_nesting_depth
    cases = []
    for depth in sorted({lim + 1, 64, 1000, _max_depth(ctx)}):
        nest = _nest_json(depth)
        oid = ctx.op_id("deep_nesting_json")
        cases.append((f"pad depth {depth}",
                      b'{"op_id":"' + oid.encode() + b'","delta":1,"pad":' + nest + b"}",
                      "application/json"))
        cases.append((f"delta depth {depth}",
                      b'{"op_id":"' + oid.encode() + b'","delta":' + nest + b"}",
                      "application/json"))
        cases.append((f"body depth {depth}", nest, "application/json"))
    out = await post_each(ctx, t, Outcome(), "deep_nesting_json", cases, (400,),
                          ("too_deep", "bad_body"))
    depth = lim + 1
    batch = (b'{"ops":[{"table":"' + ctx.table.encode() + b'","key":"'
             + ctx.junk_key("deep_nesting_json").encode() + b'","op_id":"'
             + ctx.op_id("deep_nesting_json").encode() + b'","delta":1,"pad":'
             + _nest_json(depth) + b"}]}")
    ans = await post(ctx, t, "/v1/batch", batch)
    out.requests += 1
    expect_reject(out, f"batch op pad depth {depth}", ans, (400,), ("too_deep",))
    ans = await post(ctx, t, "/v1/batch", b'{"ops":[],"x":' + _nest_json(_max_depth(ctx)) + b"}")
    out.requests += 1
    expect_reject(out, "batch side field deep", ans, (400,), ("too_deep",))
    return out


@junk("deep_nesting_msgpack", "http")
async def deep_nesting_msgpack(ctx: Ctx, t: Target) -> Outcome:
    """msgpack nested one past the limit, 64, 1000 and as deep as the body limit allows."""
    lim = ctx.limits.max_nesting_depth
    cases = []
    for depth in sorted({lim + 1, 64, 1000, min(_max_depth(ctx) * 2, 200_000)}):
        nest = _nest_msgpack(depth)
        oid = pack(ctx.op_id("deep_nesting_msgpack"))
        cases.append((f"pad depth {depth}", b"\x83\xa5op_id" + oid + b"\xa5delta\x01\xa3pad" + nest,
                      "application/msgpack"))
        cases.append((f"delta depth {depth}", b"\x82\xa5op_id" + oid + b"\xa5delta" + nest,
                      "application/msgpack"))
        cases.append((f"body depth {depth}", nest, "application/msgpack"))
        maps = min(depth, (ctx.limits.max_body_bytes - 200) // 3)
        cases.append((f"map depth {maps}", b"\x81\xa1a" * maps + b"\xc0", "application/msgpack"))
    return await post_each(ctx, t, Outcome(), "deep_nesting_msgpack", cases, (400,),
                           ("too_deep", "bad_body"))
