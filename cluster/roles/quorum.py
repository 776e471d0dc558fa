"""Small pieces the write path shares: the durable incarnation counter and quorum waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.wal.files import write_durably


def next_incarnation(data_dir: Path, at_least: int = 0) -> int:
    """Read, bump and durably store this data directory's incarnation number (no lower than
    ``at_least``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "incarnation"
    try:
        current = int(path.read_text().strip() or 0)
    except FileNotFoundError:
        current = 0
    value = max(current + 1, at_least)
    write_durably(path, f"{value}\n")
    return value


def quorum_future(futures: Sequence[asyncio.Future[Any]], need: int,
                  timeout: float) -> asyncio.Future[bool]:
    """Resolves True once ``need`` of ``futures`` succeed (a result other than False), False
    when that became impossible or ``timeout`` passed. Callbacks, not ``asyncio.wait``: no task
    per wait on the hot path."""
    # the futures' loop: get_running_loop() costs a getpid() syscall on Python 3.11
    loop = futures[0].get_loop() if futures else asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()
    if need <= 0:
        done.set_result(True)
        return done
    state = [0, 0]  # successes, failures
    total = len(futures)

    def on_done(f: asyncio.Future[Any]) -> None:
        if done.done():
            if not f.cancelled():
                f.exception()  # consume it: a late failure is expected, not an error
            return
        if f.cancelled() or f.exception() is not None or f.result() is False:
            state[1] += 1
        else:
            state[0] += 1
        if state[0] >= need:
            done.set_result(True)
            timer.cancel()
        elif state[1] > total - need:
            done.set_result(False)
            timer.cancel()

    def on_timeout() -> None:
        if not done.done():
            done.set_result(False)

    timer = loop.call_later(timeout, on_timeout)
    for f in futures:
        f.add_done_callback(on_done)
    return done
