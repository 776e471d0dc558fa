"""The proxy's Toxiproxy-shaped control API, and its command line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from client.proxy import ProxyServer

pytestmark = pytest.mark.timeout(30)


@pytest_asyncio.fixture
async def echo_addr() -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest_asyncio.fixture
async def api() -> AsyncIterator[tuple[ProxyServer, aiohttp.ClientSession, str]]:
    async with ProxyServer("127.0.0.1:0") as srv, aiohttp.ClientSession() as s:
        assert srv.control_addr is not None
        yield srv, s, f"http://127.0.0.1:{srv.control_addr[1]}"


async def call(s: aiohttp.ClientSession, method: str, url: str,
               body: Any = None) -> tuple[int, Any]:
    async with s.request(method, url, json=body) as resp:
        raw = await resp.read()
        try:
            return resp.status, await resp.json() if raw else None
        except (aiohttp.ContentTypeError, ValueError):
            return resp.status, raw.decode()


async def echo_through(listen: str) -> bytes:
    host, port = listen.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"ping")
        return await asyncio.wait_for(reader.readexactly(4), 5.0)
    finally:
        writer.close()


async def test_proxy_lifecycle(api: Any, echo_addr: str) -> None:
    srv, s, base = api
    status, text = await call(s, "GET", f"{base}/version")
    assert status == 200 and "toxiproxy" in text
    body = {"name": "n1", "listen": "127.0.0.1:0", "upstream": echo_addr}
    status, created = await call(s, "POST", f"{base}/proxies", body)
    assert status == 201 and created["name"] == "n1" and created["enabled"] is True
    assert (await call(s, "POST", f"{base}/proxies", body))[0] == 409
    status, listing = await call(s, "GET", f"{base}/proxies")
    assert status == 200 and set(listing) == {"n1"}
    listen = listing["n1"]["listen"]
    assert await echo_through(listen) == b"ping"

    status, _ = await call(s, "POST", f"{base}/proxies/n1", {"enabled": False})
    assert status == 200
    with pytest.raises(OSError):
        await echo_through(listen)
    assert (await call(s, "POST", f"{base}/reset"))[0] == 204
    assert await echo_through(listen) == b"ping"

    assert (await call(s, "GET", f"{base}/proxies/nope"))[0] == 404
    assert (await call(s, "DELETE", f"{base}/proxies/n1"))[0] == 204
    assert (await call(s, "GET", f"{base}/proxies/n1"))[0] == 404


async def test_toxic_crud(api: Any, echo_addr: str) -> None:
    srv, s, base = api
    await call(s, "POST", f"{base}/proxies",
               {"name": "n1", "listen": "127.0.0.1:0", "upstream": echo_addr,
                "protocol": "http"})
    toxics = f"{base}/proxies/n1/toxics"
    status, t = await call(s, "POST", toxics, {"type": "latency", "stream": "upstream",
                                               "attributes": {"latency": 10}})
    assert status == 200 and t["name"] == "latency_upstream" and t["toxicity"] == 1.0
    status, t = await call(s, "POST", toxics, {"name": "ack", "type": "lost_ack",
                                               "toxicity": 0.25})
    assert status == 200 and t["stream"] == "downstream"
    assert [x["name"] for x in (await call(s, "GET", toxics))[1]] == ["latency_upstream", "ack"]
    status, t = await call(s, "POST", f"{toxics}/latency_upstream",
                           {"attributes": {"jitter": 5}})
    assert status == 200 and t["attributes"] == {"latency": 10, "jitter": 5}
    status, err = await call(s, "POST", toxics, {"type": "latency", "toxicity": 3})
    assert status == 400 and "toxicity" in err["error"]
    assert (await call(s, "POST", toxics, {"type": "latency", "stream": "upstream"}))[0] == 409
    assert (await call(s, "DELETE", f"{toxics}/ack"))[0] == 204
    assert (await call(s, "GET", f"{toxics}/ack"))[0] == 404
    assert (await call(s, "POST", f"{base}/reset"))[0] == 204
    assert (await call(s, "GET", toxics))[1] == []


async def test_populate_creates_and_updates(api: Any, echo_addr: str) -> None:
    srv, s, base = api
    items = [{"name": "a", "listen": "127.0.0.1:0", "upstream": echo_addr},
             {"name": "b", "listen": "127.0.0.1:0", "upstream": echo_addr, "enabled": False}]
    status, body = await call(s, "POST", f"{base}/populate", items)
    assert status == 201 and [p["name"] for p in body["proxies"]] == ["a", "b"]
    assert srv.get("b").enabled is False
    status, body = await call(s, "POST", f"{base}/populate", [{"name": "b", "enabled": True}])
    assert status == 201 and srv.get("b").enabled


def test_cli_help() -> None:
    out = subprocess.run([sys.executable, "-m", "client.proxy", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "--control" in out.stdout
