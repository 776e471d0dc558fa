"""The application shape, ours against Redis: one client object shared by many coroutines, each
awaiting one increment at a time; throughput, client and server CPU per op, latency of a call.

    python -m bench.bench_app [--seconds 5] [--coroutines 256] [--keys 10000] [--quick]
                              [--json PATH] [--profile PATH]

What an application does is neither of ``bench.bench_redis``'s shapes: its request handlers do
not build batches, they each ``await client.incr(...)`` and go on, and many of them run at once
on one event loop sharing one client. So this runs ``--coroutines`` coroutines for
``--seconds``, each awaiting one increment of a random key among ``--keys`` at a time, in a
loop, against:

Ours: one ``client.sdk.CounterClient`` with its default settings (it gathers the calls issued
within ``batch_interval`` into one ``/v1/batch`` per leader, and retries with the same op id),
over the cluster of ``bench.bench_redis`` (3 node processes, RF 3, W 2, fsync on, the FBF).

Redis: redis-py's asyncio client (one client, its connection pool shared by the coroutines),
one ``evalsha`` of ``bench.bench_redis``'s idempotency script (``SET op:<id> 1 NX EX 10``, then
``INCRBY``) an op, with a fresh op id, on the same ``redis-server`` (AOF, ``appendfsync
always``).

For each: acknowledged ops/s, this process's CPU per op (the client's: its batching, routing,
encoding and the event loop), the server processes' CPU per op (the 3 nodes', or
redis-server's, from /proc), p50/p99 of one call as the coroutine awaits it, and after the run
the counters read back and summed (every acknowledged op counted once: the sum equals the
acknowledged ops when no call failed). Then ours / Redis in ops/s. The client shares the
machine's cores with the servers in both cases, as ``bench.bench_redis``'s load does.

``--profile PATH`` writes cProfile stats of this process during ours' load phase only and
prints the client's (``client/``) top functions by own time, per op. The profiler slows the
client, so read that run's throughput as the profile's, not the benchmark's; its timer is the
wall clock (a CPU timer costs a syscall a call here, more than most of the functions it
times), so a call that blocks or loses its core (a socket send, on a machine the nodes share)
counts its waiting too.

Needs ``redis-server`` on the PATH and the ``redis`` package for the Redis side; without them
it says so and measures ours alone.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import pstats
import random
import time
from collections import Counter
from typing import Any

from bench.bench_cluster import cpu_seconds, pct, run_and_report
from bench.bench_redis import SCRIPT, WINDOW_S, RedisServer, missing
from client.errors import ClientError
from client.sdk import CounterClient
from cluster.local import LocalCluster

TABLE = "app"


def result(ops: int, errors: int, elapsed: float, client_cpu: float, server_cpu: float,
           lat: list[float], server: str) -> dict[str, Any]:
    per = max(ops, 1)
    return {"ops": ops, "ops_per_s": round(ops / elapsed),
            "client_cpu_us_per_op": round(client_cpu / per * 1e6, 1),
            f"{server}_cpu_us_per_op": round(server_cpu / per * 1e6, 1),
            "p50_ms": round(pct(lat, 0.50) * 1e3, 2), "p99_ms": round(pct(lat, 0.99) * 1e3, 2),
            "errors": errors}


async def drive(coroutines: int, seconds: float, call: Any,
                failures: tuple[type[Exception], ...]) -> tuple[int, Counter[str], list[float],
                                                                 float]:
    """``coroutines`` loops, each awaiting ``call()`` one at a time until ``seconds`` have
    passed (a call in flight at the deadline is awaited). Returns the calls that succeeded,
    the failures (``failures`` raised) by exception class, every call's latency and the
    elapsed time."""
    lat: list[float] = []
    done = [0]
    failed: Counter[str] = Counter()
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        clock = time.perf_counter
        while clock() < deadline:
            t0 = clock()
            try:
                await call()
            except failures as exc:
                failed[type(exc).__name__] += 1
            else:
                done[0] += 1
            lat.append(clock() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(coroutines)))
    return done[0], failed, lat, time.perf_counter() - start


async def ours_phase(args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--dedup", "fbf", "--rate", "200000", "--window", str(WINDOW_S)]
    prof = cProfile.Profile() if args.profile else None
    async with LocalCluster(3, rf=3, extra_args=extra, secret=True) as cluster:
        pids = [n.proc.pid for n in cluster.nodes.values() if n.proc]
        client = CounterClient(cluster.urls, **({} if args.max_batches_in_flight is None else
                                                {"max_batches_in_flight":
                                                 args.max_batches_in_flight}))
        await client.start()
        try:
            keys = args.keys

            def call() -> Any:
                return client.incr(TABLE, f"k{random.randrange(keys)}", 1)

            cpu0, own0 = cpu_seconds(pids), time.process_time()
            if prof is not None:
                prof.enable()
            ops, failed, lat, elapsed = await drive(args.coroutines, args.seconds, call,
                                                    (ClientError,))
            if prof is not None:
                prof.disable()
            node_cpu, own = cpu_seconds(pids) - cpu0, time.process_time() - own0
            out = result(ops, sum(failed.values()), elapsed, own, node_cpu, lat, "node")
            stats = client.stats
            out["ops_per_request"] = round(stats.acknowledged / max(stats.http_requests, 1), 1)
            out["duplicates"] = stats.duplicates
            out["retries"] = stats.retries
            if failed:
                out["failed_by"] = dict(failed)
            # every acknowledged op counted once: the counters' total, read back at quorum
            values = await client.get_many(TABLE, [f"k{i}" for i in range(keys)])
            out["counted"] = sum(values)
        finally:
            await client.stop()
    if prof is not None:
        prof.dump_stats(args.profile)
        out["profile"] = args.profile
    return out


async def redis_phase(server: RedisServer, args: argparse.Namespace) -> dict[str, Any]:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    r = aioredis.Redis(port=server.port, max_connections=args.coroutines)
    try:
        sha = await r.script_load(SCRIPT)
        seq = itertools.count()
        prefix = f"app{os.getpid()}"
        keys = args.keys
        dups = [0]

        async def call() -> None:
            got = await r.evalsha(sha, 2, f"op:{prefix}:{next(seq)}",
                                  f"k{random.randrange(keys)}", 1, WINDOW_S)
            dups[0] += got is None  # none expected: every op id is fresh

        assert server.proc is not None
        cpu0, own0 = cpu_seconds([server.proc.pid]), time.process_time()
        ops, failed, lat, elapsed = await drive(args.coroutines, args.seconds, call,
                                                (RedisError,))
        server_cpu = cpu_seconds([server.proc.pid]) - cpu0
        own = time.process_time() - own0
        out = result(ops, sum(failed.values()), elapsed, own, server_cpu, lat, "server")
        out["duplicates"] = dups[0]
        names = [f"k{i}" for i in range(keys)]
        total = 0
        for i in range(0, keys, 1000):
            total += sum(int(v) for v in await r.mget(names[i:i + 1000]) if v is not None)
        out["counted"] = total
    finally:
        await r.aclose()
    return out


def profile_summary(path: str, ops: int, top: int = 15) -> list[dict[str, Any]]:
    """The client's (``client/``) functions with the most own time in the profile at ``path``,
    each with its calls and own time per op."""
    stats = pstats.Stats(path)
    rows = []
    per = max(ops, 1)
    for (file, line, name), (_cc, ncalls, tottime, cumtime, _callers) in \
            stats.stats.items():  # type: ignore[attr-defined]
        parts = file.replace(os.sep, "/").split("/")
        if "client" not in parts[:-1]:
            continue
        where = "/".join(parts[parts.index("client"):])
        rows.append({"function": f"{where}:{line}({name})", "calls_per_op": round(ncalls / per, 2),
                     "tottime_us_per_op": round(tottime / per * 1e6, 2),
                     "cumtime_us_per_op": round(cumtime / per * 1e6, 2)})
    rows.sort(key=lambda r: -r["tottime_us_per_op"])
    return rows[:top]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"config": {"seconds": args.seconds, "coroutines": args.coroutines,
                                      "keys": args.keys, "cores": os.cpu_count()}}
    why = missing()
    if why is not None:
        print(why, "(measuring ours alone)", flush=True)
        out["redis_skipped"] = why
    else:
        async with RedisServer() as server:
            out["redis"] = await redis_phase(server, args)
        print("redis, app shape:", out["redis"], flush=True)
    out["ours"] = await ours_phase(args)
    print("ours, app shape:", out["ours"], flush=True)
    if "redis" in out:
        out["ratio_ops_per_s"] = round(out["ours"]["ops_per_s"]
                                       / max(out["redis"]["ops_per_s"], 1), 2)
        print("ours / redis, ops/s:", out["ratio_ops_per_s"], flush=True)
    if args.profile:
        rows = profile_summary(args.profile, out["ours"]["ops"])
        out["client_profile_top"] = rows
        print(f"client (client/...) functions by own time, us an op (cProfile, wall clock, of "
              f"ours' load phase, written to {args.profile}):", flush=True)
        for row in rows:
            print(f"  {row['tottime_us_per_op']:7.2f} own {row['cumtime_us_per_op']:8.2f} cum "
                  f"{row['calls_per_op']:6.2f} calls  {row['function']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_app", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="per load phase")
    ap.add_argument("--coroutines", type=int, default=256,
                    help="coroutines sharing one client, each one call at a time")
    ap.add_argument("--keys", type=int, default=10_000, help="distinct counters written")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--profile", default=None,
                    help="write cProfile stats of ours' load phase (this process) here")
    ap.add_argument("--max-batches-in-flight", type=int, default=None,
                    help="the SDK's setting of that name (default: its default); 0 gives the "
                         "fixed batch window of releases before 0.6.0")
    ap.add_argument("--quick", action="store_true", help="1 s phases, 64 coroutines")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.coroutines = min(args.seconds, 1.0), min(args.coroutines, 64)
    return run_and_report(main_async(args), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
