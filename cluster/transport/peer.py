"""Persistent, batched peer connections: one outbound link per peer, many ops per frame.

Callers ask a ``PeerLink`` for ``call(kind, items)``; every call made in the same event-loop turn
to the same peer and kind is coalesced into one frame, so a hundred concurrent single-op HTTP
requests cost one frame, not a hundred. Replies are sliced back to their callers.
Inbound connections arrive on the node's HTTP port and are told apart by ``wire.MAGIC``
(``cluster.edge.listener``), so a node needs one address only, as ``--peers`` lists. Frames are
signed and checked per connection when the cluster has a secret (``cluster.transport.auth``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cluster.core.config import NodeConfig
from cluster.core.errors import PeerError
from cluster.transport.auth import AuthError, PeerAuth, Signer, Verifier
from cluster.transport.wire import (
    MAGIC,
    PROTOCOL_VERSION,
    SPEAKS,
    FrameDecoder,
    Kind,
    NewerForm,
    check_hello,
    encode_frame,
)

log = logging.getLogger("cluster.peer")

Handler = Callable[[str, int, Any], Any]  # (peer id, kind, body) -> reply or awaitable reply
Waiter = tuple[int, int, "asyncio.Future[Any]"]


class PeerProtocol(asyncio.Protocol):
    """Frames in both directions: requests go to ``handler``, replies resolve ``on_reply``."""

    def __init__(self, handler: Handler | None, on_reply: Callable[[int, int, Any], None] | None,
                 on_lost: Callable[[Exception | None], None] | None = None, *,
                 auth: PeerAuth | None = None, signer: Signer | None = None,
                 verifier: Verifier | None = None) -> None:
        """An inbound connection gets ``auth`` (its first frame must be a signed HELLO when
        the node has a secret); an outbound one gets the ``signer`` and ``verifier`` its
        HELLO set up (``PeerAuth.dial``)."""
        self.handler = handler
        self.on_reply = on_reply
        self.on_lost = on_lost
        self.peer_id = "?"
        self.transport: asyncio.Transport | None = None
        self.auth = auth
        self._signer = signer
        if verifier is not None:
            self._decoder = FrameDecoder(verifier=verifier)
        elif auth is not None and auth.enabled:
            self._decoder = FrameDecoder(accept=self._accept)
        else:
            self._decoder = FrameDecoder()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # set when connected
        self._replies: list[bytes] = []  # written together at the end of the loop turn
        # the form frames go out in (``wire``): the cluster's finalized protocol on a dialed
        # link (``PeerLink.form``); replies on an inbound one stay in form 1, which every
        # release reads (a reply form that needs more is for the release that brings one)
        self.form = 1

    def _accept(self, hello: Any, signed: bytes | memoryview, trailer: bytes) -> Verifier:
        assert self.auth is not None
        self.peer_id, self._signer, verifier = self.auth.accept(hello, signed, trailer)
        check_hello(hello)
        return verifier

    @property
    def awaiting_hello(self) -> bool:
        """An inbound connection on a cluster with a secret whose HELLO has not checked out."""
        return self._decoder.awaiting_hello

    def encode(self, kind: int, req_id: int, body: Any) -> bytes:
        return encode_frame(kind, req_id, body, self._signer, self.form)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        decoder = self._decoder
        dropped = decoder.dropped
        try:
            frames = decoder.feed(data)
        except PeerError as exc:
            self._refuse(exc)
            return
        if decoder.dropped != dropped and self.auth is not None:
            for _ in range(decoder.dropped - dropped):
                self.auth.reject("replay", self.peer_id, "frame sequence number already used")
        for kind, req_id, body in frames:
            if isinstance(body, NewerForm):  # a form this node does not speak: never read
                log.warning("peer frame from %s refused: %s", self.peer_id, body.error)
                if kind >= Kind.REPLY:
                    if self.on_reply is not None:
                        self.on_reply(Kind.ERROR, req_id, str(body.error))
                else:
                    self._reply_error(req_id, body.error)
            elif kind >= Kind.REPLY:
                if self.on_reply is not None:
                    self.on_reply(kind, req_id, body)
            elif kind == Kind.HELLO:
                self.peer_id = str(body.get("node", "?")) if isinstance(body, dict) else "?"
                if not decoder.signed:  # a signed HELLO was checked by ``_accept``
                    try:
                        check_hello(body)
                    except PeerError as exc:
                        self._refuse(exc)
                        return
            elif self.handler is not None:
                self._dispatch(kind, req_id, body)

    def _refuse(self, exc: PeerError) -> None:
        reason = exc.reason if isinstance(exc, AuthError) else "bad_frame"
        if self.auth is not None:
            self.auth.reject(reason, self.peer_id, exc)
        else:
            log.warning("closing peer connection from %s: %s", self.peer_id, exc)
        if self.transport is not None:
            self.transport.close()

    def _dispatch(self, kind: int, req_id: int, body: Any) -> None:
        try:
            result = self.handler(self.peer_id, kind, body)  # type: ignore[misc]
        except Exception as exc:  # a bad request must not take the connection down
            self._reply_error(req_id, exc)
            return
        if isinstance(result, asyncio.Future):  # reply from a callback: no task per frame
            result.add_done_callback(lambda f: self._finished(req_id, f))
        elif isinstance(result, Awaitable):
            task = asyncio.ensure_future(self._finish(req_id, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(self.encode(Kind.REPLY, req_id, result))

    async def _finish(self, req_id: int, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reply_error(req_id, exc)
            return
        self._reply(self.encode(Kind.REPLY, req_id, result))

    def _finished(self, req_id: int, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self._reply_error(req_id, PeerError("cancelled"))
        elif (exc := fut.exception()) is not None:
            self._reply_error(req_id, exc)  # type: ignore[arg-type]
        else:
            self._reply(self.encode(Kind.REPLY, req_id, fut.result()))

    def _reply_error(self, req_id: int, exc: Exception) -> None:
        log.warning("peer request from %s failed: %r", self.peer_id, exc)
        self._reply(self.encode(Kind.ERROR, req_id, f"{type(exc).__name__}: {exc}"))

    def send(self, frame: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)

    def _reply(self, frame: bytes) -> None:
        """Replies go out together at the end of the loop turn: a group commit answers many
        frames at once, and one write of all of them is one syscall instead of one each."""
        if self._loop is None:
            self.send(frame)
            return
        replies = self._replies
        replies.append(frame)
        if len(replies) == 1:
            self._loop.call_soon(self._write_replies)

    def _write_replies(self) -> None:
        replies, self._replies = self._replies, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(replies)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for task in list(self._tasks):
            task.cancel()
        if self.on_lost is not None:
            self.on_lost(exc)


class _Batch:
    __slots__ = ("items", "waiters")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.waiters: list[Waiter] = []



def refusal(peer_id: str, closed: bool, fault: Callable[[int, list[Any]], bool] | None,
            kind: int, items: list[Any]) -> PeerError | None:
    """Why a call on a link fails before it is queued: the link is closed, or the test fault
    hook drops it. None when it goes ahead. (The TCP link and the simulator's link share it.)"""
    if closed:
        return PeerError(f"link to {peer_id} is closed")
    if fault is not None and fault(kind, items):
        return PeerError(f"fault hook dropped a {kind} call to {peer_id}")
    return None


def resolve_waiters(peer_id: str, waiters: list[Waiter], kind: int, body: Any) -> None:
    """Answer the calls merged into one frame: each gets its slice of a list reply (or the
    whole reply), or every one the peer's error."""
    if kind == Kind.ERROR:
        err = PeerError(f"peer {peer_id}: {body}")
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(err)
        return
    sliced = isinstance(body, list)
    for start, count, fut in waiters:
        if not fut.done():
            fut.set_result(body[start : start + count] if sliced else body)

class PeerLink:
    """Outbound connection to one peer, connected lazily and again after a loss."""

    def __init__(self, own_id: str, peer_id: str, host: str, port: int, *,
                 connect_timeout: float = 1.0, retry_interval: float = 0.2,
                 max_inflight_frames: int = 0, auth: PeerAuth | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.own_id, self.peer_id, self.host, self.port = own_id, peer_id, host, port
        self.auth = auth if auth is not None else PeerAuth(own_id, None)
        self.ssl = ssl_context  # TLS to the peer (``peer_ssl``)
        # Frames of one kind allowed unanswered at once (0: no limit). While the limit is
        # reached, calls accumulate into the next frame: bigger frames exactly when busy.
        self.max_inflight_frames = max_inflight_frames
        self._kind_inflight: dict[int, int] = {}
        self.connect_timeout = connect_timeout
        self.retry_interval = retry_interval
        self._proto: PeerProtocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._last_failure = 0.0
        self._pending: dict[int, _Batch] = {}
        self._flush_scheduled = False
        self._inflight: dict[int, tuple[list[Waiter], float, int]] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None  # kept: see ``call``
        self._closed = False
        # Test hook: ``fault(kind, items)`` returning True fails the call as if the peer were
        # unreachable (deterministic interleavings in tests/test_fault_*.py).
        self.fault: Callable[[int, list[Any]], bool] | None = None
        self.frames_sent = 0
        self.items_sent = 0
        self.bytes_sent = 0
        self._form = 1

    @property
    def form(self) -> int:
        """The form this link's frames go out in: the cluster's finalized protocol version."""
        return self._form

    @form.setter
    def form(self, value: int) -> None:
        self._form = value
        if self._proto is not None:
            self._proto.form = value

    @property
    def connected(self) -> bool:
        return self._proto is not None

    def maybe_live(self) -> bool:
        """Connected, or not known to have failed within the last retry interval."""
        return self._proto is not None or (
            time.monotonic() - self._last_failure >= self.retry_interval
        )

    @property
    def inflight(self) -> int:
        return len(self._inflight) + sum(len(b.items) for b in self._pending.values())

    def call(self, kind: int, items: list[Any], *, probe: bool = False) -> asyncio.Future[Any]:
        """Queue ``items`` for the next frame of ``kind``; the future gets this call's replies.
        A ``probe`` (heartbeat) always tries to connect and never marks the peer as failed, so
        a peer that comes back is reached by the next probe, not after a back-off."""
        loop = self._loop  # get_running_loop() costs a getpid() syscall on Python 3.11
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        refused = refusal(self.peer_id, self._closed, self.fault, kind, items)
        if refused is not None:
            fut.set_exception(refused)
            return fut
        if self._proto is None:
            if not probe and not self.maybe_live() and self._connecting is None:
                fut.set_exception(PeerError(f"peer {self.peer_id} is unreachable"))
                return fut
            self._ensure_connecting(record_failure=not probe)
        batch = self._pending.get(kind)
        if batch is None:
            batch = self._pending[kind] = _Batch()
        batch.waiters.append((len(batch.items), len(items), fut))
        batch.items.extend(items)
        if not self._flush_scheduled and self._proto is not None:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        proto = self._proto
        if proto is None or proto.transport is None or not self._pending:
            return
        now = time.monotonic()
        frames = []
        limit, counts = self.max_inflight_frames, self._kind_inflight
        for kind, batch in list(self._pending.items()):
            if limit and counts.get(kind, 0) >= limit:
                continue  # sent when a reply frees a slot
            del self._pending[kind]
            req_id = next(self._ids)
            try:
                frame = proto.encode(kind, req_id, batch.items)
            except (ValueError, TypeError, OverflowError) as exc:  # a bug upstream: fail
                err = PeerError(f"cannot encode a {kind} frame for {self.peer_id}: {exc!r}")
                for _, _, fut in batch.waiters:  # these callers, not the link
                    if not fut.done():
                        fut.set_exception(err)
                continue
            counts[kind] = counts.get(kind, 0) + 1
            self._inflight[req_id] = (batch.waiters, now, kind)
            frames.append(frame)
            self.items_sent += len(batch.items)
            self.bytes_sent += len(frame)
        self.frames_sent += len(frames)
        if frames:
            proto.transport.writelines(frames)

    def _release(self, kind: int) -> None:
        self._kind_inflight[kind] -= 1
        if kind in self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _on_reply(self, kind: int, req_id: int, body: Any) -> None:
        entry = self._inflight.pop(req_id, None)
        if entry is None:
            return
        self._release(entry[2])
        resolve_waiters(self.peer_id, entry[0], kind, body)

    def forget_failure(self) -> None:
        """Let the next call try to connect again at once (a peer that was still starting)."""
        self._last_failure = 0.0

    def connect_soon(self) -> None:
        """Start connecting now, so the first op does not pay for the handshake. A failure
        here (the peer is still starting) does not mark the peer as failed."""
        if self._proto is None:
            self._ensure_connecting(record_failure=False)

    def _ensure_connecting(self, record_failure: bool = True) -> None:
        if self._connecting is None and not self._closed:
            self._connecting = asyncio.ensure_future(self._connect(record_failure))

    async def _connect(self, record_failure: bool = True) -> None:
        loop = asyncio.get_running_loop()
        hello, signer, verifier = self.auth.dial(self.peer_id)
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    lambda: PeerProtocol(None, self._on_reply, self._on_lost, auth=self.auth,
                                         signer=signer, verifier=verifier),
                    self.host, self.port, ssl=self.ssl),
                self.connect_timeout,
            )
        except (TimeoutError, OSError) as exc:
            if record_failure:
                self._last_failure = time.monotonic()
            self._fail_all(PeerError(f"cannot connect to peer {self.peer_id}: {exc!r}"))
            return
        finally:
            self._connecting = None
        if proto.transport is None:  # closed before we resumed (a proxy whose node is down):
            # connection_lost ran while no protocol was installed; installing it now would
            # leave a link that queues every call and sends none
            if record_failure:
                self._last_failure = time.monotonic()
            self._fail_all(PeerError(f"connection to peer {self.peer_id} closed at once"))
            return
        proto.peer_id = self.peer_id
        proto.send(MAGIC + proto.encode(Kind.HELLO, 0, {**hello, "version": PROTOCOL_VERSION,
                                                        "speaks": list(SPEAKS)}))
        proto.form = self._form
        self._proto = proto
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _on_lost(self, exc: Exception | None) -> None:
        self._proto = None
        self._last_failure = time.monotonic()
        self._fail_all(PeerError(f"connection to peer {self.peer_id} lost: {exc!r}"))

    def _fail_all(self, err: PeerError) -> None:
        waiters = [w for batch in self._pending.values() for w in batch.waiters]
        waiters += [w for ws, _, _ in self._inflight.values() for w in ws]
        self._pending.clear()
        self._inflight.clear()
        self._kind_inflight.clear()
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # a caller that already gave up must not leave it unretrieved

    def sweep(self, max_age: float) -> None:
        """Forget requests whose callers all gave up and that the peer never answered."""
        cutoff = time.monotonic() - max_age
        for req_id, (waiters, sent, kind) in list(self._inflight.items()):
            if sent < cutoff and all(f.done() for _, _, f in waiters):
                del self._inflight[req_id]
                self._release(kind)

    async def stop(self) -> None:
        self.abort()
        await asyncio.sleep(0)

    def abort(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._fail_all(PeerError(f"link to {self.peer_id} closed"))


def close_all(protocols: set[asyncio.Protocol]) -> None:
    for proto in list(protocols):
        transport = getattr(proto, "transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()


def peer_ssl(config: NodeConfig) -> ssl.SSLContext | None:
    """How this node dials peers over TLS: checked against ``tls_ca`` when given (no host name
    check: peers are addressed by IP); without a CA it only encrypts, and the HMAC on every
    frame is what authenticates the peer."""
    return None if config.tls_cert is None else dial_ssl(config.tls_ca)


def dial_ssl(ca_file: str | None) -> ssl.SSLContext:
    """A context for dialing a node's TLS port: its certificate checked against ``ca_file``
    when given (no host name check: nodes are addressed by IP), else encryption only."""
    if ca_file is not None:
        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.check_hostname = False
        return ctx
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
