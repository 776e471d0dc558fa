"""``CounterClient``: the async SDK (op ids, retries, failover, batching) over the HTTP API.

    async with CounterClient(["127.0.0.1:7101"], state_path="client.json") as c:
        await c.incr("pageviews", "home")         # AddResult(applied=True, ...)
        await c.get("pageviews", "home")          # 1
        await c.get_many("pageviews", ["home", "about"])   # [1, 0]
        async for key, value in c.scan("pageviews", prefix="ho"):
            print(key, value)                     # home 1
        await c.delete("pageviews", "home")       # AddResult(kind="delete", ...)
        await c.set_table("pageviews", ttl_s=86400.0)      # {"table": ..., "ttl_s": 86400.0}
        await c.tables()                          # [{"name": "pageviews", "ttl_s": 86400.0}]

Every add and every delete gets an op id ``<client-id>:<seq>`` once and keeps it through every
retry, so a retry whose original was applied is answered "duplicate", a success. One client's
adds and deletes of a key reach the cluster in the order they were issued (``client.batcher``).
Reads (``get``, ``get_many``, each page of ``scan``) and table settings change nothing, or set
the same thing again, so they are retried on the next node until ``total_timeout``. See
``client.errors`` for what each failure means and ``client.config`` for every setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from client.batcher import Batcher
from client.config import ClientConfig, normalize_url
from client.errors import BadRequestError, ClientClosedError, ClientError, TransientError
from client.nodes import NodePool
from client.opids import OpIdSource
from client.retry import ADD, AddResult, PendingOp, RetryLoop
from client.stats import ClientStats
from client.transport import HttpTransport, query
from idc_contract import CONSISTENCIES, INT64_MAX, INT64_MIN, is_name

BatchOp = tuple[str, str, int]
ReadPair = tuple[str, str]
T = TypeVar("T")

#: reads a /v1/read request may carry when no node has said (``max_reads`` in /v1/health)
DEFAULT_MAX_READS = 1000
PREFIX_RE = re.compile(r"[A-Za-z0-9_.:\-]{0,128}")


class CounterClient:
    """An async context manager; ``start``/``stop`` (drain in-flight ops)/``abort``."""

    def __init__(self, nodes: Sequence[str] | None = None, *, config: ClientConfig | None = None,
                 rng: random.Random | None = None, **settings: Any) -> None:
        if config is None:
            config = ClientConfig(nodes=tuple(nodes or ()), **settings)
        elif nodes or settings:
            config = config.replace(**({"nodes": tuple(nodes)} if nodes else {}), **settings)
        self.config = config
        # ``op_budget``, kept with what it was computed from
        self._budget, self._budget_said, self._budget_config = 0.0, -1, config
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
        self.batcher = Batcher(self._new_op, self._run_to, interval=interval,
                               max_ops=config.max_batch_ops if interval > 0 else 1,
                               coalesce=config.coalesce and interval > 0,
                               on_coalesce=self._count_coalesced, stats=self.stats,
                               max_in_flight=config.max_batches_in_flight,
                               max_wait=config.attempt_timeout, route=self._route)
        self._max_reads: dict[str, int] = {}  # node URL -> the max_reads it advertised
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
        """Seconds an op may spend retrying: inside the window, with the configured margin.
        Kept until the nodes say another window or clock tolerance (``NodePool.said``), or the
        config changes: every op asks."""
        said, config = self.pool.said, self.config
        if said != self._budget_said or config is not self._budget_config:
            self._budget = config.budget(self.window_s, self.pool.skew())
            self._budget_said, self._budget_config = said, config
        return self._budget

    @property
    def max_reads(self) -> int:
        """Reads ``get_many`` puts in one /v1/read: the smallest ``max_reads`` the nodes that
        answered /v1/health advertise (a node that does not say counts as
        ``DEFAULT_MAX_READS``)."""
        return min(self._max_reads.values(), default=DEFAULT_MAX_READS)

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
                limit = ans.get("max_reads")
                if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                    limit = DEFAULT_MAX_READS
                self._max_reads[url] = limit
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

    def _new_op(self, table: str, key: str, delta: int, kind: str = ADD) -> PendingOp:
        assert self.opids is not None
        now = time.monotonic()
        self.stats.sent_ops += 1
        return PendingOp(table, key, delta, self.opids.next(), now, now + self.op_budget, kind)

    def _route(self, table: str, key: str) -> str | None:
        """The URL of the key's leader, where its auto-batched ops go first (None: not known
        yet, or ``route_to_leader`` off: any node will do)."""
        return self.pool.leader_url(table, key) if self.config.route_to_leader else None

    async def _run_to(self, ops: list[PendingOp], leader: str | None) -> None:
        """Send one lane's auto-batched ops: one request, to their leader first."""
        await self.retry.run(ops, prefer=leader)

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

    async def delete(self, table: str, key: str) -> AddResult:
        """Delete a counter: every add acknowledged before it is gone, and the counter starts
        again from 0. A write like an add: an op id from the same source, kept through every
        retry (same attempt numbers, age, deadline inside the window), and a retry answered
        "duplicate" is a success (``AddResult.kind == "delete"``, ``delta`` 0); it fails with
        the same errors. It goes in the automatic batches (as ``{"op": "delete"}``), but never
        merged with adds and never beside an op of its own key: it waits until this client's
        earlier adds of the key have ended, and its later ones wait for it."""
        self._check_running()
        _check_name(table, "table")
        _check_name(key, "key")
        self.stats.ops += 1
        return await self.batcher.add(table, key, 0, delete=True)

    async def batch(self, ops: Sequence[BatchOp], *,
                    return_exceptions: bool = False) -> list[AddResult | ClientError]:
        """Send these adds as one /v1/batch (with retries), to the node that leads most of
        them; results in order. Raises the first error unless ``return_exceptions``. Adds
        only; the batch waits for any delete this client issued earlier on one of its keys."""
        self._check_running()
        for table, key, delta in ops:
            _check_add(table, key, delta)
        futs = self.batcher.submit_batch(list(ops), self._run_batch)
        self.stats.ops += len(futs)
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

    async def _run_batch(self, pending: list[PendingOp]) -> None:
        """An explicit batch: one request, to the node that leads most of its ops first."""
        leaders = Counter(self._route(op.table, op.key) for op in pending)
        prefer = leaders.most_common(1)[0][0]
        await self.retry.run(pending, batch_endpoint=True, prefer=prefer)

    # -- reads -----------------------------------------------------------------------------

    async def get(self, table: str, key: str, consistency: str = "quorum", *,
                  node: str | None = None) -> int:
        """A counter's value; ``node`` reads through that node only. Retries transient errors
        until ``total_timeout``, then raises the last one (retrying later may help)."""
        self._check_running()
        _check_name(table, "table")
        _check_name(key, "key")
        _check_consistency(consistency)
        path, params = f"/v1/counters/{table}/{key}", f"?consistency={consistency}"

        async def attempt(url: str, timeout: float) -> int:
            body = await self.transport.get_json(url, path, params=params, timeout=timeout)
            return int(body["value"])

        return await self._failover(attempt, node=node)

    async def get_many(self, table: str, keys: Sequence[str],
                       consistency: str = "quorum") -> list[int]:
        """The values of ``keys`` of one table, in order (0 for a counter never written,
        deleted or expired), through ``POST /v1/read``. More keys than ``max_reads`` are split
        into requests of at most that many, sent side by side; each is retried on the next
        node on a transient error, as ``get`` is. The first error that ends a request (after
        its retries) ends the call, and the other requests are cancelled."""
        self._check_running()
        _check_name(table, "table")
        if isinstance(keys, str):
            raise BadRequestError("keys: a sequence of key names, not one string",
                                  code="bad_key")
        return await self.get_many_pairs([(table, k) for k in keys], consistency)

    async def get_many_pairs(self, reads: Sequence[ReadPair],
                             consistency: str = "quorum") -> list[int]:
        """``get_many`` over ``(table, key)`` pairs that may span tables; values in order."""
        self._check_running()
        pairs = list(reads)
        for pair in pairs:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise BadRequestError(f"reads: each read is a (table, key) pair, got {pair!r}",
                                      code="bad_read")
            _check_name(pair[0], "table")
            _check_name(pair[1], "key")
        _check_consistency(consistency)
        size = self.max_reads
        chunks = [pairs[i:i + size] for i in range(0, len(pairs), size)]
        if len(chunks) <= 1:
            return await self._read_chunk(chunks[0], consistency) if chunks else []
        tasks = [asyncio.ensure_future(self._read_chunk(c, consistency)) for c in chunks]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        return [v for part in parts for v in part]

    async def _read_chunk(self, pairs: list[ReadPair], consistency: str) -> list[int]:
        body = {"reads": [{"table": t, "key": k} for t, k in pairs], "consistency": consistency}

        async def attempt(url: str, timeout: float) -> list[int]:
            ans = await self.transport.call_json("POST", url, "/v1/read", body, timeout=timeout)
            values = ans["values"]
            if not isinstance(values, list) or len(values) != len(pairs):
                raise ValueError(f"{len(pairs)} reads answered by {values!r:.100}")
            return [_as_int(v) for v in values]

        return await self._failover(attempt)

    def scan(self, table: str, prefix: str = "", page_size: int = 1000,
             consistency: str = "quorum") -> AsyncIterator[tuple[str, int]]:
        """Every counter of ``table`` (whose key starts with ``prefix``) as ``(key, value)``,
        page by page (``GET /v1/counters/{table}``, ``page_size`` at most a page), following
        each page's ``next`` cursor until it is null; a page may come short or empty before
        the end. A page whose request fails transiently is asked again (of the next node) with
        the same cursor, so nothing repeats and nothing is skipped; the cluster returns every
        counter that exists for the whole scan exactly once. Arguments are checked now, the
        first page is asked for on the first iteration.

            async for key, value in client.scan("pageviews", prefix="2024-"):
                ...
        """
        self._check_running()
        _check_scan(table, prefix, page_size, consistency)
        return self._scan(table, prefix, page_size, consistency)

    async def _scan(self, table: str, prefix: str, page_size: int,
                    consistency: str) -> AsyncIterator[tuple[str, int]]:
        async for page in self._pages(table, prefix, page_size, consistency):
            for item in page:
                yield item

    def scan_pages(self, table: str, prefix: str = "", page_size: int = 1000,
                   consistency: str = "quorum") -> AsyncIterator[list[tuple[str, int]]]:
        """``scan`` a page at a time, as the cluster sent them (empty ones included)."""
        self._check_running()
        _check_scan(table, prefix, page_size, consistency)
        return self._pages(table, prefix, page_size, consistency)

    async def _pages(self, table: str, prefix: str, page_size: int,
                     consistency: str) -> AsyncIterator[list[tuple[str, int]]]:
        path = f"/v1/counters/{table}"
        after: str | None = None
        while True:
            params = query({"prefix": prefix or None, "after": after, "limit": page_size,
                            "consistency": consistency})

            async def attempt(url: str, timeout: float,
                              params: str = params) -> tuple[list[tuple[str, int]], str | None]:
                ans = await self.transport.get_json(url, path, params=params, timeout=timeout)
                return _page(ans)

            page, after = await self._failover(attempt)
            yield page
            if after is None:
                return

    # -- tables ----------------------------------------------------------------------------

    async def set_table(self, table: str, ttl_s: float | None = None) -> dict[str, Any]:
        """Set a table's settings on every node (``PUT /v1/tables/{table}``): with ``ttl_s``
        (seconds, > 0) a counter whose last acknowledged write is older than that reads 0 and
        leaves scans; ``None`` turns expiry off. Returns the node's answer (``{"table",
        "ttl_s"}``). Setting the same thing twice is harmless, so a transient error is retried
        on the next node, as a read is."""
        self._check_running()
        _check_name(table, "table")
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float)
                                  or not math.isfinite(ttl_s) or ttl_s <= 0):
            raise BadRequestError(f"ttl_s: a finite number of seconds > 0, or None, "
                                  f"got {ttl_s!r}", code="bad_ttl")
        path, body = f"/v1/tables/{table}", {"ttl_s": ttl_s}

        async def attempt(url: str, timeout: float) -> dict[str, Any]:
            return await self.transport.call_json("PUT", url, path, body, timeout=timeout)

        return await self._failover(attempt)

    async def tables(self) -> list[dict[str, Any]]:
        """Every table with settings: ``[{"name": ..., "ttl_s": ... or None}, ...]``."""
        self._check_running()

        async def attempt(url: str, timeout: float) -> list[dict[str, Any]]:
            ans = await self.transport.get_json(url, "/v1/tables", timeout=timeout)
            tables = ans["tables"]
            if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
                raise TypeError(f"tables: {tables!r:.100}")
            return tables

        return await self._failover(attempt)

    async def _failover(self, attempt: Callable[[str, float], Awaitable[T]], *,
                        node: str | None = None) -> T:
        """Run ``attempt(node_url, timeout)`` on the nodes in turn (``node``: that one only)
        until it returns, backing off between tries, for at most ``total_timeout``; then the
        last transient error is raised. An answer of the wrong shape (``KeyError``,
        ``TypeError``, ``ValueError`` from ``attempt``) is not retried."""
        cfg = self.config
        deadline = time.monotonic() + cfg.total_timeout
        nodes = [normalize_url(node)] if node else self.pool.order()
        turn = 0
        while True:
            url = nodes[turn % len(nodes)]
            left = deadline - time.monotonic()
            try:
                out = await attempt(url, min(cfg.attempt_timeout, max(left, 0.01)))
                self.pool.record(url, True)
                return out
            except TransientError as exc:
                self.stats.errors[type(exc).__name__] += 1
                self.pool.record(url, False)
                turn += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, self.retry.backoff_delay(turn)))
            except (KeyError, TypeError, ValueError) as exc:
                raise BadRequestError(f"{url}: unexpected answer: {exc!r}") from exc


def _check_consistency(consistency: Any) -> None:
    if consistency not in CONSISTENCIES:
        raise BadRequestError(f"consistency: one of {', '.join(CONSISTENCIES)}, "
                              f"got {consistency!r}", code="bad_consistency")


def _check_scan(table: str, prefix: Any, page_size: Any, consistency: str) -> None:
    _check_name(table, "table")
    if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
        raise BadRequestError(f"prefix: must match [A-Za-z0-9_.:-]{{0,128}}, got {prefix!r}",
                              code="bad_prefix")
    if type(page_size) is not int or page_size <= 0:
        raise BadRequestError(f"page_size: an integer > 0, got {page_size!r}",
                              code="bad_page_size")
    _check_consistency(consistency)


def _as_int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"a counter's value must be an integer, got {value!r:.50}")
    return value


def _page(ans: dict[str, Any]) -> tuple[list[tuple[str, int]], str | None]:
    """A scan page's counters and its ``next`` cursor (None: the last page)."""
    counters, after = ans["counters"], ans["next"]
    if not isinstance(counters, list) or not (after is None or isinstance(after, str)):
        raise TypeError(f"scan page: {ans!r:.100}")
    page = []
    for item in counters:
        key = item["key"]
        if not isinstance(key, str):
            raise TypeError(f"scan page: key {key!r:.50}")
        page.append((key, _as_int(item["value"])))
    return page, after


def _check_name(value: Any, field: str) -> None:
    if not is_name(value):
        raise BadRequestError(f"{field}: must match [A-Za-z0-9_.:-]{{1,128}}, got {value!r}",
                              code=f"bad_{field}")


def _check_add(table: str, key: str, delta: int) -> None:
    """Checked before an op id is spent, so one bad call cannot spoil a shared batch."""
    _check_name(table, "table")
    _check_name(key, "key")
    if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
        raise BadRequestError(f"delta: must be an integer in signed 64-bit range, got {delta!r}",
                              code="bad_delta")
