"""One proxied connection: the client side, the upstream side, and a ``Pipe`` per direction that
applies the stream toxics (latency, bandwidth, slicer, timeout, reset_peer, limit_data,
slow_close) to the bytes on their way. Protocol handlers (``client.proxy.protocols``) feed the
pipes, whole messages at a time where they understand the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from client.proxy.toxics import Toxic


class Proxy(Protocol):
    """What a connection needs of its proxy (``client.proxy.server.Proxy``): declared here, so
    the link does not import the server that imports it."""

    counters: Counter[str]
    rng: random.Random
    toxics: dict[str, Toxic]
    upstream_addr: tuple[str, int]
    connect_timeout: float
    protocol: str

    def forget(self, conn: Connection) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def gate(self, toxic: Toxic, where: str) -> Any: ...  # a protocols.ReorderGate

    async def send_http_copy(self, raw: bytes) -> None: ...


# Serves a connection once its upstream is open (the proxy's protocol, ``client.proxy.protocols``)
Handler = Callable[["Connection"], Awaitable[None]]

_ids = itertools.count(1)
_HIGH_WATER = 256  # queued chunks before a reader waits


class Pipe:
    """Delivers chunks to ``writer`` in order, through the connection's stream toxics."""

    def __init__(self, conn: Connection, direction: str, writer: asyncio.StreamWriter) -> None:
        self.conn = conn
        self.direction = direction
        self.writer = writer
        self.sent = 0
        self._queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self.task = conn.spawn(self._run())

    def send_nowait(self, data: bytes) -> None:
        self._queue.put_nowait((time.monotonic(), data))
        if self._queue.qsize() > _HIGH_WATER:
            self._room.clear()

    async def send(self, data: bytes) -> None:
        self.send_nowait(data)
        await self._room.wait()

    async def finish(self) -> None:
        """The source closed: deliver what is queued, then close the connection."""
        self._queue.put_nowait((time.monotonic(), None))
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self.task)

    async def _run(self) -> None:
        conn, rng = self.conn, self.conn.rng
        while True:
            if self._queue.qsize() <= _HIGH_WATER // 2:
                self._room.set()
            stamp, data = await self._queue.get()
            toxics = conn.stream_toxics(self.direction)
            delay = sum(max(0.0, t.attr("latency") + rng.uniform(-t.attr("jitter"),
                                                                 t.attr("jitter")))
                        for t in toxics if t.type == "latency") / 1000.0
            wait = stamp + delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:
                linger = max([t.attr("delay") for t in toxics if t.type == "slow_close"] or [0])
                if linger:
                    await asyncio.sleep(linger / 1000.0)
                conn.close()
                return
            if any(t.type == "timeout" for t in toxics):
                conn.proxy.counters["bytes_blackholed"] += len(data)
                continue
            if not await self._write(data, toxics):
                return

    async def _write(self, data: bytes, toxics: list[Toxic]) -> bool:
        conn = self.conn
        limits = [int(t.attr("bytes")) for t in toxics if t.type == "limit_data"]
        limit = min(limits) if limits else None
        if limit is not None:
            data = data[: max(0, limit - self.sent)]
        rates = [t.attr("rate") for t in toxics if t.type == "bandwidth" and t.attr("rate") > 0]
        rate = min(rates) * 1000.0 if rates else 0.0
        slicers = [t for t in toxics if t.type == "slicer" and t.attr("average_size") > 0]
        pieces = _slices(data, slicers[0], conn.rng) if slicers else [data]
        pause = slicers[0].attr("delay") / 1e6 if slicers else 0.0
        if rate:  # Toxiproxy's way: each piece waits for its share of the rate, then goes
            step = max(1, int(rate * 0.05))
            pieces = [p[i : i + step] for p in pieces for i in range(0, len(p), step)]
        try:
            for piece in pieces:
                if rate:
                    await asyncio.sleep(len(piece) / rate)
                self.writer.write(piece)
                await self.writer.drain()
                self.sent += len(piece)
                if pause:
                    await asyncio.sleep(pause)
        except (ConnectionError, OSError):
            conn.close()
            return False
        if limit is not None and self.sent >= limit:
            conn.close()
            return False
        return True


def _slices(data: bytes, toxic: Toxic, rng: random.Random) -> list[bytes]:
    avg, var = int(toxic.attr("average_size")), int(toxic.attr("size_variation"))
    out, pos = [], 0
    while pos < len(data):
        size = max(1, avg + rng.randint(-var, var) if var else avg)
        out.append(data[pos : pos + size])
        pos += size
    return out


class Connection:
    """A client connection and its upstream; ``close`` ends both, at once, exactly once."""

    def __init__(self, proxy: Proxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, handler: Handler) -> None:
        self.id = next(_ids)
        self.proxy = proxy
        self.handler = handler
        self.rng = proxy.rng
        self.client_r, self.client_w = reader, writer
        self.up_r: asyncio.StreamReader | None = None
        self.up_w: asyncio.StreamWriter | None = None
        self.to_upstream: Pipe | None = None
        self.to_client: Pipe | None = None
        self.draws: dict[int, bool] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.closed = asyncio.Event()
        self.main: asyncio.Task[Any] | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.close()

    def active(self, toxic: Toxic) -> bool:
        """Stream toxics: toxicity drawn once per connection (Toxiproxy's rule)."""
        key = id(toxic)
        hit = self.draws.get(key)
        if hit is None:
            hit = self.draws[key] = self.rng.random() < toxic.toxicity
        return hit

    def stream_toxics(self, direction: str) -> list[Toxic]:
        out = []
        for t in self.proxy.toxics.values():
            if not t.is_message and t.stream == direction and self.active(t):
                out.append(t)
                if t.type in ("timeout", "reset_peer"):
                    self.arm(t)
        return out

    def arm(self, toxic: Toxic) -> None:
        """Start a timeout/reset_peer toxic's timer on this connection (once)."""
        key = id(toxic)
        if key in self.timers or self.closed.is_set() or not self.active(toxic):
            return
        ms = float(toxic.attr("timeout"))
        if toxic.type == "timeout" and ms <= 0:
            self.timers[key] = asyncio.get_running_loop().call_later(1e9, lambda: None)
            return
        reset = toxic.type == "reset_peer"
        self.timers[key] = asyncio.get_running_loop().call_later(
            ms / 1000.0, lambda: self.close(reset=reset))

    def hit(self, toxic: Toxic) -> bool:
        """Message toxics: toxicity drawn per message."""
        return toxic.toxicity >= 1.0 or self.rng.random() < toxic.toxicity

    def message_toxics(self, direction: str) -> list[Toxic]:
        return [t for t in self.proxy.toxics.values() if t.is_message and t.stream == direction]

    async def run(self) -> None:
        proxy = self.proxy
        self.main = asyncio.current_task()
        try:
            try:
                host, port = proxy.upstream_addr
                up_r, up_w = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=1 << 22), proxy.connect_timeout)
            except (OSError, TimeoutError):
                proxy.counters["upstream_connect_failed"] += 1
                return
            self.up_r, self.up_w = up_r, up_w
            if self.closed.is_set():  # closed while connecting
                up_w.close()
                return
            self.to_upstream = Pipe(self, "upstream", up_w)
            self.to_client = Pipe(self, "downstream", self.client_w)
            for t in list(proxy.toxics.values()):
                if t.type in ("timeout", "reset_peer"):
                    self.arm(t)
            await self.handler(self)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                asyncio.CancelledError):
            pass
        finally:
            self.close()

    def close(self, *, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for timer in self.timers.values():
            timer.cancel()
        for w in (self.client_w, self.up_w):
            if w is None:
                continue
            if reset:
                _rst(w)
            else:
                w.close()
        current = asyncio.current_task()
        for task in [*self.tasks, self.main]:
            if task is not None and task is not current:
                task.cancel()
        self.proxy.forget(self)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer sees ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
