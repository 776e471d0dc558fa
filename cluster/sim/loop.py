"""``SimLoop``: an asyncio event loop on virtual time, with no I/O at all.

``BaseEventLoop._run_once`` asks its selector to wait until the next timer is due; our selector
waits by moving the clock there instead. Callbacks run in exactly the order asyncio gives them
(ready queue first, then timers by deadline, ties in scheduling order), so a run is a pure
function of its inputs. Nothing may wait for a file descriptor or a thread: the simulated
network and disk are timers too.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Deadlock(RuntimeError):
    """Nothing ready and no timer pending: every task waits for something that never comes."""


class _VirtualSelector:
    """Waiting for events = letting virtual time pass until the next timer."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise Deadlock("no callback ready and no timer scheduled")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """``time()`` is virtual seconds since the start; it only moves when the loop is idle."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        when = self._now + seconds
        scheduled = self._scheduled  # type: ignore[attr-defined]  # land exactly on the next deadline (no float drift)
        if scheduled and abs(scheduled[0].when() - when) < 1e-7:
            when = max(when, scheduled[0].when())
        self._now = when

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass
