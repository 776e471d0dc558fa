"""``SimLoop``: an asyncio event loop on virtual time, with no I/O at all.

``BaseEventLoop._run_once`` asks its selector to wait until the next timer is due; our selector
waits by moving the clock there instead. Callbacks run in exactly the order asyncio gives them
(ready queue first, then timers by deadline, ties in scheduling order), so a run is a pure
function of its inputs. Nothing may wait for a file descriptor or a thread: the simulated
network and disk are timers too.

A machine can be frozen whole, as SIGSTOP (or a long GC pause, or a stolen VM) freezes a
process: every callback runs in a context naming its owner (``OWNER``: the machine whose node
scheduled it, directly or through a task it spawned), and a callback whose owner is frozen when
it comes due is held, in order, until the owner thaws (``thaw``), then runs, late. Virtual time
goes on meanwhile, so a thawed node finds its timers overdue and its monotonic clock jumped,
and acts on what it believed before the freeze.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, Protocol

OWNER: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("sim_owner", default=None)


class Owner(Protocol):
    """A machine whose callbacks can be frozen (``cluster.sim.world.Host``)."""

    paused: bool
    held: list[Held]


class Held:
    """One callback of an owner: runs now, or waits in ``owner.held`` while it is frozen."""

    __slots__ = ("owner", "callback", "args", "context", "handle", "timer")

    def __init__(self, owner: Owner, callback: Callable[..., Any], args: tuple[Any, ...],
                 context: contextvars.Context, timer: bool = False) -> None:
        self.owner, self.callback, self.args, self.context = owner, callback, args, context
        self.handle: asyncio.Handle | None = None
        self.timer = timer  # a timer that came due (else: a callback that was ready)

    def __call__(self) -> None:
        if self.handle is not None and self.handle.cancelled():
            return  # cancelled while it was held
        if self.owner.paused:
            self.owner.held.append(self)
        else:
            self.callback(*self.args)


def run_as(owner: Owner | None, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` now as ``owner``'s code: what it schedules belongs to ``owner``."""
    ctx = contextvars.copy_context()
    return ctx.run(_as, owner, fn, args)


def _as(owner: Owner | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    OWNER.set(owner)
    return fn(*args)


def owned(owner: Owner | None) -> contextvars.Context:
    """A fresh context for a task of ``owner``."""
    ctx = contextvars.copy_context()
    ctx.run(OWNER.set, owner)
    return ctx


def thaw(owner: Owner, inbox: list[Callable[[], None]] | None = None) -> None:
    """``owner`` runs again, in the order asyncio would: the callbacks that were ready when it
    froze, then what waited in its sockets (``inbox``: each delivered as its code), then the
    timers that came due meanwhile. A woken node thus reads the frames that queued before its
    overdue timers (its failure detector, say) have run."""
    held, owner.held = owner.held, []
    loop = asyncio.get_running_loop()
    for cb in held:
        if not cb.timer:
            loop.call_soon(cb, context=cb.context)
    for deliver in inbox or ():
        loop.call_soon(run_as, owner, deliver, context=contextvars.Context())
    for cb in held:
        if cb.timer:
            loop.call_soon(cb, context=cb.context)


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

    def call_soon(self, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        if context is None:
            context = contextvars.copy_context()
        if isinstance(callback, Held):
            return super().call_soon(callback, context=context)
        owner = context.get(OWNER)
        if owner is None:
            return super().call_soon(callback, *args, context=context)
        held = Held(owner, callback, args, context)
        held.handle = super().call_soon(held, context=context)
        return held.handle

    def call_at(self, when: float, callback: Callable[..., Any],  # type: ignore[override]
                *args: Any, context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if context is None:
            context = contextvars.copy_context()
        owner = context.get(OWNER)
        if owner is None:
            return super().call_at(when, callback, *args, context=context)
        held = Held(owner, callback, args, context, timer=True)
        handle = super().call_at(when, held, context=context)
        held.handle = handle
        return handle

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass
