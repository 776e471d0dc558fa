"""Side by side with Redis: the same load shapes against Redis with an idempotency-key script,
and against a 3-node cluster of ours; throughput, CPU per op and the ratios, from one run.

    python -m bench.bench_redis [--seconds 5] [--concurrency 24] [--batch 100] [--quick]

Redis (what a user would run instead): one ``redis-server`` started here on a free port, no
replication, AOF on with ``appendfsync always`` (an acknowledged op is on disk, as ours is on
W = 2 of 3 disks), exact dedup by an idempotency key in one atomic Lua script::

    if redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[2]) then
        return redis.call('INCRBY', KEYS[2], ARGV[1]) end

driven by redis-py's asyncio client with ``--concurrency`` workers: ``single`` is one script
call a round trip, ``pipelined`` is ``--batch`` calls in one pipeline. Its dedup memory per
remembered op id comes from ``INFO memory`` before and after the run.

Ours: 3 node processes, RF 3, W 2, fsync on, the FBF (the same cluster as
``bench.bench_cluster``): ``single`` is one op a request sent to its key's leader (what the SDK
does), ``pipelined`` is ``--batch`` ops a ``/v1/batch`` of one leader's keys (what the SDK
sends: it splits a batch by leader), and ``batch to any node`` the same batches of random keys
sent to any node, which forwards each op to its leader (printed, not judged; the hot-path
issue's first measure was of that shape). The load generator shares the machine's
cores with the servers in both cases. Then one op a request again, paced at 80% of the rate
just measured, for its p99 (latency counted from when each request was due).

It ends with the hot-path issue's targets, each with what this run measured and whether it
is met.

Needs ``redis-server`` on the PATH (Debian: ``apt-get install redis-server``) and the ``redis``
package (``pip install -e '.[bench]'``); without them it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import shutil
import subprocess
import tempfile
import time
from typing import Any

from bench.bench_cluster import (
    Load,
    batch_phase,
    cpu_seconds,
    routed_batch_phase,
    routed_single_phase,
    run_and_report,
)
from cluster.local import LocalCluster, free_ports

SCRIPT = """
if redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[2]) then
    return redis.call('INCRBY', KEYS[2], ARGV[1])
end
return false
"""
WINDOW_S = 10


def missing() -> str | None:
    """Why Redis cannot be measured here, or None."""
    if shutil.which("redis-server") is None:
        return ("redis-server not found: install it (Debian: apt-get install redis-server) to "
                "compare against Redis")
    try:
        import redis.asyncio  # noqa: F401
    except ImportError:
        return "the redis package is missing: pip install -e '.[bench]'"
    return None


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> RedisServer:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir,
             "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis.asyncio as aioredis

        deadline = time.monotonic() + 10
        while True:
            try:
                r = aioredis.Redis(port=self.port)
                await r.ping()
                await r.aclose()
                return self
            except Exception:  # noqa: BLE001 - still starting
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                await asyncio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


async def redis_phase(server: RedisServer, args: argparse.Namespace, batch: int
                      ) -> dict[str, Any]:
    """``batch`` script calls a round trip (1: single), ``--concurrency`` workers."""
    import redis.asyncio as aioredis

    r = aioredis.Redis(port=server.port, max_connections=args.concurrency)
    sha = await r.script_load(SCRIPT)
    seq = itertools.count()
    prefix = f"b{os.getpid()}:{batch}"
    done = [0, 0]  # ops, duplicates (none expected: every id is fresh)
    deadline = time.perf_counter() + args.seconds

    def call(pipe: Any) -> Any:
        """One script call on ``pipe`` (the client: a coroutine; a pipeline: queued)."""
        op = next(seq)
        return pipe.evalsha(sha, 2, f"op:{prefix}:{op}", f"k{random.randrange(args.keys)}", 1,
                            WINDOW_S)

    async def worker() -> None:
        while time.perf_counter() < deadline:
            if batch == 1:
                got = [await call(r)]
            else:
                pipe = r.pipeline(transaction=False)
                for _ in range(batch):
                    call(pipe)
                got = await pipe.execute()
            done[0] += len(got)
            done[1] += sum(1 for g in got if g is None)

    assert server.proc is not None
    cpu0, own0 = cpu_seconds([server.proc.pid]), time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    ops = max(done[0], 1)
    out = {"ops_per_s": round(done[0] / elapsed),
           "server_cpu_us_per_op": round((cpu_seconds([server.proc.pid]) - cpu0) / ops * 1e6, 1),
           "client_cpu_us_per_op": round((time.process_time() - own0) / ops * 1e6, 1),
           "duplicates": done[1]}
    await r.aclose()
    return out


async def redis_bytes_per_id(server: RedisServer, n: int) -> float:
    """Memory Redis holds per remembered op id (the SET NX EX keys), from INFO memory."""
    import redis.asyncio as aioredis

    r = aioredis.Redis(port=server.port)
    await r.flushall()
    before = (await r.info("memory"))["used_memory"]
    sha = await r.script_load(SCRIPT)
    for base in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(base, min(base + 1000, n)):
            pipe.evalsha(sha, 2, f"op:client-{i % 64}:{i}", "k0", 1, WINDOW_S * 100)
        await pipe.execute()
    after = (await r.info("memory"))["used_memory"]
    await r.aclose()
    return round((after - before) / n, 1)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"config": {"seconds": args.seconds, "concurrency": args.concurrency,
                                      "batch": args.batch, "cores": os.cpu_count()}}
    why = missing()
    if why is not None:
        print(why, flush=True)
        out["skipped"] = why
        return out
    async with RedisServer() as server:
        out["redis_single"] = await redis_phase(server, args, 1)
        print("redis, single:", out["redis_single"], flush=True)
        out["redis_pipelined"] = await redis_phase(server, args, args.batch)
        print("redis, pipelined:", out["redis_pipelined"], flush=True)
        out["redis_bytes_per_op_id"] = await redis_bytes_per_id(server, args.memory_ids)
        print("redis, bytes per remembered op id:", out["redis_bytes_per_op_id"], flush=True)
    extra = ["--dedup", "fbf", "--rate", "200000", "--window", str(WINDOW_S)]
    async with LocalCluster(3, rf=3, extra_args=extra, secret=True) as cluster:
        load = Load(cluster, args.keys, f"bench{os.getpid()}")
        ours_single = await routed_single_phase(load, args)
        out["ours_single"] = {"ops_per_s": ours_single["ops_per_s"],
                              "node_cpu_us_per_op": ours_single["node_cpu_us_per_op"]}
        print("ours, single (to the leader):", out["ours_single"], flush=True)
        paced = await routed_single_phase(load, args, rate=PACED * ours_single["ops_per_s"])
        out["ours_single_paced"] = {"rate": round(PACED * ours_single["ops_per_s"]),
                                    "ops_per_s": paced["ops_per_s"],
                                    "p50_ms": paced["p50_ms"], "p99_ms": paced["p99_ms"]}
        print(f"ours, single at {PACED:.0%} of that rate:", out["ours_single_paced"], flush=True)
        ours_batch = await routed_batch_phase(load, args)
        out["ours_pipelined"] = {"ops_per_s": ours_batch["ops_per_s"],
                                 "node_cpu_us_per_op": ours_batch["node_cpu_us_per_op"]}
        print("ours, batch (to the leader):", out["ours_pipelined"], flush=True)
        any_node = await batch_phase(load, args)
        out["ours_batch_any_node"] = {"ops_per_s": any_node["ops_per_s"],
                                      "node_cpu_us_per_op": any_node["node_cpu_us_per_op"]}
        print("ours, batch to any node (forwarded):", out["ours_batch_any_node"], flush=True)
    out["ratios"] = {
        shape: round(out[f"ours_{shape}"]["ops_per_s"] / max(out[f"redis_{shape}"]["ops_per_s"],
                                                             1), 2)
        for shape in ("single", "pipelined")}
    print("ours / redis, ops/s:", out["ratios"], flush=True)
    out["targets"] = targets(out)
    print(targets_table(out["targets"]), flush=True)
    return out


PACED = 0.8  # the paced single-op phase runs at this share of the measured peak

# The hot-path issue's targets: (name, what is measured, the bound, at least or at most).
TARGETS: list[tuple[str, tuple[str, ...], float, str]] = [
    ("batched ops/s", ("ours_pipelined", "ops_per_s"), 100_000, ">="),
    ("batched node CPU per op (us)", ("ours_pipelined", "node_cpu_us_per_op"), 15, "<="),
    ("batched / Redis pipelined", ("ratios", "pipelined"), 2.0, ">="),
    ("single ops/s", ("ours_single", "ops_per_s"), 5_000, ">="),
    ("single node CPU per op (us)", ("ours_single", "node_cpu_us_per_op"), 250, "<="),
    ("single / Redis single", ("ratios", "single"), 0.35, ">="),
    (f"single p99 at {PACED:.0%} of peak (ms)", ("ours_single_paced", "p99_ms"), 20, "<="),
]


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the value this run measured and whether it is met."""
    rows = []
    for name, (section, field), bound, sense in TARGETS:
        value = out[section][field]
        met = value >= bound if sense == ">=" else value <= bound
        rows.append({"target": name, "bound": f"{sense} {bound:g}", "measured": value,
                     "met": met})
    return rows


def targets_table(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["target"]) for r in rows)
    lines = [f"{'target':<{width}}  {'bound':>10}  {'measured':>10}  met"]
    lines += [f"{r['target']:<{width}}  {r['bound']:>10}  {r['measured']:>10g}  "
              f"{'yes' if r['met'] else 'no'}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_redis", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="per load phase")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--batch", type=int, default=100, help="ops a pipeline / a /v1/batch")
    ap.add_argument("--keys", type=int, default=10_000, help="distinct counters written")
    ap.add_argument("--memory-ids", type=int, default=200_000,
                    help="op ids written to measure Redis's dedup memory")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--quick", action="store_true", help="1 s phases, 20k ids (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.memory_ids = min(args.seconds, 1.0), min(args.memory_ids, 20_000)
    return run_and_report(main_async(args), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
