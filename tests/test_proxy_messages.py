"""Message-level toxics: HTTP requests/responses and the cluster's peer frames."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from client.proxy import Proxy
from cluster.transport.wire import MAGIC, FrameDecoder, Kind, encode_frame

pytestmark = pytest.mark.timeout(30)


class Upstream:
    """An HTTP server recording (id, arrival time) of every POST /hit/{id}."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, float]] = []
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def hit(self, request: web.Request) -> web.Response:
        self.hits.append((request.match_info["id"], time.monotonic()))
        return web.json_response({"n": len(self.hits)})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hit/{id}", self.hit)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"

    def ids(self) -> list[str]:
        return [i for i, _ in self.hits]


async def wait_for(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[Upstream]:
    u = Upstream()
    await u.start()
    yield u
    assert u.runner is not None
    await u.runner.cleanup()


@pytest_asyncio.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[Proxy]:
    async with Proxy("h", "127.0.0.1:0", upstream.address, protocol="http",
                     rng=random.Random(5)) as p:
        yield p


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def post(s: aiohttp.ClientSession, p: Proxy, op: str, timeout: float = 2.0) -> Any:
    async with s.post(f"{p.url}/hit/{op}", json={},
                      timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        return await resp.json()


async def test_plain_requests_pass(proxy: Proxy, upstream: Upstream,
                                   session: aiohttp.ClientSession) -> None:
    for i in range(3):
        assert (await post(session, proxy, str(i)))["n"] == i + 1
    assert proxy.counters["messages_upstream"] == 3


async def test_drop_request_hang(proxy: Proxy, upstream: Upstream,
                                 session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="drop")
    with pytest.raises(TimeoutError):
        await post(session, proxy, "a", timeout=0.3)
    assert upstream.hits == []


async def test_drop_request_close(proxy: Proxy, upstream: Upstream,
                                  session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="drop", attributes={"mode": "close"})
    start = time.monotonic()
    with pytest.raises(aiohttp.ClientError):
        await post(session, proxy, "a")
    assert time.monotonic() - start < 1.0 and upstream.hits == []


async def test_lost_ack_means_the_server_processed_it(proxy: Proxy, upstream: Upstream,
                                                      session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="lost_ack")
    with pytest.raises(aiohttp.ClientError):
        await post(session, proxy, "a")
    assert upstream.ids() == ["a"]
    proxy.remove_toxic("lost_ack_downstream")
    assert (await post(session, proxy, "a"))["n"] == 2


async def test_duplicate_at_once_and_after_a_delay(proxy: Proxy, upstream: Upstream,
                                                   session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="duplicate", attributes={"copies": 2})
    await post(session, proxy, "a")
    await wait_for(lambda: len(upstream.hits) == 3)
    proxy.remove_toxic("duplicate_upstream")
    proxy.add_toxic(type="duplicate", attributes={"delay": 300})
    await post(session, proxy, "b")
    await wait_for(lambda: upstream.ids().count("b") == 2)
    times = [t for i, t in upstream.hits if i == "b"]
    assert times[1] - times[0] >= 0.28
    # a copy counts as delivered once its answer is read, just after the upstream saw it
    await wait_for(lambda: proxy.counters["duplicate_delivered"] == 3)
    assert proxy.counters["duplicate_failed"] == 0


async def test_delayed_request_arrives_after_its_client_gave_up(
        proxy: Proxy, upstream: Upstream, session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="delay", attributes={"latency": 400})
    sent = time.monotonic()
    with pytest.raises(TimeoutError):
        await post(session, proxy, "late", timeout=0.1)
    await wait_for(lambda: upstream.ids() == ["late"])
    assert upstream.hits[0][1] - sent >= 0.38


async def test_delay_on_responses(proxy: Proxy, upstream: Upstream,
                                  session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="delay", stream="downstream", attributes={"latency": 200})
    start = time.monotonic()
    await post(session, proxy, "a")
    assert time.monotonic() - start >= 0.19 and upstream.hits[0][1] - start < 0.15


async def test_reorder_shuffles_held_requests(proxy: Proxy, upstream: Upstream) -> None:
    proxy.add_toxic(type="reorder", attributes={"count": 5, "window": 2000})
    orders = []
    for trial in range(4):
        sessions = [aiohttp.ClientSession() for _ in range(5)]
        try:
            tasks = []
            for i, s in enumerate(sessions):
                tasks.append(asyncio.ensure_future(post(s, proxy, f"{trial}-{i}", timeout=5)))
                await asyncio.sleep(0.02)  # sent in order 0..4
            await asyncio.gather(*tasks)
        finally:
            for s in sessions:
                await s.close()
        orders.append([i for i in upstream.ids() if i.startswith(f"{trial}-")])
    assert all(sorted(o) == [f"{t}-{i}" for i in range(5)] for t, o in enumerate(orders))
    assert any(o != sorted(o) for o in orders)


async def test_message_toxicity_is_drawn_per_request(proxy: Proxy, upstream: Upstream,
                                                     session: aiohttp.ClientSession) -> None:
    proxy.add_toxic(type="lost_ack", toxicity=0.5)
    lost = 0
    for i in range(40):
        try:
            await post(session, proxy, str(i))
        except aiohttp.ClientError:
            lost += 1
    assert len(upstream.hits) == 40 and 8 < lost < 32


# -- peer frames ------------------------------------------------------------------------------


class PeerUpstream:
    """Speaks the peer framing: records request frames, answers each with a REPLY."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, Any]] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(MAGIC)) == MAGIC
        dec = FrameDecoder()
        while data := await reader.read(65536):
            for kind, req_id, body in dec.feed(data):
                self.frames.append((kind, req_id, body))
                writer.write(encode_frame(Kind.REPLY, req_id, ["ok"]))
        writer.close()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[PeerUpstream]:
    u = PeerUpstream()
    u.server = await asyncio.start_server(u.handle, "127.0.0.1", 0)
    yield u
    u.server.close()


async def send_frames(p: Proxy, n: int, expect_replies: int,
                      timeout: float = 2.0) -> list[int]:
    reader, writer = await asyncio.open_connection(*p.listen_addr)
    try:
        writer.write(MAGIC + b"".join(encode_frame(Kind.REPLICATE, i, [i]) for i in range(n)))
        dec = FrameDecoder()
        replies: list[int] = []
        deadline = time.monotonic() + timeout
        while len(replies) < expect_replies and time.monotonic() < deadline:
            try:
                data = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            except TimeoutError:
                break
            replies += [req_id for _, req_id, _ in dec.feed(data)]
        return replies
    finally:
        writer.close()


async def test_peer_frames_pass_and_duplicate(peer: PeerUpstream) -> None:
    async with Proxy("p", "127.0.0.1:0", peer.address, protocol="peer") as p:
        assert sorted(await send_frames(p, 5, 5)) == list(range(5))
        p.add_toxic(type="duplicate")
        await send_frames(p, 3, 6)
        await wait_for(lambda: len(peer.frames) == 11)
        assert sorted(r for _, r, _ in peer.frames[5:]) == [0, 0, 1, 1, 2, 2]


async def test_peer_frames_drop_and_lost_ack(peer: PeerUpstream) -> None:
    async with Proxy("p", "127.0.0.1:0", peer.address, protocol="peer") as p:
        p.add_toxic(type="drop")
        assert await send_frames(p, 3, 3, timeout=0.3) == [] and peer.frames == []
        p.clear_toxics()
        p.add_toxic(type="lost_ack", attributes={"mode": "hang"})
        assert await send_frames(p, 3, 3, timeout=0.3) == []
        assert len(peer.frames) == 3  # applied upstream, the answers were lost


async def test_peer_frames_reorder(peer: PeerUpstream) -> None:
    async with Proxy("p", "127.0.0.1:0", peer.address, protocol="peer",
                     rng=random.Random(1)) as p:
        p.add_toxic(type="reorder", attributes={"count": 6, "window": 500})
        await send_frames(p, 6, 6)
        await wait_for(lambda: len(peer.frames) == 6)
        order = [r for _, r, _ in peer.frames]
        assert sorted(order) == list(range(6)) and order != list(range(6))
