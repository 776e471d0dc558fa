"""The client edge on real node processes: bearer token, TLS, slow clients, connection cap."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import CounterClient
from cluster.local import LocalCluster
from tests.cluster_util import running_cluster, write_certs

pytestmark = pytest.mark.timeout(120)

TOKEN = "tok-0123456789abcdef"


def _error(body: bytes) -> dict[str, Any]:
    parsed = json.loads(body)
    assert set(parsed) == {"error"} and set(parsed["error"]) == {"code", "message"}, parsed
    return parsed["error"]


async def test_bearer_token_guards_everything_but_health(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"old-token-abcdefghijkl\n{TOKEN}\n")  # two during a rotation
    async with running_cluster(1, rf=1, extra_args=["--token-file", str(token_file)]) as cluster:
        url = cluster.urls[0]
        async with aiohttp.ClientSession() as s:
            body = {"op_id": "c:1", "delta": 5}
            for headers in ({}, {"Authorization": "Bearer wrong-token-xxxxxxxx"},
                            {"Authorization": f"Basic {TOKEN}"}):
                async with s.post(f"{url}/v1/counters/t/k", json=body, headers=headers) as r:
                    assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
                    assert _error(await r.read())["code"] == "unauthorized"
            async with s.get(f"{url}/metrics") as r:
                assert r.status == 401
            async with s.get(f"{url}/v1/health") as r:
                assert r.status == 200
            async with s.get(f"{url}/v1/openapi.json") as r:
                assert r.status == 200
        async with CounterClient([url], token=TOKEN) as c:
            assert (await c.add("t", "k", 5)).applied
            assert await c.get("t", "k") == 5
        async with CounterClient([url], token="old-token-abcdefghijkl") as c:
            assert await c.get("t", "k") == 5


async def test_bad_token_file_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("short\n")
    cluster = LocalCluster(1, rf=1, extra_args=["--token-file", str(token_file)])
    with pytest.raises(RuntimeError):
        await cluster.start(timeout=10)
    await cluster.abort()
    log = (cluster.data_dir / "n1.log").read_text()
    assert "token_file" in log and "16+ characters" in log


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_certs(tmp_path_factory.mktemp("tls"))


async def test_tls_cluster_serves_clients_and_replicates_over_tls(certs: dict[str, str]) -> None:
    args = ["--tls-cert", certs["cert"], "--tls-key", certs["key"], "--tls-ca", certs["ca"]]
    async with running_cluster(3, extra_args=args) as cluster:
        urls = [u.replace("http://", "https://") for u in cluster.urls]
        async with CounterClient(urls, ca_file=certs["ca"]) as c:
            for i in range(30):
                assert (await c.add("t", f"k{i % 3}", 1)).applied
        ctx = ssl.create_default_context(cafile=certs["ca"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            for url in urls:  # every replica got every op over the encrypted peer links
                for k in range(3):
                    async with s.get(f"{url}/v1/counters/t/k{k}?consistency=one") as r:
                        assert (await r.json())["value"] == 10
            async with s.get(f"{urls[0]}/metrics") as r:
                text = await r.text()
            assert "idc_peer_auth_accepted_total" in text
        async with aiohttp.ClientSession() as s:  # plain HTTP to a TLS port gets nowhere
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"{cluster.urls[0]}/v1/health",
                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                    await r.read()


async def _read_all(reader: asyncio.StreamReader, timeout: float) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout)


async def test_slow_headers_and_slow_bodies_get_408_and_are_closed() -> None:
    args = ["--header-timeout", "0.5", "--body-timeout", "0.5"]
    async with running_cluster(1, rf=1, extra_args=args) as cluster:
        node = cluster.nodes["n1"]
        reader, writer = await asyncio.open_connection(node.host, node.port)
        writer.write(b"POST /v1/counters/t/k HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        answer = await _read_all(reader, 10)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and _error(body)["code"] == "request_timeout"

        reader, writer = await asyncio.open_connection(node.host, node.port)
        writer.write(b"POST /v1/counters/t/k HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 40\r\n\r\n{\"op_id\": ")
        answer = await _read_all(reader, 10)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{node.url}/v1/counters/t/k?consistency=one") as r:
                assert (await r.json())["value"] == 0
            async with s.get(f"{node.url}/metrics") as r:
                assert 'idc_http_refused_total{reason="header_timeout"} 1' in await r.text()


async def test_connections_past_the_per_client_cap_get_429() -> None:
    async with running_cluster(1, rf=1, extra_args=["--max-connections-per-client", "3"]
                               ) as cluster:
        node = cluster.nodes["n1"]
        request = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
        held = []
        for _ in range(3):  # three keep-alive connections, each answered and kept open
            reader, writer = await asyncio.open_connection(node.host, node.port)
            writer.write(request)
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            held.append(writer)
        reader, writer = await asyncio.open_connection(node.host, node.port)
        writer.write(request)
        answer = await _read_all(reader, 10)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429") and _error(body)["code"] == "too_many_connections"
        held.pop().close()  # a slot frees up when a connection closes

        async def fourth_ok() -> bool:
            r, w = await asyncio.open_connection(node.host, node.port)
            w.write(request)
            line = await r.readline()
            w.close()
            return line.startswith(b"HTTP/1.1 200")

        for _ in range(50):
            if await fourth_ok():
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the freed slot was never given back")
        for w in held:
            w.close()


async def test_an_op_that_would_overflow_its_entry_is_refused_and_nothing_breaks() -> None:
    big = (1 << 63) - 1  # a valid delta; three of them pass what an entry can hold (2^64 - 1)
    async with running_cluster(3) as cluster:
        url = cluster.urls[0]
        async with aiohttp.ClientSession() as s:
            async def add(op_id: str, delta: int) -> tuple[int, dict[str, Any]]:
                async with s.post(f"{url}/v1/counters/t/big",
                                  json={"op_id": op_id, "delta": delta}) as r:
                    return r.status, await r.json()

            assert (await add("o:1", big))[0] == 200
            assert (await add("o:2", big))[0] == 200
            status, body = await add("o:3", big)
            assert status == 400 and body["error"]["code"] == "counter_overflow", body
            assert await add("o:2", big) == (200, {"applied": False, "duplicate": True})
            assert (await add("o:4", -5))[0] == 200  # the N side still has room
            async with s.post(f"{url}/v1/batch", json={"ops": [
                    {"table": "t", "key": "big", "op_id": "o:5", "delta": big},
                    {"table": "t", "key": "other", "op_id": "o:6", "delta": 1}]}) as r:
                results = (await r.json())["results"]
            assert results[0]["status"] == 400 and results[1] == {"applied": True}
            for node_url in cluster.urls:  # every replica agrees, and peers still talk
                async with s.get(f"{node_url}/v1/counters/t/big?consistency=all") as r:
                    assert (await r.json())["value"] == 2 * big - 5
    assert set((await cluster.stop()).values()) == {0}  # snapshots and drain still work
