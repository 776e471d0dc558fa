"""``python -m client.chaos --dedup``: the paper's Fig. 14 and Fig. 15 on a real local cluster,
and every dedup strategy of ``cluster.core.dedup`` on the same workload, in one table.

One cluster serves one table per strategy (``--dedup fbf,d_none=none,d_exact=exact,...``).

- Fig. 14 (accuracy over time): every logical increment goes to every strategy's counter in one
  ``/v1/batch`` (one op id per counter); the client proxies lose a share of the answers (the
  lost ack), and the client retries with the same ids, as the paper's client does (it sends no
  ``age_ms``, so the comparison is about dedup alone). A sampler reads every counter twice a
  second; the expected value is the number of increments acknowledged so far.
- Fig. 15 (write latency): batches of 50 increments sent one at a time straight to a node,
  interleaved across the strategies' tables, no faults.
- Table: each strategy's final value against the checker's exact bounds (acknowledged plus a
  subset of the unknown), over- and under-count, and its batch latency.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.chaos.history import History
from client.chaos.runner import ChaosConfig, latencies
from client.chaos.topology import Topology
from client.checker import check
from client.errors import ClientError
from client.sdk import CounterClient
from client.transport import HttpTransport
from cluster.core.dedup import DEDUP_NAMES

KEY = "c"


def table_of(strategy: str) -> str:
    return f"d_{strategy}"


@dataclass(slots=True)
class DedupResult:
    strategies: list[str]
    lost_ack: float
    samples: list[dict[str, float]] = field(default_factory=list)
    batch_ms: dict[str, list[float]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    client_stats: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


async def run_dedup(cfg: ChaosConfig, strategies: list[str], *, lost_ack: float = 0.06,
                    latency_batches: int = 200, batch_size: int = 50) -> DedupResult:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    overrides = ",".join(f"{table_of(s)}={s}" for s in strategies)
    node_args = ("--dedup", f"fbf,{overrides}", *cfg.node_args)
    res = DedupResult(strategies, lost_ack)
    async with Topology(nodes=cfg.nodes, rf=cfg.rf, urls=cfg.urls, node_args=node_args,
                        proxy_peers=False, seed=cfg.seed) as topo:
        res.batch_ms = await measure_latency(list(topo.node_urls.values())[0], strategies,
                                             latency_batches, batch_size)
        for proxy in topo.client_proxies.values():
            proxy.add_toxic(type="lost_ack", toxicity=lost_ack)
        history = History(out / "dedup-history.jsonl")
        try:
            await _accuracy_run(cfg, topo, strategies, history, res)
            await topo.heal()
            await _final(topo, strategies, history)
        finally:
            history.close()
        health = await _health(list(topo.node_urls.values())[0])
    rep = check(history.events, nodes=topo.ids)
    by_key = {f.key: f for f in rep.finals}
    for s in strategies:
        res.rows.append(_row(s, by_key.get(f"{table_of(s)}/{KEY}"), res.batch_ms.get(s, []),
                             health.get("tables", {}).get(table_of(s), {}), history.events))
    return res


async def measure_latency(url: str, strategies: list[str], batches: int,
                          size: int) -> dict[str, list[float]]:
    """Fig. 15: one batch of ``size`` increments at a time, round-robin over the strategies."""
    transport = HttpTransport()
    await transport.start()
    out: dict[str, list[float]] = {s: [] for s in strategies}
    run = f"lat{random.randrange(1 << 30):x}"
    seq = 0
    order = list(strategies)
    rng = random.Random(batches)
    try:
        for i in range(batches + 5):
            rng.shuffle(order)  # no strategy always follows the same one
            for s in order:
                ops = []
                for j in range(size):
                    ops.append({"table": table_of(s), "key": f"l{j % 10}",
                                "op_id": f"{run}:{seq}", "delta": 1})
                    seq += 1
                start = time.perf_counter()
                await transport.post_batch(url, ops, timeout=10.0)
                if i >= 5:  # the first rounds warm connections and filters up
                    out[s].append((time.perf_counter() - start) * 1000.0)
    finally:
        await transport.close()
    return out


async def _accuracy_run(cfg: ChaosConfig, topo: Topology, strategies: list[str],
                        history: History, res: DedupResult) -> None:
    wl = cfg.workload
    tables = [table_of(s) for s in strategies]
    acked = [0]
    stop_at = time.monotonic() + wl.duration
    async with CounterClient(topo.client_urls, discover=False, send_age=False,
                             attempt_timeout=wl.attempt_timeout, total_timeout=wl.total_timeout,
                             rng=random.Random(cfg.seed)) as c:
        async def worker(process: int) -> None:
            interval = wl.processes / wl.rate
            while time.monotonic() < stop_at:
                began = time.monotonic()
                for t in tables:  # one process per counter: each runs one op at a time
                    history.record(f"{process}/{t}", "invoke", "add", 1, key=f"{t}/{KEY}")
                results = await c.batch([(t, KEY, 1) for t in tables], return_exceptions=True)
                all_ok = True
                for t, r in zip(tables, results, strict=True):
                    kind = ("ok" if not isinstance(r, ClientError)
                            else "fail" if r.applied is False else "info")
                    all_ok &= kind == "ok"
                    history.record(f"{process}/{t}", kind, "add", 1, key=f"{t}/{KEY}",
                                   attempts=getattr(r, "attempts", None),
                                   duplicate=getattr(r, "duplicate", None) or None)
                acked[0] += all_ok
                process += 0 if all_ok else wl.processes
                await asyncio.sleep(max(0.0, began + interval - time.monotonic()))

        async def sampler() -> None:
            url = list(topo.node_urls.values())[0]
            async with CounterClient([url], discover=False, batch_interval=0) as reader:
                while time.monotonic() < stop_at + 1.0:
                    row: dict[str, float] = {"t": history.now(), "expected": acked[0]}
                    for s, t in zip(strategies, tables, strict=True):
                        try:
                            row[s] = await reader.get(t, KEY, "quorum")
                        except ClientError:
                            row[s] = float("nan")
                    res.samples.append(row)
                    await asyncio.sleep(0.5)

        workers = [worker(p) for p in range(wl.processes)]
        await asyncio.gather(sampler(), *workers)
        res.client_stats = c.stats.as_dict()


async def _final(topo: Topology, strategies: list[str], history: History) -> None:
    await topo.wait_healthy()
    async with CounterClient(list(topo.node_urls.values()), discover=False,
                             batch_interval=0) as c:
        for s in strategies:
            hkey = f"{table_of(s)}/{KEY}"
            for node_id, url in topo.node_urls.items():
                proc = f"final-{node_id}"
                history.record(proc, "invoke", "final-read", None, key=hkey, node=node_id)
                try:
                    v = await c.get(table_of(s), KEY, "one", node=url)
                except ClientError:
                    history.record(proc, "fail", "final-read", None, key=hkey, node=node_id)
                else:
                    history.record(proc, "ok", "final-read", v, key=hkey, node=node_id)


async def _health(url: str) -> dict[str, Any]:
    async with CounterClient([url], discover=False) as c:
        try:
            return await c.health(url)
        except ClientError:
            return {}


def _row(strategy: str, final: Any, lat: list[float], table_health: dict[str, Any],
         events: list[dict[str, Any]]) -> dict[str, Any]:
    key = f"{table_of(strategy)}/{KEY}"
    ok_lat = latencies([e for e in events if e.get("key") == key])
    value = next(iter(final.values.values())) if final and final.values else None
    acked = final.acknowledged if final else 0
    srt = sorted(lat)
    return {
        "strategy": strategy,
        "final": value,
        "acknowledged": acked,
        "unknown": final.indeterminate if final else 0,
        "error_pct": round(100.0 * (value - acked) / acked, 2) if value is not None and acked
        else None,
        "over_count": final.over_count if final else None,
        "under_count": final.under_count if final else None,
        "converged": final.converged if final else None,
        "exact": final.valid if final else False,
        "batch50_mean_ms": round(sum(srt) / len(srt), 3) if srt else None,
        "batch50_p50_ms": round(srt[len(srt) // 2], 3) if srt else None,
        "batch50_p99_ms": round(srt[min(len(srt) - 1, int(0.99 * len(srt)))], 3) if srt
        else None,
        "op_p50_ms_under_faults": ok_lat.get("p50"),
        "window_s": table_health.get("window_s"),
        "estimated_fpp": table_health.get("estimated_fpp"),
    }


def main_dedup(cfg: ChaosConfig, strategies_arg: str | None) -> int:
    from client.chaos.plots import render_table, write_outputs

    strategies = [s for s in (strategies_arg or "").split(",") if s] or list(DEDUP_NAMES)
    unknown = [s for s in strategies if s not in DEDUP_NAMES]
    if unknown or "fbf" not in strategies or "none" not in strategies:
        print(f"error: strategies must be from {DEDUP_NAMES} and include fbf and none; "
              f"unknown: {unknown}", file=sys.stderr)
        return 2
    res = asyncio.run(run_dedup(cfg, strategies))
    res.files = write_outputs(res, Path(cfg.out_dir))
    print(render_table(res))
    (Path(cfg.out_dir) / "dedup_report.json").write_text(json.dumps(
        {"strategies": res.strategies, "lost_ack": res.lost_ack, "rows": res.rows,
         "client_stats": res.client_stats, "files": res.files}, indent=2, default=str))
    fbf = next(r for r in res.rows if r["strategy"] == "fbf")
    return 0 if fbf["exact"] else 1
