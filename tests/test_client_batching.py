"""When the SDK's automatic batches leave (``client.batcher.Batcher``): no network, a fake
``run`` that holds each batch until the test lets it end."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import pytest

from client import ClientConfig, ConfigurationError
from client.batcher import Batcher
from client.retry import AddResult, PendingOp


async def wait_until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


class Runs:
    """A ``run`` that records each batch and ends it when ``end(i)`` is called."""

    def __init__(self) -> None:
        self.batches: list[list[PendingOp]] = []
        self._ends: list[asyncio.Event] = []

    async def __call__(self, ops: list[PendingOp]) -> None:
        ended = asyncio.Event()
        self.batches.append(ops)
        self._ends.append(ended)
        await ended.wait()
        for op in ops:
            op.finish(AddResult(op.op_id, op.delta, True, False, 1, "fake"))

    def end(self, i: int) -> None:
        self._ends[i].set()

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


def batcher(runs: Runs, **kw: float) -> Batcher:
    seq = itertools.count()

    def new_op(table: str, key: str, delta: int, kind: str) -> PendingOp:
        return PendingOp(table, key, delta, f"c:{next(seq)}", 0.0, 1e9, kind)

    args = {"interval": 60.0, "max_ops": 500, "max_in_flight": 2, "max_wait": 60.0, **kw}
    return Batcher(new_op, runs, interval=args["interval"], max_ops=int(args["max_ops"]),
                   coalesce=False, on_coalesce=lambda: None,
                   max_in_flight=int(args["max_in_flight"]), max_wait=args["max_wait"])


async def test_a_lone_op_leaves_in_its_own_loop_turn() -> None:
    """Nothing is out: the op does not wait for the interval (a minute here) to find company;
    ops issued in the same turn still leave together."""
    runs = Runs()
    b = batcher(runs)
    first = [b.add("t", f"k{i}", 1) for i in range(3)]
    await wait_until(lambda: runs.sizes == [3], timeout=5)
    runs.end(0)
    assert [(await f).delta for f in first] == [1, 1, 1]


async def test_ops_gather_while_every_batch_is_out_and_leave_when_one_ends() -> None:
    runs = Runs()
    b = batcher(runs)
    b.add("t", "a", 1)
    await wait_until(lambda: runs.sizes == [1], timeout=5)
    b.add("t", "b", 1)
    await wait_until(lambda: runs.sizes == [1, 1], timeout=5)
    later = []
    for i in range(5):  # two batches out: these gather, over several loop turns
        later.append(b.add("t", f"c{i}", 2))
        await asyncio.sleep(0)
    assert runs.sizes == [1, 1] and b.in_flight == 3
    runs.end(0)
    await wait_until(lambda: runs.sizes == [1, 1, 5], timeout=5)
    runs.end(1)
    runs.end(2)
    assert [(await f).delta for f in later] == [2] * 5


async def test_a_stuck_batch_holds_the_gathered_ops_no_longer_than_max_wait() -> None:
    runs = Runs()
    b = batcher(runs, max_in_flight=1, max_wait=0.05)
    b.add("t", "a", 1)
    await wait_until(lambda: runs.sizes == [1], timeout=5)
    b.add("t", "b", 1)
    b.add("t", "c", 1)
    await wait_until(lambda: runs.sizes == [1, 2], timeout=5)  # batch 0 had not ended
    runs.end(0)
    runs.end(1)


async def test_max_in_flight_zero_batches_by_the_interval() -> None:
    """The fixed window: an op waits ``interval`` for company even with nothing out."""
    runs = Runs()
    b = batcher(runs, max_in_flight=0, interval=0.05)
    b.add("t", "a", 1)
    for _ in range(3):
        await asyncio.sleep(0)
    assert runs.sizes == []
    b.add("t", "b", 1)
    await wait_until(lambda: runs.sizes == [2], timeout=5)
    runs.end(0)


async def test_a_full_batch_leaves_at_once_even_at_the_limit() -> None:
    runs = Runs()
    b = batcher(runs, max_in_flight=1, max_ops=4)
    b.add("t", "a", 1)
    await wait_until(lambda: runs.sizes == [1], timeout=5)
    for i in range(4):
        b.add("t", f"k{i}", 1)
    assert runs.sizes == [1]  # the task is created; its run starts at the next turn
    await wait_until(lambda: runs.sizes == [1, 4], timeout=5)
    runs.end(0)
    runs.end(1)


def test_max_batches_in_flight_is_validated() -> None:
    assert ClientConfig(nodes=("h:1",)).max_batches_in_flight == 2
    assert ClientConfig(nodes=("h:1",), max_batches_in_flight=0).max_batches_in_flight == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="max_batches_in_flight"):
            ClientConfig(nodes=("h:1",), max_batches_in_flight=bad)  # type: ignore[arg-type]
