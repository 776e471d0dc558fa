"""The whole cluster's CPU per batched op, measured in one process.

    python -m bench.bench_inprocess [--batches 400] [--batch 100] [--rounds 3] [--quick]
                                    [--nodes 3] [--rf 0] [--fsync]

Three nodes (``--nodes``, each key on ``--rf`` of them, W a majority of it) run in this
process (``NodeServer``, fsync off unless ``--fsync``, signed peer frames, the FBF), and
batches of one leader's keys are handed to that leader's ``/v1/batch`` route (``post_batch``)
without HTTP; replication, acks and publication go over loopback between the three, as between
processes. The requests are built before the clock starts and the answers read after it, so
the CPU this process uses per op is the whole cluster's logic for that op: the
edge's checks, routing, the dedup on three nodes, the leader's apply and release, two replicas'
merges, log and frame encoding, signatures. Not in it: HTTP parsing, fsync, and the wakeups
between processes, which ``bench.bench_cluster`` has.

Why: on a shared 2-core VM, ``bench_cluster``'s numbers move 10 - 40% between runs, because its
four processes compete for the cores and each wakeup costs what the machine makes it cost. One
process doing all the work is mostly user time and moves less. It still moves: to see a change
of a few percent, alternate two trees, run one after the other from the root of each (the
nodes import the ``cluster`` package of the current directory).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import uvloop

_TABLE = "fbf_t"


def _configs(tmp: Path, nodes: int = 3, rf: int = 0, fsync: bool = False) -> list[Any]:
    from cluster.core.config import from_mapping
    from cluster.local import free_ports

    secret = tmp / "cluster.secret"
    secret.write_text(os.urandom(32).hex())
    secret.chmod(0o600)
    ports = free_ports(nodes)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    return [from_mapping({"node_id": f"n{i + 1}", "listen": f"127.0.0.1:{p}", "peers": peers,
                          "data_dir": str(tmp / f"n{i + 1}"), "fsync": fsync,
                          "secret_file": str(secret), "dedup": "fbf", "rate": 200_000,
                          "window": 10, "rf": rf})
            for i, p in enumerate(ports)]


async def _round(args: argparse.Namespace) -> dict[str, float]:
    from cluster.core.ring import Ring
    from cluster.edge import routes
    from cluster.server import NodeServer

    with tempfile.TemporaryDirectory() as tmp:
        servers = [NodeServer(c) for c in _configs(Path(tmp), args.nodes, args.rf, args.fsync)]
        try:
            for s in servers:
                await s.start()
            node = servers[0].node
            deadline = time.monotonic() + 30
            while not node.ready:
                if time.monotonic() > deadline:
                    raise RuntimeError("n1 not ready within 30 s")
                await asyncio.sleep(0.05)
            # the keys n1 leads (a fresh ring: asking n1's would fill its cache)
            ring = Ring(list(node.ring.members), vnodes=node.ring.vnodes, rf=node.ring.rf)
            keys = [f"k{i}" for i in range(args.keys) if ring.leader(_TABLE, f"k{i}") == "n1"]
            if not keys:
                raise RuntimeError(f"n1 leads none of k0..k{args.keys - 1}: raise --keys")
            ids = itertools.count()
            rng = random.Random(7)

            def bodies(n: int) -> list[bytes]:
                """``n`` requests of new ops, built before the clock starts (a client's work)."""
                return [msgpack.packb({"ops": [
                    {"table": _TABLE, "key": rng.choice(keys), "op_id": f"c{next(ids):012d}:op",
                     "delta": 1} for _ in range(args.batch)]}) for _ in range(n)]

            latencies: list[float] = []

            async def worker(requests: list[bytes], answers: list[bytes]) -> None:
                for body in requests:
                    async def read(body: bytes = body) -> bytes:
                        return body

                    t = time.perf_counter()
                    answers.append(await routes.post_batch(node, read, "application/msgpack",
                                                           True))
                    latencies.append(time.perf_counter() - t)

            def check(answers: list[bytes]) -> None:
                """Every op was new, so each must have been applied."""
                for answer in answers:
                    refused = [r for r in msgpack.unpackb(answer)["results"]
                               if r.get("applied") is not True]
                    if refused:
                        raise RuntimeError(f"{len(refused)} ops not applied: {refused[:3]}")

            per = max(1, args.batches // args.concurrency)
            # warm-up: three ops a key (nearly every key made: a new key costs several times an
            # op on an existing one), the filters and pages grown
            warm = max(per // 4, 3 * len(keys) // (args.batch * args.concurrency) + 1)
            answers: list[bytes] = []
            await asyncio.gather(*(worker(bodies(warm), answers)
                                   for _ in range(args.concurrency)))
            check(answers)
            work = [bodies(per) for _ in range(args.concurrency)]
            answers = []
            latencies.clear()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            await asyncio.gather(*(worker(requests, answers) for requests in work))
            r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
            check(answers)
        finally:
            for s in servers:
                await s.stop()
    ops = per * args.concurrency * args.batch
    user = (r1.ru_utime - r0.ru_utime) / ops * 1e6
    system = (r1.ru_stime - r0.ru_stime) / ops * 1e6
    latencies.sort()
    return {"cpu_us_per_op": round(user + system, 2), "user_us_per_op": round(user, 2),
            "sys_us_per_op": round(system, 2), "ops_per_s": round(ops / wall),
            # a batch's time in the leader's route, its quorum waits included
            "batch_ms_p50": round(latencies[len(latencies) // 2] * 1e3, 2),
            "batch_ms_p99": round(latencies[min(len(latencies) - 1,
                                                int(len(latencies) * 0.99))] * 1e3, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.bench_inprocess",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prints one line a round and the rounds' range; --json writes them too.")
    ap.add_argument("--batches", type=int, default=400, help="batches measured a round")
    ap.add_argument("--batch", type=int, default=100, help="ops a batch")
    ap.add_argument("--concurrency", type=int, default=8, help="batches in flight")
    ap.add_argument("--keys", type=int, default=10_000,
                    help="keys k0..k<N-1>, of which n1 leads about a third (as bench_cluster's "
                         "leader-routed batches)")
    ap.add_argument("--rounds", type=int, default=3, help="fresh clusters, one after another")
    ap.add_argument("--nodes", type=int, default=3, help="nodes in the cluster")
    ap.add_argument("--rf", type=int, default=0,
                    help="replicas a key (0: min(3, nodes)); W is a majority of it")
    ap.add_argument("--fsync", action="store_true", help="fsync the logs (off by default)")
    ap.add_argument("--quick", action="store_true", help="one short round (smoke run)")
    ap.add_argument("--json", help="also write the rounds here")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.rounds, args.keys = 40, 1, 1000
    for name, value in (("--batches", args.batches), ("--batch", args.batch),
                        ("--concurrency", args.concurrency), ("--keys", args.keys),
                        ("--rounds", args.rounds), ("--nodes", args.nodes)):
        if value < 1:
            ap.error(f"{name} must be at least 1, got {value}")
    rounds = []
    for i in range(args.rounds):
        row = uvloop.run(_round(args))  # the loop the nodes run on
        rounds.append(row)
        print(f"in-process cluster, round {i + 1}: {row}", flush=True)
    cpu = [r["cpu_us_per_op"] for r in rounds]
    print(f"in-process cluster, batches of {args.batch}: {min(cpu)} - {max(cpu)} us of CPU an op "
          f"over {len(rounds)} round(s) ({args.nodes} nodes, rf {args.rf or min(3, args.nodes)})",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
