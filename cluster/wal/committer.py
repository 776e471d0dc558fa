"""The writer side of ``DurableLog``: the ``Committer`` writes and fsyncs what the loop queued.

An op is acknowledged only after its record is on disk, so an append's future resolves only
after an fsync that covers it. Many concurrent appends share one ``write`` and one fsync (group
commit): one writer thread per log (``Committer.start``) takes everything queued since its last
commit, writes and fsyncs it, and hands the outcome back to the event loop with one
``call_soon_threadsafe``, so the loop keeps serving while the disk works. (It replaced a writer
task that crossed to a worker thread with ``run_in_executor`` for every commit: an executor
future, a wrapped asyncio future and a task wakeup per fsync, the largest part of one op's CPU
in ``bench/bench_hotpath.py``.) With ``fsync=False`` or ``fsync_in_loop`` there is no thread:
the log calls ``write_items`` at the end of the loop turn that queued the items.

The queue holds entries (encoded frames, record count, ack future) and markers: a ``_Rotation``
(a snapshot's cut: the next records go to a new segment) and ``_STOP`` (the writer ends after
what is before it). Items are written in queue order and their outcomes posted in that order,
through the log's callbacks (``committed``, ``rotated``, ``fail``, ``stopped``), which run on
the loop. The file itself, its writes, fsyncs and rotations, is ``cluster.wal.active``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from cluster.wal.active import ActiveSegment


class _Rotation:
    """Queue marker: records before it go to the current segment, records after it to the next."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[int]) -> None:
        self.future = future


_Entry = tuple[bytes, int, "asyncio.Future[None]"]  # encoded frames, record count, ack
_STOP = _Rotation.__new__(_Rotation)  # queue marker: the writer thread ends after what is before


class Committer:
    """Writes the items of ``q`` (or those handed to ``write_items``) to the active segment.

    ``committed(entries, records, nbytes, seconds)``: the next ``entries`` queued entries are
    durable; ``rotated(seq)``: the next queued item, a rotation, is done (the new segment's
    seq); ``fail(exc)``: writing failed, the writer ends; ``stopped()``: the writer has ended.
    The log sets ``aborted`` (on the loop) to make the writer drop what it has not written and
    stop posting outcomes other than ``stopped``.
    """

    def __init__(
        self,
        q: queue.SimpleQueue[_Entry | _Rotation],
        *,
        max_batch_records: int,
        segment_bytes: int,
        threaded: bool,
        committed: Callable[[int, int, int, float], None],
        rotated: Callable[[int], None],
        fail: Callable[[BaseException], None],
        stopped: Callable[[], None],
    ) -> None:
        self.q = q
        self.max_batch = max_batch_records
        self.segment_bytes = segment_bytes
        self.threaded = threaded
        self.segment: ActiveSegment | None = None  # the file appended to, from ``start``
        self.thread: threading.Thread | None = None
        self.aborted = False
        self._committed, self._rotated = committed, rotated
        self._fail, self._stopped = fail, stopped

    def start(self, segment: ActiveSegment, loop: asyncio.AbstractEventLoop, name: str) -> None:
        """Write to ``segment`` from now on; when threaded, start the thread that takes ``q``."""
        self.segment = segment
        if self.threaded:
            self.thread = threading.Thread(
                target=self._thread_main, args=(loop,), name=name, daemon=True
            )
            self.thread.start()

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        q = self.q

        def post(fn: Callable[..., None], *args: Any) -> None:
            # a closed loop raises RuntimeError: nobody is waiting any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

        try:
            while True:
                items = [q.get()]
                while True:
                    try:
                        items.append(q.get_nowait())
                    except queue.Empty:
                        break
                if self.aborted or not self.write_items(items, post):
                    return
        finally:
            post(self._stopped)

    def write_items(self, items: Iterable[_Entry | _Rotation],
                    post: Callable[..., None]) -> bool:
        """Write ``items`` in order (entries in batches of at most ``max_batch_records``,
        each one write and one fsync); False once the writer must end (stopped or failed)."""
        chunk: list[bytes] = []
        count = 0
        try:
            for item in items:
                if isinstance(item, tuple):
                    if chunk and count + item[1] > self.max_batch:
                        self._commit_io(chunk, count, post)
                        chunk, count = [], 0
                    chunk.append(item[0])
                    count += item[1]
                    continue
                if chunk:
                    self._commit_io(chunk, count, post)
                    chunk, count = [], 0
                if item is _STOP:
                    if not self.threaded:
                        post(self._stopped)
                    return False
                assert self.segment is not None
                self.segment.rotate()
                post(self._rotated, self.segment.seq)
            if chunk:
                self._commit_io(chunk, count, post)
        except Exception as exc:  # noqa: BLE001 - poisons the log: every waiter hears it
            if not self.aborted:
                post(self._fail, exc)
            if not self.threaded:
                post(self._stopped)
            return False
        return True

    def _commit_io(self, chunk: list[bytes], count: int, post: Callable[..., None]) -> None:
        data = b"".join(chunk)
        segment = self.segment
        assert segment is not None
        seconds = segment.write(data)
        post(self._committed, len(chunk), count, len(data), seconds)
        if segment.size >= self.segment_bytes:
            segment.rotate()


def _call(fn: Callable[..., None], *args: Any) -> None:
    """``post`` for the writer that runs on the loop: call at once."""
    fn(*args)
