"""A lean HTTP/1.1 keep-alive load client for the benchmarks (raw asyncio, msgpack bodies).

The load generator shares the 2-core box with the nodes, so it must cost as little as possible:
requests are pre-formatted bytes, responses are parsed by Content-Length only.
"""

from __future__ import annotations

import asyncio


class HttpConn(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConn:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, host, port)
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._try_complete()

    def _try_complete(self) -> None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0 or self._waiter is None:
            return
        head = bytes(buf[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(buf) < end + 4 + length:
            return
        status = int(head.split(" ", 2)[1])
        body = bytes(buf[end + 4 : end + 4 + length])
        del buf[: end + 4 + length]
        waiter, self._waiter = self._waiter, None
        if not waiter.done():
            waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection lost: {exc!r}"))
        if not self._closed.done():
            self._closed.set_result(None)

    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = "application/msgpack") -> tuple[int, bytes]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: {content_type}\r\n"
                f"Accept: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.transport.write(head + body)
        return await self._waiter

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            await self._closed
