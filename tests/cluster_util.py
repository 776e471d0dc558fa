"""Helpers for the multi-process tests: a cluster of real nodes, a small JSON client, waits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from cluster.local import LocalCluster


def write_certs(directory: Path) -> dict[str, str]:
    """A test CA and a certificate for 127.0.0.1 signed by it, written as PEM files: the paths
    of ``ca``, ``cert`` and ``key`` (for ``--tls-cert``, ``--tls-key``, ``--tls-ca``)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": directory / "ca.pem", "cert": directory / "cert.pem",
             "key": directory / "key.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    return {k: str(v) for k, v in paths.items()}


@contextlib.asynccontextmanager
async def running_cluster(nodes: int = 3, **kw: Any) -> AsyncIterator[LocalCluster]:
    cluster = LocalCluster(nodes, **kw)
    await cluster.start()
    try:
        yield cluster
    finally:
        try:
            await asyncio.wait_for(cluster.stop(timeout=5.0), 20.0)
        finally:
            await cluster.abort()


class Client:
    """JSON over aiohttp, one session; returns (status, decoded body)."""

    def __init__(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def close(self) -> None:
        await self.session.close()

    async def _req(self, method: str, url: str, **kw: Any) -> tuple[int, Any]:
        async with self.session.request(method, url, **kw) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, raw

    async def add(self, base: str, table: str, key: str, op_id: str, delta: int,
                  **extra: Any) -> tuple[int, Any]:
        body = {"op_id": op_id, "delta": delta, **extra}
        return await self._req("POST", f"{base}/v1/counters/{table}/{key}", json=body)

    async def batch(self, base: str, ops: list[dict[str, Any]]) -> tuple[int, Any]:
        return await self._req("POST", f"{base}/v1/batch", json={"ops": ops})

    async def raw_post(self, url: str, data: bytes, content_type: str = "application/json"
                       ) -> tuple[int, Any]:
        return await self._req("POST", url, data=data, headers={"Content-Type": content_type})

    async def value(self, base: str, table: str, key: str, consistency: str = "one") -> int:
        status, body = await self._req(
            "GET", f"{base}/v1/counters/{table}/{key}", params={"consistency": consistency})
        assert status == 200, (status, body)
        return int(body["value"])

    async def get(self, url: str) -> tuple[int, Any]:
        return await self._req("GET", url)


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout: float = 10.0,
                     what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def inprocess_configs(tmp: Path, **extra: Any) -> list[Any]:
    """Three nodes' configs for one event loop: free ports, no fsync, short quorum waits."""
    from cluster.core.config import from_mapping
    from cluster.local import free_ports

    ports = free_ports(3)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    return [from_mapping({"node_id": f"n{i + 1}", "listen": f"127.0.0.1:{p}", "peers": peers,
                          "data_dir": str(tmp / f"n{i + 1}"), "fsync": False,
                          "quorum_timeout": 0.5, **extra})
            for i, p in enumerate(ports)]


@contextlib.asynccontextmanager
async def inprocess_nodes(cfgs: list[Any]) -> AsyncIterator[list[Any]]:
    """``NodeServer``s of ``cfgs`` started in this loop, stopped on the way out."""
    from cluster.server import NodeServer

    servers = [NodeServer(c) for c in cfgs]
    try:
        for s in servers:
            await s.start()
        yield servers
    finally:
        for s in servers:
            with contextlib.suppress(Exception):
                await s.stop()


def node_url(server: Any) -> str:
    assert server.address is not None
    return f"http://{server.address[0]}:{server.address[1]}"

