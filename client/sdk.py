"""``CounterClient``: the async SDK (op ids, retries, failover, batching) over the HTTP API.

    async with CounterClient(["127.0.0.1:7101"], state_path="client.json") as c:
        await c.incr("pageviews", "home")         # AddResult(applied=True, ...)
        await c.get("pageviews", "home")          # 1

Every add gets an op id ``<client-id>:<seq>`` once and keeps it through every retry, so a retry
whose original was applied is answered "duplicate", a success. See ``client.errors`` for what
each failure means and ``client.config`` for every setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from typing import Any

from client.batcher import Batcher
from client.config import ClientConfig, normalize_url
from client.errors import BadRequestError, ClientClosedError, ClientError, TransientError
from client.nodes import NodePool
from client.opids import OpIdSource
from client.retry import AddResult, PendingOp, RetryLoop
from client.stats import ClientStats
from client.transport import HttpTransport
from idc_contract import CONSISTENCIES, INT64_MAX, INT64_MIN, NAME_RE

BatchOp = tuple[str, str, int]


class CounterClient:
    """An async context manager; ``start``/``stop`` (drain in-flight ops)/``abort``."""

    def __init__(self, nodes: Sequence[str] | None = None, *, config: ClientConfig | None = None,
                 rng: random.Random | None = None, **settings: Any) -> None:
        if config is None:
            config = ClientConfig(nodes=tuple(nodes or ()), **settings)
        elif nodes or settings:
            config = config.replace(**({"nodes": tuple(nodes)} if nodes else {}), **settings)
        self.config = config
        self.stats = ClientStats()
        self.pool = NodePool(config.nodes,
                             failure_backoff_interval=config.failure_backoff_interval)
        self.transport = HttpTransport(use_msgpack=config.use_msgpack,
                                       max_connections=config.max_connections,
                                       stats=self.stats, token=config.token,
                                       ca_file=config.ca_file)
        self.retry = RetryLoop(self.transport, self.pool.order, self.pool.record,
                               attempt_timeout=config.attempt_timeout,
                               backoff_interval=config.backoff_interval,
                               max_backoff_interval=config.max_backoff_interval,
                               stats=self.stats, rng=rng, send_age=config.send_age)
        interval = config.batch_interval
        self.batcher = Batcher(self._new_op, self._run_routed, interval=interval,
                               max_ops=config.max_batch_ops if interval > 0 else 1,
                               coalesce=config.coalesce and interval > 0,
                               on_coalesce=self._count_coalesced)
        self.opids: OpIdSource | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._state = "new"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> CounterClient:
        await self.start()
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is asyncio.CancelledError:
            await self.abort()
        else:
            await self.stop()

    async def start(self) -> None:
        if self._state != "new":
            return
        cfg = self.config
        self.opids = OpIdSource(cfg.client_id, cfg.state_path, block=cfg.seq_block)
        await self.transport.start()
        self._state = "running"
        await self.refresh()
        self._health_task = asyncio.create_task(self._health_loop(), name="client-health")

    async def stop(self) -> None:
        """Finish every op already issued (each within its deadline), then close."""
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        self._state = "closing"
        try:
            await self.batcher.drain()
        finally:
            await self._close()

    async def abort(self) -> None:
        """Close now; ops in flight end as outcome unknown (or not applied if never sent)."""
        if self._state == "closed":
            return
        self._state = "closing"
        try:
            await self.batcher.abort()
        finally:
            await self._close()

    async def _close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.transport.close()
        self._state = "closed"

    @property
    def client_id(self) -> str:
        if self.opids is None:
            raise ClientClosedError("client not started")
        return self.opids.client_id

    @property
    def window_s(self) -> float:
        """The cluster's advertised window (until known, ``config.assumed_window``)."""
        return self.pool.window(self.config.assumed_window)

    @property
    def op_budget(self) -> float:
        """Seconds an op may spend retrying: inside the window, with the configured margin."""
        return self.config.budget(self.window_s, self.pool.skew())

    # -- health and discovery --------------------------------------------------------------

    async def health(self, node: str | None = None) -> dict[str, Any]:
        url = normalize_url(node) if node else self.pool.order()[0]
        return await self.transport.get_json(url, "/v1/health",
                                             timeout=self.config.attempt_timeout)

    async def refresh(self) -> None:
        """Ask every known node's /v1/health for the window, the members and new addresses."""
        urls = list(self.pool.urls)
        answers = await asyncio.gather(*(self.health(u) for u in urls), return_exceptions=True)
        for url, ans in zip(urls, answers, strict=True):
            if isinstance(ans, dict):
                self.pool.learn(url, ans, discover=self.config.discover)
                self.pool.record(url, True)
            elif isinstance(ans, ClientError):
                self.pool.record(url, False)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval)
            with contextlib.suppress(ClientError):
                await self.refresh()

    # -- writes ----------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state != "running":
            raise ClientClosedError(f"client is {self._state}")

    def _new_op(self, table: str, key: str, delta: int) -> PendingOp:
        assert self.opids is not None
        now = time.monotonic()
        self.stats.sent_ops += 1
        return PendingOp(table, key, delta, self.opids.next(), now, now + self.op_budget)

    def _by_leader(self, ops: Sequence[PendingOp]) -> dict[str | None, list[PendingOp]]:
        """The ops grouped by their key's leader URL (None: not known, any node will do)."""
        if not self.config.route_to_leader:
            return {None: list(ops)}
        leader_url = self.pool.leader_url
        groups: dict[str | None, list[PendingOp]] = {}
        for op in ops:
            groups.setdefault(leader_url(op.table, op.key), []).append(op)
        return groups

    async def _run_routed(self, ops: list[PendingOp]) -> None:
        """Send auto-batched ops: one request per leader, each to that leader first."""
        groups = self._by_leader(ops)
        if len(groups) == 1:
            (url, group), = groups.items()
            await self.retry.run(group, prefer=url)
        else:
            await asyncio.gather(*(self.retry.run(g, prefer=u) for u, g in groups.items()))

    def _count_coalesced(self) -> None:
        self.stats.coalesced += 1

    async def add(self, table: str, key: str, delta: int) -> AddResult:
        """Add ``delta`` (may be negative) to a counter, exactly once or with a clear error."""
        self._check_running()
        _check_add(table, key, delta)
        self.stats.ops += 1
        return await self.batcher.add(table, key, delta)

    async def incr(self, table: str, key: str, by: int = 1) -> AddResult:
        return await self.add(table, key, by)

    async def decr(self, table: str, key: str, by: int = 1) -> AddResult:
        return await self.add(table, key, -by)

    async def batch(self, ops: Sequence[BatchOp], *,
                    return_exceptions: bool = False) -> list[AddResult | ClientError]:
        """Send these adds as one /v1/batch (with retries), to the node that leads most of
        them; results in order. Raises the first error unless ``return_exceptions``."""
        self._check_running()
        for table, key, delta in ops:
            _check_add(table, key, delta)
        pending = [self._new_op(t, k, d) for t, k, d in ops]
        loop = asyncio.get_running_loop()
        futs = []
        for op in pending:
            fut: asyncio.Future[AddResult] = loop.create_future()
            op.waiters.append(fut)
            futs.append(fut)
        self.stats.ops += len(pending)
        if pending:
            groups = self._by_leader(pending)
            prefer = max(groups, key=lambda u: len(groups[u]))
            await self.retry.run(pending, batch_endpoint=True, prefer=prefer)
        results = await asyncio.gather(*futs, return_exceptions=True)
        out: list[AddResult | ClientError] = []
        for r in results:
            if isinstance(r, ClientError):
                if not return_exceptions:
                    raise r
                out.append(r)
            elif isinstance(r, BaseException):
                raise r
            else:
                out.append(r)
        return out

    # -- reads -----------------------------------------------------------------------------

    async def get(self, table: str, key: str, consistency: str = "quorum", *,
                  node: str | None = None) -> int:
        """A counter's value; ``node`` reads through that node only. Retries transient errors
        until ``total_timeout``, then raises the last one (retrying later may help)."""
        self._check_running()
        _check_name(table, "table")
        _check_name(key, "key")
        if consistency not in CONSISTENCIES:
            raise BadRequestError(f"consistency: one of {', '.join(CONSISTENCIES)}")
        cfg = self.config
        deadline = time.monotonic() + cfg.total_timeout
        nodes = [normalize_url(node)] if node else self.pool.order()
        path, params = f"/v1/counters/{table}/{key}", f"?consistency={consistency}"
        turn = 0
        while True:
            url = nodes[turn % len(nodes)]
            left = deadline - time.monotonic()
            try:
                body = await self.transport.get_json(
                    url, path, params=params, timeout=min(cfg.attempt_timeout, max(left, 0.01)))
                self.pool.record(url, True)
                return int(body["value"])
            except TransientError as exc:
                self.stats.errors[type(exc).__name__] += 1
                self.pool.record(url, False)
                turn += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, self.retry.backoff_delay(turn)))
            except (KeyError, TypeError, ValueError) as exc:
                raise BadRequestError(f"{url}: unexpected read answer: {exc!r}") from exc


def _check_name(value: Any, field: str) -> None:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise BadRequestError(f"{field}: must match [A-Za-z0-9_.:-]{{1,128}}, got {value!r}",
                              code=f"bad_{field}")


def _check_add(table: str, key: str, delta: int) -> None:
    """Checked before an op id is spent, so one bad call cannot spoil a shared batch."""
    _check_name(table, "table")
    _check_name(key, "key")
    if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
        raise BadRequestError(f"delta: must be an integer in signed 64-bit range, got {delta!r}",
                              code="bad_delta")
