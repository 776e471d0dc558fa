"""``SyncCounterClient``: the async SDK for synchronous code, on a private event-loop thread.

    with SyncCounterClient(["127.0.0.1:7101"]) as c:
        c.incr("pageviews", "home")
        c.get("pageviews", "home")
        c.get_many("pageviews", ["home", "about"])
        for key, value in c.scan("pageviews", prefix="ho"):
            ...
        c.delete("pageviews", "home")
        c.set_table("pageviews", ttl_s=86400.0)

Calls from many threads are fine: they all hand their coroutine to the one loop, so automatic
batching (and the order of each key's adds and deletes) works across threads too. A ``scan``
iterator asks for each page on the loop as the iteration reaches it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Generator, Sequence
from typing import Any, TypeVar

from client.errors import ClientClosedError, ClientError
from client.retry import AddResult
from client.sdk import BatchOp, CounterClient, ReadPair
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

    def get_many(self, table: str, keys: Sequence[str],
                 consistency: str = "quorum") -> list[int]:
        return self._call(self.client.get_many(table, keys, consistency))

    def get_many_pairs(self, reads: Sequence[ReadPair],
                       consistency: str = "quorum") -> list[int]:
        return self._call(self.client.get_many_pairs(reads, consistency))

    def scan(self, table: str, prefix: str = "", page_size: int = 1000,
             consistency: str = "quorum") -> Generator[tuple[str, int], None, None]:
        """``CounterClient.scan`` as a plain iterator (arguments checked now); ``close()`` it
        to stop early."""
        pages = self.client.scan_pages(table, prefix, page_size, consistency)
        return (item for page in self._iterate(pages) for item in page)

    def scan_pages(self, table: str, prefix: str = "", page_size: int = 1000,
                   consistency: str = "quorum") -> Generator[list[tuple[str, int]], None, None]:
        return self._iterate(self.client.scan_pages(table, prefix, page_size, consistency))

    def _iterate(self, agen: AsyncIterator[T]) -> Generator[T, None, None]:
        """Each step of ``agen`` run on the loop; closing the iterator closes it there."""
        try:
            while True:
                done, item = self._call(_step(agen))
                if done:
                    return
                yield item
        finally:
            if self._loop is not None:
                self._call(_close(agen))

    def delete(self, table: str, key: str) -> AddResult:
        return self._call(self.client.delete(table, key))

    def set_table(self, table: str, ttl_s: float | None = None) -> dict[str, Any]:
        return self._call(self.client.set_table(table, ttl_s))

    def tables(self) -> list[dict[str, Any]]:
        return self._call(self.client.tables())

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


async def _step(agen: AsyncIterator[T]) -> tuple[bool, Any]:
    try:
        return False, await agen.__anext__()
    except StopAsyncIteration:
        return True, None


async def _close(agen: AsyncIterator[Any]) -> None:
    aclose = getattr(agen, "aclose", None)
    if aclose is not None:
        await aclose()
