"""Scale benchmark: what a 3-node cluster (RF 3) costs while it holds many counters.

    python -m bench.bench_scale [--counters 200000] [--idle-seconds 10] [--settle-seconds 8]

Loads ``--counters`` distinct counters through /v1/batch into a real 3-process cluster, waits
``--settle-seconds`` (at least one anti-entropy round after the load), then, sending nothing,
measures for ``--idle-seconds``: CPU per node (utime + stime from /proc/<pid>/stat, as % of one
core), RSS per node and RSS bytes per counter (growth since before the load), and the event
loop's lag histogram from /metrics (``idc_loop_lag_seconds``, when the node exports it).
The nodes snapshot only on log growth here (``--snapshot-interval`` 3600), so a snapshot of the
loaded state does not land inside the idle window; fsync is off (it does not matter idle, and
the load goes faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.bench_cluster import cpu_seconds, load_counters, rss_kib
from bench.httpload import HttpConn
from cluster.local import LocalCluster


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
            "max_le": next((le for le, c in buckets.items() if c >= count), "+Inf")}


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
                         "max_le_since_start": now["max_le"]}
    return {"seconds": round(elapsed, 1), "cpu_pct_per_node": cpu, "loop_lag": lag or None}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--no-fsync", "--snapshot-interval", "3600",
             "--antientropy-interval", str(args.antientropy_interval), *args.node_args]
    out: dict[str, Any] = {"config": {"nodes": 3, "rf": 3, "counters": args.counters,
                                      "antientropy_interval": args.antientropy_interval}}
    async with LocalCluster(3, rf=3, extra_args=extra, secret=True) as cluster:
        pids = {n.id: n.proc.pid for n in cluster.nodes.values() if n.proc}
        rss0 = {nid: rss_kib(pid) for nid, pid in pids.items()}
        out["idle_empty"] = await idle_phase(cluster, min(args.idle_seconds, 5.0))
        print("idle, empty:", out["idle_empty"], flush=True)
        secs = await load_counters(cluster, args.counters)
        out["load"] = {"seconds": round(secs, 1), "ops_per_s": round(args.counters / secs)}
        print("load:", out["load"], flush=True)
        await asyncio.sleep(args.settle_seconds)
        out["idle_loaded"] = await idle_phase(cluster, args.idle_seconds)
        print("idle, loaded:", out["idle_loaded"], flush=True)
        rss = {nid: rss_kib(pid) for nid, pid in pids.items()}
        out["memory"] = {
            "rss_mib": {nid: round(v / 1024, 1) for nid, v in rss.items()},
            "bytes_per_counter": {nid: round((rss[nid] - rss0[nid]) * 1024 / args.counters)
                                  for nid in rss},
        }
        print("memory:", out["memory"], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_scale")
    ap.add_argument("--counters", type=int, default=200_000)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--settle-seconds", type=float, default=8.0,
                    help="wait after the load before measuring (>= one anti-entropy interval)")
    ap.add_argument("--antientropy-interval", type=float, default=5.0)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--node-args", nargs=argparse.REMAINDER, default=[],
                    help="extra flags for every node")
    args = ap.parse_args(argv)
    try:
        import uvloop

        results = uvloop.run(main_async(args))
    except ImportError:
        results = asyncio.run(main_async(args))
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
