"""Scale benchmark: what a 3-node cluster (RF 3) costs while it holds many counters.

    python -m bench.bench_scale [--counters 200000] [--idle-seconds 10] [--settle-seconds 8]
                                [--rate 2000] [--steady-seconds 10] [--partition-seconds 10]
                                [--phases idle,steady,partition,restart]
                                [--node-args --max-hints 0]

Loads ``--counters`` distinct counters through /v1/batch into a real 3-process cluster, waits
``--settle-seconds`` (at least one anti-entropy round after the load), then:
  1. idle: sending nothing, for ``--idle-seconds``: CPU per node (utime + stime from
     /proc/<pid>/stat, as % of one core), RSS per node and RSS bytes per counter (growth since
     before the load), and the event loop's lag (``idc_loop_lag_seconds`` in /metrics: samples
     over 20 ms in the window);
  2. steady: ``--rate`` ops/s (batches of 100, random loaded counters) for ``--steady-seconds``:
     CPU per node and the share of it anti-entropy took (``idc_antientropy_cpu_seconds_total``);
  3. partition: n3's peer links all run through TCP proxies in this process
     (``client.proxy``, the nodes' ``--connect-via``); the proxies are cut (listeners closed,
     connections dropped) for ``--partition-seconds`` while n1 and n2 take ``--rate`` ops/s,
     then restored; reports the writes n3 missed, the seconds until
     every replica's digest checksum (``idc_digest_checksum``) is equal again, and the
     anti-entropy bytes and keys exchanged meanwhile, plus the hints delivered (``--node-args
     --max-hints 0`` leaves the whole repair to anti-entropy);
  4. restart: kill -9 of n1 and a restart: seconds until READY, records replayed, RSS after;
  5. membership: under ``--rate`` ops/s, n4 joins (``--join``) and, once it is normal on every
     member, is decommissioned again: the seconds each move took, the keys and bytes
     anti-entropy streamed, the counters n4 held, the writes acked and refused meanwhile, and
     each node's exit status (n4 must exit 0). The nodes run with ``--window``
     ``--membership-window`` (a move lasts at least the window).
The nodes snapshot only on log growth here (``--snapshot-interval`` 3600), so a snapshot of the
loaded state does not land inside the idle window (``--snapshot-interval 10 --steady-seconds 25``
takes snapshots of every counter during the steady phase, which reports them and the loop's
worst lag meanwhile); fsync is off (it does not matter idle, and
the load goes faster).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from typing import Any

import msgpack

from bench.bench_cluster import cpu_seconds, load_counters, rss_kib, run_and_report
from bench.httpload import HttpConn
from client.proxy.server import Proxy
from cluster.local import LocalCluster, free_ports


async def metrics_text(host: str, port: int) -> str:
    conn = await HttpConn.open(host, port)
    try:
        _, body = await conn.request("GET", "/metrics", content_type="text/plain")
    finally:
        await conn.close()
    return body.decode()


def loop_lag(text: str) -> dict[str, Any] | None:
    """Count and the le-buckets of ``idc_loop_lag_seconds`` (None: the node has no histogram)."""
    buckets: dict[str, float] = {}
    count = None
    for line in text.splitlines():
        if line.startswith("idc_loop_lag_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("idc_loop_lag_seconds_count "):
            count = float(line.split()[1])
    if count is None:
        return None
    over_20ms = count - buckets.get("0.02", count)
    return {"samples": int(count), "over_20ms": int(over_20ms),
            "max_le": next((le for le, c in buckets.items() if c >= count), "+Inf"),
            "buckets": buckets}


def worst_lag(now: dict[str, Any] | None, then: dict[str, Any] | None) -> str | None:
    """The smallest ``le`` bucket holding every lag sample taken between two scrapes."""
    if now is None or then is None:
        return None
    total = now["samples"] - then["samples"]
    for le, c in now["buckets"].items():
        if c - then["buckets"].get(le, 0) >= total:
            return str(le)
    return "+Inf"


async def idle_phase(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    procs = {n.id: n.proc.pid for n in cluster.nodes.values() if n.proc}
    before = {nid: cpu_seconds([pid]) for nid, pid in procs.items()}
    lag0 = {n.id: loop_lag(await metrics_text(n.host, n.port)) for n in cluster.nodes.values()}
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - t0
    cpu = {nid: round(100 * (cpu_seconds([pid]) - before[nid]) / elapsed, 2)
           for nid, pid in procs.items()}
    lag = {}
    for n in cluster.nodes.values():
        now, then = loop_lag(await metrics_text(n.host, n.port)), lag0[n.id]
        if now is not None and then is not None:
            lag[n.id] = {"samples": now["samples"] - then["samples"],
                         "over_20ms": now["over_20ms"] - then["over_20ms"],
                         "worst": worst_lag(now, then),
                         "max_le_since_start": now["max_le"]}
    return {"seconds": round(elapsed, 1), "cpu_pct_per_node": cpu, "loop_lag": lag or None}


def metric(text: str, name: str) -> float:
    """Sum of the samples of ``name`` (any labels) in a /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def scrape(cluster: LocalCluster, names: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for n in cluster.nodes.values():
        if not n.running:  # a decommissioned node exited
            continue
        text = await metrics_text(n.host, n.port)
        out[n.id] = {name: metric(text, name) for name in names}
    return out


class Writer:
    """``rate`` ops/s in batches of 100 to random counters of ``mem`` (the loaded ones)."""

    def __init__(self, cluster: LocalCluster, counters: int, rate: float) -> None:
        self.cluster, self.counters, self.rate = cluster, counters, rate
        self.acked = self.failed = 0
        self.keys: set[str] = set()
        self.seq = 0

    async def run(self, seconds: float, nodes: list[str]) -> None:
        targets = [self.cluster.nodes[n] for n in nodes]
        conns = [await HttpConn.open(n.host, n.port) for n in targets]
        rng = random.Random(len(self.keys))
        period = 100 / self.rate
        start = time.monotonic()
        try:
            i = 0
            while (now := time.monotonic()) - start < seconds:
                await asyncio.sleep(max(0.0, start + i * period - now))
                keys = [f"c{rng.randrange(self.counters)}" for _ in range(100)]
                self.seq += 1
                ops = [{"table": "mem", "key": k, "op_id": f"w{self.seq}:{j}", "delta": 1}
                       for j, k in enumerate(keys)]
                try:
                    status, _ = await asyncio.wait_for(
                        conns[i % len(conns)].request("POST", "/v1/batch",
                                                      msgpack.packb({"ops": ops})), 10)
                except (TimeoutError, OSError):
                    status = 0
                if status == 200:
                    self.acked += 100
                    self.keys.update(keys)
                else:
                    self.failed += 100
                i += 1
        finally:
            for conn in conns:
                await conn.close()


async def steady_phase(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    procs = {n.id: n.proc.pid for n in cluster.nodes.values() if n.proc}
    names = ["idc_antientropy_cpu_seconds_total", "idc_antientropy_bytes_total",
             "idc_snapshots_total"]
    m0, cpu0, t0 = await scrape(cluster, names), dict.fromkeys(procs, 0.0), time.monotonic()
    for nid, pid in procs.items():
        cpu0[nid] = cpu_seconds([pid])
    lag0 = {n.id: loop_lag(await metrics_text(n.host, n.port)) for n in cluster.nodes.values()}
    w = Writer(cluster, args.counters, args.rate)
    await w.run(args.steady_seconds, list(cluster.nodes))
    elapsed = time.monotonic() - t0
    m1 = await scrape(cluster, names)
    out: dict[str, Any] = {"rate": args.rate, "acked": w.acked, "failed": w.failed,
                           "seconds": round(elapsed, 1), "nodes": {}}
    for nid, pid in procs.items():
        cpu = cpu_seconds([pid]) - cpu0[nid]
        ae = m1[nid][names[0]] - m0[nid][names[0]]
        lag = loop_lag(await metrics_text(cluster.nodes[nid].host, cluster.nodes[nid].port))
        then = lag0[nid]
        out["nodes"][nid] = {
            "cpu_pct": round(100 * cpu / elapsed, 1),
            "antientropy_cpu_pct": round(100 * ae / elapsed, 2),
            "antientropy_share_of_node_cpu_pct": round(100 * ae / cpu, 2) if cpu else None,
            "antientropy_bytes": int(m1[nid][names[1]] - m0[nid][names[1]]),
            "snapshots": int(m1[nid][names[2]] - m0[nid][names[2]]),
            "lag_over_20ms": (lag["over_20ms"] - then["over_20ms"]) if lag and then else None,
            "worst_lag_le": worst_lag(lag, then)}
    return out


def proxy_n3(cluster: LocalCluster) -> list[Proxy]:
    """A proxy on each peer link to and from n3 (set before the nodes start)."""
    nodes, proxies = cluster.nodes, []
    vias: dict[str, list[str]] = {}
    plan = [("n1", "n3"), ("n2", "n3"), ("n3", "n1"), ("n3", "n2")]
    for (src, dst), port in zip(plan, free_ports(len(plan)), strict=True):
        proxies.append(Proxy(f"{src}-{dst}", f"127.0.0.1:{port}",
                             f"{nodes[dst].host}:{nodes[dst].port}"))
        vias.setdefault(src, []).append(f"{dst}=127.0.0.1:{port}")
    for src, via in vias.items():
        nodes[src].args += ["--connect-via", ",".join(via)]
    return proxies


async def partition_phase(cluster: LocalCluster, proxies: list[Proxy],
                          args: argparse.Namespace) -> dict[str, Any]:
    """n3 cut off while n1 and n2 take writes; then the repair, timed and weighed."""
    names = ["idc_antientropy_bytes_total", "idc_antientropy_keys_total",
             "idc_hints_delivered_total", "idc_antientropy_cpu_seconds_total"]
    m0 = await scrape(cluster, names)
    w = Writer(cluster, args.counters, args.rate)
    for p in proxies:
        await p.disable()
    try:
        await w.run(args.partition_seconds, ["n1", "n2"])
    finally:
        for p in proxies:
            await p.enable()
    healed = time.monotonic()
    equal_after = None
    while time.monotonic() - healed < args.repair_timeout:
        pages = [await metrics_text(n.host, n.port) for n in cluster.nodes.values()]
        sums = {metric(p, 'idc_digest_checksum{table="mem"}') for p in pages}
        pending = sum(metric(p, "idc_digest_pending") for p in pages)
        if len(sums) == 1 and not pending:
            equal_after = round(time.monotonic() - healed, 2)
            break
        await asyncio.sleep(0.2)
    m1 = await scrape(cluster, names)
    delta = {name: int(sum(m1[n][name] - m0[n][name] for n in m1)) for name in names[:3]}
    entry_bytes = 40  # about one [table, key, {origin: [P, N]} x 3] entry as msgpack
    return {"paused_seconds": args.partition_seconds, "rate": args.rate,
            "missed_writes": w.acked, "missed_keys": len(w.keys), "failed_writes": w.failed,
            "seconds_until_equal": equal_after,
            "antientropy_bytes": delta[names[0]], "antientropy_keys": delta[names[1]],
            "hints_delivered": delta[names[2]],
            "bytes_per_missed_key": round(delta[names[0]] / max(1, len(w.keys)), 1),
            "dataset_bytes_estimate": args.counters * entry_bytes}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if "membership" in args.phases:
        args.node_args = ["--window", str(args.membership_window), *args.node_args]
    extra = ["--no-fsync", "--snapshot-interval", str(args.snapshot_interval),
             "--antientropy-interval", str(args.antientropy_interval), *args.node_args]
    out: dict[str, Any] = {"config": {"nodes": 3, "rf": 3, "counters": args.counters,
                                      "antientropy_interval": args.antientropy_interval}}
    phases = set(args.phases.split(","))
    cluster = LocalCluster(3, rf=3, extra_args=extra, secret=True)
    proxies = proxy_n3(cluster) if "partition" in phases else []
    async with contextlib.AsyncExitStack() as stack:
        for p in proxies:
            await stack.enter_async_context(p)
        await stack.enter_async_context(cluster)
        pids = {n.id: n.proc.pid for n in cluster.nodes.values() if n.proc}
        rss0 = {nid: rss_kib(pid) for nid, pid in pids.items()}
        out["idle_empty"] = await idle_phase(cluster, min(args.idle_seconds, 5.0))
        print("idle, empty:", out["idle_empty"], flush=True)
        secs = await load_counters(cluster, args.counters)
        out["load"] = {"seconds": round(secs, 1), "ops_per_s": round(args.counters / secs)}
        print("load:", out["load"], flush=True)
        await asyncio.sleep(args.settle_seconds)
        if "idle" in phases:
            out["idle_loaded"] = await idle_phase(cluster, args.idle_seconds)
            print("idle, loaded:", out["idle_loaded"], flush=True)
        rss = {nid: rss_kib(pid) for nid, pid in pids.items()}
        out["memory"] = {
            "rss_mib": {nid: round(v / 1024, 1) for nid, v in rss.items()},
            "bytes_per_counter": {nid: round((rss[nid] - rss0[nid]) * 1024 / args.counters)
                                  for nid in rss},
        }
        print("memory:", out["memory"], flush=True)
        if "steady" in phases:
            out["steady"] = await steady_phase(cluster, args)
            print("steady writes:", out["steady"], flush=True)
        if "partition" in phases:
            out["partition"] = await partition_phase(cluster, proxies, args)
            print("partition and repair:", out["partition"], flush=True)
        if "restart" in phases:
            out["restart"] = await restart_phase(cluster, args.restart_timeout)
            print("restart after kill -9:", out["restart"], flush=True)
        if "membership" in phases:
            out["membership"] = await membership_phase(cluster, args)
            print("join and decommission under load:", out["membership"], flush=True)
    return out


async def ring_view(node: Any) -> dict[str, Any]:
    """A node's ``/v1/ring``."""
    conn = await HttpConn.open(node.host, node.port)
    try:
        status, body = await conn.request("GET", "/v1/ring", b"", "application/json")
    finally:
        await conn.close()
    view: dict[str, Any] = json.loads(body)
    return view


async def ring_version(node: Any) -> tuple[int, bool]:
    """A node's membership version and whether a move is under way (``/v1/ring``)."""
    view = await ring_view(node)
    return view["version"], view["move"] is not None


async def wait_version(nodes: list[Any], version: int, timeout: float) -> float:
    """Seconds until every node in ``nodes`` holds ``version`` with no move under way."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        views = [await ring_version(n) for n in nodes]
        if all(v >= version and not moving for v, moving in views):
            return round(time.monotonic() - t0, 2)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"membership version {version} not settled in {timeout:g} s")


async def wait_shed(nodes: list[Any], version: int, timeout: float) -> dict[str, Any]:
    """Once ``version`` is normal everywhere: seconds until every node in ``nodes`` dropped
    the keys it no longer replicates (``/v1/ring``'s ``shed``), and the counters each held
    before and after."""
    t0 = time.monotonic()
    before = {n.id: metric(await metrics_text(n.host, n.port), "idc_counters") for n in nodes}
    while time.monotonic() - t0 < timeout:
        views = [(await ring_view(n))["shed"] for n in nodes]
        if all(v["done_version"] >= version for v in views):
            after = {n.id: metric(await metrics_text(n.host, n.port), "idc_counters")
                     for n in nodes}
            return {"shed_seconds_after_normal": round(time.monotonic() - t0, 2),
                    "shed_dropped_keys": sum(v["dropped_keys"] for v in views),
                    "counters_before_shed": {k: int(v) for k, v in before.items()},
                    "counters_after_shed": {k: int(v) for k, v in after.items()}}
        await asyncio.sleep(0.2)
    raise RuntimeError(f"keys not shed in {timeout:g} s")


async def membership_phase(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """n4 joins, then is decommissioned, while ``--rate`` ops/s go to n1..n3."""
    names = ["idc_antientropy_bytes_total", "idc_antientropy_keys_total",
             "idc_stale_ring_refusals_total"]
    base = list(cluster.nodes.values())
    m0 = await scrape(cluster, names)
    w = Writer(cluster, args.counters, args.rate)
    load = asyncio.create_task(w.run(args.membership_seconds, [n.id for n in base]))
    try:
        n4 = cluster.add_node("n4", join=[base[0].id])
        t0 = time.monotonic()
        await n4.start(timeout=args.restart_timeout)
        ready = round(time.monotonic() - t0, 2)
        joined = await wait_version([*base, n4], 3, args.repair_timeout)
        page = await metrics_text(n4.host, n4.port)
        held = metric(page, "idc_counters")
        streamed = {name: metric(page, name) for name in names[:2]}  # n4's own exchanges
        # dedup continuity moves with time: the joiner's filter holds only what it was sent,
        # so its fill is that of its own share of the load, not a merge of whole tables
        fill = {n.id: metric(await metrics_text(n.host, n.port), "idc_fbf_fill")
                for n in [*base, n4]}
        shed = await wait_shed(base, 3, args.repair_timeout)
        t1 = time.monotonic()
        dec = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster", "decommission", "n4", "--via", base[1].address,
            "--secret-file", str(cluster.secret_file), "--timeout", str(args.repair_timeout),
            stdout=asyncio.subprocess.DEVNULL)
        code = await dec.wait()
        left = round(time.monotonic() - t1, 2)
        assert n4.proc is not None
        exit_code = await asyncio.wait_for(n4.proc.wait(), 30)
    finally:
        await load
    m1 = await scrape(cluster, names)
    delta = {name: int(sum(m1[n][name] - m0.get(n, {}).get(name, 0) for n in m1))
             for name in names}
    return {"rate": args.rate, "window": args.membership_window,
            "join_seconds_to_ready": ready, "join_seconds_to_normal": joined,
            "n4_counters": int(held), "share_of_counters": round(held / args.counters, 3),
            **shed,
            "decommission_seconds": left, "decommission_exit": code, "n4_exit": exit_code,
            "acked": w.acked, "failed": w.failed,
            "fbf_fill_after_join": {k: round(v, 5) for k, v in fill.items()},
            "n4_streamed_keys": int(streamed[names[1]]),
            "n4_streamed_bytes": int(streamed[names[0]]),
            "others_antientropy_keys": delta[names[1]],
            "others_antientropy_bytes": delta[names[0]],
            "stale_ring_refusals": delta[names[2]]}


async def restart_phase(cluster: LocalCluster, timeout: float) -> dict[str, Any]:
    """kill -9 of n1, holding every loaded counter and its log, then a restart: the seconds
    until it prints READY (recovered: snapshot loaded, log replayed, in-doubt ops settled, the
    replicas' dedup pulled), the records replayed and its RSS after."""
    node = cluster.nodes["n1"]
    await node.kill()
    t0 = time.perf_counter()
    await node.start(timeout=timeout)
    ready = time.perf_counter() - t0
    text = await metrics_text(node.host, node.port)
    replayed = next((int(float(line.split()[1])) for line in text.splitlines()
                     if line.startswith("idc_replayed_records ")), None)
    assert node.proc is not None
    return {"seconds_to_ready": round(ready, 2), "records_replayed": replayed,
            "rss_mib": round(rss_kib(node.proc.pid) / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_scale")
    ap.add_argument("--counters", type=int, default=200_000)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--settle-seconds", type=float, default=8.0,
                    help="wait after the load before measuring (>= one anti-entropy interval)")
    ap.add_argument("--antientropy-interval", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=2000.0, help="ops/s in the write phases")
    ap.add_argument("--steady-seconds", type=float, default=10.0)
    ap.add_argument("--snapshot-interval", type=float, default=3600.0,
                    help="the nodes' --snapshot-interval: set it below --steady-seconds to "
                         "measure the loop's lag while snapshots of every counter are taken")
    ap.add_argument("--partition-seconds", type=float, default=10.0)
    ap.add_argument("--repair-timeout", type=float, default=60.0)
    ap.add_argument("--phases", default="idle,steady,partition,restart",
                    help="comma-separated subset of idle,steady,partition,restart,membership")
    ap.add_argument("--membership-window", type=float, default=5.0,
                    help="the nodes' --window when the membership phase runs (a move lasts "
                         "window + max_clock_skew + 2 failure timeouts at least)")
    ap.add_argument("--membership-seconds", type=float, default=30.0,
                    help="how long the load runs in the membership phase")
    ap.add_argument("--restart-timeout", type=float, default=120.0,
                    help="seconds the restarted node may take to print READY")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--node-args", nargs=argparse.REMAINDER, default=[],
                    help="extra flags for every node")
    ap.add_argument("--quick", action="store_true",
                    help="20k counters and 2-3 s phases (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.counters = min(args.counters, 20_000)
        args.idle_seconds, args.settle_seconds = 2.0, 2.0
        args.steady_seconds, args.partition_seconds = 2.0, 3.0
    return run_and_report(main_async(args), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
