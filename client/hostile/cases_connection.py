"""HTTP junk at the connection level: oversized headers, bytes that are not HTTP, broken
framing, truncated, slow and stalled requests, too many connections from one address, and
connections that say nothing. The node answers 4xx or closes; nothing is applied."""

from __future__ import annotations

import asyncio

from client.hostile.context import Ctx, Part, Target
from client.hostile.http_client import (
    chunk_body,
    counter_path,
    exchange,
    http_request,
    jdump,
    keepalive_get,
)
from client.hostile.outcome import Outcome, expect_reject
from client.hostile.registry import junk
from cluster.transport.wire import MAGIC


@junk("headers_too_long", "conn")
async def headers_too_long(ctx: Ctx, t: Target) -> Outcome:
    """A 10 kB header value, a 10 kB header name, 200 headers, a 9 kB URL (400 or 431)."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("headers_too_long"))
    body = jdump(ctx.op("headers_too_long"))
    reqs = [("10 kB value", http_request(ctx, "POST", key, body, headers=["X-A: " + "a" * 10_000])),
            ("10 kB name", http_request(ctx, "POST", key, body, headers=["X" * 10_000 + ": a"])),
            ("200 headers", http_request(ctx, "POST", key, body,
                                         headers=[f"X-{i}: v" for i in range(200)])),
            ("9 kB url", http_request(ctx, "GET", key + "?q=" + "a" * 9_000, ctype=None))]
    for case, data in reqs:
        ans = await exchange(ctx, t, data)
        out.requests += 1
        expect_reject(out, case, ans, (400, 413, 414, 431), None, may_close=True)
    return out


@junk("garbage_bytes", "conn", closes=True)
async def garbage_bytes(ctx: Ctx, t: Target) -> Outcome:
    """Bytes that are not HTTP: random, a TLS ClientHello, an HTTP/2 preface, an SSH banner."""
    out = Outcome()
    rnd = bytes(ctx.rng.getrandbits(8) for _ in range(512))
    if rnd[:1] == b"\x00":
        rnd = b"\x01" + rnd[1:]
    blobs = [("random 512 bytes", rnd),
             ("TLS ClientHello", bytes.fromhex("16030100a5010000a10303") + rnd[:160]),
             ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
             ("SSH banner", b"SSH-2.0-OpenSSH_9.6\r\n"),
             ("blank lines", b"\r\n" * 64),
             ("NUL then junk", b"\x00\x01\x02\x03\x04\x05\x06\x07" * 8),
             ("request line only", b"GET\r\n\r\n"),
             ("binary request line", b"\x7f\xff\xfe /v1/health HTTP/1.1\r\n\r\n")]
    for case, data in blobs:
        ans = await exchange(ctx, t, data, read_timeout=ctx.limits.header_timeout + 3.0)
        out.requests += 1
        # blank lines are skipped by HTTP parsers: the node then waits for headers (408)
        expect_reject(out, case, ans, (400, 408), None, may_close=True)
    return out


@junk("malformed_framing", "conn", closes=True)
async def malformed_framing(ctx: Ctx, t: Target) -> Outcome:
    """Broken HTTP framing: CL with TE, bad chunk sizes, negative or overflowing CL, two CLs,
    bad method tokens, a raw non-UTF-8 path, NUL and obs-fold in headers, HTTP/9.9."""
    out = Outcome()
    tok = f"Authorization: Bearer {ctx.token}\r\n".encode() if ctx.token else b""
    key = counter_path(ctx, ctx.junk_key("malformed_framing")).encode()
    body = jdump(ctx.op("malformed_framing"))
    start = b"POST " + key + b" HTTP/1.1\r\nHost: h\r\n" + tok
    reqs = [
        ("CL and TE", start + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"
         % len(body) + chunk_body(body)),
        ("bad chunk size", start + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n" + body
         + b"\r\n0\r\n\r\n"),
        ("chunk size overflow", start + b"Transfer-Encoding: chunked\r\n\r\n"
         + b"f" * 40 + b"\r\n" + body + b"\r\n0\r\n\r\n"),
        ("negative CL", start + b"Content-Length: -1\r\n\r\n" + body),
        ("CL overflow", start + b"Content-Length: 99999999999999999999999\r\n\r\n" + body),
        ("two different CLs", start + b"Content-Length: %d\r\nContent-Length: 3\r\n\r\n"
         % len(body) + body),
        ("CL not a number", start + b"Content-Length: 1x\r\n\r\n" + body),
        ("TE gzip only", start + b"Transfer-Encoding: gzip\r\n\r\n" + body),
        ("method FOO", b"FOO " + key + b" HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("lowercase method", b"post " + key + b" HTTP/1.1\r\nHost: h\r\n" + tok
         + b"Content-Length: %d\r\n\r\n" % len(body) + body),
        ("raw non-UTF-8 path", b"GET /v1/counters/junk/\xff\xfe HTTP/1.1\r\nHost: h\r\n\r\n"),
        ("NUL in header", b"GET /v1/health HTTP/1.1\r\nHost: a\x00b\r\n\r\n"),
        ("space before colon", start + b"Content-Length : %d\r\n\r\n" % len(body) + body),
        ("obs-fold", start + b"X-A: a\r\n b\r\nContent-Length: %d\r\n\r\n" % len(body) + body),
        ("HTTP/9.9", b"GET /v1/health HTTP/9.9\r\nHost: h\r\n\r\n"),
    ]
    for case, data in reqs:
        ans = await exchange(ctx, t, data)
        out.requests += 1
        expect_reject(out, case, ans, (400, 405, 411, 413, 431), None, may_close=True)
    return out


@junk("truncated_requests", "conn", closes=True)
async def truncated_requests(ctx: Ctx, t: Target) -> Outcome:
    """Valid ops cut short: half the headers, headers only, Content-Length larger than what is
    sent; then close (or half-close and listen). Nothing may be applied."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("truncated_requests"))
    body = jdump(ctx.op("truncated_requests"))
    full = http_request(ctx, "POST", key, body, length=len(body) + 50)
    head_end = full.index(b"\r\n\r\n") + 4
    cuts = [("half the headers", full[:head_end // 2]), ("headers only", full[:head_end]),
            ("CL larger than the body", full), ("half the body", full[:head_end + len(body) // 2])]
    for case, data in cuts:
        for half in (False, True):
            ans = await exchange(ctx, t, [data, 0.05], read_timeout=0.3 if not half else
                                 ctx.limits.body_timeout + 3.0, half_close=half)
            out.requests += 1
            if half:  # the node saw EOF: it may answer 400, or just close
                expect_reject(out, case + " + half-close", ans, (400, 408), None, may_close=True)
            elif ans.status is not None:  # nothing is owed, but what comes must be right
                expect_reject(out, case, ans, (400, 408), None)
            else:
                out.seen["closed by us"] += 1
    return out


@junk("slowloris", "conn", refused=("header_timeout",))
async def slowloris(ctx: Ctx, t: Target) -> Outcome:
    """A valid op's headers trickled a few bytes at a time: 408 request_timeout and close after
    header_timeout, nothing applied."""
    out = Outcome()
    data = http_request(ctx, "POST", counter_path(ctx, ctx.junk_key("slowloris")),
                        jdump(ctx.op("slowloris")))
    ht = ctx.limits.header_timeout
    step = max(0.05, min(0.5, ht / 8))
    parts: list[Part] = []
    for i in range(0, len(data), 3):
        parts += [data[i:i + 3], step]
    ans = await exchange(ctx, t, parts, read_timeout=ht + 5.0)
    out.requests += 1
    expect_reject(out, "headers trickled", ans, (408,), ("request_timeout",))
    if ans.status == 408 and not (ht * 0.8 <= ans.elapsed <= ht + 5.0):
        out.fail("timeout", "headers trickled", f"408 after {ans.elapsed:.2f}s, "
                 f"header_timeout is {ht:g}s")
    if ans.status == 408 and ans.end != "closed":
        out.fail("open", "headers trickled", "connection not closed after the 408")
    return out


@junk("slow_body", "conn")
async def slow_body(ctx: Ctx, t: Target) -> Outcome:
    """A valid op whose body trickles, or stalls half way: 408 and close after body_timeout,
    nothing applied."""
    out = Outcome()
    bt = ctx.limits.body_timeout
    for case in ("trickled", "stalled"):
        body = jdump(ctx.op("slow_body"))
        data = http_request(ctx, "POST", counter_path(ctx, ctx.junk_key("slow_body")), body)
        head = data[:len(data) - len(body)]
        parts: list[Part] = [head]
        if case == "trickled":
            step = max(0.05, min(0.5, bt / 6))
            for i in range(len(body) - 1):
                parts += [body[i:i + 1], step]
        else:
            parts += [body[:len(body) // 2], bt + 5.0]
        ans = await exchange(ctx, t, parts, read_timeout=bt + 5.0, until_answer=True)
        out.requests += 1
        expect_reject(out, f"body {case}", ans, (408,), ("request_timeout",))
        if ans.status == 408 and not (bt * 0.8 <= ans.elapsed <= bt + 5.0):
            out.fail("timeout", f"body {case}", f"408 after {ans.elapsed:.2f}s, body_timeout "
                     f"is {bt:g}s")
    return out


@junk("slow_body_close", "conn")
async def slow_body_close(ctx: Ctx, t: Target) -> Outcome:
    """After a body's 408 the node closes the connection (body_timeout + 3 s at most), whether
    the sender stalls half way or keeps trickling: it does not keep reading the rest."""
    out = Outcome()
    bt = ctx.limits.body_timeout
    for case in ("stalled half way", "trickling on"):
        body = jdump(ctx.op("slow_body_close"))
        data = http_request(ctx, "POST", counter_path(ctx, ctx.junk_key("slow_body_close")),
                            body)
        parts: list[Part] = [data[:len(data) - len(body)]]
        if case == "stalled half way":
            parts += [body[:len(body) // 2], bt + 30.0]
        else:
            step = max(0.05, min(0.5, bt / 6))
            for i in range(len(body) - 1):
                parts += [body[i:i + 1], step]
        ans = await exchange(ctx, t, parts, read_timeout=bt + 3.0)
        out.requests += 1
        expect_reject(out, case, ans, (408,), ("request_timeout",))
        # "reset": the node closed while bytes were still coming (trickling on), as it should
        if ans.end not in ("closed", "reset") or ans.elapsed > bt + 3.0:
            out.fail("open", case, f"connection {ans.end} only {ans.elapsed:.1f}s after it "
                     f"opened (body_timeout {bt:g}s)")
    return out


@junk("too_many_connections", "conn", refused=("too_many_connections",))
async def too_many_connections(ctx: Ctx, t: Target) -> Outcome:
    """max_connections_per_client + 3 connections held open from one address: the excess get
    429 too_many_connections and are closed; once released, a new connection is served."""
    out = Outcome()
    cap, extra = ctx.limits.max_connections_per_client, 3
    source = ctx.cap_source
    writers: list[asyncio.StreamWriter] = []
    n429 = 0
    try:
        for i in range(cap + extra):
            ans, writer = await keepalive_get(ctx, t, source)
            out.requests += 1
            if writer is not None:
                writers.append(writer)
            if ans.status == 429:
                n429 += 1
                expect_reject(out, f"connection {i + 1}", ans, (429,), ("too_many_connections",))
                if ans.end == "open":
                    out.fail("open", f"connection {i + 1}", "not closed after the 429")
            elif ans.status == 200:
                out.seen["200"] += 1
            else:
                expect_reject(out, f"connection {i + 1}", ans, (200, 429))
    finally:
        for w in writers:
            w.close()
    if n429 < extra:
        out.fail("status", f"{cap + extra} connections", f"only {n429} got 429 (cap {cap})")
    if source is not None and n429 > extra:
        out.notes.add(f"{n429} 429s for {extra} connections over the cap (others were open)")
    for _ in range(20):  # the node releases the slots when it sees the closes
        await asyncio.sleep(0.1)
        ans, writer = await keepalive_get(ctx, t, source)
        out.requests += 1
        if writer is not None:
            writer.close()
        if ans.status == 200:
            out.seen["200 after release"] += 1
            break
    else:
        out.fail("status", "after release", f"no new connection served: {ans.describe()}")
    return out


@junk("idle_connection", "conn", closes=True)
async def idle_connection(ctx: Ctx, t: Target) -> Outcome:
    """Connect and say nothing: the node closes within min(10 s, header_timeout), no answer."""
    out = Outcome()
    limit = min(10.0, ctx.limits.header_timeout)
    ans = await exchange(ctx, t, [], read_timeout=limit + 3.0)
    out.requests += 1
    out.seen[ans.label] += 1
    if ans.end == "open" or ans.status is not None:
        out.fail("open", "silent connection", f"not closed within {limit + 3.0:g}s: "
                 f"{ans.describe()}")
    ans = await exchange(ctx, t, [MAGIC[:3]], read_timeout=limit + 3.0)
    out.requests += 1
    out.seen[ans.label] += 1
    if ans.end == "open" or ans.status is not None:
        out.fail("open", "half of MAGIC then silence", f"not closed within {limit + 3.0:g}s")
    return out
