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
    """A ``run`` that records each batch (and the leader it went to) and ends it when
    ``end(i)`` is called."""

    def __init__(self) -> None:
        self.batches: list[list[PendingOp]] = []
        self.leaders: list[str | None] = []
        self._ends: list[asyncio.Event] = []

    async def __call__(self, ops: list[PendingOp], leader: str | None) -> None:
        ended = asyncio.Event()
        self.batches.append(ops)
        self.leaders.append(leader)
        self._ends.append(ended)
        await ended.wait()
        for op in ops:
            op.finish(AddResult(op.op_id, op.delta, True, False, 1, "fake"))

    def end(self, i: int) -> None:
        self._ends[i].set()

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


async def out_one_by_one(b: Batcher, runs: Runs, *keys: str) -> None:
    """An add of each key, each waited for until its batch has left (a batch each)."""
    for key in keys:
        sent = len(runs.sizes)
        b.add("t", key, 1)
        await wait_until(lambda sent=sent: len(runs.sizes) == sent + 1, timeout=5)


def batcher(runs: Runs, **kw: float) -> Batcher:
    """Keys starting with "s" are led by node "slow", the others by node "fast"."""
    seq = itertools.count()

    def new_op(table: str, key: str, delta: int, kind: str) -> PendingOp:
        return PendingOp(table, key, delta, f"c:{next(seq)}", 0.0, 1e9, kind)

    def route(table: str, key: str) -> str:
        return "slow" if key.startswith("s") else "fast"

    args = {"interval": 60.0, "max_ops": 500, "max_in_flight": 2, "max_wait": 60.0, **kw}
    return Batcher(new_op, runs, interval=args["interval"], max_ops=int(args["max_ops"]),
                   coalesce=False, on_coalesce=lambda: None,
                   max_in_flight=int(args["max_in_flight"]), max_wait=args["max_wait"],
                   route=route)


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
    await out_one_by_one(b, runs, "a", "b")
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


async def test_a_slow_leader_holds_back_only_the_ops_it_leads() -> None:
    """Each leader's ops have a lane of their own: with both of one node's batches out (it
    does not answer), another node's ops still leave as soon as they are issued, and a batch
    is one request to one leader."""
    runs = Runs()
    b = batcher(runs)
    await out_one_by_one(b, runs, "s1", "s2")
    b.add("t", "s3", 1)  # the slow node's lane is full: this one gathers
    fast = [b.add("t", f"f{i}", 1) for i in range(3)]
    await wait_until(lambda: len(runs.sizes) == 3, timeout=5)
    assert runs.sizes == [1, 1, 3] and runs.leaders == ["slow", "slow", "fast"]
    runs.end(2)
    assert [(await f).delta for f in fast] == [1, 1, 1]
    b.add("t", "f9", 1)  # the fast node's lane is free again: out at once
    await wait_until(lambda: len(runs.sizes) == 4, timeout=5)
    assert runs.leaders[3] == "fast"
    runs.end(0)  # the slow node answers one: what gathered for it leaves
    await wait_until(lambda: len(runs.sizes) == 5, timeout=5)
    assert runs.leaders[4] == "slow" and runs.sizes[4] == 1
    for i in (1, 3, 4):
        runs.end(i)


async def test_a_stuck_batch_holds_its_lane_for_twice_what_batches_lately_took() -> None:
    """Batches that ended at once teach the lane a short round trip; one that then never
    ends holds the ops gathered behind it for about twice that (here ``interval``, 20 ms),
    not for ``max_wait`` (a minute)."""
    runs = Runs()
    b = batcher(runs, max_in_flight=1, interval=0.02)
    for i in range(3):
        done = b.add("t", f"k{i}", 1)
        await wait_until(lambda i=i: len(runs.sizes) == i + 1, timeout=5)
        runs.end(i)
        await done
    b.add("t", "a", 1)  # batch 3: never answered
    await wait_until(lambda: len(runs.sizes) == 4, timeout=5)
    late = b.add("t", "b", 1)
    await wait_until(lambda: len(runs.sizes) == 5, timeout=5)  # left after ~20 ms
    assert runs.sizes[4] == 1 and b.in_flight == 2
    runs.end(4)
    assert (await late).delta == 1
    runs.end(3)


def test_max_batches_in_flight_is_validated() -> None:
    assert ClientConfig(nodes=("h:1",)).max_batches_in_flight == 1
    assert ClientConfig(nodes=("h:1",), max_batches_in_flight=0).max_batches_in_flight == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="max_batches_in_flight"):
            ClientConfig(nodes=("h:1",), max_batches_in_flight=bad)  # type: ignore[arg-type]
