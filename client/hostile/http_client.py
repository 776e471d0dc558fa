"""A raw HTTP/1.1 client over asyncio streams: requests built byte by byte and sent in timed
parts, so nothing between the junk and the node tidies it up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from client.hostile.context import Ctx, Part, Target, open_stream
from client.hostile.outcome import Answer, Outcome, expect_reject

pack = msgpack.Packer(use_bin_type=True).pack


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


async def _read_answer(reader: asyncio.StreamReader, buf: bytearray, until_answer: bool) -> str:
    """Read into ``buf`` (8 MiB at most) until the node closes ("closed"), the connection breaks
    ("reset") or, with ``until_answer``, a whole response is in ("answered")."""
    try:
        while len(buf) < (8 << 20):
            chunk = await reader.read(65536)
            if not chunk:
                return "closed"
            buf.extend(chunk)
            if until_answer and parse_response(bytes(buf))[0] is not None:
                return "answered"
    except (ConnectionError, OSError):
        return "reset"
    return "closed"


async def _send_parts(writer: asyncio.StreamWriter, parts: Sequence[Part],
                      reading: asyncio.Future[str], half_close: bool) -> None:
    """Write ``parts``, waiting where a part is a number, until ``reading`` ends (the node closed
    or answered); then half-close if asked."""
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
        reader, writer = await open_stream(ctx, target, source)
    except (OSError, TimeoutError):
        return Answer(error="connect", elapsed=time.monotonic() - started)
    buf = bytearray()
    reading = asyncio.ensure_future(_read_answer(reader, buf, until_answer))
    await _send_parts(writer, parts, reading, half_close)
    try:
        end = await asyncio.wait_for(asyncio.shield(reading),
                                     ctx.read_timeout if read_timeout is None else read_timeout)
    except TimeoutError:
        end = "open"
    finally:
        reading.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
    status, headers, body, _ = parse_response(bytes(buf))
    return Answer(status, headers, body, end, time.monotonic() - started)


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


async def post_each(ctx: Ctx, target: Target, out: Outcome, cls: str,
                    cases: Sequence[tuple[str, bytes, str]], statuses: Iterable[int],
                    codes: Iterable[str] | None, path: str | None = None) -> Outcome:
    """POST each (case, body, content type) to a junk key (or ``path``) and check the refusal."""
    for i, (case, body, ctype) in enumerate(cases):
        p = path or counter_path(ctx, ctx.junk_key(cls, i))
        ans = await post(ctx, target, p, body, ctype)
        out.requests += 1
        expect_reject(out, case, ans, statuses, codes)
    return out


async def keepalive_get(ctx: Ctx, t: Target, source: str | None
                        ) -> tuple[Answer, asyncio.StreamWriter | None]:
    """Open a connection, GET /v1/health on it (keep-alive) and leave it open."""
    ctx.count()
    started = time.monotonic()
    try:
        reader, writer = await open_stream(ctx, t, source)
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
