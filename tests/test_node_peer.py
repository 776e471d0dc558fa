"""Peer wire format and links: framing, coalescing many calls into one frame, failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.core.errors import PeerError
from cluster.edge.listener import Listener
from cluster.roles.member import quorum_future
from cluster.transport.peer import PeerLink, PeerProtocol
from cluster.transport.wire import HEADER, FrameDecoder, Kind, encode_frame

pytestmark = pytest.mark.timeout(30)

bodies = st.recursive(st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20),
                      lambda c: st.lists(c, max_size=4), max_leaves=20)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**32), bodies), max_size=8),
       st.integers(1, 50))
def test_frames_survive_any_fragmentation(frames: list[tuple[int, int, Any]], step: int) -> None:
    data = b"".join(encode_frame(k, r, b) for k, r, b in frames)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(data), step):
        got += dec.feed(data[i : i + step])
    assert got == [(k, r, b) for k, r, b in frames]


def test_bad_frames_raise_peer_error() -> None:
    with pytest.raises(PeerError):
        FrameDecoder().feed(HEADER.pack(1 << 30, 0))
    with pytest.raises(PeerError):
        FrameDecoder().feed(HEADER.pack(3, 1) + b"abc")  # signed, but this decoder has no key
    with pytest.raises(PeerError):
        FrameDecoder().feed(HEADER.pack(1, 0) + b"\xc1")


class Echo:
    """A peer server: replies to each item with (kind, item), counts frames."""

    def __init__(self) -> None:
        self.frames: list[int] = []

    def __call__(self, peer: str, kind: int, body: Any) -> Any:
        self.frames.append(len(body))
        if kind == Kind.READ:
            return [[peer, item] for item in body]
        if kind == Kind.REPAIR:
            raise ValueError("boom")
        return asyncio.sleep(0, result=True)  # an awaitable reply


async def serve(handler: Echo) -> tuple[asyncio.Server, int, set[asyncio.Protocol]]:
    loop = asyncio.get_running_loop()
    peers: set[asyncio.Protocol] = set()
    server = await loop.create_server(Listener(asyncio.Protocol, handler, peers).protocol,
                                      "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], peers


async def test_calls_in_one_turn_share_one_frame() -> None:
    handler = Echo()
    server, port, _ = await serve(handler)
    link = PeerLink("me", "them", "127.0.0.1", port)
    try:
        first = await link.call(Kind.READ, ["warm-up"])
        assert first == [["me", "warm-up"]]
        futs = [link.call(Kind.READ, [f"a{i}", f"b{i}"]) for i in range(50)]
        results = await asyncio.gather(*futs)
        assert results[7] == [["me", "a7"], ["me", "b7"]]
        assert handler.frames[-1] == 100 and len(handler.frames) == 2  # one frame for 50 calls
        assert await link.call(Kind.REPLICATE, [1, 2, 3]) is True
        with pytest.raises(PeerError, match="boom"):
            await link.call(Kind.REPAIR, [1])
        assert link.frames_sent == 4
    finally:
        link.abort()
        server.close()
        await server.wait_closed()


async def test_unreachable_peer_fails_fast_then_reconnects() -> None:
    handler = Echo()
    server, port, peers = await serve(handler)
    server.close()
    await server.wait_closed()
    link = PeerLink("me", "them", "127.0.0.1", port, retry_interval=0.05)
    try:
        with pytest.raises(PeerError):
            await link.call(Kind.READ, ["x"])
        assert not link.maybe_live()
        with pytest.raises(PeerError, match="unreachable"):
            await link.call(Kind.READ, ["x"])
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            Listener(asyncio.Protocol, handler, peers).protocol, "127.0.0.1", port)
        await asyncio.sleep(0.06)
        assert await link.call(Kind.READ, ["y"]) == [["me", "y"]]
        assert link.connected
    finally:
        link.abort()
        server.close()
        await server.wait_closed()


async def test_lost_connection_fails_inflight_calls() -> None:
    gate = asyncio.Event()

    def slow(peer: str, kind: int, body: Any) -> Any:
        return gate.wait()

    loop = asyncio.get_running_loop()
    peers: set[asyncio.Protocol] = set()
    server = await loop.create_server(Listener(asyncio.Protocol, slow, peers).protocol,
                                      "127.0.0.1", 0)
    link = PeerLink("me", "them", "127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        fut = link.call(Kind.REPLICATE, [1])
        while not peers:
            await asyncio.sleep(0.01)
        for p in list(peers):
            p.transport.close()  # type: ignore[attr-defined]
        with pytest.raises(PeerError, match="lost"):
            await asyncio.wait_for(fut, 5)
    finally:
        gate.set()
        link.abort()
        server.close()
        await server.wait_closed()


async def test_quorum_future() -> None:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(3)]
    q = quorum_future(futs, 2, 5.0)
    futs[0].set_result(True)
    futs[1].set_exception(PeerError("down"))
    assert not q.done()
    futs[2].set_result(None)
    assert await q is True
    futs = [loop.create_future() for _ in range(3)]
    q = quorum_future(futs, 2, 5.0)
    futs[0].set_result(False)
    futs[1].set_exception(PeerError("down"))
    assert await q is False
    futs[2].set_result(True)  # late success changes nothing
    slow = [loop.create_future()]
    assert await quorum_future(slow, 1, 0.01) is False
    assert await quorum_future([], 0, 1.0) is True


async def test_a_connection_closed_before_connect_resumes_is_not_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer closes at once (a link proxy whose node is not listening yet): the connection
    is lost before ``PeerLink._connect`` resumes. Installing that dead protocol left a link that
    queued every call and sent none, for good (the chaos runs that collapsed, and over-counts:
    the node's in-doubt ops never settled). Now the calls fail and the next one reconnects."""
    handler = Echo()
    server, port, _ = await serve(handler)
    made = PeerProtocol.connection_made
    first: list[bool] = []

    def close_the_first(self: PeerProtocol, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        if self.on_reply is not None and not first:  # the dialing side, first connection only
            first.append(True)
            transport.close()  # connection_lost runs before _connect resumes

    monkeypatch.setattr(PeerProtocol, "connection_made", close_the_first)
    link = PeerLink("me", "them", "127.0.0.1", port)
    try:
        with pytest.raises(PeerError):
            await asyncio.wait_for(link.call(Kind.READ, ["x"]), 5.0)
        assert first and not link.connected
        for _ in range(5):  # a call made while the dead attempt still ran fails with it
            link.forget_failure()
            try:
                reply = await asyncio.wait_for(link.call(Kind.READ, ["y"]), 5.0)
            except PeerError:
                continue
            assert reply == [["me", "y"]] and link.connected
            break
        else:
            pytest.fail("the link never reconnected")
    finally:
        await link.stop()
        server.close()
        await server.wait_closed()
