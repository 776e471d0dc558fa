"""The junk classes that found node bugs when they were written (all fixed since; see
``tests/test_hostile.py``): a lone-surrogate op id, alone and in a batch's fast path, a
non-UTF-8 bearer token, counters pushed past 2**64, a peer connection without a HELLO, a scan
``limit`` of digits that are not ASCII (500), a delete's op id that is not UTF-8 once
percent-decoded (applied under U+FFFD), a delete sent as the body of the add route (applied),
and scan cursors written otherwise than a scan hands them out (taken).

``client.hostile.cases`` imports this module last, so these classes keep their place at the
end of the registry."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from client.hostile.cases_http_routes import (
    check_victim,
    cursor,
    del_table,
    delete,
    get,
    victim,
)
from client.hostile.context import INT64_MAX, Ctx, Target
from client.hostile.http_client import counter_path, exchange, http_request, jdump, pack, post
from client.hostile.outcome import Outcome, expect_reject
from client.hostile.peer_client import expect_closed, peer_exchange
from client.hostile.registry import junk
from cluster.transport.wire import HEADER, MAGIC


@junk("op_id_lone_surrogate", "http")
async def op_id_lone_surrogate(ctx: Ctx, t: Target) -> Outcome:
    """An op id that is a JSON-escaped lone surrogate ("\\ud800"): not encodable as UTF-8, so
    it must be refused with 400 bad_op_id (single op and batch)."""
    out = Outcome()
    key = ctx.junk_key("op_id_lone_surrogate")
    cases = [("single", counter_path(ctx, key), b'{"op_id":"\\ud800","delta":1}'),
             ("single, in the middle", counter_path(ctx, key),
              b'{"op_id":"a\\udfffb:1","delta":1}'),
             ("single, UTF-8-encoded surrogate bytes", counter_path(ctx, key),
              b'{"op_id":"\xed\xa0\x80","delta":1}'),
             ("batch, with attempt", "/v1/batch",
              b'{"ops":[{"table":"' + ctx.table.encode() + b'","key":"' + key.encode()
              + b'","op_id":"\\ud800","delta":1,"attempt":1}]}')]
    for case, path, body in cases:
        ans = await post(ctx, t, path, body)
        out.requests += 1
        expect_reject(out, case, ans, (400,), ("bad_op_id",))
    return out


def _led_by(ctx: Ctx, node_id: str, table: str, prefix: str) -> str:
    """A key of ``table`` whose leader is ``node_id`` (from the ring, as the nodes compute it)."""
    for i in range(10_000):
        key = f"{prefix}-{i}"
        if ctx.ring is None or ctx.ring.leader(table, key) == node_id:
            return key
    return f"{prefix}-0"


async def _read_everywhere(ctx: Ctx, out: Outcome, table: str, key: str) -> dict[str, Any]:
    """The key's value read from every node at consistency=all (the answer's label where the
    body holds no value)."""
    values = {}
    for x in ctx.targets:
        read = await exchange(ctx, x, http_request(
            ctx, "GET", counter_path(ctx, key, table) + "?consistency=all", ctype=None))
        out.requests += 1
        try:
            values[x.node_id] = json.loads(read.body)["value"]
        except (ValueError, KeyError, TypeError):
            values[x.node_id] = read.label
    return values


@junk("batch_surrogate_fast_path", "http")
async def batch_surrogate_fast_path(ctx: Ctx, t: Target) -> Outcome:
    """A batch of two 4-field ops led by the node it is sent to: a valid one (victim) in one
    table and one whose op id is a lone surrogate in another. The batch must be refused whole
    (400); afterwards the victim op, sent alone, must be applied (not taken as a duplicate)."""
    out = Outcome()
    cls = "batch_surrogate_fast_path"
    victim_table, bad_table = ctx.table + "_v", ctx.table + "_x"
    victim_key = _led_by(ctx, t.node_id, victim_table,
                         f"{ctx.run_id}-{cls}-v{ctx.rng.randrange(10**6)}")
    bad_key = _led_by(ctx, t.node_id, bad_table, f"{ctx.run_id}-{cls}-b")
    # names the node has checked once take the batch's fast path
    for table, key in ((victim_table, victim_key), (bad_table, bad_key)):
        await exchange(ctx, t, http_request(ctx, "GET", counter_path(ctx, key, table) +
                                            "?consistency=one", ctype=None))
        out.requests += 1
    victim = ctx.op_id(cls)
    body = jdump({"ops": [
        {"table": victim_table, "key": victim_key, "op_id": victim, "delta": 1},
        {"table": bad_table, "key": bad_key, "op_id": "SURROGATE", "delta": 1}]}).replace(
        b'"SURROGATE"', b'"\\ud800"')
    ans = await post(ctx, t, "/v1/batch", body)
    out.requests += 1
    expect_reject(out, "batch with a surrogate op id", ans, (400,), ("bad_op_id",))
    ans = await post(ctx, t, counter_path(ctx, victim_key, victim_table),
                     jdump({"op_id": victim, "delta": 1}))
    out.requests += 1
    out.seen[f"victim alone: {ans.label}"] += 1
    try:
        result = json.loads(ans.body) if ans.status == 200 else None
    except ValueError:
        result = None
    if ans.status != 200 or not isinstance(result, dict) or result.get("applied") is not True:
        out.fail("effect", "victim op sent alone afterwards",
                 f"expected applied:true (the refused batch must not have recorded it): "
                 f"{ans.describe()}")
    if ans.status == 200:  # acknowledged (applied or "duplicate"): it must count, once
        values = await _read_everywhere(ctx, out, victim_table, victim_key)
        if any(v != 1 for v in values.values()):
            out.fail("effect", "victim's counter", f"the acknowledged op reads {values}")
    return out


@junk("non_utf8_token", "http", needs_token=True)
async def non_utf8_token(ctx: Ctx, t: Target) -> Outcome:
    """Authorization headers with bytes that are not UTF-8 (401 unauthorized expected)."""
    out = Outcome()
    for case, value in (("0xff 0xfe", b"\xff\xfe\xfd"), ("latin-1 e-acute", b"caf\xe9"),
                        ("token + 0xff", (ctx.token or "").encode() + b"\xff")):
        data = http_request(ctx, "POST", counter_path(ctx, ctx.junk_key("non_utf8_token")),
                            jdump(ctx.op("non_utf8_token")),
                            headers=[b"Authorization: Bearer " + value], token=False)
        ans = await exchange(ctx, t, data)
        out.requests += 1
        expect_reject(out, case, ans, (401,), ("unauthorized",))
    return out


@junk("counter_overflow", "http")
async def counter_overflow(ctx: Ctx, t: Target) -> Outcome:
    """Valid ops of delta 2**63-1 on one fresh key until its total passes 2**64: every answer
    is 200 or a 4xx in the contract's shape, and the value read from every node equals the sum
    of the acknowledged deltas."""
    out = Outcome()
    table = ctx.table + "_ovf"
    key = f"{ctx.run_id}-ovf-{ctx.rng.randrange(10**9)}"
    acked = 0
    for i in range(4):
        ans = await post(ctx, t, counter_path(ctx, key, table),
                         jdump({"op_id": ctx.op_id("counter_overflow"), "delta": INT64_MAX}))
        out.requests += 1
        if ans.status == 200:
            out.seen["200"] += 1
            acked += INT64_MAX
        else:
            expect_reject(out, f"add {i + 1} of 2**63-1", ans, (400, 409, 422), None)
    values = {}
    for x in ctx.targets:
        ans = await exchange(ctx, x, http_request(ctx, "GET", counter_path(ctx, key, table)
                                                  + "?consistency=all", ctype=None))
        out.requests += 1
        try:
            values[x.node_id] = json.loads(ans.body)["value"] if ans.status == 200 else ans.label
        except (ValueError, KeyError, TypeError):
            values[x.node_id] = ans.label
    if any(v != acked for v in values.values()):
        out.fail("effect", "value after the adds", f"acknowledged {acked}, read {values}")
    return out


@junk("peer_idle_no_hello", "peer")
async def peer_idle_no_hello(ctx: Ctx, t: Target) -> Outcome:
    """MAGIC and then nothing (or half a frame header): an unauthenticated peer connection
    must not be held open longer than a silent HTTP one (min(10 s, header_timeout))."""
    out = Outcome()
    limit = min(10.0, ctx.limits.header_timeout) + 2.0
    answers = await asyncio.gather(
        peer_exchange(ctx, t, MAGIC, read_timeout=limit),
        peer_exchange(ctx, t, MAGIC + b"\x00\x00", read_timeout=limit),
        peer_exchange(ctx, t, MAGIC + HEADER.pack(100, 1) + b"\x93", read_timeout=limit))
    for case, ans in zip(("MAGIC only", "MAGIC + 2 bytes", "MAGIC + partial frame"), answers,
                         strict=True):
        out.requests += 1
        expect_closed(out, case, ans)
    return out


@junk("scan_limit_not_ascii", "http")
async def scan_limit_not_ascii(ctx: Ctx, t: Target) -> Outcome:
    """Scan limits of digits that are not ASCII ("²", "①": str.isdigit() takes them and int()
    does not: 500; "١٠", "５": taken as 10 and 5), or 5000 digits long (past int()'s 4300-digit
    limit: 500). Each must be 400 bad_limit."""
    out = Outcome()
    for case, q in (("superscript two", "%C2%B2"), ("circled one", "%E2%91%A0"),
                    ("arabic-indic 10", "%D9%A1%D9%A0"), ("fullwidth 5", "%EF%BC%95"),
                    ("devanagari 7", "%E0%A5%AD"), ("5000 digits", "9" * 5000),
                    ("4400 zeros and a 1", "0" * 4400 + "1")):
        ans = await get(ctx, t, f"/v1/counters/{ctx.table}?limit={q}")
        out.requests += 1
        expect_reject(out, f"limit: {case}", ans, (400,), ("bad_limit",))
    return out


@junk("delete_op_id_not_utf8", "http")
async def delete_op_id_not_utf8(ctx: Ctx, t: Target) -> Outcome:
    """Deletes whose op id is percent-escaped bytes that are not UTF-8 (%FF, %FE, a cut
    sequence, an encoded surrogate, an overlong form): the query's decoding makes each
    U+FFFD, so they were applied as one op id. Each must be 400 bad_op_id, and the counter
    the class raised first keeps its value."""
    out = Outcome()
    cls = "delete_op_id_not_utf8"
    found = await victim(ctx, t, out, cls)
    key = found[0] if found else ctx.junk_key(cls)
    path = counter_path(ctx, key, del_table(ctx))
    for raw in ("%FF", "%FE", f"{ctx.run_id}%C3", "%ED%A0%80", "%C0%AF", "a%80b"):
        ans = await delete(ctx, t, f"{path}?op_id={raw}")
        out.requests += 1
        expect_reject(out, f"op_id={raw}", ans, (400,), ("bad_op_id",))
    await check_victim(ctx, out, found, "deletes with op ids not UTF-8")
    return out


@junk("post_body_delete", "http")
async def post_body_delete(ctx: Ctx, t: Target) -> Outcome:
    """``{"op_id", "op": "delete"}`` as the body of POST /v1/counters/{table}/{key}, whose op
    is an add (delta required): it deleted the counter. Must be 400, the counter the class
    raised first keeping its value."""
    out = Outcome()
    cls = "post_body_delete"
    found = await victim(ctx, t, out, cls)
    key = found[0] if found else ctx.junk_key(cls)
    path = counter_path(ctx, key, del_table(ctx))
    for case, body, ctype in (
            ("json", jdump({"op_id": ctx.op_id(cls), "op": "delete"}), "application/json"),
            ("msgpack", pack({"op_id": ctx.op_id(cls), "op": "delete"}), "application/msgpack"),
            ("with attempt", jdump({"op_id": ctx.op_id(cls), "op": "delete", "attempt": 2}),
             "application/json"),
            ("with a delta", jdump({"op_id": ctx.op_id(cls), "op": "delete", "delta": 1}),
             "application/json")):
        ans = await post(ctx, t, path, body, ctype)
        out.requests += 1
        expect_reject(out, case, ans, (400,), ("bad_op", "bad_delta"))
    await check_victim(ctx, out, found, "delete bodies on the add route")
    return out


@junk("scan_cursor_not_canonical", "http")
async def scan_cursor_not_canonical(ctx: Ctx, t: Target) -> Outcome:
    """Cursors naming a real position but not written as a scan hands them out: a leaf with a
    space, a sign, a leading zero, an underscore or non-ASCII digits, base64 with padding or
    characters outside its alphabet, which the decoder skips (int() and b64decode took them
    all). 400 bad_cursor."""
    out = Outcome()
    good = cursor("1:5:k")
    for case, value in (("leaf ' 5'", cursor("1: 5:k")), ("leaf '+5'", cursor("1:+5:k")),
                        ("leaf '05'", cursor("1:05:k")), ("leaf '0_5'", cursor("1:0_5:k")),
                        ("leaf arabic-indic 5", cursor("1:\u0665:k")),
                        ("leaf '5 '", cursor("1:5 :k")), ("padding", good + "=="),
                        ("junk characters", good + "!!"),
                        ("a dot inside", f"{good[:3]}.{good[3:]}"),
                        ("a space inside", f"{good[:3]}%20{good[3:]}"),
                        ("a newline at the end", f"{good}%0A")):
        ans = await get(ctx, t, f"/v1/counters/{ctx.table}?limit=1&after={value}")
        out.requests += 1
        expect_reject(out, f"cursor: {case}", ans, (400,), ("bad_cursor",))
    return out
