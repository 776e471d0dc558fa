"""The hot routes without aiohttp: a raw asyncio protocol, parsing with ``httptools``.

Every client connection starts here (``Listener.raw_factory``). It serves the routes the SDK
uses, ``POST /v1/counters/{table}/{key}``, ``POST /v1/batch``, ``GET /v1/counters/{table}/{key}``
and ``GET /v1/health``, through the same functions as the aiohttp app (``cluster.edge.routes``).
At the first request it does not serve, or does not serve exactly as aiohttp would (another
route or method, a chunked body, ``Expect``, ``Upgrade``, a percent-encoded path, a body over
the limit, a request ``httptools`` refuses, headers past aiohttp's line limit), it hands the
connection to aiohttp's protocol at that request's first byte, feeding it the bytes it holds:
the move ``PortMux`` makes after sniffing. aiohttp then has the connection for good.

Requests on a connection are answered one at a time, in order (pipelined ones wait in the
buffer). The guards are aiohttp's: ``header_timeout`` (408, counted as the listener's refusal),
``body_timeout`` (408, close), ``idle_timeout`` (close), an unread body skipped for at most
``lingering_time``, and a drain on stop. Timers are armed only when a request is incomplete;
the idle one is armed once per connection and re-armed when it fires early.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from email.utils import formatdate
from http import HTTPStatus

import httptools

from cluster.core.errors import ClusterError, RequestTimeout
from cluster.edge import routes
from cluster.edge.listener import Listener
from cluster.edge.routes import WWW_AUTHENTICATE, Edge, encode, refusal, wants_msgpack
from cluster.roles.member import Node

log = logging.getLogger("cluster.http")

MAX_HEAD = 8190  # aiohttp's max_line_size / max_field_size: a longer head is aiohttp's to refuse
MAX_HEADERS = 128  # aiohttp's max_headers: more are aiohttp's to refuse
_HIGH_WATER = 1 << 16  # bytes buffered past what a request needs before reading pauses
_KNOWN = frozenset((b"host", b"content-length", b"content-type", b"accept", b"authorization",
                    b"transfer-encoding", b"expect", b"upgrade"))
_COUNTERS = b"/v1/counters/"
_CONSISTENCY = b"consistency="

_STATUS = {(v, s.value): f"HTTP/{v} {s.value} {s.phrase}\r\n".encode()
           for v in ("1.0", "1.1") for s in HTTPStatus}
_CTYPE = {False: b"Content-Type: application/json\r\n",
          True: b"Content-Type: application/msgpack\r\n"}
_INTERNAL = json.dumps({"error": {"code": "internal", "message": "internal error"}},
                       separators=(",", ":")).encode()
_WWW = f"WWW-Authenticate: {WWW_AUTHENTICATE}\r\n".encode()
_date = [0, b""]


def _date_line() -> bytes:
    now = int(time.time())
    if now != _date[0]:
        _date[:] = [now, b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"]
    return _date[1]  # type: ignore[return-value]


class Request:
    """One request the raw protocol serves: its route, arguments and the headers it reads."""

    __slots__ = ("route", "table", "key", "consistency", "version", "keep_alive", "ctype",
                 "accept", "auth")

    def __init__(self, route: str, table: str = "", key: str = "",
                 consistency: str | None = None) -> None:
        self.route, self.table, self.key, self.consistency = route, table, key, consistency
        self.version, self.keep_alive = "1.1", True
        self.ctype = self.accept = ""
        self.auth: str | None = None


def match(method: bytes, url: bytes) -> Request | None:
    """The raw route of ``method url``, or None: aiohttp's to answer. Only targets whose
    meaning cannot differ between the two paths match (no percent-encoding, no dot segments,
    a plain ``consistency=`` query)."""
    if not url.startswith(b"/") or b"%" in url or b"#" in url or not url.isascii():
        return None
    path, _, query = url.partition(b"?")
    if path == b"/v1/batch":
        return Request("batch") if method == b"POST" else None
    if path == b"/v1/health":
        return Request("health") if method == b"GET" else None
    if not path.startswith(_COUNTERS):
        return None
    names = path[len(_COUNTERS):].split(b"/")
    if len(names) != 2 or not all(names) or {b".", b".."} & set(names):
        return None
    table, key = names[0].decode(), names[1].decode()
    if method == b"POST":
        return Request("post_counter", table, key)
    if method != b"GET":
        return None
    if not query:
        return Request("get_counter", table, key)
    if (not query.startswith(_CONSISTENCY) or query.count(b"=") != 1
            or any(c in query for c in b"&;+")):
        return None
    return Request("get_counter", table, key, query[len(_CONSISTENCY):].decode())


class RawServer:
    """What every raw connection shares: the node, its edge, the limits, and the connections
    open now (for the drain on stop)."""

    def __init__(self, node: Node, edge: Edge, listener: Listener, *,
                 lingering_time: float) -> None:
        self.node, self.edge, self.listener = node, edge, listener
        cfg = node.config
        self.header_timeout, self.body_timeout = cfg.header_timeout, cfg.body_timeout
        self.idle_timeout, self.lingering_time = cfg.idle_timeout, lingering_time
        self.max_body = cfg.max_body_bytes
        self.conns: set[RawHttp] = set()
        self.closing = False

    def protocol(self, client: str) -> RawHttp:
        return RawHttp(self, client)

    async def drain(self, timeout: float) -> None:
        """Stop: idle connections close now, busy ones after their answer (``Connection:
        close``); whatever is still busy after ``timeout`` is closed."""
        self.closing = True
        for conn in list(self.conns):
            conn.shutdown()
        deadline = time.monotonic() + timeout
        while any(c.busy for c in self.conns) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.abort()

    def abort(self) -> None:
        for conn in list(self.conns):
            conn.close()


class RawHttp(asyncio.Protocol):
    """One client connection while the raw protocol has it."""

    def __init__(self, server: RawServer, client: str) -> None:
        self.server, self.client = server, client
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False  # a request is being answered
        self._body: bytes | None = None  # the current request's body, when it came whole
        self._pending = 0  # else its length: still (partly) to come, at the start of buf
        self._waiter: asyncio.Future[bytes] | None = None  # a handler waiting for its body
        self._skip = 0  # bytes of an unread body still to discard
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # when the last answer went out
        self._read_paused = self._write_paused = self._closing = False
        # what the parser's callbacks collect for the request being parsed
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._count = 0
        self._odd = False  # a header this protocol leaves to aiohttp
        self._parser: httptools.HttpRequestParser | None = None
        self._head: tuple[bytes, str, bool, bool] | None = None  # method, version, keep-alive,
        # upgrade: read when the headers are complete (llhttp resets them at the message's end)

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # once per connection: get_running_loop() costs a getpid() syscall on Python 3.11
        self.loop = asyncio.get_running_loop()
        self.server.conns.add(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.busy:
            self._advance()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done() and len(buf) >= self._pending:
            waiter.set_result(self._take())
        elif len(buf) > self._pending + _HIGH_WATER and not self._read_paused:
            assert self.transport is not None
            self._read_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # as aiohttp: the transport closes (an in-flight answer is dropped)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self.busy:
            self._advance()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._cancel_timers()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(RequestTimeout("connection closed before the body was "
                                                      "complete"))
        if self in self.server.conns:
            self.server.conns.discard(self)
            self.server.listener.released_raw(self.client)

    # -- parser callbacks (httptools) --------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count += 1
        name = name.lower()
        if name in _KNOWN:
            if name in self._headers:
                self._odd = True  # a repeated header: which one counts is aiohttp's call
            self._headers[name] = value.strip()

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        self._head = (parser.get_method(), parser.get_http_version(),
                      parser.should_keep_alive(), parser.should_upgrade())

    # -- requests ----------------------------------------------------------------------------

    def _advance(self) -> None:
        """Start on the next buffered request, if there is a whole head; hand the connection
        over at a request this protocol does not serve."""
        buf = self.buf
        if self._skip:  # the rest of a body the route did not read, for lingering_time at most
            n = min(self._skip, len(buf))
            del buf[:n]
            self._skip -= n
            if self._skip:
                if self._body_timer is None:
                    self._body_timer = asyncio.get_running_loop().call_later(
                        self.server.lingering_time, self.close)
                return
            self._cancel_body_timer()
        if self._closing or self._write_paused or self.transport is None:
            return
        if self.server.closing:
            self.close()
            return
        if buf[:1] in (b"\r", b"\n"):  # stray line ends before a request, as llhttp skips
            while buf[:1] in (b"\r", b"\n"):
                del buf[:1]
            if not buf and self._header_timer is None:  # a request has begun, for the clock
                self._header_timer = asyncio.get_running_loop().call_later(
                    self.server.header_timeout, self._too_slow)
        if not buf:
            return
        end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._hand_over()
            elif self._header_timer is None:
                self._header_timer = asyncio.get_running_loop().call_later(
                    self.server.header_timeout, self._too_slow)
            return
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        head = end + 4
        req, length = self._parse(bytes(buf[:head]))
        if req is None:
            self._hand_over()
            return
        del buf[:head]
        self.busy = True
        self._pending = length
        if len(buf) >= length:
            self._body = self._take()
        self.loop.create_task(self._serve(req))

    def _parse(self, head: bytes) -> tuple[Request | None, int]:
        """The head's request and its body length; (None, 0) when it is aiohttp's."""
        self._url, self._headers, self._count, self._odd = b"", {}, 0, False
        self._head = None
        self._parser = parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return None, 0
        finally:
            self._parser = None
        headers = self._headers
        if self._head is None:
            return None, 0
        method, version, keep_alive, upgrade = self._head
        if (self._odd or self._count > MAX_HEADERS or version not in ("1.1", "1.0") or upgrade
                or b"transfer-encoding" in headers or b"expect" in headers
                or b"upgrade" in headers or (version == "1.1" and b"host" not in headers)):
            return None, 0
        req = match(method, self._url)
        if req is None:
            return None, 0
        length = int(headers.get(b"content-length", b"0"))  # llhttp checked it is a number
        if length > self.server.max_body or (length and method != b"POST"):
            return None, 0  # aiohttp answers 413 after reading past the limit; or a GET body
        req.version, req.keep_alive = version, keep_alive
        req.ctype = headers.get(b"content-type", b"").decode("utf-8", "surrogateescape")
        req.accept = headers.get(b"accept", b"").decode("utf-8", "surrogateescape")
        auth = headers.get(b"authorization")
        req.auth = None if auth is None else auth.decode("utf-8", "surrogateescape")
        return req, length

    async def _read(self) -> bytes:
        """The current request's body (``routes.BodyReader``): at once when it came whole,
        else within ``body_timeout``."""
        if self._body is not None:
            body, self._body = self._body, None
            return body
        if len(self.buf) >= self._pending:  # it came while the route started
            return self._take()
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timeout = self.server.body_timeout
        self._body_timer = loop.call_later(timeout, self._body_late, timeout)
        try:
            return await waiter
        finally:
            self._waiter = None
            self._cancel_body_timer()

    def _take(self) -> bytes:
        """The current request's body, out of the buffer."""
        n, self._pending = self._pending, 0
        body = bytes(self.buf[:n])
        del self.buf[:n]
        return body

    def _body_late(self, timeout: float) -> None:
        self._body_timer = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(RequestTimeout(
                f"request body not complete within {timeout:g} s"))

    async def _serve(self, req: Request) -> None:
        node = self.server.node
        hist = node.metrics.request_histogram(req.route)
        start = time.perf_counter()
        mp = wants_msgpack(req.accept, req.ctype)
        status, extra, close = 200, b"", not req.keep_alive
        try:
            self.server.edge.check_token(req.route, req.auth)
            if req.route == "post_counter":
                body = await routes.post_counter(node, req.table, req.key, self._read, req.ctype,
                                                 mp)
            elif req.route == "batch":
                body = await routes.post_batch(node, self._read, req.ctype, mp)
            elif req.route == "get_counter":
                body = await routes.get_counter(node, req.table, req.key, req.consistency, mp)
            else:
                body = routes.health(node, mp)
        except ClusterError as exc:
            payload, unauthorized, close_now = refusal(node.metrics, exc)
            status, body = exc.status, encode(payload, mp)
            if unauthorized:
                extra = _WWW
            close = close or close_now
        except Exception as exc:  # a bug: logged, answered 500 in the error shape, closed
            log.error("error handling a request", exc_info=exc)
            status, body, mp, close = 500, _INTERNAL, False, True
        finally:
            hist.observe(time.perf_counter() - start)
        self._answer(req, status, body, mp, extra, close)

    def _answer(self, req: Request, status: int, body: bytes, mp: bool, extra: bytes,
                close: bool) -> None:
        transport = self.transport
        self._body = None  # a whole body the route did not read goes with its request
        self._skip, self._pending = self._pending, 0  # one still coming is skipped
        if transport is None or transport.is_closing():
            self.busy = False
            return
        close = close or self.server.closing
        if req.version == "1.1":
            conn = b"Connection: close\r\n" if close else b""
        else:
            conn = b"" if close else b"Connection: keep-alive\r\n"
        transport.write(b"".join((
            _STATUS[req.version, status], _CTYPE[mp],
            b"Content-Length: %d\r\n" % len(body), extra, _date_line(), conn, b"\r\n", body)))
        self.busy = False
        if close:
            self.close()
            return
        loop = self.loop
        self._last = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_later(self.server.idle_timeout, self._idle)
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        self._advance()

    def _idle(self) -> None:
        """The keep-alive timeout: close a connection with no request for ``idle_timeout``."""
        self._idle_timer = None
        if self.busy or self.buf or self.transport is None:
            return  # the next answer re-arms it; a partial request has the header timer
        loop = asyncio.get_running_loop()
        left = self._last + self.server.idle_timeout - loop.time()
        if left <= 0:
            self.close()
        else:
            self._idle_timer = loop.call_later(left, self._idle)

    def _too_slow(self) -> None:
        self._header_timer = None
        self.server.listener.too_slow(self.client, self.transport)

    def _hand_over(self) -> None:
        """Give the connection to aiohttp's protocol, from the current request's first byte."""
        transport = self.transport
        assert transport is not None
        self._cancel_timers()
        self.server.conns.discard(self)  # counted on: the guard releases it when it closes
        self.transport = None
        if self._read_paused:
            transport.resume_reading()
        guard = self.server.listener.guarded(self.client)
        data, self.buf = bytes(self.buf), bytearray()
        transport.set_protocol(guard)
        guard.connection_made(transport)
        if data:
            guard.data_received(data)

    def shutdown(self) -> None:
        """The node is stopping: close now when idle, else after the answer in progress."""
        if not self.busy:
            self.close()

    def close(self) -> None:
        self._closing = True
        self._cancel_timers()
        if self.transport is not None:
            self.transport.close()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_body_timer()
        for name in ("_header_timer", "_idle_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)
