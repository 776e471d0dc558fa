"""Merge the calls made in one event-loop turn into one batch call.

A node receives many small calls at once: one-op HTTP requests, FORWARD frames from several
coordinators, REPLICATE frames from several leaders. Merging them costs nothing in latency (the
batch runs at the end of the same loop turn) and makes the fixed costs per batch (a vectorised
dedup call, a log append, a frame per peer) shared by more ops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class TickBatcher(Generic[T]):
    """``submit(items)`` returns a future of this call's share of ``process(all items)``.

    ``process`` gets the concatenated items and returns an awaitable of either a list aligned
    with them (each caller gets its slice) or one value (every caller gets it).

    With ``side`` (a default value), each item also carries one side value, given per call to
    ``submit(items, side_values)`` or the default, and ``process(items, side_values)`` gets
    them aligned with the items (the leader's per-op time limits).
    """

    def __init__(self, process: Callable[..., Awaitable[Any]], *, side: Any = None) -> None:
        self._process = process
        self._default = side
        self._items: list[T] = []
        self._side: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, int, asyncio.Future[Any]]] = []
        self._scheduled = False
        self.batches = 0
        self.items = 0

    def submit(self, items: list[T], side_values: list[Any] | None = None) -> asyncio.Future[Any]:
        loop = self._loop  # kept: get_running_loop() costs a getpid() syscall on Python 3.11
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._waiters.append((len(self._items), len(items), fut))
        self._items.extend(items)
        if self._default is not None:
            self._side.extend([self._default] * len(items) if side_values is None
                              else side_values)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        items, side, waiters = self._items, self._side, self._waiters
        self._items, self._side, self._waiters, self._scheduled = [], [], [], False
        self.batches += 1
        self.items += len(items)
        try:
            result = asyncio.ensure_future(self._process(items) if self._default is None
                                           else self._process(items, side), loop=self._loop)
        except Exception as exc:  # the batch could not even start: every caller learns why
            _fail(waiters, exc)
            return
        result.add_done_callback(lambda f: _distribute(f, waiters))


def _fail(waiters: list[tuple[int, int, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, _, fut in waiters:
        if not fut.done():
            fut.set_exception(exc)


def _distribute(done: asyncio.Future[Any], waiters: list[tuple[int, int, asyncio.Future[Any]]]
                ) -> None:
    if done.cancelled():
        _fail(waiters, asyncio.CancelledError())
        return
    exc = done.exception()
    if exc is not None:
        _fail(waiters, exc)
        return
    result = done.result()
    if isinstance(result, list):
        for start, count, fut in waiters:
            if not fut.done():
                fut.set_result(result[start : start + count])
    else:
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_result(result)
