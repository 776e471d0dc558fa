"""What a proxy understands of the bytes it carries: nothing (tcp), HTTP/1.1 messages (http), or
the cluster's length-prefixed peer frames (peer). Message toxics act here, per message.

HTTP: one request is in flight per client connection (HTTP/1.1 without pipelining, which is what
aiohttp and curl do), so the handler reads a request, applies the upstream message toxics,
forwards it, reads the answer, applies the downstream ones, and writes it back. A request the
proxy holds (delay, reorder) is forwarded even if its client gave up meanwhile: it was "in the
network". Duplicates travel on their own upstream connection and their answers are discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from client.proxy.toxics import Toxic
from cluster.transport.auth import FLAG_SIGNED, TRAILER_BYTES
from cluster.transport.wire import HEADER, MAGIC

if TYPE_CHECKING:
    from client.proxy.link import Connection, Pipe

MAX_HEAD = 64 << 10


@dataclass(slots=True)
class Message:
    raw: bytes
    close: bool


async def read_http(reader: asyncio.StreamReader, *, request: bool) -> Message | None:
    """One whole HTTP/1.1 message, raw; None on a clean EOF before its first byte."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ConnectionError("connection closed inside an HTTP head") from exc
    if len(head) > MAX_HEAD:
        raise ConnectionError("HTTP head too large")
    lines = head[:-4].split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    close = headers.get(b"connection") == b"close"
    if not request:
        parts = lines[0].split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status < 200 or status in (204, 304):
            return Message(head, close)
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        return Message(head + await _read_chunked(reader), close)
    length = headers.get(b"content-length")
    if length is not None:
        return Message(head + await reader.readexactly(int(length)), close)
    if request:
        return Message(head, close)
    return Message(head + await reader.read(), True)  # body until the server closes


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the blank line
                trailer = await reader.readuntil(b"\r\n")
                out += trailer
                if trailer == b"\r\n":
                    return bytes(out)
        out += await reader.readexactly(size + 2)


class ReorderGate:
    """Holds items until ``count`` are waiting or ``window`` ms passed, then releases them in a
    shuffled order, ``spacing`` seconds apart (so the new order survives the event loop)."""

    def __init__(self, toxic: Toxic, rng: object, spacing: float = 0.002) -> None:
        self.toxic = toxic
        self.rng = rng
        self.spacing = spacing
        self._held: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def put(self, release: Callable[[], None]) -> None:
        self._held.append(release)
        if len(self._held) >= int(self.toxic.attr("count")):
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.toxic.attr("window") / 1000.0, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        self.rng.shuffle(held)  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        for i, release in enumerate(held):
            loop.call_later(i * self.spacing, release)

    async def hold(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.put(lambda: None if fut.done() else fut.set_result(None))
        await fut


async def _apply(conn: Connection, direction: str, raw: bytes,
                 send: Callable[[bytes], Awaitable[None]],
                 send_later: Callable[[bytes], None] | None = None) -> str:
    """Run the message toxics of ``direction``; returns "pass", "hang", "close" or "held" (a
    reorder gate took the message and will send it with ``send_later``)."""
    proxy = conn.proxy
    for toxic in conn.message_toxics(direction):
        if not conn.hit(toxic):
            continue
        proxy.counters[f"{toxic.type}_{direction}"] += 1
        kind = toxic.type
        if kind in ("drop", "lost_ack"):
            return str(toxic.attr("mode"))
        if kind == "delay":
            jitter = toxic.attr("jitter")
            await asyncio.sleep(max(0.0, toxic.attr("latency")
                                    + conn.rng.uniform(-jitter, jitter)) / 1000.0)
        elif kind == "reorder" and send_later is not None:
            proxy.gate(toxic, f"{direction}:{conn.id}").put(lambda: send_later(raw))
            return "held"
        elif kind == "reorder":
            await proxy.gate(toxic, direction).hold()
        elif kind == "duplicate":
            for _ in range(int(toxic.attr("copies"))):
                proxy.spawn(_later(toxic.attr("delay") / 1000.0, send, raw))
    return "pass"


async def _later(delay: float, send: Callable[[bytes], Awaitable[None]], raw: bytes) -> None:
    if delay > 0:
        await asyncio.sleep(delay)
    await send(raw)


async def run_tcp(conn: Connection) -> None:
    assert conn.up_r is not None and conn.to_upstream and conn.to_client
    await _both(_pump(conn.client_r, conn.to_upstream), _pump(conn.up_r, conn.to_client))


async def _both(a: Awaitable[None], b: Awaitable[None]) -> None:
    ta, tb = asyncio.ensure_future(a), asyncio.ensure_future(b)
    try:
        await asyncio.wait([ta, tb], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (ta, tb):
            if not t.done():
                t.cancel()
        for t in (ta, tb):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def _pump(reader: asyncio.StreamReader, pipe: Pipe) -> None:
    while True:
        data = await reader.read(65536)
        if not data:
            await pipe.finish()
            return
        await pipe.send(data)


async def run_http(conn: Connection) -> None:
    assert conn.up_r is not None and conn.to_upstream and conn.to_client
    proxy = conn.proxy
    while True:
        req = await read_http(conn.client_r, request=True)
        if req is None:
            break
        proxy.counters["messages_upstream"] += 1
        verdict = await _apply(conn, "upstream", req.raw, proxy.send_http_copy)
        if verdict == "close":
            conn.close()
            return
        if verdict == "hang":
            continue
        await conn.to_upstream.send(req.raw)
        resp = await read_http(conn.up_r, request=False)
        if resp is None:
            break
        proxy.counters["messages_downstream"] += 1
        verdict = await _apply(conn, "downstream", resp.raw, conn.to_client.send)
        if verdict == "close":
            conn.close()
            return
        if verdict == "hang":
            continue
        await conn.to_client.send(resp.raw)
        if req.close or resp.close:
            break
    await conn.to_client.finish()


async def run_peer(conn: Connection) -> None:
    assert conn.up_r is not None and conn.to_upstream and conn.to_client
    await _both(_frames(conn, conn.client_r, conn.to_upstream, "upstream"),
                _frames(conn, conn.up_r, conn.to_client, "downstream"))


async def _frames(conn: Connection, reader: asyncio.StreamReader, pipe: Pipe,
                  direction: str) -> None:
    """Split a peer stream into ``cluster.transport.wire`` frames; anything else passes through
    raw."""
    if direction == "upstream":
        magic = await reader.readexactly(len(MAGIC))
        await pipe.send(magic)
        if magic != MAGIC:
            return await _pump(reader, pipe)
    counters = conn.proxy.counters
    while True:
        try:
            header = await reader.readexactly(HEADER.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                await pipe.send(exc.partial)
            await pipe.finish()
            return
        length, flags = HEADER.unpack(header)
        if flags not in (0, FLAG_SIGNED):  # a trailer format this proxy does not know
            await pipe.send(header)
            return await _pump(reader, pipe)
        # A signed frame carries seq and MAC after its payload (cluster.transport.auth): the proxy
        # cannot forge one, but it can drop, delay, reorder or repeat it like any network can.
        frame = header + await reader.readexactly(
            length + (TRAILER_BYTES if flags == FLAG_SIGNED else 0))
        counters[f"messages_{direction}"] += 1
        verdict = await _apply(conn, direction, frame, pipe.send, pipe.send_nowait)
        if verdict == "close":
            conn.close()
            return
        if verdict == "pass":
            await pipe.send(frame)


HANDLERS: dict[str, Callable[[Connection], Awaitable[None]]] = {
    "tcp": run_tcp, "http": run_http, "peer": run_peer,
}
