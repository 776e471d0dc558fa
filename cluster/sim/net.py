"""The simulated network: ``SimLink`` has ``PeerLink``'s call API; ``SimNet`` carries its frames.

As the real link, every call made to one peer in one loop turn goes out as one frame per kind,
and the reply is sliced back to the callers. Every frame (request or reply) is msgpack-encoded
with the wire's options and decoded at the receiver, so nodes share no object. Faults, drawn per
frame from the net's seeded ``random.Random``:

    drop       the frame is lost (a request, or an ack after the peer processed it)
    delay      now and then a frame takes much longer (which also reorders frames)
    duplicate  the frame arrives twice (the handler runs twice; a second reply is ignored)
    partition  ``blocked`` directed pairs: frames vanish silently, as into a black hole
    crash      calls to a node that is down fail at once; its open calls fail (connection lost)
    pause      the node is frozen whole (``cluster.sim.loop``); frames to it wait in its inbox
               and are delivered, stale, when it resumes
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from cluster.core.errors import PeerError
from cluster.sim.loop import run_as
from cluster.transport.peer import Waiter, refusal, resolve_waiters
from cluster.transport.wire import Kind


class Host(Protocol):
    """What the network needs of a machine (``cluster.sim.world.Host``)."""

    id: str
    up: bool
    paused: bool
    held: list[Any]
    epoch: int
    inbox: list[Callable[[], None]]
    outbox: list[tuple[str, Callable[[], None]]]

    @property
    def node(self) -> Any: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Any: ...


_pack = msgpack.Packer(use_bin_type=True).pack


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


@dataclass
class Faults:
    """Per-frame fault probabilities (all zero when healed)."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0  # probability of a long delay
    delay_mean: float = 0.4  # seconds, exponential
    latency: tuple[float, float] = (0.0002, 0.002)


@dataclass
class SimNet:
    rng: random.Random
    faults: Faults = field(default_factory=Faults)
    hosts: Mapping[str, Host] = field(default_factory=dict)
    blocked: set[tuple[str, str]] = field(default_factory=set)
    frames: int = 0
    dropped: int = 0

    def transmit(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """Carry one frame src -> dst: maybe lose it, delay it, or deliver it twice."""
        self.frames += 1
        if (src, dst) in self.blocked or self.rng.random() < self.faults.drop:
            self.dropped += 1
            return
        copies = 2 if self.rng.random() < self.faults.duplicate else 1
        loop = asyncio.get_running_loop()
        for _ in range(copies):
            lo, hi = self.faults.latency
            delay = self.rng.uniform(lo, hi)
            if self.rng.random() < self.faults.delay:
                delay += self.rng.expovariate(1 / self.faults.delay_mean)
            # on the wire: its own callback, owned by no machine (a freeze of the sender
            # does not hold a frame that left)
            loop.call_later(delay, self._arrive, src, dst, deliver, context=contextvars.Context())

    def _arrive(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        if (src, dst) in self.blocked:
            self.dropped += 1
            return
        host = self.hosts[dst]
        if host.paused:
            host.inbox.append(deliver)
        else:
            run_as(host, deliver)

    def send(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """A frame leaves ``src``: held in its outbox while ``src`` is paused."""
        host = self.hosts[src]
        if host.paused:
            host.outbox.append((dst, deliver))
        else:
            self.transmit(src, dst, deliver)


class SimLink:
    """Outbound link from one node instance to a peer (``PeerLink``'s API)."""

    def __init__(self, net: SimNet, own: Host, peer_id: str) -> None:
        self.net, self.own, self.peer_id = net, own, peer_id
        self.epoch = own.epoch  # the node instance this link belongs to
        self._pending: dict[int, tuple[list[Any], list[Waiter]]] = {}
        self._inflight: dict[int, tuple[list[Waiter], float, int]] = {}
        self._flush_scheduled = False
        self._ids = itertools.count(1)
        self._closed = False
        self.fault: Callable[[int, list[Any]], bool] | None = None
        self.frames_sent = self.items_sent = self.bytes_sent = 0

    @property
    def connected(self) -> bool:
        return self.net.hosts[self.peer_id].up

    def maybe_live(self) -> bool:
        return self.connected

    @property
    def inflight(self) -> int:
        return len(self._inflight) + sum(len(b[0]) for b in self._pending.values())

    def call(self, kind: int, items: list[Any], *, probe: bool = False) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        refused = refusal(self.peer_id, self._closed, self.fault, kind, items)
        if refused is not None:
            fut.set_exception(refused)
            return fut
        if not self.connected:  # connection refused
            fut.set_exception(PeerError(f"peer {self.peer_id} is unreachable"))
            return fut
        batch = self._pending.get(kind)
        if batch is None:
            batch = self._pending[kind] = ([], [])
        batch[1].append((len(batch[0]), len(items), fut))
        batch[0].extend(items)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        pending, self._pending = self._pending, {}
        for kind, (items, waiters) in pending.items():
            req_id = next(self._ids)
            data = _pack(items)
            self._inflight[req_id] = (waiters, now, kind)
            self.frames_sent += 1
            self.items_sent += len(items)
            self.bytes_sent += len(data)
            target = self.net.hosts[self.peer_id]
            self.net.send(self.own.id, self.peer_id, _Request(self, target, target.epoch, kind,
                                                              req_id, data))

    def on_reply(self, kind: int, req_id: int, body: Any) -> None:
        entry = self._inflight.pop(req_id, None)
        if entry is None or self._closed:
            return
        resolve_waiters(self.peer_id, entry[0], kind, body)

    def lose(self, why: str) -> None:
        """The connection broke (the peer crashed): every open call fails."""
        err = PeerError(f"connection to peer {self.peer_id} lost: {why}")
        waiters = [w for _, ws in self._pending.values() for w in ws]
        waiters += [w for ws, _, _ in self._inflight.values() for w in ws]
        self._pending.clear()
        self._inflight.clear()
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(err)
                fut.exception()

    def forget_failure(self) -> None:
        pass

    def connect_soon(self) -> None:
        pass

    def sweep(self, max_age: float) -> None:
        cutoff = asyncio.get_running_loop().time() - max_age
        for req_id, (waiters, sent, _kind) in list(self._inflight.items()):
            if sent < cutoff and all(f.done() for _, _, f in waiters):
                del self._inflight[req_id]

    async def stop(self) -> None:
        self.abort()

    def abort(self) -> None:
        self._closed = True
        self.lose("link closed")


class _Request:
    """One request frame in flight; calling it delivers it to the peer's current instance."""

    __slots__ = ("link", "target", "epoch", "kind", "req_id", "data")

    def __init__(self, link: SimLink, target: Host, epoch: int, kind: int, req_id: int,
                 data: bytes) -> None:
        self.link, self.target, self.epoch = link, target, epoch
        self.kind, self.req_id, self.data = kind, req_id, data

    def __call__(self) -> None:
        target, link = self.target, self.link
        node = target.node
        if not target.up or target.epoch != self.epoch or node is None:
            return  # sent to an instance that crashed meanwhile: its connection is gone
        src = link.own.id
        try:
            result = node.handle_peer(src, self.kind, _unpack(self.data))
        except Exception as exc:  # as PeerProtocol._dispatch: an error reply
            self._reply(Kind.ERROR, f"{type(exc).__name__}: {exc}")
            return
        if isinstance(result, asyncio.Future):
            result.add_done_callback(self._finished)
        elif isinstance(result, Awaitable):
            target.spawn(self._finish(result))
        else:
            self._reply(Kind.REPLY, result)

    async def _finish(self, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reply(Kind.ERROR, f"{type(exc).__name__}: {exc}")
            return
        self._reply(Kind.REPLY, result)

    def _finished(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self._reply(Kind.ERROR, "PeerError: cancelled")
        elif (exc := fut.exception()) is not None:
            self._reply(Kind.ERROR, f"{type(exc).__name__}: {exc}")
        else:
            self._reply(Kind.REPLY, fut.result())

    def _reply(self, kind: int, body: Any) -> None:
        target, link = self.target, self.link
        if not target.up or target.epoch != self.epoch:
            return  # the replying instance crashed: the reply never left
        data = _pack(body)
        net = link.net

        def deliver() -> None:
            if link.own.up and link.own.epoch == link.epoch:
                link.on_reply(kind, self.req_id, _unpack(data))

        net.send(target.id, link.own.id, deliver)
