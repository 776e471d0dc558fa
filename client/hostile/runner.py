"""The run: every junk class against live nodes, round after round, while a well-behaved client
counts; then the checks (good counts, junk counters at 0, every node healthy, refusal reasons
counted in ``/metrics``) and the report."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import re
import secrets
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from client.checker import distance, reachable_sums
from client.config import normalize_url
from client.hostile.cases import REGISTRY, JunkClass
from client.hostile.context import BudgetExhausted, Ctx, Limits, Target
from client.hostile.good_client import GoodStats, good_client
from client.hostile.outcome import Outcome
from cluster.core.ring import Ring


@dataclass
class HostileConfig:
    nodes: Sequence[str]
    secret: bytes | None = None
    token: str | None = None
    duration: float = 30.0
    rounds: int = 0  # 0: as many as fit in ``duration``
    classes: Sequence[str] | None = None  # None: all
    skip: Sequence[str] = ()
    limits: Limits = field(default_factory=Limits)
    concurrency: int = 4
    max_requests: int = 200_000
    good_rate: float = 100.0
    good_workers: int = 4
    good_keys: int = 6
    good_max_connections: int = 8
    table: str = "junk"
    good_table: str = "good"
    source: str | None = "auto"  # source address of junk connections ("auto": 127.0.0.2 on
    cap_source: str | None = "auto"  # loopback targets) and of the connection-cap class
    seed: int | None = None
    settle: float = 1.0  # seconds between the end of the traffic and the final reads


METRICS = ("idc_peer_auth_rejected_total", "idc_http_refused_total", "idc_unauthorized_total",
           "idc_bad_requests_total", "idc_counters", "idc_peer_auth_accepted_total")
_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{reason="([^"]*)"\})?\s+([-+0-9.eE]+|NaN)$')


def parse_metrics(text: str) -> dict[str, float]:
    """``name`` or ``name{reason}`` -> value, for the families in ``METRICS``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) in METRICS:
            name = m.group(1) + (f"{{{m.group(2)}}}" if m.group(2) is not None else "")
            out[name] = float(m.group(3))
    return out


def _bindable(addr: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Runner:
    def __init__(self, config: HostileConfig) -> None:
        self.config = config
        self.urls = [normalize_url(u) for u in config.nodes]
        seed = config.seed if config.seed is not None else secrets.randbits(32)
        self.seed = seed
        self.rng = random.Random(seed)
        self.run_id = f"h{seed:08x}"[:9]
        self.problems: list[str] = []
        self._session: aiohttp.ClientSession | None = None

    # -- plain HTTP to the nodes (health, metrics, final reads) -----------------------------

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.config.token:
            h["Authorization"] = f"Bearer {self.config.token}"
        return h

    async def _get(self, url: str, path: str) -> tuple[int, bytes]:
        assert self._session is not None
        try:
            async with self._session.get(url + path, headers=self._headers()) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return 0, repr(exc).encode()

    async def health(self, url: str) -> dict[str, Any] | None:
        status, body = await self._get(url, "/v1/health")
        if status != 200:
            return None
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    async def metrics(self, url: str) -> dict[str, float]:
        status, body = await self._get(url, "/metrics")
        return parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}

    async def read(self, url: str, table: str, key: str) -> int | str:
        status, body = await self._get(url, f"/v1/counters/{table}/{key}?consistency=all")
        if status != 200:
            return f"HTTP {status}: {body[:80]!r}"
        try:
            value = json.loads(body)["value"]
        except (ValueError, KeyError, TypeError):
            return f"bad answer {body[:80]!r}"
        return value if isinstance(value, int) else f"bad value {value!r}"

    async def _token_required(self, url: str) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(url + "/metrics") as resp:
                return resp.status == 401
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    # -- the run ---------------------------------------------------------------------------

    def _classes(self, ctx: Ctx) -> list[JunkClass]:
        cfg = self.config
        names = list(cfg.classes) if cfg.classes else list(REGISTRY)
        unknown = [n for n in [*names, *cfg.skip] if n not in REGISTRY]
        if unknown:
            raise SystemExit(f"unknown junk classes: {', '.join(unknown)} (see --list)")
        return [REGISTRY[n] for n in names if n not in set(cfg.skip)]

    async def run(self) -> dict[str, Any]:
        cfg = self.config
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            targets, ring = await self._discover()
            ctx = self._context(targets, ring, await self._token_required(self.urls[0]))
            classes = self._classes(ctx)
            before = {u: await self.metrics(u) for u in self.urls}
            stats = GoodStats()
            stop = asyncio.Event()
            good = asyncio.create_task(good_client(
                self.urls, cfg.token, cfg.good_table, ctx.good_keys, stop, stats,
                rate=cfg.good_rate, workers=cfg.good_workers,
                client_id=f"{self.run_id}-good", rng=random.Random(self.rng.random()),
                max_connections=cfg.good_max_connections))
            outcomes: dict[str, Outcome] = {c.name: Outcome() for c in classes}
            rounds = 0
            try:
                rounds = await self._junk(ctx, classes, outcomes, started)
            finally:
                stop.set()
                try:
                    await asyncio.wait_for(good, 60.0)
                except Exception as exc:  # the good client itself failed
                    self.problems.append(f"good client: {exc!r}")
            junk_s = time.monotonic() - started
            await asyncio.sleep(cfg.settle)
            good_report = await self._check_good(ctx, stats)
            junk_report = await self._check_junk(ctx)
            nodes_report = await self._check_nodes()
            after = {u: await self.metrics(u) for u in self.urls}
            metrics_report = self._metrics(before, after, classes, outcomes)
        return self._report(ctx, classes, outcomes, rounds, junk_s, good_report, junk_report,
                            nodes_report, metrics_report)

    async def _discover(self) -> tuple[list[Target], Ring | None]:
        targets: list[Target] = []
        ring: Ring | None = None
        for url in self.urls:
            h = await self.health(url)
            if h is None:
                raise SystemExit(f"{url}: no /v1/health answer; is the node up?")
            parts = urlsplit(url)
            targets.append(Target(url, parts.hostname or "127.0.0.1", parts.port or 80,
                                  str(h.get("node"))))
            if ring is None and isinstance(h.get("members"), list):
                with contextlib.suppress(Exception):
                    ring = Ring(h["members"], vnodes=int(h.get("ring", {}).get("vnodes", 256)),
                                rf=int(h.get("rf", 3)))
        return targets, ring

    def _context(self, targets: list[Target], ring: Ring | None, token_required: bool) -> Ctx:
        cfg = self.config
        loopback = all(_is_loopback(t.host) for t in targets)
        source, cap_source = cfg.source, cfg.cap_source
        if source == "auto":
            source = "127.0.0.2" if loopback and _bindable("127.0.0.2") else None
        if cap_source == "auto":
            cap_source = "127.0.0.3" if loopback and _bindable("127.0.0.3") else source
        if token_required and not cfg.token:
            self.problems.append("the nodes want a bearer token and none was given: the HTTP "
                                 "junk only reaches the token check")
        good_keys = [f"{self.run_id}-g{i}" for i in range(cfg.good_keys)]
        ctx = Ctx(targets, limits=cfg.limits, token=cfg.token, secret=cfg.secret,
                  token_required=token_required, run_id=self.run_id, table=cfg.table,
                  good_table=cfg.good_table, good_keys=good_keys, ring=ring, source=source,
                  cap_source=cap_source, max_requests=cfg.max_requests, rng=self.rng)
        return ctx

    async def _junk(self, ctx: Ctx, classes: list[JunkClass], outcomes: dict[str, Outcome],
                    started: float) -> int:
        cfg = self.config
        sem = asyncio.Semaphore(max(1, cfg.concurrency))
        rounds = 0
        exhausted = False

        async def one(cls: JunkClass, target: Target) -> None:
            nonlocal exhausted
            out = outcomes[cls.name]
            if cls.needs_secret and ctx.secret is None:
                out.skipped = "needs --secret-file"
                return
            if cls.needs_token and not (ctx.token and ctx.token_required):
                out.skipped = "needs a node token (--token)"
                return
            async with sem:
                if exhausted:
                    return
                t0 = time.monotonic()
                try:
                    async with asyncio.timeout(ctx.class_timeout):
                        res = await cls.fn(ctx, target)
                except BudgetExhausted:
                    exhausted = True
                    return
                except TimeoutError:
                    res = Outcome()
                    res.fail("timeout", "whole class", f"did not finish in "
                             f"{ctx.class_timeout:g}s")
                except Exception as exc:  # a bug in the class itself: report, go on
                    res = Outcome()
                    res.fail("crash", "whole class", f"{type(exc).__name__}: {exc}")
                res.seconds = time.monotonic() - t0
            out.merge(res)

        while not exhausted:
            elapsed = time.monotonic() - started
            if rounds and (elapsed >= cfg.duration or (cfg.rounds and rounds >= cfg.rounds)):
                break
            n = len(ctx.targets)
            await asyncio.gather(*(one(cls, ctx.targets[(rounds + i) % n])
                                   for i, cls in enumerate(classes)))
            rounds += 1
        if exhausted:
            self.problems.append(f"--max-requests {cfg.max_requests} reached")
        return rounds

    async def _check_good(self, ctx: Ctx, stats: GoodStats) -> dict[str, Any]:
        keys: dict[str, Any] = {}
        ok = True
        for key in ctx.good_keys:
            acked, unknown = stats.acked[key], stats.unknown.get(key, [])
            ranges, approx = reachable_sums(acked, unknown)
            values = {u: await self.read(u, ctx.good_table, key) for u in self.urls}
            bad = {u: v for u, v in values.items()
                   if not isinstance(v, int) or distance(v, ranges) != 0}
            if bad:
                ok = False
                self.problems.append(f"good key {key}: acked {acked} (+ up to {sum(unknown)} "
                                     f"unknown), read {values}")
            keys[key] = {"acked": acked, "unknown": unknown, "values": list(values.values()),
                         "exact": not unknown and not bad}
        return {"ok": ok, "exact": ok and not any(stats.unknown.values()),
                "acked_ops": stats.acked_ops,
                "unknown_ops": sum(len(v) for v in stats.unknown.values()),
                "not_applied_ops": stats.not_applied, "errors": dict(stats.errors),
                "keys": keys}

    async def _check_junk(self, ctx: Ctx) -> dict[str, Any]:
        nonzero: dict[str, Any] = {}
        sem = asyncio.Semaphore(8)

        async def check(key: str, url: str) -> None:
            async with sem:
                v = await self.read(url, ctx.table, key)
            if v != 0:
                nonzero[f"{key}@{url}"] = v

        await asyncio.gather(*(check(k, u) for k in sorted(ctx.junk_keys) for u in self.urls))
        tables: dict[str, list[str]] = {}
        for url in self.urls:
            h = await self.health(url) or {}
            tables[url] = sorted(h.get("tables", {}))
        if nonzero:
            self.problems.append(f"junk changed {len(nonzero)} junk counters: "
                                 f"{dict(list(nonzero.items())[:5])}")
        return {"ok": not nonzero, "keys_checked": len(ctx.junk_keys),
                "reads": len(ctx.junk_keys) * len(self.urls), "nonzero": nonzero,
                "tables": tables}

    async def _check_nodes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for url in self.urls:
            h = await self.health(url)
            up = h is not None and h.get("status") == "ok"
            out[url] = {"up": up, "node": h.get("node") if h else None,
                        "status": h.get("status") if h else "no answer"}
            if not up:
                self.problems.append(f"{url} is not healthy after the run: {out[url]}")
        return out

    def _metrics(self, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 classes: list[JunkClass], outcomes: dict[str, Outcome]) -> dict[str, Any]:
        delta: Counter[str] = Counter()
        for url in self.urls:
            for name, value in after.get(url, {}).items():
                d = value - before.get(url, {}).get(name, 0.0)
                if d:
                    delta[name] += int(d)
        by: dict[str, dict[str, int]] = {"idc_peer_auth_rejected_total": {},
                                         "idc_http_refused_total": {}}
        for name, value in delta.items():
            family, _, reason = name.partition("{")
            if family in by and reason:
                by[family][reason.rstrip("}")] = value
        expected_peer = sorted({r for c in classes for r in c.reasons
                                if not outcomes[c.name].skipped and outcomes[c.name].requests})
        expected_http = sorted({r for c in classes for r in c.refused
                                if not outcomes[c.name].skipped and outcomes[c.name].requests})
        missing = [r for r in expected_peer
                   if by["idc_peer_auth_rejected_total"].get(r, 0) <= 0]
        missing += [r for r in expected_http if by["idc_http_refused_total"].get(r, 0) <= 0]
        if missing and any(after.values()):
            self.problems.append(f"refusal reasons that did not go up: {missing}")
        return {"peer_auth_rejected": by["idc_peer_auth_rejected_total"],
                "http_refused": by["idc_http_refused_total"],
                "unauthorized": delta.get("idc_unauthorized_total", 0),
                "bad_requests": delta.get("idc_bad_requests_total", 0),
                "peer_auth_accepted": delta.get("idc_peer_auth_accepted_total", 0),
                "counters_added": delta.get("idc_counters", 0),
                "expected_peer_reasons": expected_peer, "expected_http_reasons": expected_http,
                "missing_reasons": missing, "scraped": bool(any(after.values()))}

    def _report(self, ctx: Ctx, classes: list[JunkClass], outcomes: dict[str, Outcome],
                rounds: int, junk_s: float, good: dict[str, Any], junk_r: dict[str, Any],
                nodes: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        table = {}
        for cls in classes:
            o = outcomes[cls.name]
            table[cls.name] = {
                "group": cls.group, "requests": o.requests, "seen": dict(o.seen),
                "verdict": o.verdict(), "ok": o.ok, "skipped": o.skipped,
                "failure_kinds": dict(o.failure_kinds),
                "failures": [str(f) for f in o.failures], "notes": sorted(o.notes),
                "closes": cls.closes, "seconds": round(o.seconds, 2), "doc": cls.doc}
            if not o.ok:
                self.problems.append(f"class {cls.name}: {o.verdict()}")
        ran = [c for c in classes if not outcomes[c.name].skipped]
        ok = not self.problems
        return {
            "ok": ok, "seed": self.seed, "run_id": self.run_id, "nodes": self.urls,
            "rounds": rounds, "junk_seconds": round(junk_s, 1),
            "classes_tried": len(ran), "classes_skipped": len(classes) - len(ran),
            "junk_requests": sum(outcomes[c.name].requests for c in ran),
            "classes": table, "good": good, "junk": junk_r, "health": nodes,
            "metrics": metrics, "problems": list(self.problems),
            "source": ctx.source, "cap_source": ctx.cap_source,
        }


async def run_hostile(config: HostileConfig) -> dict[str, Any]:
    """Run the junk and the good client against ``config.nodes``; the report (``ok`` says
    whether every check passed)."""
    return await Runner(config).run()


async def try_class(config: HostileConfig, name: str, *, targets: int = 1) -> Outcome:
    """Run one class once against each of the first ``targets`` nodes, without the good
    client; then its junk keys must read 0 on every node ("effect" failures otherwise)."""
    runner = Runner(config)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        runner._session = session
        found, ring = await runner._discover()
        ctx = runner._context(found, ring, await runner._token_required(runner.urls[0]))
        cls = REGISTRY[name]
        out = Outcome()
        for target in found[:targets]:
            async with asyncio.timeout(ctx.class_timeout):
                out.merge(await cls.fn(ctx, target))
        junk_report = await runner._check_junk(ctx)
        for where, value in junk_report["nonzero"].items():
            out.fail("effect", where, f"junk counter reads {value}")
    return out
