"""Cluster benchmark: 3 real node processes, RF=3, W=2, fsync on; bounded in time.

    python -m bench.bench_cluster [--seconds 8] [--concurrency 24] [--batch 100] [--no-memory]
                                  [--no-secret] [--syscalls]

Measures, in one run against one cluster:
  1. /v1/batch throughput (``--batch`` ops a request): ops/s, request p50/p99;
  2. one op per HTTP request: ops/s, p50/p99 (and ``single_routed``: each op sent to its key's
     leader, no forwarding hop, as the SDK does once it knows the ring);
  3. write latency with the FBF vs dedup off: the same cluster serves table ``fbf_t`` with the
     FBF and ``none_t`` with no dedup (``--dedup fbf,none_t=none``); requests alternate;
  4. node memory: RSS of a live node after loading ``--live-counters`` distinct counters, and
     RSS of fresh processes holding 1M counters (built by writes, and loaded from a snapshot as
     a restarted node holds them) / a window of 1M op ids (``--no-memory`` skips);
  5. ``roles`` (only when named in ``--phases``): where the nodes' CPU goes by role. Every op
     is on a key n1 leads, sent to n1 (8 connections), so n1 does all the leading and n2 and
     n3 only replicate; user and system CPU per op of the leader and of each replica, for
     batches of ``--batch`` and for one op a request.
The load generator runs in this process on the same machine and competes for the same cores.
``--syscalls`` adds each load phase's syscalls per op (strace over the nodes' threads).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from bench.httpload import HttpConn
from cluster.core.ring import Ring
from cluster.local import LocalCluster


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (all their threads), from /proc."""
    return sum(sum(cpu_split(pid)) for pid in pids)


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads) in seconds, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / tick, int(fields[12]) / tick


class Load:
    def __init__(self, cluster: LocalCluster, keys: int, prefix: str) -> None:
        self.addrs = [(n.host, n.port) for n in cluster.nodes.values()]
        self.pids = [n.proc.pid for n in cluster.nodes.values() if n.proc]
        self.ids = list(cluster.nodes)
        self.keys = keys
        self.seq = itertools.count()
        self.prefix = prefix
        self.errors = 0
        self.syscalls = False  # --syscalls: an strace census in the middle of each phase
        self._leaders: dict[str, dict[str, list[str]]] = {}

    def op(self, table: str, leader: str | None = None) -> dict[str, Any]:
        """A new op on a random key; of the keys ``leader`` leads (RF 3) when given."""
        if leader is None:
            key = f"k{random.randrange(self.keys)}"
        else:
            key = random.choice(self._led(table)[leader])
        return {"table": table, "key": key, "op_id": f"{self.prefix}:{next(self.seq)}",
                "delta": 1}

    def _led(self, table: str) -> dict[str, list[str]]:
        """The keys of ``table`` by leader, found once (a routed load then costs the client
        no more than a plain one, where drawing and rejecting keys cost it ~10 us an op)."""
        led = self._leaders.get(table)
        if led is None:
            ring = Ring(self.ids, rf=3)
            led = self._leaders[table] = {n: [] for n in self.ids}
            for i in range(self.keys):
                led[ring.leader(table, f"k{i}")].append(f"k{i}")
        return led

    async def run(self, concurrency: int, seconds: float, make: Any,
                  rate: float | None = None, at: int | None = None) -> dict[str, list[float]]:
        """``make(conn)`` sends one request and returns (label, ops); latencies per label.

        ``rate``: requests a second in all, on a fixed schedule (request i is due at
        ``start + i / rate``), each latency counted from when its request was due, so a slow
        answer that delays the next requests counts against them too (no coordinated
        omission). Without it, every worker sends its next request as soon as it has an answer.
        ``at``: every connection goes to that node (an index of ``addrs``), not round the nodes.
        """
        lat: dict[str, list[float]] = {}
        ops = [0]
        sched = [0.0, 0.0]  # the schedule's start and the deadline, set as the workers start
        issued = itertools.count()

        async def worker(i: int) -> None:
            conn = await HttpConn.open(*self.addrs[i % len(self.addrs) if at is None else at])
            try:
                while time.perf_counter() < sched[1]:
                    t0 = time.perf_counter()
                    if rate is not None:
                        t0 = sched[0] + next(issued) / rate
                        if t0 >= sched[1]:
                            break
                        if t0 > time.perf_counter():
                            await asyncio.sleep(t0 - time.perf_counter())
                    label, n, ok = await make(conn)
                    lat.setdefault(label, []).append(time.perf_counter() - t0)
                    ops[0] += n
                    self.errors += not ok
            finally:
                await conn.close()

        fsyncs0 = await self.fsyncs()
        start = time.perf_counter()
        sched[:] = [start, start + seconds]
        cpu0, own0 = cpu_seconds(self.pids), time.process_time()
        census = asyncio.ensure_future(self.census(seconds)) if self.syscalls else None
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        if census is not None:
            lat["_syscalls"] = [await census]  # type: ignore[list-item]
        lat["_elapsed"] = [time.perf_counter() - start]
        lat["_ops"] = [float(ops[0])]
        lat["_node_cpu"] = [cpu_seconds(self.pids) - cpu0]
        lat["_client_cpu"] = [time.process_time() - own0]
        lat["_fsyncs"] = [float(await self.fsyncs() - fsyncs0)]
        return lat

    async def fsyncs(self) -> int:
        """Group-commit fsyncs so far, summed over the nodes (from /metrics)."""
        return await self.metric("idc_log_fsyncs_total")

    async def metric(self, name: str) -> int:
        """A counter of /metrics, summed over the nodes."""
        total = 0
        for addr in self.addrs:
            conn = await HttpConn.open(*addr)
            try:
                _, body = await conn.request("GET", "/metrics", content_type="text/plain")
            finally:
                await conn.close()
            for line in body.decode().splitlines():
                if line.startswith(name + " "):
                    total += int(float(line.split()[1]))
        return total

    async def census(self, seconds: float) -> dict[str, float]:
        """Syscalls per op (ops: applied by a leader) of the three nodes, all threads, traced
        by ``strace -f -c`` in the middle third of a phase of ``seconds``. Tracing slows the
        nodes several times over, which changes how ops batch (fewer per commit, more GIL
        handoffs): compare runs of one shape with each other, not with untraced numbers.
        Empty when strace is missing."""
        strace = shutil.which("strace")
        if strace is None:
            return {}
        await asyncio.sleep(seconds / 3)
        with tempfile.NamedTemporaryFile(suffix=".strace") as out:
            argv = [strace, "-f", "-c", "-o", out.name]
            for pid in self.pids:
                argv += ["-p", str(pid)]
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            attached = 0  # "Process N attached", one a thread: count from when all are
            while attached < len(self.pids):
                said = await asyncio.wait_for(proc.stderr.readline(), seconds)
                if not said:
                    break
                attached += b"attached" in said
            await asyncio.sleep(0.2)  # the processes' other threads
            applied0 = await self.metric("idc_applied_total")
            await asyncio.sleep(seconds / 3)
            ops = max(await self.metric("idc_applied_total") - applied0, 1)
            proc.send_signal(signal.SIGINT)
            await proc.communicate()
            counts: dict[str, float] = {}
            for line in Path(out.name).read_text().splitlines():
                f = line.split()
                if len(f) >= 5 and f[3].isdigit() and f[-1] != "total":
                    counts[f[-1]] = int(f[3])
        total = sum(counts.values())
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
        return {"per_op": round(total / ops, 1),
                **{name: round(n / ops, 2) for name, n in top}}


async def batch_phase(load: Load, args: argparse.Namespace) -> dict[str, Any]:
    async def make(conn: HttpConn) -> tuple[str, int, bool]:
        body = msgpack.packb({"ops": [load.op("fbf_t") for _ in range(args.batch)]})
        status, _ = await conn.request("POST", "/v1/batch", body)
        return "batch", args.batch, status == 200

    lat = await load.run(args.concurrency, args.seconds, make)
    return summary("batch", lat)


async def routed_batch_phase(load: Load, args: argparse.Namespace) -> dict[str, Any]:
    """Batches built per leader, as a ring-aware client can (the ring is public: health's
    ``ring``): every op lands on its leader, no forwarding hop."""
    conns: dict[int, str] = {}

    async def make(conn: HttpConn) -> tuple[str, int, bool]:
        leader = conns.setdefault(id(conn), load.ids[len(conns) % len(load.ids)])
        ops = [load.op("fbf_t", leader) for _ in range(args.batch)]
        status, _ = await conn.request("POST", "/v1/batch", msgpack.packb({"ops": ops}))
        return "batch", args.batch, status == 200

    lat = await load.run(args.concurrency, args.seconds, make)
    return summary("batch", lat)


ROLES_CONCURRENCY = 8


async def roles_phase(load: Load, args: argparse.Namespace) -> dict[str, Any]:
    """CPU per op by role: every op on a key the first node leads, sent to it, so it leads
    every op and the other two only replicate them. For each shape (``--batch`` ops a
    request, one op a request): ops/s, and user and system CPU per op (us) of the leader and
    of each replica."""
    leader = load.ids[0]
    pids = dict(zip(load.ids, load.pids, strict=True))
    out: dict[str, Any] = {}
    for shape, count in (("batch", args.batch), ("single", 1)):
        async def make(conn: HttpConn, count: int = count) -> tuple[str, int, bool]:
            if count == 1:
                op = load.op("fbf_t", leader)
                body = msgpack.packb({"op_id": op["op_id"], "delta": 1})
                status, _ = await conn.request("POST", f"/v1/counters/fbf_t/{op['key']}", body)
            else:
                ops = [load.op("fbf_t", leader) for _ in range(count)]
                status, _ = await conn.request("POST", "/v1/batch",
                                               msgpack.packb({"ops": ops}))
            return "roles", count, status == 200

        before = {n: cpu_split(pid) for n, pid in pids.items()}
        lat = await load.run(ROLES_CONCURRENCY, args.seconds, make, at=0)
        ops = max(lat["_ops"][0], 1.0)
        per_op = {n: {"user": round((cpu_split(pid)[0] - before[n][0]) / ops * 1e6, 1),
                      "sys": round((cpu_split(pid)[1] - before[n][1]) / ops * 1e6, 1)}
                  for n, pid in pids.items()}
        out[shape] = {"ops_per_s": round(ops / lat["_elapsed"][0]),
                      "leader_us_per_op": per_op.pop(leader),
                      "replica_us_per_op": per_op}
    return out


async def single_phase(load: Load, args: argparse.Namespace, tables: list[str],
                       concurrency: int) -> dict[str, Any]:
    turn = itertools.cycle(tables)

    async def make(conn: HttpConn) -> tuple[str, int, bool]:
        table = next(turn)
        op = load.op(table)
        body = msgpack.packb({"op_id": op["op_id"], "delta": 1})
        status, _ = await conn.request("POST", f"/v1/counters/{table}/{op['key']}", body)
        return table, 1, status == 200

    lat = await load.run(concurrency, args.seconds, make)
    return {t: summary(t, lat, label=t) for t in tables}


async def routed_single_phase(load: Load, args: argparse.Namespace,
                              rate: float | None = None) -> dict[str, Any]:
    """One op per request, each sent to its key's leader (as the SDK does once it knows the
    ring): no FORWARD hop between coordinator and leader. ``rate``: paced (``Load.run``)."""
    conns: dict[int, str] = {}

    async def make(conn: HttpConn) -> tuple[str, int, bool]:
        leader = conns.setdefault(id(conn), load.ids[len(conns) % len(load.ids)])
        op = load.op("fbf_t", leader)
        body = msgpack.packb({"op_id": op["op_id"], "delta": 1})
        status, _ = await conn.request("POST", f"/v1/counters/fbf_t/{op['key']}", body)
        return "fbf_t", 1, status == 200

    lat = await load.run(args.concurrency, args.seconds, make, rate)
    sec = summary("fbf_t", lat)
    sec["ops_per_s"] = round(sec["requests"] / args.seconds)
    return sec


def summary(name: str, lat: dict[str, list[float]], label: str | None = None) -> dict[str, Any]:
    values = lat.get(label or name, [])
    elapsed = lat["_elapsed"][0]
    ops = max(lat["_ops"][0], 1.0)
    extra = {"syscalls": lat["_syscalls"][0]} if "_syscalls" in lat else {}
    return {**extra,
        "requests": len(values),
        "node_cpu_us_per_op": round(lat["_node_cpu"][0] / ops * 1e6, 1),
        "client_cpu_us_per_op": round(lat["_client_cpu"][0] / ops * 1e6, 1),
        "ops_per_fsync": round(ops / max(lat["_fsyncs"][0], 1.0), 1),
        "fsyncs_per_s": round(lat["_fsyncs"][0] / elapsed),
        "ops_per_s": round(lat["_ops"][0] / elapsed) if label is None else None,
        "p50_ms": round(pct(values, 0.50) * 1e3, 3),
        "p99_ms": round(pct(values, 0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(values) * 1e3, 3) if values else None,
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def load_counters(cluster: LocalCluster, count: int) -> float:
    """Write ``count`` distinct counters through /v1/batch; returns seconds taken."""
    addrs = [(n.host, n.port) for n in cluster.nodes.values()]
    per = 500
    chunks = iter(range(0, count, per))
    start = time.perf_counter()

    async def worker(i: int) -> None:
        conn = await HttpConn.open(*addrs[i % len(addrs)])
        try:
            for base in chunks:
                ops = [{"table": "mem", "key": f"c{j}", "op_id": f"mem:{j}", "delta": 1}
                       for j in range(base, min(base + per, count))]
                await conn.request("POST", "/v1/batch", msgpack.packb({"ops": ops}))
        finally:
            await conn.close()

    await asyncio.gather(*(worker(i) for i in range(12)))
    return time.perf_counter() - start


_MEM_SNIPPET = r"""
import sys, time, json, gc
from pathlib import Path
def rss():
    for l in Path('/proc/self/status').read_text().splitlines():
        if l.startswith('VmRSS:'): return int(l.split()[1])
from cluster.core.shards import ShardStore
from cluster.core.dedup import make_dedup
what, n = sys.argv[1], int(sys.argv[2])
base = rss()
if what in ('counters', 'save'):
    s = ShardStore('n1')
    for i in range(n):
        s.apply_local('t', f'user:{i:08d}', 1000 + i)
    extra = {}
    if what == 'save':  # for 'counters_loaded', in a process of its own
        Path(sys.argv[3]).write_bytes(s.to_bytes())
        sys.exit(0)
elif what == 'counters_loaded':  # the store a restarted node holds, without the build's leftovers
    s = ShardStore.from_bytes(Path(sys.argv[3]).read_bytes(), 'n1')
    s.flush_digests()
    extra = {}
else:
    d = make_dedup(what, window=10.0, rate=n / 10.0, target_fpp=1e-6)
    for i in range(n):
        d.seen_or_add(f'client-{i % 64}:{i}'.encode())
    extra = {'nbytes': d.nbytes(), 'estimated_fpp': d.estimated_fpp()}
gc.collect()
print(json.dumps({'what': what, 'n': n, 'rss_delta_mib': round((rss() - base) / 1024, 1), **extra}))
"""


def memory_offline(n: int) -> list[dict[str, Any]]:
    """RSS of ``n`` counters built by writes, of the same loaded from a snapshot (what a node
    holds after a restart: no leftovers of the writes), and of ``n`` ids in two dedups."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        blob = str(Path(tmp) / "store.bin")
        for what in ("counters", "save", "counters_loaded", "fbf", "exact"):
            res = subprocess.run([sys.executable, "-c", _MEM_SNIPPET, what, str(n), blob],
                                 capture_output=True, text=True, timeout=300, check=True)
            if what != "save":
                row = json.loads(res.stdout)
                row["bytes_each"] = round(row["rss_delta_mib"] * (1 << 20) / n, 1)
                out.append(row)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--dedup", "fbf,none_t=none", "--rate", "200000", "--window", "10", *args.node_args]
    if not args.fsync:
        extra.append("--no-fsync")
    results: dict[str, Any] = {"config": {"nodes": 3, "rf": 3, "write_quorum": 2,
                                          "fsync": args.fsync, "secret": args.secret,
                                          "cores": os.cpu_count()}}
    phases = set(args.phases.split(","))
    async with LocalCluster(3, rf=3, extra_args=extra, secret=args.secret) as cluster:
        load = Load(cluster, args.keys, f"bench{os.getpid()}")
        await single_phase(load, args, ["fbf_t"], 8)  # warm up connections and tables
        if args.syscalls:
            if shutil.which("strace") is None:
                print("--syscalls: strace not found (Debian: apt-get install strace); "
                      "measuring without it", flush=True)
            load.syscalls = True
        if "batch" in phases:
            results["batch"] = await batch_phase(load, args)
            print("batch:", results["batch"], flush=True)
        if "routed" in phases:
            results["batch_routed"] = await routed_batch_phase(load, args)
            print("batch, leader-routed:", results["batch_routed"], flush=True)
        if "single" in phases:
            sec = (await single_phase(load, args, ["fbf_t"], args.concurrency))["fbf_t"]
            sec["ops_per_s"] = round(sec["requests"] / args.seconds)
            results["single"] = sec
            print("single:", sec, flush=True)
        if "single_routed" in phases:
            results["single_routed"] = await routed_single_phase(load, args)
            print("single, leader-routed:", results["single_routed"], flush=True)
        if "compare" in phases:
            cmp = await single_phase(load, args, ["fbf_t", "none_t"], args.compare_concurrency)
            ratio = {k: round(cmp["fbf_t"][k] / cmp["none_t"][k], 3)
                     for k in ("p50_ms", "mean_ms")}
            results["fbf_vs_none"] = {**cmp, "ratio": ratio}
            print("fbf vs none:", results["fbf_vs_none"], flush=True)
        if "roles" in phases:
            results["roles"] = await roles_phase(load, args)
            print("by role (one leader):", results["roles"], flush=True)
        results["errors"] = load.errors
        if "live" in phases and args.live_counters:
            secs = await load_counters(cluster, args.live_counters)
            results["live_memory"] = {
                "counters_loaded": args.live_counters, "load_seconds": round(secs, 1),
                "ops_per_s": round(args.live_counters / secs),
                "rss_mib": {n.id: round(rss_kib(n.proc.pid) / 1024, 1)
                            for n in cluster.nodes.values() if n.proc},
            }
            print("live memory:", results["live_memory"], flush=True)
    if args.memory and "memory" in phases:
        results["memory_1m"] = memory_offline(1_000_000)
        print("memory (fresh process, 1M):", results["memory_1m"], flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_cluster")
    ap.add_argument("--quick", action="store_true",
                    help="2 s phases, no 1M-counter load, no memory phase (smoke run)")
    ap.add_argument("--seconds", type=float, default=8.0, help="per phase")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--compare-concurrency", type=int, default=8)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--secret", action=argparse.BooleanOptionalAction, default=True,
                    help="peers sign every frame (HMAC-SHA256); --no-secret to compare")
    ap.add_argument("--live-counters", type=int, default=1_000_000,
                    help="distinct counters to load into the live cluster (0: skip)")
    ap.add_argument("--phases", default="batch,routed,single,single_routed,compare,live,memory",
                    help="comma-separated subset of batch,routed,single,single_routed,compare,"
                         "live,memory, and roles (not run by default: CPU per op by role)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--syscalls", action="store_true",
                    help="count the nodes' syscalls per op with strace in the middle third of "
                         "each load phase (tracing slows them: read counts, not speed)")
    ap.add_argument("--node-args", nargs=argparse.REMAINDER, default=[],
                    help="extra flags for every node, e.g. --node-args --max-inflight-frames 2")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.live_counters, args.memory = min(args.seconds, 2.0), 0, False
    return run_and_report(main_async(args), args.json)



def run_and_report(coro: Any, json_path: str | None) -> int:
    """Run a benchmark's main coroutine (on uvloop when installed), print its results as JSON
    and, with ``json_path``, write them there too."""
    try:
        import uvloop

        results = uvloop.run(coro)
    except ImportError:
        results = asyncio.run(coro)
    print(json.dumps(results, indent=2))
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
