"""TickBatcher: calls made in one loop turn run as one batch; results and errors fan back out."""

from __future__ import annotations

import asyncio

import pytest

from cluster.roles.batching import TickBatcher


async def test_one_turn_one_batch_sliced_results() -> None:
    seen: list[list[int]] = []

    async def process(items: list[int]) -> list[int]:
        seen.append(items)
        return [x * 10 for x in items]

    b: TickBatcher[int] = TickBatcher(process)
    futs = [b.submit([1, 2]), b.submit([3]), b.submit([4, 5, 6])]
    assert await asyncio.gather(*futs) == [[10, 20], [30], [40, 50, 60]]
    assert seen == [[1, 2, 3, 4, 5, 6]]
    assert await b.submit([7]) == [70]  # a later turn is a new batch
    assert (b.batches, b.items) == (2, 7)


async def test_scalar_result_and_errors_reach_every_caller() -> None:
    loop = asyncio.get_running_loop()

    def durable(items: list[int]) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_soon(fut.set_result, None)
        return fut

    b: TickBatcher[int] = TickBatcher(durable)
    assert await asyncio.gather(b.submit([1]), b.submit([2])) == [None, None]

    def broken(items: list[int]) -> asyncio.Future[None]:
        raise RuntimeError("log closed")

    b = TickBatcher(broken)
    f1, f2 = b.submit([1]), b.submit([2])
    for f in (f1, f2):
        with pytest.raises(RuntimeError, match="log closed"):
            await f
