"""The floor under the write path: the same messages and fsyncs with no counter logic at all.

    python -m bench.bench_floor [--seconds 5] [--concurrency 24] [--batch 1,100] [--no-fsync]

Three processes on loopback play the shape of one acknowledged write at RF 3, W 2: a client
request reaches its leader; the leader appends it to its log (group commit: a writer thread,
one write and one fdatasync for everything queued, its answer posted back to the event loop) and
sends one frame to each of two replicas, which append to their own logs the same way and ack;
the leader answers once its own append and one replica's are durable. Requests and frames are
length-prefixed msgpack (``--batch`` items of the size our ops have), read by asyncio protocols
under uvloop, as the nodes do. Nothing else: no HTTP parsing, no dedup, no counters, no peer
signatures, no routing, no timers.

What it prints is what this machine charges for the architecture itself, in ops/s and process
CPU per op (the three servers, from /proc), beside which ``bench.bench_cluster`` and
``bench.bench_redis`` can be read: no Python implementation of this design can go below it,
and the difference is what our logic costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import msgpack

from bench.bench_cluster import cpu_seconds
from cluster.local import free_ports

_LEN = struct.Struct(">I")


def _frames(buf: bytearray) -> list[Any]:
    """Complete length-prefixed msgpack frames at the front of ``buf`` (consumed)."""
    out = []
    while len(buf) >= 4:
        (n,) = _LEN.unpack_from(buf)
        if len(buf) < 4 + n:
            break
        out.append(msgpack.unpackb(bytes(buf[4:4 + n])))
        del buf[:4 + n]
    return out


def _frame(obj: Any) -> bytes:
    body = msgpack.packb(obj)
    return _LEN.pack(len(body)) + body


class GroupLog:
    """Appends committed by one writer thread: one write and one fdatasync for all queued."""

    def __init__(self, path: str, fsync: bool, loop: asyncio.AbstractEventLoop) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.fsync, self.loop = fsync, loop
        self.q: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True).start()

    def append(self, data: bytes) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        self.q.put((data, fut))
        return fut

    def _run(self) -> None:
        while True:
            items = [self.q.get()]
            while True:
                try:
                    items.append(self.q.get_nowait())
                except queue.Empty:
                    break
            os.write(self.fd, b"".join(d for d, _ in items))
            if self.fsync:
                os.fdatasync(self.fd)
            self.loop.call_soon_threadsafe(_resolve, [f for _, f in items])


def _resolve(futs: list[asyncio.Future[None]]) -> None:
    for f in futs:
        if not f.done():
            f.set_result(None)


class Server(asyncio.Protocol):
    """One connection: a client's (leader role) or a leader's (replica role)."""

    def __init__(self, node: Node) -> None:
        self.node, self.buf = node, bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for msg in _frames(self.buf):
            self.node.handle(self, msg)


class ReplicaLink(asyncio.Protocol):
    """The leader's connection to one replica: frames out, acks back in order."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiting: list[asyncio.Future[None]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, msg: Any) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        assert self.transport is not None
        self.transport.write(_frame(msg))
        return fut

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for _ack in _frames(self.buf):
            self.waiting.pop(0).set_result(None)


class Node:
    def __init__(self, role: str, log: GroupLog, replicas: list[ReplicaLink]) -> None:
        self.role, self.log, self.replicas = role, log, replicas

    def handle(self, conn: Server, msg: Any) -> None:
        data = msgpack.packb(msg)
        own = self.log.append(data)
        if self.role == "replica":
            own.add_done_callback(lambda _f: conn.transport.write(_frame(1)))  # type: ignore[union-attr]
            return
        acks = [r.send(msg) for r in self.replicas]
        state = [False, 0, False]  # own durable, replica acks, answered

        def one(_f: asyncio.Future[None], own_done: bool = False) -> None:
            if own_done:
                state[0] = True
            else:
                state[1] += 1
            if state[0] and state[1] >= 1 and not state[2] and conn.transport is not None:
                state[2] = True  # W = 2: its own copy and one replica's
                conn.transport.write(_frame(len(msg)))

        own.add_done_callback(lambda f: one(f, True))
        for a in acks:
            a.add_done_callback(one)


async def serve(role: str, port: int, replica_ports: list[int], fsync: bool, logdir: str
                ) -> None:
    loop = asyncio.get_running_loop()
    log = GroupLog(os.path.join(logdir, f"{role}-{port}.log"), fsync, loop)
    replicas: list[ReplicaLink] = []
    for rp in replica_ports:
        _t, link = await loop.create_connection(ReplicaLink, "127.0.0.1", rp)
        replicas.append(link)
    node = Node(role, log, replicas)
    await loop.create_server(lambda: Server(node), "127.0.0.1", port)
    print("READY", flush=True)
    await asyncio.Event().wait()


async def drive(port: int, pids: list[int], batch: int, seconds: float, concurrency: int
                ) -> dict[str, Any]:
    item = ["fbf_t", "k1234", "bench12345:678901", 1, 1, 1_700_000_000_000]  # an op's size
    msg = [item] * batch
    wire = _frame(msg)
    done = [0]
    lat: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                writer.write(wire)
                (n,) = _LEN.unpack(await reader.readexactly(4))
                await reader.readexactly(n)
                lat.append(time.perf_counter() - t0)
                done[0] += batch
        finally:
            writer.close()

    cpu0 = cpu_seconds(pids)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    ops = max(done[0], 1)
    lat.sort()
    return {"batch": batch, "ops_per_s": round(done[0] / elapsed),
            "server_cpu_us_per_op": round((cpu_seconds(pids) - cpu0) / ops * 1e6, 1),
            "p50_ms": round(lat[len(lat) // 2] * 1e3, 2) if lat else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="per batch size")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--batch", default="1,100", help="ops a request, comma-separated")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--quick", action="store_true", help="1 s per batch size")
    ap.add_argument("--serve", nargs=3, metavar=("ROLE", "PORT", "REPLICAS"),
                    help=argparse.SUPPRESS)  # a server process of this benchmark
    ap.add_argument("--logdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        import uvloop

        role, port, reps = args.serve
        uvloop.run(serve(role, int(port), [int(p) for p in reps.split(",") if p],
                         args.fsync, args.logdir))
        return 0
    if args.quick:
        args.seconds = min(args.seconds, 1.0)
    return asyncio.run(run(args))


async def run(args: argparse.Namespace) -> int:
    leader, r1, r2 = free_ports(3)
    procs: list[subprocess.Popen[bytes]] = []
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as logdir:
        try:
            for role, port, reps in (("replica", r1, ""), ("replica", r2, ""),
                                     ("leader", leader, f"{r1},{r2}")):
                p = subprocess.Popen(
                    [sys.executable, "-m", "bench.bench_floor", "--serve", role, str(port), reps,
                     "--logdir", logdir, "--fsync" if args.fsync else "--no-fsync"],
                    stdout=subprocess.PIPE)
                procs.append(p)
                assert p.stdout is not None
                if p.stdout.readline().strip() != b"READY":
                    raise RuntimeError(f"the {role} on {port} did not start")
            pids = [p.pid for p in procs]
            for batch in [int(b) for b in args.batch.split(",")]:
                res = await drive(leader, pids, batch, args.seconds, args.concurrency)
                results.append(res)
                print("floor:", res, flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"fsync": args.fsync, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
