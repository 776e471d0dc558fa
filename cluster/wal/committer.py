"""The writer side of ``DurableLog``: the ``Committer`` writes and fsyncs what the loop queued.

An op is acknowledged only after its record is on disk, so an append's future resolves only
after an fsync that covers it. Many concurrent appends share one ``write`` and one fsync (group
commit): one writer thread per log (``Committer.start``) takes everything queued since its last
commit, writes and fsyncs it, and hands the outcome back to the event loop, so the loop keeps
serving while the disk works. (It replaced a writer task that crossed to a worker thread with
``run_in_executor`` for every commit: an executor future, a wrapped asyncio future and a task
wakeup per fsync, the largest part of one op's CPU in ``bench/bench_hotpath.py``.) With
``fsync=False`` or ``fsync_in_loop`` there is no thread: the log calls ``write_items`` at the
end of the loop turn that queued the items.

The thread runs one of two loops with the same outcomes:

- ``cluster/wal/_writer.pyx`` (compiled when ``pip install -e .`` finds a C compiler; off with
  ``IDC_WAL_KERNEL=0``): the queue is a C array, and the thread waits, writes, fdatasyncs and
  tells the loop (an eventfd it reads) without the GIL, coming back to Python only for markers,
  a full segment or an error. Under load the loop holds the GIL nearly always, and each time
  the Python thread took it back (after the queue, the write and the fsync) cost a handover.
- otherwise a ``SimpleQueue`` and ``write_items``, posting each outcome with
  ``call_soon_threadsafe``.

The queue holds entries (encoded frames, record count, ack future) and markers: a ``_Rotation``
(a snapshot's cut: the next records go to a new segment) and ``_STOP`` (the writer ends after
what is before it). Items are written in queue order and their outcomes posted in that order,
through the log's callbacks (``committed``, ``rotated``, ``fail``, ``stopped``), which run on
the loop. The file itself, its writes, fsyncs and rotations, is ``cluster.wal.active``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from cluster.core.compiled import optional
from cluster.wal.active import ActiveSegment
from cluster.wal.frames import MAX_COMMIT_BYTES

_native, NATIVE_WHY_NOT = optional("cluster.wal._writer", "IDC_WAL_KERNEL")


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
        *,
        max_batch_records: int,
        threaded: bool,
        committed: Callable[[int, int, int, float], None],
        rotated: Callable[[int], None],
        fail: Callable[[BaseException], None],
        stopped: Callable[[], None],
    ) -> None:
        self.q: queue.SimpleQueue[_Entry | _Rotation] = queue.SimpleQueue()
        self.max_batch = max_batch_records
        self.threaded = threaded
        self.segment: ActiveSegment | None = None  # the file appended to, from ``start``
        self.thread: threading.Thread | None = None
        self.aborted = False
        self._committed, self._rotated = committed, rotated
        self._fail, self._stopped = fail, stopped
        # the compiled loop (``_writer.GroupCommit``), its eventfd and the markers it queued
        self.native = threaded and _native is not None and hasattr(os, "eventfd")  # Linux
        self._gc: Any = None
        self._efd = -1
        self._markers: deque[_Rotation] = deque()
        self._wake_soon = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, segment: ActiveSegment, loop: asyncio.AbstractEventLoop, name: str) -> None:
        """Write to ``segment`` from now on; when threaded, start the thread that takes the
        queue."""
        self.segment, self._loop = segment, loop
        if not self.threaded:
            return
        main = self._thread_main
        if self.native:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._gc = _native.GroupCommit(self._efd)
            loop.add_reader(self._efd, self._wakeup)
            main = self._native_main
        self.thread = threading.Thread(target=main, args=(loop,), name=name, daemon=True)
        self.thread.start()

    def put(self, item: _Entry | _Rotation) -> None:
        """On the loop: queue an entry or a marker for the thread."""
        if self._gc is None:
            self.q.put(item)  # wakes the thread if it waits; else it takes it after its fsync
            return
        if type(item) is tuple:
            self._gc.push(item[0], item[1])
        else:
            self._markers.append(item)  # type: ignore[arg-type]
            self._gc.push_marker()
        if not self._wake_soon:  # at the end of this loop turn, with what else it queues
            self._wake_soon = True
            assert self._loop is not None
            self._loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_soon = False
        self._gc.wake()

    def abort(self) -> None:
        """On the loop: drop what is not written. Returns once no write or fsync runs (one in
        flight finishes first), so the log may close the segment."""
        self.aborted = True
        if self._gc is not None:
            self._gc.abort()
            assert self._loop is not None
            self._loop.remove_reader(self._efd)
        elif self.thread is not None:
            self.q.put(_STOP)

    # ------------------------------------------------------------ the compiled loop

    def _wakeup(self) -> None:
        """On the loop, when the thread's eventfd is readable: hand over what it committed."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        self._deliver()

    def _deliver(self) -> None:
        """Hand the log what the thread finished, in queue order: commits and rotations (so a
        commit after a rotation never reaches the log before it)."""
        if self.aborted:
            return
        for entries, records, nbytes, seconds, seq in self._gc.take():
            if seq < 0:
                self._committed(entries, records, nbytes, seconds)
            else:
                self._rotated(seq)

    def _native_main(self, loop: asyncio.AbstractEventLoop) -> None:
        gc, post = self._gc, _poster(loop)
        try:
            while True:
                segment = self.segment
                assert segment is not None
                segment.reserve()
                status, written, err = gc.run(segment.fd, segment.size, self.max_batch,
                                              MAX_COMMIT_BYTES, segment.room(), True)
                segment.wrote(written)
                if status == _native.ABORTED:
                    return
                if status == _native.ERROR:
                    post(self._deliver)  # what it committed reaches the log before the failure
                    if not self.aborted:
                        post(self._fail, OSError(err, os.strerror(err)))
                    return
                if status == _native.FULL:  # of its zeros (reserve more), or of records
                    if segment.full:
                        segment.rotate()
                    continue
                marker = self._markers.popleft()  # MARKER: the next item is one
                if marker is _STOP:
                    gc.pop_marker(-1)
                    return
                segment.rotate()
                gc.pop_marker(segment.seq)  # reaches the loop in order, as commits do
        except Exception as exc:  # noqa: BLE001 - poisons the log: every waiter hears it
            if not self.aborted:
                post(self._deliver)
                post(self._fail, exc)
        finally:
            if not post(self._finished):
                os.close(self._efd)  # the loop is gone: nobody reads it any more

    def _finished(self) -> None:
        """On the loop, once the compiled loop's thread has ended (after all it finished)."""
        assert self._loop is not None
        if not self.aborted:
            self._deliver()
            self._loop.remove_reader(self._efd)
        os.close(self._efd)
        self._stopped()

    # ------------------------------------------------------------ the Python loop

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        q, post = self.q, _poster(loop)
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
                    post: Callable[..., object]) -> bool:
        """Write ``items`` in order (entries in batches of at most ``max_batch_records``,
        each one write and one fsync); False once the writer must end (stopped or failed)."""
        chunk: list[bytes] = []
        count = nbytes = 0
        try:
            for item in items:
                if isinstance(item, tuple):
                    if chunk and (count + item[1] > self.max_batch
                                  or nbytes + len(item[0]) > MAX_COMMIT_BYTES):
                        self._commit_io(chunk, count, post)
                        chunk, count, nbytes = [], 0, 0
                    chunk.append(item[0])
                    count += item[1]
                    nbytes += len(item[0])
                    continue
                if chunk:
                    self._commit_io(chunk, count, post)
                    chunk, count, nbytes = [], 0, 0
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

    def _commit_io(self, chunk: list[bytes], count: int, post: Callable[..., object]) -> None:
        data = b"".join(chunk)
        segment = self.segment
        assert segment is not None
        seconds = segment.write(data)
        post(self._committed, len(chunk), count, len(data), seconds)
        if segment.full:
            segment.rotate()


def _poster(loop: asyncio.AbstractEventLoop) -> Callable[..., bool]:
    """``post`` for a writer thread: call on the loop; False when the loop is closed (then
    nobody is waiting any more)."""

    def post(fn: Callable[..., None], *args: Any) -> bool:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    return post


def _call(fn: Callable[..., None], *args: Any) -> None:
    """``post`` for the writer that runs on the loop: call at once."""
    fn(*args)
