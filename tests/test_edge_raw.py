"""The raw protocol of the hot routes (``cluster.edge.raw``) on a real socket, in one loop:
pipelining, requests split byte by byte, the handoff to aiohttp, the guards, the drain; and the
same answers as aiohttp for a battery of requests (one node with the raw path, one without).

aiohttp's answers carry a ``Server`` header and the raw protocol's do not: these tests use it to
tell which path answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cluster.core.config import from_mapping
from cluster.local import free_ports
from cluster.server import NodeServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "raw-test-token-0123456789"


@contextlib.asynccontextmanager
async def node(tmp: Path, name: str = "n1", raw_http: bool = True,
               **extra: object) -> AsyncIterator[NodeServer]:
    port = free_ports(1)[0]
    cfg = from_mapping({"node_id": "n1", "listen": f"127.0.0.1:{port}",
                        "peers": f"n1=127.0.0.1:{port}", "data_dir": str(tmp / name),
                        "fsync": False, "max_body_bytes": 1000, **extra})
    server = NodeServer(cfg, raw_http=raw_http)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        for writer in _OPEN.pop(id(server), []):
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


_OPEN: dict[int, list[asyncio.StreamWriter]] = {}  # closed when their node stops


async def connect(server: NodeServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.address is not None
    reader, writer = await asyncio.open_connection(*server.address)
    _OPEN.setdefault(id(server), []).append(writer)
    return reader, writer


def post(key: str, body: bytes, *, version: str = "1.1", headers: str = "",
         length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"POST /v1/counters/t/{key} HTTP/{version}\r\nHost: x\r\n{headers}"
            f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n").encode() + body


def batch(*ops: tuple[str, str, int], headers: str = "") -> bytes:
    body = json.dumps({"ops": [{"table": "t", "key": k, "op_id": i, "delta": d}
                               for k, i, d in ops]}).encode()
    return (f"POST /v1/batch HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {len(body)}"
            "\r\n\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    return (b"POST /v1/counters/t/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


def op(op_id: str, delta: int = 1) -> bytes:
    return json.dumps({"op_id": op_id, "delta": delta}).encode()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-case names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), 10)
    return int(lines[0].split(" ")[1]), headers, body


def raw_answered(headers: dict[str, str]) -> bool:
    return "server" not in headers


async def closed(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout) == b""
    except (ConnectionError, TimeoutError):
        return False


async def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    async with node(tmp_path) as server:
        reader, writer = await connect(server)
        writer.write(post("p", op("c:1")) + post("p", op("c:2")) + post("p", op("c:1"))
                     + batch(("p", "c:3", 5))
                     + b"GET /v1/counters/t/p?consistency=one HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = [await response(reader) for _ in range(5)]
        assert [json.loads(b) for _, _, b in answers] == [
            {"applied": True}, {"applied": True}, {"applied": False, "duplicate": True},
            {"results": [{"applied": True}]}, {"value": 7}]
        assert all(s == 200 and raw_answered(h) for s, h, _ in answers)
        writer.close()


async def test_a_request_split_byte_by_byte(tmp_path: Path) -> None:
    async with node(tmp_path) as server:
        reader, writer = await connect(server)
        for _ in range(2):  # the second on the same connection, after an answer
            data = b"\r\n" + post("b", op(f"b:{_}"))
            for i in range(len(data)):
                writer.write(data[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0.001)
            status, headers, body = await response(reader)
            assert (status, json.loads(body)) == (200, {"applied": True}) and raw_answered(headers)
        assert server.node.state.shards.value("t", "b") == 2
        writer.close()


async def test_a_write_then_another_route_hands_the_connection_to_aiohttp(
        tmp_path: Path) -> None:
    async with node(tmp_path) as server:
        assert server.raw is not None
        reader, writer = await connect(server)
        writer.write(post("h", op("h:1")))
        status, headers, _ = await response(reader)
        assert status == 200 and raw_answered(headers) and len(server.raw.conns) == 1
        # pipelined: a route the raw protocol does not serve, then a write
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + post("h", op("h:2")))
        status, headers, body = await response(reader)
        assert status == 200 and not raw_answered(headers) and b"idc_applied_total" in body
        status, headers, body = await response(reader)  # aiohttp keeps the connection
        assert (status, json.loads(body)) == (200, {"applied": True})
        assert not raw_answered(headers) and not server.raw.conns
        assert server.listener is not None and server.listener.stats.open_connections == 1
        writer.close()
        await closed(reader)
        for _ in range(100):
            if server.listener.stats.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert server.listener.stats.open_connections == 0


async def test_bad_json_is_refused_and_the_connection_serves_on(tmp_path: Path) -> None:
    async with node(tmp_path) as server:
        reader, writer = await connect(server)
        writer.write(post("j", b"{nope") + post("j", b"")
                     + post("j", b'{"op_id": "j:1", "delta": "x"}') + post("j", op("j:1")))
        codes = []
        for _ in range(3):
            status, headers, body = await response(reader)
            assert status == 400 and raw_answered(headers)
            codes.append(json.loads(body)["error"]["code"])
        assert codes == ["bad_body", "bad_body", "bad_delta"]
        status, _, body = await response(reader)
        assert (status, json.loads(body)) == (200, {"applied": True})
        assert server.node.metrics.bad_requests == 3
        writer.close()


async def test_oversize_and_slow_bodies(tmp_path: Path) -> None:
    async with node(tmp_path, body_timeout=0.3) as server:
        reader, writer = await connect(server)  # over the limit: aiohttp's 413, as before
        writer.write(post("o", b"x" * 2000))
        status, _, body = await response(reader)
        assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
        writer.close()

        reader, writer = await connect(server)  # a body that stops coming: 408, closed
        writer.write(post("o", op("o:1")[:5], length=len(op("o:1"))))
        status, headers, body = await response(reader)
        assert status == 408 and headers["connection"] == "close" and raw_answered(headers)
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert await closed(reader)

        reader, writer = await connect(server)  # a body that comes late, but in time
        writer.write(post("o", op("o:2")[:5], length=len(op("o:2"))))
        await asyncio.sleep(0.1)
        writer.write(op("o:2")[5:])
        status, _, body = await response(reader)
        assert (status, json.loads(body)) == (200, {"applied": True})
        writer.close()
        assert server.node.state.shards.value("t", "o") == 1


async def test_unread_body_of_a_refused_request_is_skipped(tmp_path: Path) -> None:
    async with node(tmp_path, token_file=str(_token_file(tmp_path))) as server:
        reader, writer = await connect(server)
        body = op("u:1")
        writer.write(post("u", body[:3], length=len(body)))  # no token: 401 before the body
        status, headers, _ = await response(reader)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        writer.write(body[3:] + post("u", body, headers=f"Authorization: Bearer {TOKEN}\r\n"))
        status, _, answer = await response(reader)
        assert (status, json.loads(answer)) == (200, {"applied": True})
        writer.close()


async def test_idle_and_slow_header_connections_are_closed(tmp_path: Path) -> None:
    async with node(tmp_path, idle_timeout=0.3, header_timeout=0.3) as server:
        reader, writer = await connect(server)
        writer.write(post("i", op("i:1")))
        await response(reader)
        assert await closed(reader, 3.0)  # idle past idle_timeout

        reader, writer = await connect(server)
        writer.write(post("i", op("i:2")))
        await response(reader)
        writer.write(b"POST /v1/counters/t/i HTTP/1.1\r\nHo")  # and never the rest
        status, headers, body = await response(reader)
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
        assert await closed(reader)
        assert server.listener is not None
        assert server.listener.stats.refuse.counts["header_timeout"] == 1


async def test_stop_lets_the_request_in_flight_finish(tmp_path: Path) -> None:
    async with node(tmp_path) as server:
        submit = server.node.submit
        started = asyncio.Event()

        async def slow_submit(*args: Any) -> Any:
            started.set()
            await asyncio.sleep(0.3)
            return await submit(*args)

        server.node.submit = slow_submit  # type: ignore[method-assign]
        reader, writer = await connect(server)
        idle_reader, _idle = await connect(server)
        _idle.write(post("d", op("d:0")))
        await response(idle_reader)
        writer.write(post("d", op("d:1")))
        await started.wait()
        stopping = asyncio.create_task(server.stop())
        assert await closed(idle_reader, 1.0)  # an idle connection goes at once
        status, headers, body = await response(reader)
        assert (status, json.loads(body)) == (200, {"applied": True})
        assert headers["connection"] == "close"
        await stopping


def _token_file(tmp: Path) -> Path:
    path = tmp / "tokens"
    path.write_text(TOKEN + "\n")
    return path


# the same bytes to a node with the raw path and one without; the answers must not differ
BATTERY: list[bytes] = [
    post("k", op("a:1")),
    post("k", op("a:1")),
    post("k", op("a:2"), version="1.0"),
    post("k", op("a:3"), version="1.0", headers="Connection: keep-alive\r\n"),
    post("k", op("a:4"), headers="Connection: close\r\n"),
    post("k", b"{nope"),
    post("k", b""),
    post("k", op("a:5", delta=2**63)),
    post("k", json.dumps({"op_id": "a:6", "delta": 1, "age_ms": 60_000}).encode()),
    post("k" * 129, op("a:7")),
    post("bad.name!", op("a:8")),
    post("k", op("a:9"), headers="Authorization: Bearer wrong-token-xxxxxxxx\r\n"),
    post("k", msgpack.packb({"op_id": "a:10", "delta": 1}),
         headers="Accept: application/msgpack\r\n").replace(b"application/json",
                                                           b"application/msgpack"),
    batch(("k", "b:1", 5), ("k", "b:2", 1)),
    batch(("k", "b:1", 5), ("k", "b:3", "x")),  # type: ignore[arg-type]
    b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"ops\":5}",
    b"GET /v1/counters/t/k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/counters/t/k?consistency=one HTTP/1.1\r\nHost: x\r\nAccept: application/msgpack"
    b"\r\n\r\n",
    b"GET /v1/counters/t/k?consistency=some HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/counters/t/k?consistency= HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/counters/t/./k HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/counters/t/k HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",  # no Host
    b"PUT /v1/counters/t/k HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    chunked(op("a:11")),
    b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
]


async def _answers(server: NodeServer,
                   battery: list[bytes]) -> list[tuple[int, dict[str, str], Any]]:
    out = []
    for data in battery:
        reader, writer = await connect(server)
        writer.write(data)
        status, headers, body = await response(reader)
        writer.close()
        headers["raw"] = str(raw_answered(headers))
        for name in ("date", "server"):
            headers.pop(name, None)
        decoded: Any = (msgpack.unpackb(body) if "msgpack" in headers["content-type"]
                        else json.loads(body))
        if isinstance(decoded, dict) and "addresses" in decoded:  # health: names the port
            decoded = sorted(decoded)
        out.append((status, headers, decoded))
    return out


async def test_the_raw_path_answers_as_aiohttp_does(tmp_path: Path) -> None:
    tokens = str(_token_file(tmp_path))
    async with node(tmp_path, "raw", window=10, token_file=tokens) as raw, \
            node(tmp_path, "aio", raw_http=False, window=10, token_file=tokens) as aio:
        auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
        battery = [b if b"Authorization" in b else b.replace(b"Host: x\r\n",
                                                               b"Host: x\r\n" + auth)
                   for b in BATTERY]
        got, want = await _answers(raw, battery), await _answers(aio, battery)
        assert sum(h.pop("raw") == "True" for _, h, _ in got) == len(battery) - 4
        assert not any(h.pop("raw") == "True" for _, h, _ in want)
        for data, g, w in zip(battery, got, want, strict=True):
            assert g == w, data
        assert raw.node.metrics.bad_requests == aio.node.metrics.bad_requests > 0
        assert raw.node.metrics.unauthorized == aio.node.metrics.unauthorized == 1
        assert sorted(raw.node.metrics.requests) == sorted(aio.node.metrics.requests)
