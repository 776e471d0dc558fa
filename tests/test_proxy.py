"""The fault proxy: each stream toxic against an echo server, enable/disable, toxicity."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from client.proxy import Proxy, ProxyError, ProxyServer, Toxic, ToxicError

pytestmark = pytest.mark.timeout(30)


class Echo:
    """Echo server recording every chunk it received; ``close_after`` bytes, then it closes."""

    def __init__(self, close_after: int | None = None) -> None:
        self.chunks: list[bytes] = []
        self.close_after = close_after
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = 0
        try:
            while data := await reader.read(65536):
                self.chunks.append(data)
                got += len(data)
                writer.write(data)
                await writer.drain()
                if self.close_after is not None and got >= self.close_after:
                    break
        except ConnectionError:
            pass
        finally:
            writer.close()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[Echo]:
    e = Echo()
    e.server = await asyncio.start_server(e.handle, "127.0.0.1", 0)
    yield e
    e.server.close()
    await e.server.wait_closed()


@pytest_asyncio.fixture
async def proxy(echo: Echo) -> AsyncIterator[Proxy]:
    async with Proxy("echo", "127.0.0.1:0", echo.address) as p:
        yield p


async def connect(p: Proxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = p.listen_addr
    return await asyncio.open_connection(host, port)


async def roundtrip(p: Proxy, data: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    reader, writer = await connect(p)
    start = time.monotonic()
    try:
        writer.write(data)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(data)), timeout)
        return got, time.monotonic() - start
    finally:
        writer.close()


async def test_passes_bytes_both_ways(proxy: Proxy) -> None:
    got, _ = await roundtrip(proxy, b"hello" * 1000)
    assert got == b"hello" * 1000
    assert proxy.counters["connections"] == 1


async def test_latency_delays_each_direction(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100})
    proxy.add_toxic(type="latency", stream="downstream", attributes={"latency": 100})
    _, took = await roundtrip(proxy, b"x")
    assert took >= 0.19


async def test_bandwidth_paces_bytes(proxy: Proxy) -> None:
    proxy.add_toxic(type="bandwidth", stream="downstream", attributes={"rate": 100})
    _, took = await roundtrip(proxy, b"y" * 30_000)
    assert took >= 0.25


async def test_slicer_cuts_chunks(proxy: Proxy, echo: Echo) -> None:
    proxy.add_toxic(type="slicer", stream="upstream",
                    attributes={"average_size": 10, "size_variation": 0, "delay": 5000})
    got, _ = await roundtrip(proxy, b"z" * 100)
    assert got == b"z" * 100
    assert len(echo.chunks) >= 5 and max(len(c) for c in echo.chunks) <= 20


async def test_timeout_blackholes_then_closes(proxy: Proxy, echo: Echo) -> None:
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 200})
    reader, writer = await connect(proxy)
    writer.write(b"lost")
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5.0) == b""
    assert 0.15 <= time.monotonic() - start < 3.0
    assert echo.chunks == []
    writer.close()


async def test_timeout_zero_holds_open(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", stream="downstream", attributes={"timeout": 0})
    reader, writer = await connect(proxy)
    writer.write(b"abc")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.3)
    proxy.remove_toxic("timeout_downstream")
    writer.write(b"def")
    assert await asyncio.wait_for(reader.readexactly(3), 5.0) == b"def"
    writer.close()


async def test_reset_peer_resets(proxy: Proxy) -> None:
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 50})
    reader, writer = await connect(proxy)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(100), 5.0)
    writer.close()


async def test_limit_data_closes_after_bytes(proxy: Proxy) -> None:
    proxy.add_toxic(type="limit_data", stream="downstream", attributes={"bytes": 10})
    reader, writer = await connect(proxy)
    writer.write(b"0123456789abcdef")
    assert await asyncio.wait_for(reader.read(), 5.0) == b"0123456789"
    writer.close()


async def test_slow_close_delays_close() -> None:
    echo = Echo(close_after=1)
    echo.server = await asyncio.start_server(echo.handle, "127.0.0.1", 0)
    try:
        async with Proxy("sc", "127.0.0.1:0", echo.address) as p:
            p.add_toxic(type="slow_close", stream="downstream", attributes={"delay": 300})
            reader, writer = await connect(p)
            writer.write(b"!")
            assert await reader.readexactly(1) == b"!"
            start = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
            assert time.monotonic() - start >= 0.25
            writer.close()
    finally:
        echo.server.close()


async def test_disable_refuses_and_closes_then_enable_restores(proxy: Proxy) -> None:
    reader, writer = await connect(proxy)
    await proxy.disable()
    assert await asyncio.wait_for(reader.read(), 5.0) == b""
    writer.close()
    with pytest.raises(OSError):
        await connect(proxy)
    await proxy.enable()
    got, _ = await roundtrip(proxy, b"back")
    assert got == b"back"


async def test_toxicity_is_drawn_per_connection(echo: Echo) -> None:
    import random

    async with Proxy("t", "127.0.0.1:0", echo.address, rng=random.Random(3)) as p:
        p.add_toxic(type="limit_data", stream="downstream", toxicity=0.5,
                    attributes={"bytes": 1})
        outcomes = []
        for _ in range(30):
            reader, writer = await connect(p)
            writer.write(b"ab")
            try:
                got = await asyncio.wait_for(reader.readexactly(2), 2.0)
            except asyncio.IncompleteReadError as exc:
                got = exc.partial
            outcomes.append(got == b"ab")
            writer.close()
        assert 5 < sum(outcomes) < 25  # some connections drew the toxic, some did not


def test_toxic_validation_names_the_field() -> None:
    with pytest.raises(ToxicError, match="type"):
        Toxic.from_json({"type": "nope"})
    with pytest.raises(ToxicError, match="toxicity"):
        Toxic.from_json({"type": "latency", "toxicity": 2})
    with pytest.raises(ToxicError, match="attributes.latency"):
        Toxic.from_json({"type": "latency", "attributes": {"latency": -1}})
    with pytest.raises(ToxicError, match="attributes.bogus"):
        Toxic.from_json({"type": "latency", "attributes": {"bogus": 1}})
    with pytest.raises(ToxicError, match="protocol"):
        Toxic.from_json({"type": "lost_ack"}, "tcp")
    with pytest.raises(ToxicError, match="downstream only"):
        Toxic.from_json({"type": "lost_ack", "stream": "upstream"}, "http")
    t = Toxic.from_json({"type": "latency"})
    assert (t.name, t.stream, t.toxicity, t.attributes) == (
        "latency_downstream", "downstream", 1.0, {"latency": 0, "jitter": 0})


async def test_server_names_and_duplicates(echo: Echo) -> None:
    async with ProxyServer() as srv:
        await srv.create("a", "127.0.0.1:0", echo.address)
        with pytest.raises(ProxyError) as exc:
            await srv.create("a", "127.0.0.1:0", echo.address)
        assert exc.value.status == 409
        with pytest.raises(ProxyError) as exc:
            srv.get("zz")
        assert exc.value.status == 404
        srv.get("a").add_toxic(type="latency")
        await srv.get("a").disable()
        await srv.reset()
        assert srv.get("a").enabled and not srv.get("a").toxics
