"""One chaos run: set up, play the workload against the nemesis schedule, heal, wait for quiet,
read every counter on every node, check, and write the history and the report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from client.chaos.history import History
from client.chaos.nemesis import Schedule, choose
from client.chaos.progress import Progress
from client.chaos.topology import Topology
from client.chaos.workload import Workload, WorkloadConfig
from client.checker import CounterReport, check
from client.errors import ClientError
from client.sdk import CounterClient


@dataclass(frozen=True, kw_only=True, slots=True)
class ChaosConfig:
    """nodes/rf: local cluster shape (ignored with ``urls``); node_args: extra node flags;
    nemeses: names (None: every default one); quiet/fault: seconds ranges of the schedule;
    quiet_timeout: after healing, how long replicas may take to agree before the final reads;
    repair_reads: read every key at consistency=all once before the final reads (helps the
    cluster converge by read repair; off by default so the report shows what it does alone);
    data_dir: where local nodes keep their logs and data, kept after the run (default: a
    temporary directory, deleted); compose_project: with ``urls``, the docker-compose project
    whose node containers the process faults (kill, pause) act on."""

    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    nodes: int = 3
    rf: int = 3
    urls: tuple[str, ...] = ()
    node_args: tuple[str, ...] = ()
    nemeses: tuple[str, ...] | None = None
    quiet: tuple[float, float] = (1.0, 2.0)
    fault: tuple[float, float] = (2.0, 4.0)
    quiet_timeout: float = 15.0
    repair_reads: bool = False
    out_dir: str = "chaos-out"
    seed: int | None = None
    progress: bool = True
    proxy_peers: bool | None = None
    data_dir: str | None = None
    compose_project: str | None = None


@dataclass(slots=True)
class ChaosResult:
    config: dict[str, Any]
    report: CounterReport
    history_path: str
    played: list[dict[str, Any]]
    skipped: dict[str, str]
    nodes: list[str]
    client_stats: dict[str, Any]
    proxies: dict[str, dict[str, int]]
    latency_ms: dict[str, float]
    converged_after_s: float | None
    healthy: bool
    duration_s: float
    peer_links: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.report.valid and self.healthy and not self.membership_problems

    @property
    def membership_problems(self) -> list[str]:
        """What the split-membership plays found wrong with their end (one membership, the
        answered change in it and no other)."""
        return [p for play in self.played for p in (play.get("healed") or {}).get("problems", [])]

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "report"}
        out["valid"] = self.valid
        out["membership_problems"] = self.membership_problems
        out["checker"] = self.report.to_dict()
        return out


# The dedup window of local nodes when a membership nemesis plays (unless --node-arg sets
# one): a move lasts at least a window (plus max_clock_skew and two failure timeouts), so the
# default 10 s would leave room for about one change in a 30 s run.
MEMBERSHIP_WINDOW = 2.0


def effective(cfg: ChaosConfig) -> ChaosConfig:
    """``cfg`` with the node flags the chosen nemeses need (``MEMBERSHIP_WINDOW``)."""
    args = list(cfg.node_args)
    if (not {"membership", "split-membership"}.isdisjoint(cfg.nemeses or ()) and not cfg.urls
            and not any(a == "--window" or a.startswith("--window=") for a in args)):
        return dataclasses.replace(cfg, node_args=(*args, "--window", f"{MEMBERSHIP_WINDOW:g}"))
    return cfg


async def run_chaos(cfg: ChaosConfig) -> ChaosResult:
    cfg = effective(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    try:
        async with Topology(nodes=cfg.nodes, rf=cfg.rf, urls=cfg.urls, node_args=cfg.node_args,
                            proxy_peers=cfg.proxy_peers, seed=rng.randrange(1 << 30),
                            data_dir=cfg.data_dir,
                            compose_project=cfg.compose_project) as topo:
            nemeses, skipped = choose(cfg.nemeses, topo)
            workload = Workload(cfg.workload, topo.client_urls, history,
                                seed=rng.randrange(1 << 30))
            topo.on_members.append(workload.use_nodes)  # joins and departures
            schedule = Schedule(nemeses, topo, history, random.Random(rng.random()),
                                quiet=cfg.quiet, fault=cfg.fault)
            progress = Progress(cfg.workload.duration, lambda: _status(history, schedule),
                                enabled=cfg.progress)
            for name, why in skipped.items():
                progress.note(f"nemesis {name} skipped: {why}")
            history.start = progress.start = time.monotonic()  # time 0 = workload start
            await _play(workload, schedule, progress, cfg.workload.duration)
            history.nemesis("heal", "all")
            await topo.heal()
            healthy = await topo.wait_healthy()
            await topo.wait_delivered(cfg.quiet_timeout)  # late copies still count
            converged, in_doubt = await _final_reads(topo, history, cfg)
            stats, counters = workload.stats().as_dict(), topo.proxy_counters()
            ids, links, departed = topo.ids, topo.peer_links, list(topo.departed)
    finally:
        history.close()
    report = check(history.events, nodes=ids)
    result = ChaosResult(
        config=_config_dict(cfg), report=report, history_path=str(out / "history.jsonl"),
        played=schedule.played, skipped=skipped, nodes=ids, client_stats=stats,
        proxies=counters, latency_ms=latencies(history.events), converged_after_s=converged,
        healthy=healthy, duration_s=round(time.monotonic() - started, 2), peer_links=links,
        extra={"in_doubt_left": in_doubt, **({"departed": departed} if departed else {})})
    (out / "report.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


async def _play(workload: Workload, schedule: Schedule, progress: Progress,
                duration: float) -> None:
    stop_at = time.monotonic() + duration
    bar = asyncio.ensure_future(progress.run())
    nemesis = asyncio.ensure_future(schedule.run(stop_at))
    try:
        await workload.run()
        await nemesis
    finally:
        progress.stop()
        if not nemesis.done():
            nemesis.cancel()
        await asyncio.gather(bar, nemesis, return_exceptions=True)
        if nemesis.done() and not nemesis.cancelled() and nemesis.exception():
            raise nemesis.exception()  # type: ignore[misc]


def _status(history: History, schedule: Schedule) -> str:
    c = history.counts
    fault = schedule.current.name if schedule.current else "-"
    return (f"adds {c['add:invoke']} ok {c['add:ok']} info {c['add:info']} "
            f"fail {c['add:fail']} reads {c['read:ok']} | nemesis {fault}")


async def _final_reads(topo: Topology, history: History, cfg: ChaosConfig
                       ) -> tuple[float | None, dict[str, int]]:
    """Wait (up to quiet_timeout) until every node reports the same value for every key and no
    node holds in-doubt ops (applied as leader, their quorum failed, not settled yet: until
    then a count may still include an application that will be withdrawn), then record one
    final read per key per node. Returns seconds until that quiet, None if never, and the
    in-doubt ops each node still held."""
    table, keys = cfg.workload.table, cfg.workload.key_names()
    urls = dict(topo.node_urls)
    start = time.monotonic()
    agreed: float | None = None
    async with CounterClient(list(urls.values()), discover=False, total_timeout=3.0,
                             attempt_timeout=1.0, batch_interval=0) as c:
        if cfg.repair_reads:
            for key in keys:
                with contextlib.suppress(ClientError):
                    await c.get(table, key, "all")
        while True:
            seen = await _read_all(c, table, keys, urls)
            in_doubt = await _in_doubt(c, urls)
            if all(len({v for v in per.values() if v is not None}) == 1
                   and None not in per.values() for per in seen.values()) and not any(
                    in_doubt.values()):
                agreed = round(time.monotonic() - start, 2)
                break
            if time.monotonic() - start > cfg.quiet_timeout:
                break
            await asyncio.sleep(0.5)
        for key in keys:
            for node_id, url in urls.items():
                proc = f"final-{node_id}"
                hkey = f"{table}/{key}"
                history.record(proc, "invoke", "final-read", None, key=hkey, node=node_id)
                try:
                    value = await c.get(table, key, "one", node=url)
                except ClientError as exc:
                    history.record(proc, "fail", "final-read", None, key=hkey, node=node_id,
                                   error=str(exc)[:200])
                else:
                    history.record(proc, "ok", "final-read", value, key=hkey, node=node_id)
    return agreed, {n: v for n, v in in_doubt.items() if v}


async def _in_doubt(c: CounterClient, urls: dict[str, str]) -> dict[str, int]:
    """In-doubt ops per node (/v1/health); a node that does not say counts as one."""
    async def one(url: str) -> int:
        try:
            return int((await c.health(url)).get("in_doubt", 0))
        except (ClientError, ValueError, TypeError):
            return 1

    vals = await asyncio.gather(*(one(u) for u in urls.values()))
    return dict(zip(urls, vals, strict=True))


async def _read_all(c: CounterClient, table: str, keys: list[str],
                    urls: dict[str, str]) -> dict[str, dict[str, int | None]]:
    async def one(key: str, url: str) -> int | None:
        try:
            return await c.get(table, key, "one", node=url)
        except ClientError:
            return None

    out: dict[str, dict[str, int | None]] = {}
    for key in keys:
        vals = await asyncio.gather(*(one(key, u) for u in urls.values()))
        out[key] = dict(zip(urls, vals, strict=True))
    return out


def latencies(events: list[dict[str, Any]]) -> dict[str, float]:
    """Percentiles (ms) of acknowledged adds, invocation to completion."""
    started: dict[Any, float] = {}
    lat: list[float] = []
    for ev in events:
        if ev.get("f") != "add":
            continue
        if ev["type"] == "invoke":
            started[ev["process"]] = ev["time"]
        elif ev["type"] == "ok" and ev["process"] in started:
            lat.append((ev["time"] - started.pop(ev["process"])) * 1000.0)
    if not lat:
        return {}
    lat.sort()

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2)

    return {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99), "max": round(lat[-1], 2),
            "mean": round(sum(lat) / len(lat), 2)}


def _config_dict(cfg: ChaosConfig) -> dict[str, Any]:
    d = {k: getattr(cfg, k) for k in cfg.__slots__ if k != "workload"}
    d["workload"] = asdict(cfg.workload)
    return d
