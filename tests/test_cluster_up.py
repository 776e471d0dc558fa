"""``python -m cluster up``: real processes come up, serve, and all stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys

import pytest
from cluster_util import Client

from cluster.local import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def three_free_ports() -> int:
    for _ in range(50):
        base = free_ports(1)[0]
        if base + 2 > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + 3):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no three consecutive free ports")


async def test_up_starts_serves_and_stops() -> None:
    base = three_free_ports()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cluster", "up", "--base-port", str(base), "--nodes", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    client = Client()
    try:
        assert proc.stdout is not None
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, "cluster up exited early: " + "".join(lines)
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        text = "".join(lines)
        for i in range(3):
            assert f"http://127.0.0.1:{base + i}" in text
        status, body = await client.add(f"http://127.0.0.1:{base}", "t", "k", "up:1", 4)
        assert body == {"applied": True}
        assert await client.value(f"http://127.0.0.1:{base + 2}", "t", "k", "all") == 4
        proc.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(proc.stdout.read(), 30)).decode()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert "stopped: n1=0, n2=0, n3=0" in rest
    finally:
        await client.close()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
