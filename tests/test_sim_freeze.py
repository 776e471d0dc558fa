"""The simulator's frozen machines (``cluster.sim.loop``): a paused machine's callbacks, timers
and tasks stop while virtual time goes on, and run late, in asyncio's order, when it wakes."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.sim.loop import Held, SimLoop, owned, run_as, thaw


class Machine:
    def __init__(self) -> None:
        self.paused = False
        self.held: list[Held] = []


def _run(main: Any) -> Any:
    loop = SimLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


async def _ticks(out: list[float], every: float, n: int) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(n):
        await asyncio.sleep(every)
        out.append(round(loop.time(), 6))


def test_a_frozen_machine_runs_nothing_and_wakes_late() -> None:
    """Its task's timer comes due during the freeze and fires only at the wake; a machine
    beside it keeps its pace."""
    frozen, other = Machine(), Machine()
    ticks: list[float] = []
    beside: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = loop.create_task(_ticks(ticks, 0.1, 10), context=owned(frozen))
        b = loop.create_task(_ticks(beside, 0.1, 10), context=owned(other))
        await asyncio.sleep(0.35)
        frozen.paused = True
        await asyncio.sleep(2.0)
        assert not a.done()
        frozen.paused = False
        thaw(frozen)
        await asyncio.gather(a, b)

    _run(main)
    assert ticks[:3] == [0.1, 0.2, 0.3]
    assert ticks[3] == 2.35  # the 0.4 tick was held until the wake
    assert all(t > 2.35 for t in ticks[4:])
    assert beside == [round(0.1 * i, 6) for i in range(1, 11)]


def test_a_timer_cancelled_while_held_never_runs() -> None:
    m = Machine()
    fired: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        handle = run_as(m, loop.call_later, 0.1, fired.append, "late")
        m.paused = True
        await asyncio.sleep(0.5)
        assert m.held and not fired  # due, held
        handle.cancel()
        m.paused = False
        thaw(m)
        await asyncio.sleep(0.1)

    _run(main)
    assert fired == []


def test_the_woken_machine_reads_its_sockets_before_its_overdue_timers() -> None:
    """asyncio's order: what was ready, then I/O, then the timers that came due."""
    m = Machine()
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        run_as(m, loop.call_later, 0.2, order.append, "timer")
        m.paused = True
        run_as(m, loop.call_soon, order.append, "ready")  # scheduled by its own code
        await asyncio.sleep(1.0)
        m.paused = False
        thaw(m, [lambda: order.append("frame")])
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    _run(main)
    assert order == ["ready", "frame", "timer"]


def test_frames_on_the_wire_are_not_held_by_the_senders_freeze() -> None:
    """Work with no owner (the network's deliveries) runs while every machine is frozen."""
    m = Machine()
    got: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        m.paused = True
        loop.call_later(0.3, lambda: got.append(loop.time()))
        await asyncio.sleep(1.0)

    _run(main)
    assert got == [0.3]
