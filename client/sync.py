"""``SyncCounterClient``: the async SDK for synchronous code, on a private event-loop thread.

    with SyncCounterClient(["127.0.0.1:7101"]) as c:
        c.incr("pageviews", "home")
        c.get("pageviews", "home")

Calls from many threads are fine: they all hand their coroutine to the one loop, so automatic
batching works across threads too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from client.errors import ClientClosedError, ClientError
from client.retry import AddResult
from client.sdk import BatchOp, CounterClient
from client.stats import ClientStats

T = TypeVar("T")


class SyncCounterClient:
    """Same arguments as ``CounterClient``; a context manager with ``start``/``stop``/``abort``."""

    def __init__(self, nodes: Sequence[str] | None = None, **kw: Any) -> None:
        self._args, self._kw = nodes, kw
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: CounterClient | None = None

    def __enter__(self) -> SyncCounterClient:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="counter-client", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._client = self._call(self._make())
        except BaseException:
            self._shutdown()
            raise

    async def _make(self) -> CounterClient:
        client = CounterClient(self._args, **self._kw)
        await client.start()
        return client

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop is None:
            coro.close()
            raise ClientClosedError("client is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def client(self) -> CounterClient:
        if self._client is None:
            raise ClientClosedError("client is not started")
        return self._client

    @property
    def stats(self) -> ClientStats:
        return self.client.stats

    @property
    def client_id(self) -> str:
        return self.client.client_id

    def add(self, table: str, key: str, delta: int) -> AddResult:
        return self._call(self.client.add(table, key, delta))

    def incr(self, table: str, key: str, by: int = 1) -> AddResult:
        return self._call(self.client.incr(table, key, by))

    def decr(self, table: str, key: str, by: int = 1) -> AddResult:
        return self._call(self.client.decr(table, key, by))

    def batch(self, ops: Sequence[BatchOp], *,
              return_exceptions: bool = False) -> list[AddResult | ClientError]:
        return self._call(self.client.batch(ops, return_exceptions=return_exceptions))

    def get(self, table: str, key: str, consistency: str = "quorum", *,
            node: str | None = None) -> int:
        return self._call(self.client.get(table, key, consistency, node=node))

    def health(self, node: str | None = None) -> dict[str, Any]:
        return self._call(self.client.health(node))

    def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                self._call(client.stop())
            finally:
                self._shutdown()

    def abort(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                self._call(client.abort())
            finally:
                self._shutdown()

    def _shutdown(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(10.0)
            loop.close()
