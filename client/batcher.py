"""Automatic batching: adds issued within ``interval`` seconds leave together as one /v1/batch.

With ``coalesce``, adds to the same key inside one batch window merge into one op with one op id
(the "delayed batched requests" of seed 003): fewer ids and smaller batches, at the price that
the merged callers share one outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from client.retry import AddResult, PendingOp

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Batcher:
    def __init__(self, new_op: Callable[[str, str, int], PendingOp],
                 run: Callable[[list[PendingOp]], Awaitable[None]], *, interval: float,
                 max_ops: int, coalesce: bool, on_coalesce: Callable[[], None]) -> None:
        self._new_op = new_op
        self._run = run
        self.interval = interval
        self.max_ops = max_ops
        self.coalesce = coalesce
        self._on_coalesce = on_coalesce
        self._ops: list[PendingOp] = []
        self._by_key: dict[tuple[str, str], PendingOp] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, table: str, key: str, delta: int) -> asyncio.Future[AddResult]:
        fut: asyncio.Future[AddResult] = asyncio.get_running_loop().create_future()
        op = self._by_key.get((table, key)) if self.coalesce else None
        if op is not None and INT64_MIN <= op.delta + delta <= INT64_MAX:
            op.delta += delta
            op.coalesced += 1
            self._on_coalesce()
        else:
            op = self._new_op(table, key, delta)
            self._ops.append(op)
            if self.coalesce:
                self._by_key[(table, key)] = op
        op.waiters.append(fut)
        if len(self._ops) >= self.max_ops:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self.flush)
        return fut

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._ops:
            return
        ops, self._ops = self._ops, []
        self._by_key.clear()
        task = asyncio.ensure_future(self._run(ops))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def in_flight(self) -> int:
        return len(self._tasks) + (1 if self._ops else 0)

    async def drain(self) -> None:
        """Send what is queued and wait until every batch has an outcome."""
        self.flush()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def abort(self) -> None:
        self.flush()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
