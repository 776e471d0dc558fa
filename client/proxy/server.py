"""``Proxy`` (one listener in front of one upstream, with its toxics) and ``ProxyServer`` (named
proxies plus, optionally, the Toxiproxy-shaped control API). Both are async context managers
with ``start``/``stop``/``abort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from client.proxy.errors import ProxyError as ProxyError
from client.proxy.link import Connection
from client.proxy.protocols import HANDLERS, ReorderGate, read_http
from client.proxy.toxics import PROTOCOLS, Toxic, ToxicError
from cluster.core.config import parse_hostport


class Proxy:
    """Listens on ``listen`` ("host:port", port 0 picks one) and forwards to ``upstream``."""

    def __init__(self, name: str, listen: str, upstream: str, *, protocol: str = "tcp",
                 enabled: bool = True, rng: random.Random | None = None,
                 connect_timeout: float = 2.0) -> None:
        if protocol not in PROTOCOLS:
            raise ProxyError(f"protocol: one of {PROTOCOLS}, got {protocol!r}")
        try:
            self.listen_addr = parse_hostport(listen, name="listen")
            self.upstream_addr = parse_hostport(upstream, name="upstream")
        except ValueError as exc:
            raise ProxyError(str(exc)) from exc
        self.name = name
        self.protocol = protocol
        self.enabled = enabled
        self.rng = rng or random.Random()
        self.connect_timeout = connect_timeout
        self.toxics: dict[str, Toxic] = {}
        self.conns: set[Connection] = set()
        self.counters: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gates: dict[tuple[str, str], ReorderGate] = {}

    # -- addresses -------------------------------------------------------------------------

    @property
    def listen(self) -> str:
        return f"{self.listen_addr[0]}:{self.listen_addr[1]}"

    @property
    def upstream(self) -> str:
        return f"{self.upstream_addr[0]}:{self.upstream_addr[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Proxy:
        await self.start()
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is asyncio.CancelledError:
            self.abort()
        else:
            await self.stop()

    async def start(self) -> None:
        if self.enabled:
            await self._listen()

    async def _listen(self) -> None:
        if self._server is not None:
            return
        host, port = self.listen_addr
        self._server = await asyncio.start_server(self._accept, host, port, limit=1 << 22,
                                                  reuse_address=True)
        self.listen_addr = (host, self._server.sockets[0].getsockname()[1])

    async def _unlisten(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.close_connections()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def stop(self) -> None:
        """Stop listening, close every connection, cancel held and duplicated messages."""
        await self._unlisten()
        await self._cancel_tasks()

    def abort(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.close_connections(reset=True)
        for task in list(self._tasks):
            task.cancel()

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def close_connections(self, *, reset: bool = False) -> None:
        for conn in list(self.conns):
            conn.close(reset=reset)

    async def enable(self) -> None:
        self.enabled = True
        await self._listen()

    async def disable(self) -> None:
        """Toxiproxy's "down": no listener, every open connection closed."""
        self.enabled = False
        await self._unlisten()

    async def update(self, data: Mapping[str, Any]) -> None:
        if "upstream" in data:
            try:
                self.upstream_addr = parse_hostport(str(data["upstream"]), name="upstream")
            except ValueError as exc:
                raise ProxyError(str(exc)) from exc
        if "listen" in data and str(data["listen"]) != self.listen:
            was = self._server is not None
            await self._unlisten()
            try:
                self.listen_addr = parse_hostport(str(data["listen"]), name="listen")
            except ValueError as exc:
                raise ProxyError(str(exc)) from exc
            if was:
                await self._listen()
        if "enabled" in data:
            await (self.enable() if data["enabled"] else self.disable())

    # -- connections -----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer, HANDLERS[self.protocol])
        self.conns.add(conn)
        self.counters["connections"] += 1
        await conn.run()

    def forget(self, conn: Connection) -> None:
        self.conns.discard(conn)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(_quiet_done(self._tasks))
        return task

    @property
    def pending(self) -> int:
        """Messages the proxy still holds to deliver later (delayed duplicates)."""
        return len(self._tasks)

    def gate(self, toxic: Toxic, where: str) -> ReorderGate:
        key = (toxic.name, where)
        gate = self._gates.get(key)
        if gate is None or gate.toxic is not toxic:
            gate = self._gates[key] = ReorderGate(toxic, self.rng)
        return gate

    async def send_http_copy(self, raw: bytes) -> None:
        """Deliver a duplicate HTTP request on a connection of its own; its answer is dropped."""
        host, port = self.upstream_addr
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                    self.connect_timeout)
        except (OSError, TimeoutError):
            self.counters["duplicate_failed"] += 1
            return
        try:
            writer.write(raw)
            await writer.drain()
            await asyncio.wait_for(read_http(reader, request=False), 30.0)
            self.counters["duplicate_delivered"] += 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            self.counters["duplicate_failed"] += 1
        finally:
            writer.close()

    # -- toxics ----------------------------------------------------------------------------

    def add_toxic(self, data: Mapping[str, Any] | None = None, **kw: Any) -> Toxic:
        toxic = Toxic.from_json({**(data or {}), **kw}, self.protocol)
        if toxic.name in self.toxics:
            raise ProxyError(f"toxic {toxic.name!r} already exists on {self.name}", 409)
        self.toxics[toxic.name] = toxic
        if toxic.type in ("timeout", "reset_peer"):
            for conn in list(self.conns):
                conn.arm(toxic)
        return toxic

    def update_toxic(self, name: str, data: Mapping[str, Any]) -> Toxic:
        old = self.toxic(name)
        merged = {**old.to_json(), **data,
                  "attributes": {**old.attributes, **(data.get("attributes") or {})}}
        toxic = Toxic.from_json(merged, self.protocol)
        del self.toxics[name]
        self.toxics[toxic.name] = toxic
        return toxic

    def remove_toxic(self, name: str) -> None:
        self.toxic(name)
        del self.toxics[name]

    def toxic(self, name: str) -> Toxic:
        try:
            return self.toxics[name]
        except KeyError:
            raise ProxyError(f"no toxic {name!r} on proxy {self.name}", 404) from None

    def clear_toxics(self) -> None:
        self.toxics.clear()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream,
                "enabled": self.enabled, "protocol": self.protocol,
                "toxics": [t.to_json() for t in self.toxics.values()],
                "connections": len(self.conns), "counters": dict(self.counters)}


def _quiet_done(tasks: set[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


class ProxyServer:
    """Named proxies; with ``control`` ("host:port"), the Toxiproxy-shaped HTTP control API."""

    def __init__(self, control: str | None = None, *, seed: int | None = None) -> None:
        self.control = control
        self.rng = random.Random(seed)
        self.proxies: dict[str, Proxy] = {}
        self._runner: Any = None
        self.control_addr: tuple[str, int] | None = None

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is asyncio.CancelledError:
            self.abort()
        else:
            await self.stop()

    async def start(self) -> None:
        if self.control is not None and self._runner is None:
            from client.proxy.control import start_control

            self._runner, self.control_addr = await start_control(self, self.control)

    async def stop(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def abort(self) -> None:
        for proxy in self.proxies.values():
            proxy.abort()

    async def create(self, name: str, listen: str, upstream: str, *, protocol: str = "tcp",
                     enabled: bool = True) -> Proxy:
        if not name or not isinstance(name, str):
            raise ProxyError("name: required")
        if name in self.proxies:
            raise ProxyError(f"proxy {name!r} already exists", 409)
        proxy = Proxy(name, listen, upstream, protocol=protocol, enabled=enabled,
                      rng=random.Random(self.rng.random()))
        try:
            await proxy.start()
        except OSError as exc:
            raise ProxyError(f"listen: cannot listen on {listen}: {exc}") from exc
        self.proxies[name] = proxy
        return proxy

    def get(self, name: str) -> Proxy:
        try:
            return self.proxies[name]
        except KeyError:
            raise ProxyError(f"no proxy {name!r}", 404) from None

    async def delete(self, name: str) -> None:
        await self.get(name).stop()
        del self.proxies[name]

    async def reset(self) -> None:
        """Remove every toxic and enable every proxy (Toxiproxy's POST /reset)."""
        for proxy in self.proxies.values():
            proxy.clear_toxics()
            if not proxy.enabled:
                await proxy.enable()

    async def populate(self, items: Iterable[Mapping[str, Any]]) -> list[Proxy]:
        """Create or update proxies from definitions like POST /proxies bodies."""
        out = []
        for item in items:
            if not isinstance(item, Mapping):
                raise ProxyError("populate: expected a list of proxy objects")
            name = str(item.get("name", ""))
            if name in self.proxies:
                proxy = self.proxies[name]
                await proxy.update(item)
            else:
                proxy = await self.create(name, str(item.get("listen", "127.0.0.1:0")),
                                          str(item.get("upstream", "")),
                                          protocol=str(item.get("protocol", "tcp")),
                                          enabled=bool(item.get("enabled", True)))
            out.append(proxy)
        return out


__all__ = ["Proxy", "ProxyError", "ProxyServer", "ToxicError"]
