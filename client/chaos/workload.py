"""The bounded workload: SDK clients, each with a few logical processes issuing one op at a time
(adds of random sign and size, and reads) at a target total rate, recording every op's
invocation and completion in the history.

Completion types follow CHAOS.md: ``ok`` when any attempt was acknowledged (applied or
duplicate), ``fail`` only when the op certainly was not applied (``RejectedError``,
``NotAppliedError``), ``info`` otherwise; after an ``info`` the process takes a new id.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from client.chaos.history import History
from client.config import normalize_url
from client.errors import ClientError, NotAppliedError, OutcomeUnknownError, RejectedError
from client.sdk import CounterClient
from client.stats import ClientStats


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadConfig:
    """clients: SDK instances (each its own client id); concurrency: processes per client;
    rate: target ops/s over all processes; duration: seconds of issuing; keys: counters used;
    incr/decr/read: op mix weights; max_delta: adds are 1..max_delta in size; send_age: the SDK
    sends age_ms (off: a client unaware of the window, e.g. against --dedup none)."""

    clients: int = 4
    concurrency: int = 4
    rate: float = 200.0
    duration: float = 30.0
    keys: int = 8
    table: str = "chaos"
    incr: float = 0.7
    decr: float = 0.2
    read: float = 0.1
    max_delta: int = 3
    read_consistency: str = "quorum"
    attempt_timeout: float = 0.5
    total_timeout: float = 10.0
    batch_interval: float = 0.002
    coalesce: bool = False
    send_age: bool = True

    def __post_init__(self) -> None:
        for name in ("clients", "concurrency", "keys", "max_delta"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        for name in ("rate", "duration"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")
        if min(self.incr, self.decr, self.read) < 0 or self.incr + self.decr + self.read <= 0:
            raise ValueError("incr/decr/read: weights must be >= 0 and not all 0")

    @property
    def processes(self) -> int:
        return self.clients * self.concurrency

    def key_names(self) -> list[str]:
        return [f"k{i}" for i in range(self.keys)]


class Workload:
    def __init__(self, cfg: WorkloadConfig, urls: Sequence[str], history: History, *,
                 seed: int | None = None) -> None:
        self.cfg = cfg
        self.urls = list(urls)
        self.history = history
        self.rng = random.Random(seed)
        self.clients: list[CounterClient] = []
        self.done = 0
        self.inflight = 0
        self.running = False

    def stats(self) -> ClientStats:
        total = ClientStats()
        for c in self.clients:
            for name in total.__slots__:
                if name == "errors":
                    total.errors.update(c.stats.errors)
                else:
                    setattr(total, name, getattr(total, name) + getattr(c.stats, name))
        return total

    async def run(self) -> None:
        cfg = self.cfg
        for i in range(cfg.clients):
            client = CounterClient(
                self.urls, client_id=f"chaos{i}-{self.rng.randrange(1 << 30):x}",
                discover=False, attempt_timeout=cfg.attempt_timeout,
                total_timeout=cfg.total_timeout, batch_interval=cfg.batch_interval,
                coalesce=cfg.coalesce, send_age=cfg.send_age,
                rng=random.Random(self.rng.random()))
            self.clients.append(client)
        try:
            for c in self.clients:
                await c.start()
            self.running = True
            stop_at = time.monotonic() + cfg.duration
            workers = [self._worker(slot, self.clients[slot % cfg.clients], stop_at,
                                    random.Random(self.rng.random()))
                       for slot in range(cfg.processes)]
            await asyncio.gather(*workers)
        finally:
            self.running = False
            for c in self.clients:
                await c.stop()

    async def use_nodes(self, urls: Sequence[str]) -> None:
        """The members changed (membership nemesis): from now on every client uses exactly
        ``urls`` (a node that joined is added, one that left is no longer tried), and asks
        the new ones their id and the ring at once instead of at its next health round."""
        self.urls = list(urls)
        for c in self.clients:
            for url in urls:
                c.pool.add(url)
            wanted = {normalize_url(u) for u in urls}
            for url in [u for u in c.pool.urls if u not in wanted]:
                c.pool.remove(url)
        if self.running:
            await asyncio.gather(*(c.refresh() for c in self.clients), return_exceptions=True)

    async def _worker(self, slot: int, client: CounterClient, stop_at: float,
                      rng: random.Random) -> None:
        cfg, n = self.cfg, self.cfg.processes
        process = slot
        interval = n / cfg.rate
        next_t = time.monotonic() + rng.uniform(0, interval)
        keys = cfg.key_names()
        weights = [cfg.incr, cfg.decr, cfg.read]
        while True:
            now = time.monotonic()
            if now >= stop_at:
                return
            if next_t > now:
                await asyncio.sleep(min(next_t, stop_at) - now)
                if time.monotonic() >= stop_at:
                    return
            next_t = max(next_t + interval * rng.uniform(0.5, 1.5), time.monotonic() - interval)
            kind = rng.choices(("incr", "decr", "read"), weights)[0]
            key = rng.choice(keys)
            self.inflight += 1
            try:
                if kind == "read":
                    await self._read(process, client, key)
                else:
                    delta = rng.randint(1, cfg.max_delta) * (1 if kind == "incr" else -1)
                    if not await self._add(process, client, key, delta):
                        process += n  # after an info the process continues under a new id
            finally:
                self.inflight -= 1
                self.done += 1

    async def _add(self, process: int, client: CounterClient, key: str, delta: int) -> bool:
        """One add, recorded; False when it ended as info."""
        hist, hkey = self.history, f"{self.cfg.table}/{key}"
        hist.record(process, "invoke", "add", delta, key=hkey)
        extra: dict[str, Any]
        try:
            r = await client.add(self.cfg.table, key, delta)
        except (RejectedError, NotAppliedError) as exc:
            extra = {"op_id": exc.op_id, "attempts": exc.attempts, "error": _err(exc)}
            hist.record(process, "fail", "add", delta, key=hkey, **extra)
            return True
        except (OutcomeUnknownError, ClientError) as exc:
            extra = {"op_id": exc.op_id, "attempts": exc.attempts, "error": _err(exc)}
            hist.record(process, "info", "add", delta, key=hkey, **extra)
            return False
        except Exception as exc:  # a bug, not a fault: still never a guess
            hist.record(process, "info", "add", delta, key=hkey, error=_err(exc))
            return False
        hist.record(process, "ok", "add", delta, key=hkey, op_id=r.op_id, attempts=r.attempts,
                    duplicate=r.duplicate or None, node=r.node)
        return True

    async def _read(self, process: int, client: CounterClient, key: str) -> None:
        hist, hkey = self.history, f"{self.cfg.table}/{key}"
        hist.record(process, "invoke", "read", None, key=hkey)
        try:
            value = await client.get(self.cfg.table, key, self.cfg.read_consistency)
        except ClientError as exc:  # reads change nothing: a failed read is a plain fail
            hist.record(process, "fail", "read", None, key=hkey, error=_err(exc))
            return
        hist.record(process, "ok", "read", value, key=hkey)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
