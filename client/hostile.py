"""Hostile clients: many classes of junk thrown at live nodes while a well-behaved client counts.

    python -m client.hostile --nodes http://127.0.0.1:7101,http://127.0.0.1:7102 \\
        --secret-file DATA/cluster.secret --token-file TOKENS --duration 30 --out hostile.json

Every junk class is a small async function in ``REGISTRY`` that takes the run's context and one
target node and returns an ``Outcome``: how many requests or connections it sent, what came back
(HTTP statuses, "closed", "open", peer "reply" frames ...) and every broken expectation. The
classes speak raw HTTP/1.1 and the raw peer protocol over asyncio streams, so nothing between
them and the node tidies the junk up.

While the junk runs (in rounds, each class once per round, at most ``--concurrency`` at a time),
a ``CounterClient`` adds small deltas to a few keys of the ``good`` table, with unique op ids and
retries under the same id. At the end the runner checks, from every node at consistency=all:

* the good keys: each equals the sum of the acknowledged adds, plus some subset of the adds
  whose outcome is unknown (``client.checker.reachable_sums``; with none unknown: exact);
* the junk keys (table ``junk``): every one reads 0 (the valid ops carried by refused,
  truncated, slow or unauthorised requests, and the forged peer frames, changed nothing);
* every node answers ``/v1/health`` with status ok;
* ``/metrics``: ``idc_peer_auth_rejected_total`` and ``idc_http_refused_total`` by reason
  (deltas over the run), and each reason the classes that ran should raise went up.

What a class expects: an HTTP junk request gets a 4xx in the contract's shape
``{"error": {"code", "message"}}`` (JSON or msgpack), never a 5xx. The node may instead just
close the connection where no HTTP answer is possible or owed: requests the sender truncates,
connections that never say anything, bytes that are not HTTP at all (``closes=True`` in the
registry). Forged or replayed peer traffic gets the connection closed with no reply frame.

Bounded: ``--duration`` caps the junk (no round starts after it), every class call has its own
timeout, ``--max-requests`` caps the junk requests, and the good client stops with the junk.

The last classes of the registry found node bugs when they were written (all fixed since; see
``tests/test_hostile.py``). ``counter_overflow`` writes two valid ops of 2**63-1 to a key of
its own table (``<table>_ovf``) before the ones the node must refuse.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import random
import re
import secrets
import socket
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgpack

from client.checker import distance, reachable_sums
from client.config import normalize_url
from client.errors import (
    ClientError,
    NotAppliedError,
    OutcomeUnknownError,
    RejectedError,
)
from client.sdk import CounterClient
from cluster.auth import PeerAuth, Signer, Verifier
from cluster.ring import Ring
from cluster.wire import HEADER, MAGIC, MAX_HELLO_BYTES, PROTOCOL_VERSION, FrameDecoder, Kind
from cluster.wire import encode_frame as _encode_frame

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
_pack = msgpack.Packer(use_bin_type=True).pack

# ------------------------------------------------------------------------------------------
# the run's context
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """The limits the nodes were started with (the node's defaults unless told)."""

    max_body_bytes: int = 4 << 20
    max_batch_ops: int = 10_000
    max_op_id_bytes: int = 256
    max_nesting_depth: int = 8
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_connections_per_client: int = 256
    peer_auth_skew: float = 30.0


@dataclass(frozen=True)
class Target:
    url: str
    host: str
    port: int
    node_id: str


class BudgetExhausted(Exception):
    """``--max-requests`` junk requests have been sent."""


class Ctx:
    """What every junk class gets: the targets, credentials, limits and the junk keys used."""

    def __init__(self, targets: Sequence[Target], *, limits: Limits, token: str | None,
                 secret: bytes | None, token_required: bool, run_id: str, table: str,
                 good_table: str, good_keys: Sequence[str], ring: Ring | None,
                 source: str | None, cap_source: str | None, max_requests: int,
                 rng: random.Random) -> None:
        self.targets = list(targets)
        self.limits = limits
        self.token = token
        self.secret = secret
        self.token_required = token_required
        self.run_id = run_id
        self.table = table
        self.good_table = good_table
        self.good_keys = list(good_keys)
        self.ring = ring
        self.source = source
        self.cap_source = cap_source
        self.max_requests = max_requests
        self.rng = rng
        self.requests = 0
        self.junk_keys: set[str] = set()  # keys of ``table`` that must read 0 at the end
        self._seq = itertools.count(1)

    # -- accounting ------------------------------------------------------------------------

    def count(self, n: int = 1) -> None:
        if self.requests + n > self.max_requests:
            raise BudgetExhausted(f"{self.max_requests} junk requests sent")
        self.requests += n

    def junk_key(self, cls: str, i: int = 0) -> str:
        """A key of the junk table that must stay 0 (two per class and variant at most)."""
        key = f"{self.run_id}-{cls}-{i % 2}"[:128]
        self.junk_keys.add(key)
        return key

    def op_id(self, cls: str) -> str:
        return f"{self.run_id}-{cls}:{next(self._seq)}"

    def op(self, cls: str, **extra: Any) -> dict[str, Any]:
        """A well-formed op body (the junk goes in ``extra``)."""
        return {"op_id": self.op_id(cls), "delta": 1, **extra}

    @property
    def class_timeout(self) -> float:
        lim = self.limits
        return max(lim.header_timeout, lim.body_timeout) + 15.0

    @property
    def read_timeout(self) -> float:
        """How long an answer to a complete request may take under load."""
        return 5.0


# ------------------------------------------------------------------------------------------
# what came back
# ------------------------------------------------------------------------------------------


@dataclass
class Failure:
    kind: str  # 5xx, shape, status, code, open, reply, effect, connect, timeout
    case: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.case}: {self.detail}"


@dataclass
class Outcome:
    """One class's tally (summed over rounds by the runner)."""

    requests: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    skipped: str = ""
    notes: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def fail(self, kind: str, case: str, detail: str) -> None:
        self.failure_kinds[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(Failure(kind, case, detail))

    def merge(self, other: Outcome) -> None:
        self.requests += other.requests
        self.seen.update(other.seen)
        self.failure_kinds.update(other.failure_kinds)
        room = 20 - len(self.failures)
        if room > 0:
            self.failures.extend(other.failures[:room])
        self.skipped = other.skipped or self.skipped
        self.notes |= other.notes
        self.seconds += other.seconds

    @property
    def ok(self) -> bool:
        return not self.failure_kinds

    def verdict(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        if self.ok:
            return "ok"
        return "FAIL " + ",".join(f"{k}x{n}" for k, n in sorted(self.failure_kinds.items()))


@dataclass
class Answer:
    """One raw HTTP exchange: the first response, if any, and how the connection ended."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    end: str = "closed"  # closed (EOF from the node), open (still open at our deadline), reset
    elapsed: float = 0.0
    error: str = ""

    @property
    def label(self) -> str:
        if self.status is not None:
            return str(self.status)
        return self.error or self.end

    @property
    def ctype(self) -> str:
        return self.headers.get("content-type", "")

    def error_obj(self) -> dict[str, Any] | None:
        """The ``error`` object when the body has the contract's error shape, else None."""
        return error_shape(self.ctype, self.body)

    @property
    def code(self) -> str | None:
        err = self.error_obj()
        return err["code"] if err else None

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.label}) after {self.elapsed:.2f}s"
        text = self.body[:120].decode("utf-8", "replace").replace("\n", " ")
        return f"{self.status} {self.ctype or '-'} {text!r}"


def error_shape(ctype: str, body: bytes) -> dict[str, Any] | None:
    try:
        if "msgpack" in ctype:
            obj = msgpack.unpackb(body, raw=False)
        elif "json" in ctype:
            obj = json.loads(body)
        else:
            return None
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if (isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"]
            and isinstance(err.get("message"), str)):
        return err
    return None


def expect_reject(out: Outcome, case: str, ans: Answer, statuses: Iterable[int] = (400,),
                  codes: Iterable[str] | None = None, *, may_close: bool = False) -> None:
    """Record ``ans`` and check it: one of ``statuses`` (4xx) in the contract's error shape with
    one of ``codes``; ``may_close``: the node may also close without answering."""
    out.seen[ans.label] += 1
    if ans.error == "connect":
        out.fail("connect", case, "the node did not accept a connection")
        return
    if ans.status is None:
        if not may_close or ans.end == "open":
            out.fail("status", case, f"expected {sorted(statuses)}: {ans.describe()}")
        return
    wanted = set(statuses)
    if ans.status >= 500:
        out.fail("5xx", case, ans.describe())
        return
    if ans.status not in wanted:
        out.fail("status", case, f"expected {sorted(wanted)}, got {ans.describe()}")
    if ans.status >= 400:
        err = ans.error_obj()
        if err is None:
            out.fail("shape", case, f"not the contract's error shape: {ans.describe()}")
        elif codes is not None and err["code"] not in set(codes):
            out.fail("code", case, f"expected code in {sorted(set(codes))}: {ans.describe()}")


# ------------------------------------------------------------------------------------------
# raw HTTP
# ------------------------------------------------------------------------------------------

Part = bytes | float  # bytes to send, or seconds to wait before the next part


async def _open(ctx: Ctx, target: Target, source: str | None = None
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    src = source if source is not None else ctx.source
    return await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port,
                                local_addr=(src, 0) if src else None), 5.0)


def parse_response(buf: bytes) -> tuple[int | None, dict[str, str], bytes, int]:
    """(status, headers, body, bytes used) of the first HTTP response in ``buf``; status None
    while incomplete."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None, {}, b"", 0
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        return None, {}, b"", 0
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    used = len(head) + 4
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        n = int(length)
        if len(rest) < n:
            return None, headers, b"", 0
        return status, headers, rest[:n], used + n
    if "chunked" in headers.get("transfer-encoding", ""):
        body, pos = bytearray(), 0
        while True:
            eol = rest.find(b"\r\n", pos)
            if eol < 0:
                return None, headers, b"", 0
            try:
                size = int(rest[pos:eol].split(b";")[0], 16)
            except ValueError:
                return status, headers, bytes(body), len(buf)
            if size == 0:
                return status, headers, bytes(body), used + eol + 4
            body += rest[eol + 2:eol + 2 + size]
            pos = eol + 4 + size
    return status, headers, rest, len(buf)  # until close


async def exchange(ctx: Ctx, target: Target, parts: Sequence[Part] | bytes, *,
                   read_timeout: float | None = None, source: str | None = None,
                   half_close: bool = False, count: bool = True,
                   until_answer: bool = False) -> Answer:
    """Send ``parts`` on a new connection (waiting where a part is a number, and stopping
    early if the node closes), then read until the node closes or ``read_timeout``.
    ``until_answer``: stop sending and close as soon as a whole response is in (end
    "answered")."""
    if count:
        ctx.count()
    if isinstance(parts, bytes):
        parts = [parts]
    started = time.monotonic()
    try:
        reader, writer = await _open(ctx, target, source)
    except (OSError, TimeoutError):
        return Answer(error="connect", elapsed=time.monotonic() - started)
    buf = bytearray()
    end = ["closed"]

    async def read() -> None:
        try:
            while len(buf) < (8 << 20):
                chunk = await reader.read(65536)
                if not chunk:
                    return
                buf.extend(chunk)
                if until_answer and parse_response(bytes(buf))[0] is not None:
                    end[0] = "answered"
                    return
        except (ConnectionError, OSError):
            end[0] = "reset"

    reading = asyncio.ensure_future(read())
    try:
        for part in parts:
            if reading.done():
                break
            if isinstance(part, bytes):
                writer.write(part)
                await writer.drain()
            else:
                await asyncio.wait({reading}, timeout=float(part))
        if half_close and not reading.done() and writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass  # the node closed on us: what it said is in the buffer
    try:
        await asyncio.wait_for(asyncio.shield(reading),
                               ctx.read_timeout if read_timeout is None else read_timeout)
    except TimeoutError:
        end[0] = "open"
    finally:
        reading.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
    status, headers, body, _ = parse_response(bytes(buf))
    return Answer(status, headers, body, end[0], time.monotonic() - started)


def http_request(ctx: Ctx, method: str, path: str, body: bytes = b"", *,
                 ctype: str | None = "application/json",
                 headers: Sequence[str | bytes] = (), token: bool = True,
                 length: int | None = None, chunked: bool = False, close: bool = True,
                 accept: str | None = None) -> bytes:
    """One HTTP/1.1 request as bytes (``length`` overrides Content-Length)."""
    lines: list[bytes] = [f"{method} {path} HTTP/1.1".encode("latin-1"), b"Host: hostile"]
    if token and ctx.token:
        lines.append(f"Authorization: Bearer {ctx.token}".encode("latin-1"))
    if ctype:
        lines.append(f"Content-Type: {ctype}".encode("latin-1"))
    if accept:
        lines.append(f"Accept: {accept}".encode("latin-1"))
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
    elif body or length is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body) if length is None else length}".encode())
    if close:
        lines.append(b"Connection: close")
    lines.extend(h if isinstance(h, bytes) else h.encode("latin-1") for h in headers)
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    return head + (chunk_body(body) if chunked else body)


def chunk_body(body: bytes, size: int = 16384) -> bytes:
    out = bytearray()
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return bytes(out + b"0\r\n\r\n")


def jdump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def counter_path(ctx: Ctx, key: str, table: str | None = None) -> str:
    return f"/v1/counters/{table or ctx.table}/{key}"


async def post(ctx: Ctx, target: Target, path: str, body: bytes,
               ctype: str | None = "application/json", **kw: Any) -> Answer:
    return await exchange(ctx, target, http_request(ctx, "POST", path, body, ctype=ctype, **kw))


# ------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------

JunkFn = Callable[[Ctx, Target], Awaitable[Outcome]]


@dataclass(frozen=True)
class JunkClass:
    name: str
    group: str  # http (bodies and values), conn (the HTTP transport), peer (the peer protocol)
    fn: JunkFn
    doc: str
    closes: bool = False  # the node may legitimately just close instead of answering
    needs_secret: bool = False
    needs_token: bool = False
    reasons: tuple[str, ...] = ()  # idc_peer_auth_rejected_total reasons it must raise
    refused: tuple[str, ...] = ()  # idc_http_refused_total reasons it must raise


REGISTRY: dict[str, JunkClass] = {}


def junk(name: str, group: str, *, closes: bool = False, needs_secret: bool = False,
         needs_token: bool = False, reasons: tuple[str, ...] = (),
         refused: tuple[str, ...] = ()) -> Callable[[JunkFn], JunkFn]:
    def register(fn: JunkFn) -> JunkFn:
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        REGISTRY[name] = JunkClass(name, group, fn, doc, closes, needs_secret, needs_token,
                                   reasons, refused)
        return fn
    return register


async def _posts(ctx: Ctx, target: Target, out: Outcome, cls: str,
                 cases: Sequence[tuple[str, bytes, str]], statuses: Iterable[int],
                 codes: Iterable[str] | None, path: str | None = None) -> Outcome:
    """POST each (case, body, content type) to a junk key (or ``path``) and check the refusal."""
    for i, (case, body, ctype) in enumerate(cases):
        p = path or counter_path(ctx, ctx.junk_key(cls, i))
        ans = await post(ctx, target, p, body, ctype)
        out.requests += 1
        expect_reject(out, case, ans, statuses, codes)
    return out


# ------------------------------------------------------------------------------------------
# HTTP junk: bodies and values
# ------------------------------------------------------------------------------------------


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
    out = await _posts(ctx, t, Outcome(), "invalid_json", cases, (400,), ("bad_body",))
    ans = await post(ctx, t, "/v1/batch", b'{"ops": [', "application/json")
    out.requests += 1
    expect_reject(out, "batch {\"ops\": [", ans, (400,), ("bad_body",))
    return out


@junk("invalid_msgpack", "http")
async def invalid_msgpack(ctx: Ctx, t: Target) -> Outcome:
    """Bodies that are not msgpack, truncated, with trailing bytes or impossible lengths."""
    good = _pack(ctx.op("invalid_msgpack"))
    bodies = [b"\xc1", b"\xc1\xc1\xc1", good[:-3], good + b"\x00", b"\x82\xa5op_id",
              b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
              b"\x81\x01\x02", _pack([1, 2]), _pack(None), b"\xd4"]
    cases = [(f"msgpack {b[:16]!r}", b, "application/msgpack") for b in bodies]
    out = await _posts(ctx, t, Outcome(), "invalid_msgpack", cases, (400,), ("bad_body",))
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
             ("msgpack as application/json", _pack(op), "application/json"),
             ("msgpack as text/plain", _pack(op), "text/plain"),
             ("msgpack, no content type", _pack(op), "")]
    return await _posts(ctx, t, Outcome(), "wrong_content_type",
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
                      _pack({"op_id": ctx.op_id("huge_numbers"), "delta": value}),
                      "application/msgpack"))
    return await _posts(ctx, t, Outcome(), "huge_numbers", cases, (400,),
                        ("bad_delta", "bad_body"))


@junk("string_deltas", "http")
async def string_deltas(ctx: Ctx, t: Target) -> Outcome:
    """Deltas that are strings, null, lists or maps, or missing."""
    cases = []
    for value in ("1", "0x10", "", "1e3", " 1", "١", None, [], [1], {}, {"n": 1}):
        cases.append((f"delta {value!r}", jdump({"op_id": ctx.op_id("string_deltas"),
                                                  "delta": value}), "application/json"))
    cases.append(("no delta", jdump({"op_id": ctx.op_id("string_deltas")}), "application/json"))
    return await _posts(ctx, t, Outcome(), "string_deltas", cases, (400,), ("bad_delta",))


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
    cases.append(("msgpack bin op_id", _pack({"op_id": b"bytes:1", "delta": 1}),
                  "application/msgpack"))
    cases.append(("msgpack bin keys", _pack({b"op_id": "k:1", b"delta": 1}),
                  "application/msgpack"))
    return await _posts(ctx, t, Outcome(), "bad_op_ids", cases, (400,), ("bad_op_id",))


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
    return await _posts(ctx, t, Outcome(), "bad_encodings", cases, (400,), ("bad_body",))


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
    out = await _posts(ctx, t, Outcome(), "deep_nesting_json", cases, (400,),
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
        oid = _pack(ctx.op_id("deep_nesting_msgpack"))
        cases.append((f"pad depth {depth}", b"\x83\xa5op_id" + oid + b"\xa5delta\x01\xa3pad" + nest,
                      "application/msgpack"))
        cases.append((f"delta depth {depth}", b"\x82\xa5op_id" + oid + b"\xa5delta" + nest,
                      "application/msgpack"))
        cases.append((f"body depth {depth}", nest, "application/msgpack"))
        maps = min(depth, (ctx.limits.max_body_bytes - 200) // 3)
        cases.append((f"map depth {maps}", b"\x81\xa1a" * maps + b"\xc0", "application/msgpack"))
    return await _posts(ctx, t, Outcome(), "deep_nesting_msgpack", cases, (400,),
                        ("too_deep", "bad_body"))


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
                              ("msgpack", _pack({"ops": ops}), "application/msgpack")):
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
        body = jdump({"ops": ops}) if n % 2 == 0 else _pack({"ops": ops})
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
    return await _posts(ctx, t, Outcome(), "batch_malformed", cases, (400,),
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
    oid = _pack(ctx.op_id("msgpack_exotic"))
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
    return await _posts(ctx, t, Outcome(), "msgpack_exotic", cases, (400,),
                        ("bad_delta", "bad_op_id", "bad_body"))


@junk("wrong_methods", "http")
async def wrong_methods(ctx: Ctx, t: Target) -> Outcome:
    """DELETE/PUT/PATCH/OPTIONS/TRACE on the routes, GET on /v1/batch, POST on /v1/health."""
    out = Outcome()
    key = counter_path(ctx, ctx.junk_key("wrong_methods"))
    body = jdump(ctx.op("wrong_methods"))
    reqs = [(m, key) for m in ("DELETE", "PUT", "PATCH", "OPTIONS", "TRACE")]
    reqs += [("GET", "/v1/batch"), ("PUT", "/v1/batch"), ("DELETE", "/v1/batch"),
             ("POST", "/v1/health"), ("POST", "/metrics"), ("DELETE", "/v1/health"),
             ("POST", "/v1/openapi.json")]
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
    paths = ["/", "/v2/counters/junk/k", f"/v1/counters/{ctx.table}", "/v1/counters",
             f"/v1/counters/{ctx.table}/k/extra", "/admin", "/.env", "/v1/health/x",
             "/%2e%2e/%2e%2e/etc/passwd",
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


# ------------------------------------------------------------------------------------------
# HTTP junk: the transport
# ------------------------------------------------------------------------------------------


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
        if ans.end != "closed" or ans.elapsed > bt + 3.0:
            out.fail("open", case, f"connection {ans.end} only {ans.elapsed:.1f}s after it "
                     f"opened (body_timeout {bt:g}s)")
    return out


async def _keepalive_get(ctx: Ctx, t: Target, source: str | None
                         ) -> tuple[Answer, asyncio.StreamWriter | None]:
    """Open a connection, GET /v1/health on it (keep-alive) and leave it open."""
    ctx.count()
    started = time.monotonic()
    try:
        reader, writer = await _open(ctx, t, source)
    except (OSError, TimeoutError):
        return Answer(error="connect"), None
    writer.write(http_request(ctx, "GET", "/v1/health", ctype=None, close=False))
    buf = bytearray()
    end = "open"
    try:
        async with asyncio.timeout(ctx.read_timeout):
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    end = "closed"
                    break
                buf += chunk
                status, headers, body, used = parse_response(bytes(buf))
                if status is not None and used:
                    break
    except TimeoutError:
        pass
    except (ConnectionError, OSError):
        end = "reset"
    status, headers, body, _ = parse_response(bytes(buf))
    if status is not None and status != 200 and end == "open":  # refused: the node closes
        try:
            async with asyncio.timeout(2.0):
                while await reader.read(65536):
                    pass
            end = "closed"
        except TimeoutError:
            pass
        except (ConnectionError, OSError):
            end = "reset"
    return Answer(status, headers, body, end, time.monotonic() - started), writer


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
            ans, writer = await _keepalive_get(ctx, t, source)
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
        ans, writer = await _keepalive_get(ctx, t, source)
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


# ------------------------------------------------------------------------------------------
# peer protocol junk
# ------------------------------------------------------------------------------------------


@dataclass
class PeerAnswer:
    data: bytes = b""
    end: str = "closed"  # closed, open, reset, connect
    elapsed: float = 0.0
    frames: list[tuple[int, int, Any]] = field(default_factory=list)  # decoded with verifier
    bad_reply: str = ""  # a reply that did not decode or verify

    @property
    def label(self) -> str:
        if self.end == "connect":
            return "connect failed"
        return f"{self.end}, {len(self.data)} bytes back" if self.data else self.end


async def peer_exchange(ctx: Ctx, t: Target, parts: Sequence[Part] | bytes, *,
                        read_timeout: float = 3.0, until_frames: int = 0,
                        verifier: Verifier | None = None, linger: float = 0.0) -> PeerAnswer:
    """Send ``parts`` on a new connection; read until the node closes, ``read_timeout``, or
    (with ``until_frames``) that many frames decode with ``verifier`` and ``linger`` more
    seconds have passed (to see frames that should not come)."""
    ctx.count()
    if isinstance(parts, bytes):
        parts = [parts]
    started = time.monotonic()
    try:
        reader, writer = await _open(ctx, t)
    except (OSError, TimeoutError):
        return PeerAnswer(end="connect")
    buf = bytearray()
    end = "closed"
    frames: list[tuple[int, int, Any]] = []
    bad = ""
    try:
        for part in parts:
            if isinstance(part, bytes):
                writer.write(part)
                await writer.drain()
            else:
                await asyncio.sleep(float(part))
        decoder = FrameDecoder(verifier=verifier) if verifier is not None else None
        lingering = False
        async with asyncio.timeout(read_timeout) as deadline:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                buf += chunk
                if decoder is not None and not bad:
                    try:
                        frames += decoder.feed(chunk)
                    except Exception as exc:  # a reply that does not verify
                        bad = f"{type(exc).__name__}: {exc}"
                    if until_frames and len(frames) >= until_frames and not lingering:
                        if linger <= 0:
                            end = "open"
                            break
                        lingering = True
                        deadline.reschedule(asyncio.get_running_loop().time() + linger)
    except TimeoutError:
        end = "open"
    except (ConnectionError, OSError):
        end = "reset"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
    return PeerAnswer(bytes(buf), end, time.monotonic() - started, frames, bad)


def expect_closed(out: Outcome, case: str, ans: PeerAnswer) -> None:
    """Forged peer traffic: the node closes the connection and sends nothing back."""
    out.seen[ans.label] += 1
    if ans.end == "connect":
        out.fail("connect", case, "the node did not accept a connection")
    elif ans.data:
        out.fail("reply", case, f"{len(ans.data)} bytes came back: {ans.data[:40]!r}")
    elif ans.end == "open":
        out.fail("open", case, f"connection still open after {ans.elapsed:.1f}s")


@dataclass
class Dial:
    """A signed HELLO to ``to`` (with the real secret, or another one) and its keys."""

    hello: bytes
    signer: Signer
    verifier: Verifier

    def frame(self, kind: int, req_id: int, body: Any) -> bytes:
        return _encode_frame(kind, req_id, body, self.signer)


def dial(ctx: Ctx, to: str, *, secret: bytes | None = None, ts_ms: int | None = None,
         dialer: str = "hostile") -> Dial:
    key = secret if secret is not None else ctx.secret
    assert key is not None
    hello, signer, verifier = PeerAuth(dialer, key).dial(to)
    assert signer is not None and verifier is not None
    if ts_ms is not None:
        hello["ts_ms"] = ts_ms
    hello["version"] = PROTOCOL_VERSION
    return Dial(_encode_frame(Kind.HELLO, 0, hello, signer), signer, verifier)


def _other(ctx: Ctx, t: Target) -> str:
    ids = sorted({x.node_id for x in ctx.targets} - {t.node_id})
    return ids[0] if ids else t.node_id + "-elsewhere"


def _forged_bodies(ctx: Ctx, cls: str, t: Target) -> list[tuple[str, int, Any]]:
    """REPLICATE, REPAIR and FORWARD bodies that would set a junk key and a good key huge."""
    jk = ctx.junk_key(cls)
    gk = ctx.good_keys[0] if ctx.good_keys else jk
    huge = 10**15
    now = int(time.time() * 1000)
    return [
        ("REPLICATE", Kind.REPLICATE,
         [[ctx.op_id(cls), ctx.table, jk, t.node_id, huge, 0, huge, now],
          [ctx.op_id(cls), ctx.good_table, gk, t.node_id, huge, 0, huge, now]]),
        ("REPAIR", Kind.REPAIR,
         [[ctx.table, jk, {t.node_id: [huge, 0]}], [ctx.good_table, gk, {"forged": [huge, 0]}]]),
        ("FORWARD", Kind.FORWARD, [[ctx.table, jk, ctx.op_id(cls), huge, 1, now]]),
    ]


def _unsigned(kind: int, req_id: int, body: Any) -> bytes:
    return _encode_frame(kind, req_id, body)


def _signed_with(key: bytes, kind: int, req_id: int, body: Any) -> bytes:
    return _encode_frame(kind, req_id, body, Signer(key))


@junk("peer_unsigned_frames", "peer", reasons=("unsigned",))
async def peer_unsigned_frames(ctx: Ctx, t: Target) -> Outcome:
    """MAGIC, then unsigned REPLICATE/REPAIR/FORWARD/HELLO frames setting counters huge."""
    out = Outcome()
    frames = [(name, _unsigned(kind, 1, body)) for name, kind, body in _forged_bodies(
        ctx, "peer_unsigned_frames", t)]
    frames.append(("HELLO", _unsigned(Kind.HELLO, 0, {"node": _other(ctx, t), "to": t.node_id,
                                                       "version": PROTOCOL_VERSION})))
    for name, frame in frames:
        ans = await peer_exchange(ctx, t, MAGIC + frame)
        out.requests += 1
        expect_closed(out, f"unsigned {name}", ans)
    return out


@junk("peer_wrong_secret", "peer", reasons=("bad_mac",))
async def peer_wrong_secret(ctx: Ctx, t: Target) -> Outcome:
    """A well-formed HELLO signed with a wrong secret, followed by forged REPLICATE/REPAIR."""
    out = Outcome()
    wrong = secrets.token_bytes(32)
    for name, kind, body in _forged_bodies(ctx, "peer_wrong_secret", t):
        d = dial(ctx, t.node_id, secret=wrong, dialer=_other(ctx, t))
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(kind, 1, body))
        out.requests += 1
        expect_closed(out, f"wrong secret + {name}", ans)
    return out


@junk("peer_stale_hello", "peer", needs_secret=True, reasons=("stale_hello",))
async def peer_stale_hello(ctx: Ctx, t: Target) -> Outcome:
    """Real-secret HELLOs whose ts_ms is far in the past or the future (outside the skew)."""
    out = Outcome()
    skew_ms = int(ctx.limits.peer_auth_skew * 1000)
    now = int(time.time() * 1000)
    for case, ts in (("past", now - skew_ms - 60_000), ("future", now + skew_ms + 60_000),
                     ("zero", 0)):
        d = dial(ctx, t.node_id, ts_ms=ts)
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, f"HELLO ts_ms {case}", ans)
    return out


@junk("peer_wrong_node", "peer", needs_secret=True, reasons=("wrong_node",))
async def peer_wrong_node(ctx: Ctx, t: Target) -> Outcome:
    """A real-secret HELLO addressed to another node (recorded on its way there) sent here."""
    out = Outcome()
    for to in (_other(ctx, t), "not-a-member"):
        d = dial(ctx, to)
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, f"HELLO to {to}", ans)
    return out


@junk("peer_replayed_connection", "peer", needs_secret=True, reasons=("replayed_hello",))
async def peer_replayed_connection(ctx: Ctx, t: Target) -> Outcome:
    """A legitimate connection (signed HELLO + READ + PING) is answered; the same bytes sent
    again on a new connection are refused (replayed_hello) without a reply."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    recorded = MAGIC + d.hello + d.frame(Kind.READ, 1, [[ctx.table, ctx.junk_key(
        "peer_replayed_connection")]]) + d.frame(Kind.PING, 2, [{}])
    ans = await peer_exchange(ctx, t, recorded, until_frames=2, verifier=d.verifier)
    out.requests += 1
    replies = ans.frames
    out.seen[f"legit: {len(replies)} replies"] += 1
    if ans.bad_reply:
        out.fail("reply", "legitimate connection", f"reply does not verify: {ans.bad_reply}")
    if sorted(r[1] for r in replies) != [1, 2] or any(r[0] != Kind.REPLY for r in replies):
        out.fail("status", "legitimate connection", f"expected REPLY to 1 and 2, got {replies!r}"
                 f" ({ans.label})")
    for i in range(2):
        ans = await peer_exchange(ctx, t, recorded)
        out.requests += 1
        expect_closed(out, f"replay {i + 1}", ans)
    return out


@junk("peer_replayed_frame", "peer", needs_secret=True, reasons=("replay",))
async def peer_replayed_frame(ctx: Ctx, t: Target) -> Outcome:
    """Inside a legitimate connection, the same signed PING twice and an older seq after a
    newer one: only the fresh frames are answered, the replays dropped."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    p1 = d.frame(Kind.PING, 1, [{}])
    p2 = d.frame(Kind.PING, 2, [{}])
    p3 = d.frame(Kind.PING, 3, [{}])
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + p1 + p1 + p3 + p2 + p1,
                              read_timeout=5.0, until_frames=2, linger=0.5, verifier=d.verifier)
    out.requests += 1
    ids = sorted(r[1] for r in ans.frames)
    if ans.bad_reply:
        out.fail("reply", "PING 1, 1, 3, 2, 1", f"reply does not verify: {ans.bad_reply}")
    out.seen[f"replies to {ids}"] += 1
    if ids != [1, 3]:
        out.fail("reply", "PING 1, 1, 3, 2, 1", f"expected replies to [1, 3] only, got {ids}")
    return out


def _flip(data: bytes, bit: int) -> bytes:
    b = bytearray(data)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


@junk("peer_bit_flips", "peer", needs_secret=True, reasons=("bad_mac",))
async def peer_bit_flips(ctx: Ctx, t: Target) -> Outcome:
    """Real-secret frames with one bit flipped: in the HELLO's payload or MAC, in a REPLICATE's
    payload, seq or MAC after a good HELLO. Closed, nothing applied, no reply."""
    out = Outcome()
    rng = ctx.rng
    forged = _forged_bodies(ctx, "peer_bit_flips", t)[0]
    for case in ("HELLO payload", "HELLO mac", "REPLICATE payload", "REPLICATE seq",
                 "REPLICATE mac"):
        d = dial(ctx, t.node_id)
        frame = d.frame(forged[1], 1, forged[2])
        hsize = HEADER.size
        if case.startswith("HELLO"):
            payload_bits = (len(d.hello) - 40 - hsize) * 8
            bit = ((hsize * 8 + rng.randrange(payload_bits)) if case.endswith("payload")
                   else (len(d.hello) - 32) * 8 + rng.randrange(256))
            data = MAGIC + _flip(d.hello, bit) + frame
        else:
            n = len(frame)
            if case.endswith("payload"):
                bit = hsize * 8 + rng.randrange((n - 40 - hsize) * 8)
            elif case.endswith("seq"):
                bit = (n - 40) * 8 + rng.randrange(64)
            else:
                bit = (n - 32) * 8 + rng.randrange(256)
            data = MAGIC + d.hello + _flip(frame, bit)
        ans = await peer_exchange(ctx, t, data)
        out.requests += 1
        expect_closed(out, f"flip in {case}", ans)
    return out


@junk("peer_oversized_header", "peer", reasons=("bad_frame",))
async def peer_oversized_header(ctx: Ctx, t: Target) -> Outcome:
    """Frame headers announcing more than MAX_HELLO_BYTES (up to 4 GiB) before any HELLO."""
    out = Outcome()
    for length in (MAX_HELLO_BYTES + 1, 1 << 20, (1 << 32) - 1):
        for flags in (1, 0):
            ans = await peer_exchange(ctx, t, MAGIC + HEADER.pack(length, flags) + b"\x93")
            out.requests += 1
            expect_closed(out, f"length {length} flags {flags}", ans)
    return out


@junk("peer_random_bytes", "peer", reasons=("bad_frame",))
async def peer_random_bytes(ctx: Ctx, t: Target) -> Outcome:
    """MAGIC followed by random bytes (first frame header with odd flags, or random payload)."""
    out = Outcome()
    for i in range(4):
        rnd = bytes(ctx.rng.getrandbits(8) for _ in range(256))
        if i == 0:  # a plausible header with unknown flags
            rnd = HEADER.pack(200, 0x80 | ctx.rng.getrandbits(6)) + rnd
        ans = await peer_exchange(ctx, t, MAGIC + rnd)
        out.requests += 1
        if ans.end == "open" and not ans.data:
            # a random length under the cap may wait for more bytes: close is not owed yet
            out.seen["waiting for more bytes"] += 1
        else:
            expect_closed(out, f"random {i}", ans)
    return out


@junk("peer_bad_hello", "peer", reasons=("bad_hello",))
async def peer_bad_hello(ctx: Ctx, t: Target) -> Outcome:
    """First frames that are not a valid HELLO: another kind signed, a body that is not a map,
    no nonce, a short nonce, no ts_ms, and (with the secret) a HELLO whose seq is not 0."""
    out = Outcome()
    key = secrets.token_bytes(32)
    other = _other(ctx, t)
    now = int(time.time() * 1000)
    bodies: list[tuple[str, int, Any]] = [
        ("REPLICATE first", Kind.REPLICATE, _forged_bodies(ctx, "peer_bad_hello", t)[0][2]),
        ("PING first", Kind.PING, [{}]),
        ("body a list", Kind.HELLO, [other, t.node_id]),
        ("no nonce", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now}),
        ("short nonce", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now,
                                      "nonce": b"x"}),
        ("nonce a str", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now,
                                      "nonce": "0" * 16}),
        ("ts_ms a float", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now + 0.5,
                                        "nonce": b"0" * 16}),
        ("node an int", Kind.HELLO, {"node": 1, "to": t.node_id, "ts_ms": now,
                                      "nonce": b"0" * 16}),
    ]
    for case, kind, body in bodies:
        ans = await peer_exchange(ctx, t, MAGIC + _signed_with(key, kind, 0, body))
        out.requests += 1
        expect_closed(out, case, ans)
    if ctx.secret is not None:
        d = dial(ctx, t.node_id)  # its HELLO used seq 0: signed again, it goes out as seq 1
        body = msgpack.unpackb(d.hello[HEADER.size:-40], raw=False)[2]
        hello = d.frame(Kind.HELLO, 0, body)
        ans = await peer_exchange(ctx, t, MAGIC + hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, "HELLO with seq 1", ans)
    return out


@junk("peer_truncated", "peer", closes=True)
async def peer_truncated(ctx: Ctx, t: Target) -> Outcome:
    """Frames cut short and the connection closed: half a HELLO, or (with the secret) a good
    HELLO then half of a REPLICATE that would set a junk key. Nothing applied."""
    out = Outcome()
    d = dial(ctx, t.node_id) if ctx.secret is not None else dial(
        ctx, t.node_id, secret=secrets.token_bytes(32))
    forged = _forged_bodies(ctx, "peer_truncated", t)[0]
    frame = d.frame(forged[1], 1, forged[2])
    cuts = [("half a HELLO", MAGIC + d.hello[:len(d.hello) // 2]),
            ("HELLO header only", MAGIC + d.hello[:HEADER.size]),
            ("HELLO without its MAC", MAGIC + d.hello[:-32]),
            ("HELLO + half a REPLICATE", MAGIC + d.hello + frame[:len(frame) // 2]),
            ("HELLO + REPLICATE without MAC", MAGIC + d.hello + frame[:-32])]
    for case, data in cuts:
        ans = await peer_exchange(ctx, t, [data, 0.05], read_timeout=0.3)
        out.requests += 1
        out.seen["closed by us" if ans.end == "open" else ans.label] += 1
        if ans.data and not case.startswith("HELLO +"):
            out.fail("reply", case, f"{len(ans.data)} bytes came back")
    return out


@junk("peer_unsigned_after_hello", "peer", needs_secret=True, reasons=("unsigned", "bad_mac"))
async def peer_unsigned_after_hello(ctx: Ctx, t: Target) -> Outcome:
    """A legitimate HELLO, then a REPLICATE unsigned, or signed with another connection's key:
    closed without a reply, nothing applied."""
    out = Outcome()
    name, kind, body = _forged_bodies(ctx, "peer_unsigned_after_hello", t)[0]
    d = dial(ctx, t.node_id)
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + _unsigned(kind, 1, body))
    out.requests += 1
    expect_closed(out, f"unsigned {name} after HELLO", ans)
    d, other = dial(ctx, t.node_id), dial(ctx, t.node_id)
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + other.frame(kind, 1, body))
    out.requests += 1
    expect_closed(out, f"{name} signed for another connection", ans)
    return out


@junk("peer_signed_malformed", "peer", needs_secret=True, closes=True)
async def peer_signed_malformed(ctx: Ctx, t: Target) -> Outcome:
    """A secret holder's malformed requests (unknown kind, bodies of the wrong shape): each is
    answered with an ERROR frame (or the connection closed), and the node stays up."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    frames = [(77, []), (Kind.PING, None), (Kind.READ, "x"), (Kind.READ, [[1, 2, 3]]),
              (Kind.READ, [[ctx.table, "k" * 200]]), (Kind.HOLDS, [None])]
    data = MAGIC + d.hello + b"".join(d.frame(k, i + 1, b) for i, (k, b) in enumerate(frames))
    ans = await peer_exchange(ctx, t, data, read_timeout=2.0, until_frames=len(frames),
                              verifier=d.verifier)
    out.requests += 1
    kinds = Counter("ERROR" if r[0] == Kind.ERROR else "REPLY" if r[0] == Kind.REPLY else "?"
                    for r in ans.frames)
    for k, n in kinds.items():
        out.seen[k] += n
    if len(ans.frames) < len(frames):
        out.seen[f"then {ans.end}"] += 1
    if kinds.get("?") or ans.bad_reply:
        out.fail("reply", "malformed requests", f"odd replies: {ans.frames!r:.200} "
                 f"{ans.bad_reply}")
    return out


# ------------------------------------------------------------------------------------------
# classes that found node bugs (see the report in tests/test_hostile.py)
# ------------------------------------------------------------------------------------------


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
        values = {}
        for x in ctx.targets:
            read = await exchange(ctx, x, http_request(
                ctx, "GET", counter_path(ctx, victim_key, victim_table) + "?consistency=all",
                ctype=None))
            out.requests += 1
            try:
                values[x.node_id] = json.loads(read.body)["value"]
            except (ValueError, KeyError, TypeError):
                values[x.node_id] = read.label
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


# ------------------------------------------------------------------------------------------
# the well-behaved client
# ------------------------------------------------------------------------------------------


@dataclass
class GoodStats:
    acked: Counter[str] = field(default_factory=Counter)  # key -> sum of acknowledged deltas
    acked_ops: int = 0
    unknown: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    not_applied: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def good_client(urls: Sequence[str], token: str | None, table: str, keys: Sequence[str],
                      stop: asyncio.Event, stats: GoodStats, *, rate: float, workers: int,
                      client_id: str, rng: random.Random, max_connections: int) -> None:
    """Add 1..3 to random ``keys`` at about ``rate`` ops/s until ``stop``; every outcome
    recorded (the SDK retries each op with its op id until acked or its deadline)."""
    async with CounterClient(list(urls), client_id=client_id, token=token, discover=False,
                             max_connections=max_connections) as client:
        interval = workers / rate if rate > 0 else 0.0

        async def worker() -> None:
            while not stop.is_set():
                key, delta = rng.choice(keys), rng.randint(1, 3)
                try:
                    await client.add(table, key, delta)
                    stats.acked[key] += delta
                    stats.acked_ops += 1
                except (RejectedError, NotAppliedError) as exc:
                    stats.not_applied += 1  # certainly not applied
                    stats.errors[type(exc).__name__] += 1
                except (OutcomeUnknownError, ClientError) as exc:
                    stats.unknown[key].append(delta)
                    stats.errors[type(exc).__name__] += 1
                if interval:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), interval * (0.5 + rng.random()))

        await asyncio.gather(*(worker() for _ in range(workers)))


# ------------------------------------------------------------------------------------------
# the runner
# ------------------------------------------------------------------------------------------


@dataclass
class HostileConfig:
    nodes: Sequence[str]
    secret: bytes | None = None
    token: str | None = None
    duration: float = 30.0
    rounds: int = 0  # 0: as many as fit in ``duration``
    classes: Sequence[str] | None = None  # None: all
    skip: Sequence[str] = ()
    limits: Limits = field(default_factory=Limits)
    concurrency: int = 4
    max_requests: int = 200_000
    good_rate: float = 100.0
    good_workers: int = 4
    good_keys: int = 6
    good_max_connections: int = 8
    table: str = "junk"
    good_table: str = "good"
    source: str | None = "auto"  # source address of junk connections ("auto": 127.0.0.2 on
    cap_source: str | None = "auto"  # loopback targets) and of the connection-cap class
    seed: int | None = None
    settle: float = 1.0  # seconds between the end of the traffic and the final reads


METRICS = ("idc_peer_auth_rejected_total", "idc_http_refused_total", "idc_unauthorized_total",
           "idc_bad_requests_total", "idc_counters", "idc_peer_auth_accepted_total")
_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{reason="([^"]*)"\})?\s+([-+0-9.eE]+|NaN)$')


def parse_metrics(text: str) -> dict[str, float]:
    """``name`` or ``name{reason}`` -> value, for the families in ``METRICS``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) in METRICS:
            name = m.group(1) + (f"{{{m.group(2)}}}" if m.group(2) is not None else "")
            out[name] = float(m.group(3))
    return out


def _bindable(addr: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Runner:
    def __init__(self, config: HostileConfig) -> None:
        self.config = config
        self.urls = [normalize_url(u) for u in config.nodes]
        seed = config.seed if config.seed is not None else secrets.randbits(32)
        self.seed = seed
        self.rng = random.Random(seed)
        self.run_id = f"h{seed:08x}"[:9]
        self.problems: list[str] = []
        self._session: aiohttp.ClientSession | None = None

    # -- plain HTTP to the nodes (health, metrics, final reads) -----------------------------

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.config.token:
            h["Authorization"] = f"Bearer {self.config.token}"
        return h

    async def _get(self, url: str, path: str) -> tuple[int, bytes]:
        assert self._session is not None
        try:
            async with self._session.get(url + path, headers=self._headers()) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return 0, repr(exc).encode()

    async def health(self, url: str) -> dict[str, Any] | None:
        status, body = await self._get(url, "/v1/health")
        if status != 200:
            return None
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    async def metrics(self, url: str) -> dict[str, float]:
        status, body = await self._get(url, "/metrics")
        return parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}

    async def read(self, url: str, table: str, key: str) -> int | str:
        status, body = await self._get(url, f"/v1/counters/{table}/{key}?consistency=all")
        if status != 200:
            return f"HTTP {status}: {body[:80]!r}"
        try:
            value = json.loads(body)["value"]
        except (ValueError, KeyError, TypeError):
            return f"bad answer {body[:80]!r}"
        return value if isinstance(value, int) else f"bad value {value!r}"

    async def _token_required(self, url: str) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(url + "/metrics") as resp:
                return resp.status == 401
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    # -- the run ---------------------------------------------------------------------------

    def _classes(self, ctx: Ctx) -> list[JunkClass]:
        cfg = self.config
        names = list(cfg.classes) if cfg.classes else list(REGISTRY)
        unknown = [n for n in [*names, *cfg.skip] if n not in REGISTRY]
        if unknown:
            raise SystemExit(f"unknown junk classes: {', '.join(unknown)} (see --list)")
        return [REGISTRY[n] for n in names if n not in set(cfg.skip)]

    async def run(self) -> dict[str, Any]:
        cfg = self.config
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            targets, ring = await self._discover()
            ctx = self._context(targets, ring, await self._token_required(self.urls[0]))
            classes = self._classes(ctx)
            before = {u: await self.metrics(u) for u in self.urls}
            stats = GoodStats()
            stop = asyncio.Event()
            good = asyncio.create_task(good_client(
                self.urls, cfg.token, cfg.good_table, ctx.good_keys, stop, stats,
                rate=cfg.good_rate, workers=cfg.good_workers,
                client_id=f"{self.run_id}-good", rng=random.Random(self.rng.random()),
                max_connections=cfg.good_max_connections))
            outcomes: dict[str, Outcome] = {c.name: Outcome() for c in classes}
            rounds = 0
            try:
                rounds = await self._junk(ctx, classes, outcomes, started)
            finally:
                stop.set()
                try:
                    await asyncio.wait_for(good, 60.0)
                except Exception as exc:  # the good client itself failed
                    self.problems.append(f"good client: {exc!r}")
            junk_s = time.monotonic() - started
            await asyncio.sleep(cfg.settle)
            good_report = await self._check_good(ctx, stats)
            junk_report = await self._check_junk(ctx)
            nodes_report = await self._check_nodes()
            after = {u: await self.metrics(u) for u in self.urls}
            metrics_report = self._metrics(before, after, classes, outcomes)
        return self._report(ctx, classes, outcomes, rounds, junk_s, good_report, junk_report,
                            nodes_report, metrics_report)

    async def _discover(self) -> tuple[list[Target], Ring | None]:
        targets: list[Target] = []
        ring: Ring | None = None
        for url in self.urls:
            h = await self.health(url)
            if h is None:
                raise SystemExit(f"{url}: no /v1/health answer; is the node up?")
            parts = urlsplit(url)
            targets.append(Target(url, parts.hostname or "127.0.0.1", parts.port or 80,
                                  str(h.get("node"))))
            if ring is None and isinstance(h.get("members"), list):
                with contextlib.suppress(Exception):
                    ring = Ring(h["members"], vnodes=int(h.get("ring", {}).get("vnodes", 256)),
                                rf=int(h.get("rf", 3)))
        return targets, ring

    def _context(self, targets: list[Target], ring: Ring | None, token_required: bool) -> Ctx:
        cfg = self.config
        loopback = all(_is_loopback(t.host) for t in targets)
        source, cap_source = cfg.source, cfg.cap_source
        if source == "auto":
            source = "127.0.0.2" if loopback and _bindable("127.0.0.2") else None
        if cap_source == "auto":
            cap_source = "127.0.0.3" if loopback and _bindable("127.0.0.3") else source
        if token_required and not cfg.token:
            self.problems.append("the nodes want a bearer token and none was given: the HTTP "
                                 "junk only reaches the token check")
        good_keys = [f"{self.run_id}-g{i}" for i in range(cfg.good_keys)]
        ctx = Ctx(targets, limits=cfg.limits, token=cfg.token, secret=cfg.secret,
                  token_required=token_required, run_id=self.run_id, table=cfg.table,
                  good_table=cfg.good_table, good_keys=good_keys, ring=ring, source=source,
                  cap_source=cap_source, max_requests=cfg.max_requests, rng=self.rng)
        return ctx

    async def _junk(self, ctx: Ctx, classes: list[JunkClass], outcomes: dict[str, Outcome],
                    started: float) -> int:
        cfg = self.config
        sem = asyncio.Semaphore(max(1, cfg.concurrency))
        rounds = 0
        exhausted = False

        async def one(cls: JunkClass, target: Target) -> None:
            nonlocal exhausted
            out = outcomes[cls.name]
            if cls.needs_secret and ctx.secret is None:
                out.skipped = "needs --secret-file"
                return
            if cls.needs_token and not (ctx.token and ctx.token_required):
                out.skipped = "needs a node token (--token)"
                return
            async with sem:
                if exhausted:
                    return
                t0 = time.monotonic()
                try:
                    async with asyncio.timeout(ctx.class_timeout):
                        res = await cls.fn(ctx, target)
                except BudgetExhausted:
                    exhausted = True
                    return
                except TimeoutError:
                    res = Outcome()
                    res.fail("timeout", "whole class", f"did not finish in "
                             f"{ctx.class_timeout:g}s")
                except Exception as exc:  # a bug in the class itself: report, go on
                    res = Outcome()
                    res.fail("crash", "whole class", f"{type(exc).__name__}: {exc}")
                res.seconds = time.monotonic() - t0
            out.merge(res)

        while not exhausted:
            elapsed = time.monotonic() - started
            if rounds and (elapsed >= cfg.duration or (cfg.rounds and rounds >= cfg.rounds)):
                break
            n = len(ctx.targets)
            await asyncio.gather(*(one(cls, ctx.targets[(rounds + i) % n])
                                   for i, cls in enumerate(classes)))
            rounds += 1
        if exhausted:
            self.problems.append(f"--max-requests {cfg.max_requests} reached")
        return rounds

    async def _check_good(self, ctx: Ctx, stats: GoodStats) -> dict[str, Any]:
        keys: dict[str, Any] = {}
        ok = True
        for key in ctx.good_keys:
            acked, unknown = stats.acked[key], stats.unknown.get(key, [])
            ranges, approx = reachable_sums(acked, unknown)
            values = {u: await self.read(u, ctx.good_table, key) for u in self.urls}
            bad = {u: v for u, v in values.items()
                   if not isinstance(v, int) or distance(v, ranges) != 0}
            if bad:
                ok = False
                self.problems.append(f"good key {key}: acked {acked} (+ up to {sum(unknown)} "
                                     f"unknown), read {values}")
            keys[key] = {"acked": acked, "unknown": unknown, "values": list(values.values()),
                         "exact": not unknown and not bad}
        return {"ok": ok, "exact": ok and not any(stats.unknown.values()),
                "acked_ops": stats.acked_ops,
                "unknown_ops": sum(len(v) for v in stats.unknown.values()),
                "not_applied_ops": stats.not_applied, "errors": dict(stats.errors),
                "keys": keys}

    async def _check_junk(self, ctx: Ctx) -> dict[str, Any]:
        nonzero: dict[str, Any] = {}
        sem = asyncio.Semaphore(8)

        async def check(key: str, url: str) -> None:
            async with sem:
                v = await self.read(url, ctx.table, key)
            if v != 0:
                nonzero[f"{key}@{url}"] = v

        await asyncio.gather(*(check(k, u) for k in sorted(ctx.junk_keys) for u in self.urls))
        tables: dict[str, list[str]] = {}
        for url in self.urls:
            h = await self.health(url) or {}
            tables[url] = sorted(h.get("tables", {}))
        if nonzero:
            self.problems.append(f"junk changed {len(nonzero)} junk counters: "
                                 f"{dict(list(nonzero.items())[:5])}")
        return {"ok": not nonzero, "keys_checked": len(ctx.junk_keys),
                "reads": len(ctx.junk_keys) * len(self.urls), "nonzero": nonzero,
                "tables": tables}

    async def _check_nodes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for url in self.urls:
            h = await self.health(url)
            up = h is not None and h.get("status") == "ok"
            out[url] = {"up": up, "node": h.get("node") if h else None,
                        "status": h.get("status") if h else "no answer"}
            if not up:
                self.problems.append(f"{url} is not healthy after the run: {out[url]}")
        return out

    def _metrics(self, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 classes: list[JunkClass], outcomes: dict[str, Outcome]) -> dict[str, Any]:
        delta: Counter[str] = Counter()
        for url in self.urls:
            for name, value in after.get(url, {}).items():
                d = value - before.get(url, {}).get(name, 0.0)
                if d:
                    delta[name] += int(d)
        by: dict[str, dict[str, int]] = {"idc_peer_auth_rejected_total": {},
                                         "idc_http_refused_total": {}}
        for name, value in delta.items():
            family, _, reason = name.partition("{")
            if family in by and reason:
                by[family][reason.rstrip("}")] = value
        expected_peer = sorted({r for c in classes for r in c.reasons
                                if not outcomes[c.name].skipped and outcomes[c.name].requests})
        expected_http = sorted({r for c in classes for r in c.refused
                                if not outcomes[c.name].skipped and outcomes[c.name].requests})
        missing = [r for r in expected_peer
                   if by["idc_peer_auth_rejected_total"].get(r, 0) <= 0]
        missing += [r for r in expected_http if by["idc_http_refused_total"].get(r, 0) <= 0]
        if missing and any(after.values()):
            self.problems.append(f"refusal reasons that did not go up: {missing}")
        return {"peer_auth_rejected": by["idc_peer_auth_rejected_total"],
                "http_refused": by["idc_http_refused_total"],
                "unauthorized": delta.get("idc_unauthorized_total", 0),
                "bad_requests": delta.get("idc_bad_requests_total", 0),
                "peer_auth_accepted": delta.get("idc_peer_auth_accepted_total", 0),
                "counters_added": delta.get("idc_counters", 0),
                "expected_peer_reasons": expected_peer, "expected_http_reasons": expected_http,
                "missing_reasons": missing, "scraped": bool(any(after.values()))}

    def _report(self, ctx: Ctx, classes: list[JunkClass], outcomes: dict[str, Outcome],
                rounds: int, junk_s: float, good: dict[str, Any], junk_r: dict[str, Any],
                nodes: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        table = {}
        for cls in classes:
            o = outcomes[cls.name]
            table[cls.name] = {
                "group": cls.group, "requests": o.requests, "seen": dict(o.seen),
                "verdict": o.verdict(), "ok": o.ok, "skipped": o.skipped,
                "failure_kinds": dict(o.failure_kinds),
                "failures": [str(f) for f in o.failures], "notes": sorted(o.notes),
                "closes": cls.closes, "seconds": round(o.seconds, 2), "doc": cls.doc}
            if not o.ok:
                self.problems.append(f"class {cls.name}: {o.verdict()}")
        ran = [c for c in classes if not outcomes[c.name].skipped]
        ok = not self.problems
        return {
            "ok": ok, "seed": self.seed, "run_id": self.run_id, "nodes": self.urls,
            "rounds": rounds, "junk_seconds": round(junk_s, 1),
            "classes_tried": len(ran), "classes_skipped": len(classes) - len(ran),
            "junk_requests": sum(outcomes[c.name].requests for c in ran),
            "classes": table, "good": good, "junk": junk_r, "health": nodes,
            "metrics": metrics, "problems": list(self.problems),
            "source": ctx.source, "cap_source": ctx.cap_source,
        }


async def run_hostile(config: HostileConfig) -> dict[str, Any]:
    """Run the junk and the good client against ``config.nodes``; the report (``ok`` says
    whether every check passed)."""
    return await Runner(config).run()


async def try_class(config: HostileConfig, name: str, *, targets: int = 1) -> Outcome:
    """Run one class once against each of the first ``targets`` nodes, without the good
    client; then its junk keys must read 0 on every node ("effect" failures otherwise)."""
    runner = Runner(config)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        runner._session = session
        found, ring = await runner._discover()
        ctx = runner._context(found, ring, await runner._token_required(runner.urls[0]))
        cls = REGISTRY[name]
        out = Outcome()
        for target in found[:targets]:
            async with asyncio.timeout(ctx.class_timeout):
                out.merge(await cls.fn(ctx, target))
        junk_report = await runner._check_junk(ctx)
        for where, value in junk_report["nonzero"].items():
            out.fail("effect", where, f"junk counter reads {value}")
    return out


# ------------------------------------------------------------------------------------------
# output and CLI
# ------------------------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{'class':<28} {'group':<5} {'requests':>8}  {'seen':<44} verdict"]
    for name, row in report["classes"].items():
        seen = ", ".join(f"{k}:{v}" for k, v in sorted(row["seen"].items(),
                                                        key=lambda kv: -kv[1]))
        if len(seen) > 44:
            seen = seen[:41] + "..."
        lines.append(f"{name:<28} {row['group']:<5} {row['requests']:>8}  {seen:<44} "
                     f"{row['verdict']}")
    g, j, m = report["good"], report["junk"], report["metrics"]
    lines.append("")
    lines.append(f"classes tried: {report['classes_tried']} (skipped {report['classes_skipped']})"
                 f", junk requests/connections: {report['junk_requests']}, rounds: "
                 f"{report['rounds']} in {report['junk_seconds']}s")
    lines.append(f"good client: {g['acked_ops']} acked ops, {g['unknown_ops']} unknown, "
                 f"{g['not_applied_ops']} certainly not applied; counts "
                 f"{'EXACT' if g['exact'] else 'within bounds' if g['ok'] else 'WRONG'} "
                 f"on {len(g['keys'])} keys x {len(report['nodes'])} nodes")
    lines.append(f"junk counters: {j['keys_checked']} keys x {len(report['nodes'])} nodes read, "
                 f"{len(j['nonzero'])} changed")
    up = sum(1 for n in report["health"].values() if n["up"])
    lines.append(f"nodes healthy: {up}/{len(report['health'])}")
    lines.append("idc_peer_auth_rejected_total (delta): " + _fmt(m["peer_auth_rejected"]))
    lines.append("idc_http_refused_total (delta):       " + _fmt(m["http_refused"]))
    lines.append(f"idc_unauthorized_total +{m['unauthorized']}, idc_bad_requests_total "
                 f"+{m['bad_requests']}, idc_peer_auth_accepted_total +{m['peer_auth_accepted']}")
    for p in report["problems"]:
        lines.append(f"PROBLEM: {p}")
    for name, row in report["classes"].items():
        for f in row["failures"][:3]:
            lines.append(f"  {name}: {f}")
    lines.append("RESULT: " + ("PASS" if report["ok"] else "FAIL"))
    return "\n".join(lines)


def _fmt(d: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items())) or "(none)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client.hostile",
        description="Throw many classes of junk (bad encodings, huge numbers, deep nesting, "
        "oversized bodies, slow and truncated requests, forged and replayed peer frames ...) at "
        "running nodes while a well-behaved client keeps incrementing; then check that its "
        "counts are exact, that no junk changed a counter and that every node is still up.",
        epilog="The --max-* and --*-timeout flags must match what the nodes were started with "
        "(their defaults are the node's). Exit status 0 when every check passes, 1 otherwise.")
    p.add_argument("--nodes", metavar="URL,URL,...",
                   help="the nodes: http://host:port or host:port, comma-separated")
    p.add_argument("--secret-file", metavar="FILE",
                   help="the cluster secret: enables the classes that need a real signed "
                   "HELLO (replays, stale/misaddressed HELLOs, bit flips)")
    p.add_argument("--token", metavar="T", help="bearer token of nodes started with --token-file")
    p.add_argument("--token-file", metavar="FILE",
                   help="read the token from this file (first line)")
    p.add_argument("--duration", type=float, default=30.0, metavar="S",
                   help="seconds of junk; no round starts after this (default 30)")
    p.add_argument("--rounds", type=int, default=0, metavar="N",
                   help="stop after this many rounds of every class (default: fill --duration)")
    p.add_argument("--out", metavar="FILE", help="write the JSON report here")
    p.add_argument("--classes", help="only these classes, comma-separated (see --list)")
    p.add_argument("--skip", default="", help="classes to leave out, comma-separated")
    p.add_argument("--list", action="store_true", help="list the junk classes and exit")
    p.add_argument("--concurrency", type=int, default=4, help="classes running at once (4)")
    p.add_argument("--max-requests", type=int, default=200_000,
                   help="cap on junk requests and connections (200000)")
    p.add_argument("--good-rate", type=float, default=100.0,
                   help="the good client's ops per second (100)")
    p.add_argument("--good-keys", type=int, default=6, help="keys the good client adds to (6)")
    p.add_argument("--seed", type=int, help="random seed (printed in the report)")
    p.add_argument("--source", default="auto", help="source address of junk connections "
                   "(default: 127.0.0.2 when every node is on loopback, so the per-client "
                   "connection cap keeps junk and the good client apart; 'none': the OS picks)")
    p.add_argument("--cap-source", default="auto",
                   help="source address of the connection-cap class (default 127.0.0.3 on "
                   "loopback)")
    lim = Limits()
    g = p.add_argument_group("the nodes' limits", "as the nodes were started with (the "
                             "defaults are the node's): the junk aims just past them")
    g.add_argument("--max-body-bytes", type=int, default=lim.max_body_bytes, metavar="N",
                   help=f"413 above (default {lim.max_body_bytes})")
    g.add_argument("--max-batch-ops", type=int, default=lim.max_batch_ops, metavar="N",
                   help=f"ops per /v1/batch (default {lim.max_batch_ops})")
    g.add_argument("--max-op-id-bytes", type=int, default=lim.max_op_id_bytes, metavar="N",
                   help=f"longest op id (default {lim.max_op_id_bytes})")
    g.add_argument("--max-nesting-depth", type=int, default=lim.max_nesting_depth,
                   metavar="N", help=f"deepest body nesting (default {lim.max_nesting_depth})")
    g.add_argument("--header-timeout", type=float, default=lim.header_timeout, metavar="S",
                   help=f"slowloris gets 408 after this (default {lim.header_timeout:g})")
    g.add_argument("--body-timeout", type=float, default=lim.body_timeout, metavar="S",
                   help=f"a slow body gets 408 after this (default {lim.body_timeout:g})")
    g.add_argument("--max-connections-per-client", type=int,
                   default=lim.max_connections_per_client, metavar="N",
                   help=f"429 above (default {lim.max_connections_per_client})")
    g.add_argument("--peer-auth-skew", type=float, default=lim.peer_auth_skew, metavar="S",
                   help=f"HELLO clock tolerance (default {lim.peer_auth_skew:g})")
    return p


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def config_from_args(args: argparse.Namespace) -> HostileConfig:
    from cluster.auth import load_secret

    token = args.token
    if args.token_file:
        lines = [ln.strip() for ln in Path(args.token_file).read_text().splitlines()
                 if ln.strip()]
        token = lines[0] if lines else None
    limits = Limits(args.max_body_bytes, args.max_batch_ops, args.max_op_id_bytes,
                    args.max_nesting_depth, args.header_timeout, args.body_timeout,
                    args.max_connections_per_client, args.peer_auth_skew)
    return HostileConfig(
        nodes=_split(args.nodes), secret=load_secret(args.secret_file) if args.secret_file
        else None, token=token, duration=args.duration, rounds=args.rounds,
        classes=_split(args.classes) or None, skip=_split(args.skip), limits=limits,
        concurrency=args.concurrency, max_requests=args.max_requests, good_rate=args.good_rate,
        good_keys=args.good_keys, seed=args.seed,
        source=None if args.source == "none" else args.source,
        cap_source=None if args.cap_source == "none" else args.cap_source)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for cls in REGISTRY.values():
            extra = " [needs secret]" if cls.needs_secret else ""
            extra += " [needs token]" if cls.needs_token else ""
            print(f"{cls.name:<28} {cls.group:<5} {cls.doc}{extra}")
        return 0
    if not args.nodes:
        _parser().error("--nodes is required")
    report = asyncio.run(run_hostile(config_from_args(args)))
    print(format_report(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
