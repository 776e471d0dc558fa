"""The node's one listening port: tell peers from HTTP clients, and keep hostile clients in check.

``PortMux`` reads a connection's first bytes: ``wire.MAGIC`` makes it a peer connection
(``cluster.transport.peer``, authenticated by ``cluster.transport.auth``), anything else an HTTP
one. Either kind is counted against its client address (``max_connections_per_client``: the next
one is closed, an HTTP one after a 429). An HTTP connection goes to the raw protocol
(``cluster.edge.raw``, when ``raw_factory`` is set), which serves the hot routes and enforces the
deadlines itself, and hands the connection to aiohttp's protocol, watched by ``HttpGuard``, at
the first request it does not serve. Once a request's first byte has arrived, its headers must
be complete within ``header_timeout`` (slowloris), else 408 and close; a peer connection's HELLO
must check out within the same time. On aiohttp's side the body's own deadline and the idle
keep-alive timeout are enforced in ``cluster.edge.http_api`` and by aiohttp. With
``tls_cert``/``tls_key`` the whole port speaks TLS and the sniffing happens on the decrypted
bytes, so clients and peers share one encrypted port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections import Counter
from collections.abc import Callable

from cluster.core.config import NodeConfig
from cluster.core.errors import ClusterError, ConfigError, RequestTimeout, TooManyConnections
from cluster.core.metrics import Refusals
from cluster.transport.auth import PeerAuth
from cluster.transport.peer import Handler, PeerProtocol
from cluster.transport.wire import MAGIC

log = logging.getLogger("cluster.listener")


def http_error(exc: ClusterError) -> bytes:
    """A whole HTTP/1.1 response carrying ``exc`` in the contract's error shape, for the cases
    answered below aiohttp (the connection is closed right after)."""
    body = json.dumps(exc.to_dict(), separators=(",", ":")).encode()
    reason = {408: "Request Timeout", 429: "Too Many Requests"}.get(exc.status, "Error")
    head = (f"HTTP/1.1 {exc.status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class EdgeStats:
    """What the listener refused, by reason (``/metrics``: ``idc_http_refused_total``), and
    the HTTP connections open now."""

    REASONS = ("too_many_connections", "header_timeout")

    def __init__(self) -> None:
        # ``refuse(reason, client)``: count a refused connection, and log it
        self.refuse = Refusals(log, "client connection refused", self.REASONS,
                               source="client")
        self.open_connections = 0


class HttpGuard(asyncio.Protocol):
    """Between the transport and aiohttp's protocol: the connection limit and the header
    deadline. ``Listener.request_started`` (called by the app's middleware once aiohttp has
    parsed a request's headers) stops the clock; the next byte after a response starts it."""

    __slots__ = ("inner", "listener", "client", "transport", "_timer", "_in_request")

    def __init__(self, inner: asyncio.Protocol, listener: Listener, client: str) -> None:
        self.inner = inner
        self.listener = listener
        self.client = client
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.listener.header_timeout, self._too_slow)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        self.listener.released(self)
        self.inner.connection_lost(exc)

    def request_started(self) -> None:
        self._in_request = True
        self._stop_clock()

    def request_finished(self) -> None:
        self._in_request = False

    def _stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        self.listener.too_slow(self.client, self.transport)


class Listener:
    """Makes the protocol of each accepted connection; owns the per-client connection counts."""

    def __init__(self, http_factory: Callable[[], asyncio.Protocol], peer_handler: Handler,
                 peers: set[asyncio.Protocol], *, auth: PeerAuth | None = None,
                 header_timeout: float = 10.0, max_connections_per_client: int = 256) -> None:
        self.http_factory = http_factory
        # the raw protocol's factory (``cluster.edge.raw``), given the client's address; None:
        # every HTTP connection goes to aiohttp's protocol at once
        self.raw_factory: Callable[[str], asyncio.Protocol] | None = None
        self.peer_handler = peer_handler
        self.peers = peers
        self.auth = auth
        self.header_timeout = header_timeout
        self.max_connections_per_client = max_connections_per_client
        self.stats = EdgeStats()
        self._per_client: Counter[str] = Counter()
        self._guards: dict[object, HttpGuard] = {}  # aiohttp protocol -> its guard

    def protocol(self) -> PortMux:
        return PortMux(self)

    def peer(self, transport: asyncio.Transport) -> PeerProtocol | None:
        """A peer connection, counted against its address like an HTTP one. On a cluster with
        a secret its HELLO must check out within ``header_timeout``, or it is closed: an
        unauthenticated connection holds nothing for long."""
        client = self._admit(transport, None)
        if client is None:
            return None
        proto = PeerProtocol(self.peer_handler, None, auth=self.auth)

        def lost(_exc: Exception | None) -> None:
            self.peers.discard(proto)
            self._release(client)

        proto.on_lost = lost
        self.peers.add(proto)
        if self.auth is not None and self.auth.enabled:
            asyncio.get_running_loop().call_later(self.header_timeout, self._hello_due, proto,
                                                  client)
        return proto

    def _hello_due(self, proto: PeerProtocol, client: str) -> None:
        if proto.transport is not None and proto.awaiting_hello:
            assert self.auth is not None
            self.auth.reject("hello_timeout", client,
                             f"no valid HELLO within {self.header_timeout:g} s")
            proto.transport.close()

    def http(self, transport: asyncio.Transport) -> asyncio.Protocol | None:
        """The guarded HTTP protocol for a new connection, or None when its client is over the
        limit (it has been answered 429)."""
        client = self._admit(transport, http_error(TooManyConnections(
            f"this address already has {self.max_connections_per_client} connections open; "
            "reuse them")))
        if client is None:
            return None
        self.stats.open_connections += 1
        if self.raw_factory is not None:
            return self.raw_factory(client)
        return self.guarded(client)

    def guarded(self, client: str) -> HttpGuard:
        """aiohttp's protocol, guarded, for a connection already counted against ``client``: a
        new one, or one the raw protocol hands over."""
        inner = self.http_factory()
        guard = HttpGuard(inner, self, client)
        self._guards[inner] = guard
        return guard

    def too_slow(self, client: str, transport: asyncio.Transport | None) -> None:
        """A request's headers missed ``header_timeout``: count it, answer 408, close."""
        self.stats.refuse("header_timeout", client)
        if transport is not None and not transport.is_closing():
            transport.write(http_error(RequestTimeout(
                f"request headers not complete within {self.header_timeout:g} s",
                code="request_timeout")))
            transport.close()

    def _admit(self, transport: asyncio.Transport, refusal: bytes | None) -> str | None:
        """Count a connection against its client address; None (after ``refusal``, and closed)
        when the address is at its limit."""
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self._per_client[client] >= self.max_connections_per_client:
            self.stats.refuse("too_many_connections", client)
            if refusal is not None:
                transport.write(refusal)
            transport.close()
            return None
        self._per_client[client] += 1
        return client

    def _release(self, client: str) -> None:
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    def released(self, guard: HttpGuard) -> None:
        if self._guards.pop(guard.inner, None) is None:
            return
        self.released_raw(guard.client)

    def released_raw(self, client: str) -> None:
        """A connection closed while the raw protocol had it (not handed over)."""
        self.stats.open_connections -= 1
        self._release(client)

    def guard_of(self, protocol: object) -> HttpGuard | None:
        return self._guards.get(protocol)


class PortMux(asyncio.Protocol):
    """First bytes decide: ``MAGIC`` makes a peer connection, anything else goes to HTTP."""

    SNIFF_TIMEOUT = 10.0  # a connection that never says what it is gets closed

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        timeout = min(self.SNIFF_TIMEOUT, self._listener.header_timeout)
        self._timer = asyncio.get_running_loop().call_later(timeout, transport.close)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        buf = self._buf
        if len(buf) < len(MAGIC) and MAGIC.startswith(buf):
            return  # not enough bytes to tell yet
        transport = self._transport
        assert transport is not None
        if self._timer is not None:
            self._timer.cancel()
        new: asyncio.Protocol | None
        if buf.startswith(MAGIC):
            new, rest = self._listener.peer(transport), buf[len(MAGIC):]
        else:
            new, rest = self._listener.http(transport), buf
        if new is None:
            return
        transport.set_protocol(new)
        new.connection_made(transport)
        if rest:
            new.data_received(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()


def server_ssl(config: NodeConfig) -> ssl.SSLContext | None:
    """The port's TLS context (None without ``tls_cert``)."""
    if config.tls_cert is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_cert/tls_key: cannot load: {exc}") from exc
    return ctx
