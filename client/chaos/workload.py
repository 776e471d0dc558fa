"""The bounded workload: SDK clients, each with a few logical processes issuing one op at a time
(adds of random sign and size, reads, and when the mix asks for them deletes, multi-gets and
scans) at a target total rate, recording every op's invocation and completion in the history
(formats in ``client.chaos.history``).

Completion types follow CHAOS.md: ``ok`` when any attempt was acknowledged (applied or
duplicate), ``fail`` only when the op certainly was not applied (``RejectedError``,
``NotAppliedError``), ``info`` otherwise; after an ``info`` (an add or a delete) the process
takes a new id. A read, multi-get or scan that fails changes nothing: a plain ``fail``.
"""

from __future__ import annotations

import asyncio
import random
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from client.chaos.history import History
from client.config import normalize_url
from client.errors import ClientError, NotAppliedError, OutcomeUnknownError, RejectedError
from client.nodes import NodePool
from client.retry import AddResult
from client.sdk import CounterClient
from client.stats import ClientStats

KINDS = ("incr", "decr", "read", "delete", "multiget", "scan")


class WorkloadClient(Protocol):
    """What the workload asks of a client: ``CounterClient``'s calls (a fake in tests)."""

    stats: ClientStats
    pool: NodePool

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def refresh(self) -> None: ...
    async def add(self, table: str, key: str, delta: int) -> AddResult: ...
    async def delete(self, table: str, key: str) -> AddResult: ...
    async def get(self, table: str, key: str, consistency: str = "quorum") -> int: ...
    async def get_many(self, table: str, keys: Sequence[str], *,
                       consistency: str = "quorum") -> list[int]: ...
    def scan(self, table: str, *, prefix: str = "", page_size: int = 100,
             consistency: str = "quorum") -> AsyncIterator[tuple[str, int]]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadConfig:
    """clients: SDK instances (each its own client id); concurrency: processes per client;
    rate: target ops/s over all processes; duration: seconds of issuing; keys: counters used;
    incr/decr/read/delete/multiget/scan: op mix weights (the last three 0 by default: today's
    mix); max_delta: adds are 1..max_delta in size; multiget_keys: a multi-get reads 1..that
    many distinct keys; scan_page_size: the scan's page size; scan_keys: a scan's prefix is
    the shortest prefix of a random key that at most this many keys start with (the whole
    table when it is that small); send_age: the SDK sends age_ms (off: a client unaware of
    the window, e.g. against --dedup none)."""

    clients: int = 4
    concurrency: int = 4
    rate: float = 200.0
    duration: float = 30.0
    keys: int = 8
    table: str = "chaos"
    incr: float = 0.7
    decr: float = 0.2
    read: float = 0.1
    delete: float = 0.0
    multiget: float = 0.0
    scan: float = 0.0
    max_delta: int = 3
    multiget_keys: int = 4
    scan_page_size: int = 20
    scan_keys: int = 100
    read_consistency: str = "quorum"
    attempt_timeout: float = 0.5
    total_timeout: float = 10.0
    batch_interval: float = 0.002
    max_batches_in_flight: int = 1
    coalesce: bool = False
    send_age: bool = True

    def __post_init__(self) -> None:
        for name in ("clients", "concurrency", "keys", "max_delta", "multiget_keys",
                     "scan_page_size", "scan_keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        for name in ("rate", "duration"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")
        if min(self.weights()) < 0 or sum(self.weights()) <= 0:
            raise ValueError(f"{'/'.join(KINDS)}: weights must be >= 0 and not all 0")

    def weights(self) -> list[float]:
        """The op mix, in the order of ``KINDS``."""
        return [getattr(self, k) for k in KINDS]

    @property
    def processes(self) -> int:
        return self.clients * self.concurrency

    def key_names(self) -> list[str]:
        return [f"k{i}" for i in range(self.keys)]


def scan_prefix(names: Sequence[str], rng: random.Random, max_keys: int) -> str:
    """The shortest prefix of a random name of ``names`` (sorted) that at most ``max_keys``
    names start with (the whole name when even that is too many)."""
    name = rng.choice(names)
    for n in range(len(name) + 1):
        p = name[:n]
        if bisect_left(names, p + "\x7f") - bisect_left(names, p) <= max_keys:
            return p
    return name


class Workload:
    """``client_factory`` (keyword arguments of ``CounterClient``) makes each client; a test
    passes a fake."""

    def __init__(self, cfg: WorkloadConfig, urls: Sequence[str], history: History, *,
                 seed: int | None = None,
                 client_factory: Callable[..., WorkloadClient] | None = None) -> None:
        self.cfg = cfg
        self.urls = list(urls)
        self.history = history
        self.rng = random.Random(seed)
        self.client_factory = client_factory or _counter_client
        self.clients: list[WorkloadClient] = []
        self.done = 0
        self.inflight = 0
        self.running = False
        self.stop_at = float("inf")  # set by run(); finish() brings it forward

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
            client = self.client_factory(
                nodes=self.urls, client_id=f"chaos{i}-{self.rng.randrange(1 << 30):x}",
                discover=False, attempt_timeout=cfg.attempt_timeout,
                total_timeout=cfg.total_timeout, batch_interval=cfg.batch_interval,
                max_batches_in_flight=cfg.max_batches_in_flight,
                coalesce=cfg.coalesce, send_age=cfg.send_age,
                rng=random.Random(self.rng.random()))
            self.clients.append(client)
        try:
            for c in self.clients:
                await c.start()
            self.running = True
            self.stop_at = min(self.stop_at, time.monotonic() + cfg.duration)
            workers = [self._worker(slot, self.clients[slot % cfg.clients],
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

    def finish(self) -> None:
        """Issue no new op from now on (``duration`` is then an upper bound): ``run`` returns
        once the ops in flight complete."""
        self.stop_at = min(self.stop_at, time.monotonic())

    async def _worker(self, slot: int, client: WorkloadClient, rng: random.Random) -> None:
        cfg, n = self.cfg, self.cfg.processes
        process = slot
        interval = n / cfg.rate
        next_t = time.monotonic() + rng.uniform(0, interval)
        keys = cfg.key_names()
        names = sorted(keys)
        weights = cfg.weights()  # the first three as before: old seeds draw the same ops
        while True:
            now = time.monotonic()
            if now >= self.stop_at:
                return
            if next_t > now:
                await asyncio.sleep(min(next_t, self.stop_at) - now)
                if time.monotonic() >= self.stop_at:
                    return
            next_t = max(next_t + interval * rng.uniform(0.5, 1.5), time.monotonic() - interval)
            kind = rng.choices(KINDS, weights)[0]
            key = rng.choice(keys)
            self.inflight += 1
            try:
                if kind == "read":
                    await self._read(process, client, key)
                elif kind == "multiget":
                    some = rng.sample(keys, rng.randint(1, min(cfg.multiget_keys, len(keys))))
                    await self._multiget(process, client, some)
                elif kind == "scan":
                    await self._scan(process, client, scan_prefix(names, rng, cfg.scan_keys))
                elif kind == "delete":
                    if not await self._delete(process, client, key):
                        process += n
                else:
                    delta = rng.randint(1, cfg.max_delta) * (1 if kind == "incr" else -1)
                    if not await self._add(process, client, key, delta):
                        process += n  # after an info the process continues under a new id
            finally:
                self.inflight -= 1
                self.done += 1

    async def _add(self, process: int, client: WorkloadClient, key: str, delta: int) -> bool:
        """One add, recorded; False when it ended as info."""
        return await self._write(process, "add", key, delta,
                                 lambda: client.add(self.cfg.table, key, delta))

    async def _delete(self, process: int, client: WorkloadClient, key: str) -> bool:
        """One delete, recorded like an add (value None); False when it ended as info."""
        return await self._write(process, "delete", key, None,
                                 lambda: client.delete(self.cfg.table, key))

    async def _write(self, process: int, f: str, key: str, value: int | None,
                     call: Callable[[], Awaitable[AddResult]]) -> bool:
        hist, hkey = self.history, f"{self.cfg.table}/{key}"
        hist.record(process, "invoke", f, value, key=hkey)
        extra: dict[str, Any]
        try:
            r = await call()
        except (RejectedError, NotAppliedError) as exc:
            extra = {"op_id": exc.op_id, "attempts": exc.attempts, "error": _err(exc)}
            hist.record(process, "fail", f, value, key=hkey, **extra)
            return True
        except (OutcomeUnknownError, ClientError) as exc:
            extra = {"op_id": exc.op_id, "attempts": exc.attempts, "error": _err(exc)}
            hist.record(process, "info", f, value, key=hkey, **extra)
            return False
        except Exception as exc:  # a bug, not a fault: still never a guess
            hist.record(process, "info", f, value, key=hkey, error=_err(exc))
            return False
        hist.record(process, "ok", f, value, key=hkey, op_id=r.op_id, attempts=r.attempts,
                    duplicate=r.duplicate or None, node=r.node)
        return True

    async def _read(self, process: int, client: WorkloadClient, key: str) -> None:
        hist, hkey, c = self.history, f"{self.cfg.table}/{key}", self.cfg.read_consistency
        hist.record(process, "invoke", "read", None, key=hkey, consistency=c)
        try:
            value = await client.get(self.cfg.table, key, c)
        except ClientError as exc:  # reads change nothing: a failed read is a plain fail
            hist.record(process, "fail", "read", None, key=hkey, consistency=c, error=_err(exc))
            return
        hist.record(process, "ok", "read", value, key=hkey, consistency=c)

    async def _multiget(self, process: int, client: WorkloadClient, keys: list[str]) -> None:
        table, c = self.cfg.table, self.cfg.read_consistency
        hist, hkeys = self.history, [f"{table}/{k}" for k in keys]
        hist.record(process, "invoke", "multiget", None, keys=hkeys, consistency=c)
        try:
            values = await client.get_many(table, keys, consistency=c)
        except ClientError as exc:
            hist.record(process, "fail", "multiget", None, keys=hkeys, consistency=c,
                        error=_err(exc))
            return
        hist.record(process, "ok", "multiget", list(values), keys=hkeys, consistency=c)

    async def _scan(self, process: int, client: WorkloadClient, prefix: str) -> None:
        """Every page of one scan of the table (keys starting with ``prefix``) as one op."""
        cfg, hist = self.cfg, self.history
        where = {"table": cfg.table, "prefix": prefix, "consistency": cfg.read_consistency}
        hist.record(process, "invoke", "scan", None, page_size=cfg.scan_page_size, **where)
        got: list[list[Any]] = []
        try:
            async for key, value in client.scan(cfg.table, prefix=prefix,
                                                page_size=cfg.scan_page_size,
                                                consistency=cfg.read_consistency):
                got.append([f"{cfg.table}/{key}", value])
        except ClientError as exc:
            hist.record(process, "fail", "scan", None, returned=len(got), error=_err(exc),
                        **where)
            return
        hist.record(process, "ok", "scan", got, **where)


def _counter_client(**settings: Any) -> WorkloadClient:
    # the SDK's delete, get_many and scan are typed against the Protocol, not checked here
    return cast(WorkloadClient, CounterClient(**settings))


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
