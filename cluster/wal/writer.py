"""The group-commit writer: ``DurableLog`` appends records durably, rotates and snapshots.

An op is acknowledged only after its record is on disk, so ``append`` returns only after an
fsync that covers it. Many concurrent appends share one ``write`` and one fsync (group commit):
one writer thread per log takes everything queued since its last commit, writes and fsyncs it,
and hands the outcome back to the event loop with one ``call_soon_threadsafe``, so the loop
keeps serving while the disk works. (It replaced a writer task that crossed to a worker thread
with ``run_in_executor`` for every commit: an executor future, a wrapped asyncio future and a
task wakeup per fsync, the largest part of one op's CPU in ``bench/bench_hotpath.py``.) With
``fsync=False`` or ``fsync_in_loop`` there is no thread: what one loop turn queued is written at
the end of that turn. Encoding lives in ``cluster.wal.records``, segment names
and reading in ``cluster.wal.segments``, snapshot files and the recovery ``start`` runs in
``cluster.wal.files``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import msgpack

from cluster.core.errors import ConfigError
from cluster.wal.active import ActiveSegment
from cluster.wal.errors import LogClosedError, LogError, LogWriteError
from cluster.wal.files import (
    _delete_covered,
    _read_snapshot,
    _recover,
    _Recovered,
    _write_snapshot_file,
)
from cluster.wal.records import LogRecord, encode_columns, encode_records
from cluster.wal.segments import _segment_name, decode_segment
from cluster.wal.stats import LogStats, _MutableStats

__all__ = ["DurableLog"]

log = logging.getLogger("cluster.wal")  # the name the single-module log used; filters keep it


class _Rotation:
    """Queue marker: records before it go to the current segment, records after it to the next."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[int]) -> None:
        self.future = future


_Entry = tuple[bytes, int, "asyncio.Future[None]"]  # encoded frames, record count, ack
LAZY_DELAY = 0.05  # seconds an ``append_lazily`` record waits at most for another commit
_STOP = _Rotation.__new__(_Rotation)  # queue marker: the writer thread ends after what is before


class SnapshotCut(Protocol):
    """A snapshot taken at the rotation instant and finished later (``write_snapshot``): its
    blob, or the parts whose concatenation is the blob (written without joining them)."""

    async def finish(self) -> bytes | Sequence[bytes | memoryview]: ...


class DurableLog:
    """Append-only, group-committed, crash-safe log of ``LogRecord`` plus snapshots.

    Config (validated here, ``ConfigError`` names the field):
        directory            holds the segments and snapshots; created if missing
        fsync = True         False skips fsync (benchmarks, tests); framing is unchanged
        max_batch_records    >= 1, records per write+fsync; one append is never split
        segment_bytes        >= 1, a segment is closed once it reaches this size
        fsync_in_loop=False  True: write and fsync on the event-loop thread, blocking the loop
                             for the fsync, instead of in the log's worker thread (saves the
                             thread round trip; see ``bench/bench_hotpath.py``)

    Lifecycle: ``start`` (recover) -> ``load_snapshot``/``replay`` -> appends and snapshots ->
    ``stop`` (drain and close) or ``abort`` (close now, as a crash would).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        fsync: bool = True,
        max_batch_records: int = 10_000,
        segment_bytes: int = 64 << 20,
        fsync_in_loop: bool = False,
        archive: bool = False,
    ) -> None:
        if max_batch_records < 1:
            raise ConfigError(f"max_batch_records must be >= 1, got {max_batch_records}")
        if segment_bytes < 1:
            raise ConfigError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self._dir = Path(directory)
        self._fsync = fsync
        self._fsync_in_loop = fsync_in_loop
        self._archive = archive  # covered segments go to <dir>/archive/ instead of away
        self._max_batch = max_batch_records
        self._segment_bytes = segment_bytes
        self._pack = msgpack.Packer().pack
        # Loop side: everything queued and not yet answered, in queue order (the writer
        # answers in that order). Writer side: the same items, handed over through ``_q``
        # (the thread) or ``_turn`` (written at the end of the loop turn, no thread).
        self._unacked: deque[_Entry | _Rotation] = deque()
        self._q: queue.SimpleQueue[_Entry | _Rotation] = queue.SimpleQueue()
        self._turn: list[_Entry | _Rotation] = []
        self._threaded = fsync and not fsync_in_loop
        # ``append_lazily``: records that wait for the next commit (or LAZY_DELAY)
        self._lazy: list[_Entry] = []
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._running = False
        self._closing = False
        self._failure: LogWriteError | None = None
        self._recovered: _Recovered | None = None
        self._snapshot: tuple[int, Path] | None = None
        self._segment: ActiveSegment | None = None  # the file appended to (writer side)
        self._thread: threading.Thread | None = None
        self._done: asyncio.Future[None] | None = None  # the writer has stopped
        self._aborted = False
        self._snapshot_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = _MutableStats()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running or self._recovered is not None:
            raise RuntimeError("DurableLog.start() called twice")
        self._loop = loop = asyncio.get_running_loop()
        rec = await loop.run_in_executor(None, _recover, self._dir, self._fsync)
        seq, size = rec.segments[-1] if rec.segments else (rec.next_seq, 0)
        self._segment = await loop.run_in_executor(
            None, lambda: ActiveSegment(self._dir, seq, size, fsync=self._fsync,
                                        create=not rec.segments)
        )
        self._recovered = rec
        self._snapshot = rec.snapshot
        self._snapshot_lock = asyncio.Lock()
        self._done = loop.create_future()
        self._running = True
        if self._threaded:
            self._thread = threading.Thread(
                target=self._thread_main, name=f"wal-writer:{self._dir.name}", daemon=True
            )
            self._thread.start()

    async def stop(self) -> None:
        """Write and fsync everything appended so far, finish a running snapshot, close."""
        if not self._running:
            return
        assert self._done is not None and self._snapshot_lock is not None
        if not self._closing:
            self._closing = True
            self._enqueue(_STOP)
        try:
            await asyncio.shield(self._done)
            async with self._snapshot_lock:
                pass
        except asyncio.CancelledError:
            self.abort()
            raise
        self._close()

    def abort(self) -> None:
        """Close now without writing what is queued, as a crash would; pending appends fail.

        Blocks at most for an fsync already running in the writer thread: closing the fd under
        it could hand its number to another file before the thread is done with it.
        """
        if not self._running:
            return
        self._aborted = True
        closed = LogClosedError("log aborted before the records were durable")
        for item in self._unacked:
            fut = item.future if isinstance(item, _Rotation) else item[2]
            if not fut.done():
                fut.set_exception(closed)
                fut.exception()  # the caller hears it when it awaits; no "never retrieved"
        for entry in self._lazy:
            entry[2].cancel()
        self._lazy.clear()
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._unacked.clear()
        self._turn.clear()
        if self._thread is not None:
            self._q.put(_STOP)
        self._close()

    def _close(self) -> None:
        self._running = False
        if self._segment is not None:
            self._segment.close()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def __aenter__(self) -> DurableLog:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------ reading

    def load_snapshot(self) -> bytes | None:
        """The latest complete snapshot blob, or None when the log has none."""
        if self._recovered is None:
            raise LogClosedError("load_snapshot() before start()")
        if self._snapshot is None:
            return None
        seq, path = self._snapshot
        return _read_snapshot(path, seq)

    def replay(self) -> Iterator[LogRecord]:
        """Every record that was on disk after the snapshot when ``start`` ran, in append order.

        A pure read. Call it before appending or snapshotting: a snapshot deletes the segments
        it reads. Records are the exact values appended (``kind`` comes back as a plain int).
        """
        if self._recovered is None:
            raise LogClosedError("replay() before start()")
        return self._replay(self._recovered.segments)

    def _replay(self, segments: list[tuple[int, int]]) -> Iterator[LogRecord]:
        for seq, end in segments:
            path = self._dir / _segment_name(seq)
            with open(path, "rb") as f:
                buf = f.read(end)  # only what start() checked, even if appends followed
            yield from decode_segment(path, buf)

    def stats(self) -> LogStats:
        """A consistent copy of the counters (the live ones change with every batch)."""
        return self._stats.freeze()

    @property
    def directory(self) -> Path:
        return self._dir

    # ------------------------------------------------------------ writing

    def append_nowait(self, records: Sequence[LogRecord]) -> asyncio.Future[None]:
        """Queue records; the future resolves once they are durable (or fails, never both).

        Encoding happens now, so a bad record raises ValueError here and nothing is queued.
        Cancelling the future does not take the records back.
        """
        if self._failure is not None:
            raise self._failure
        if not self._running or self._closing:
            raise LogClosedError("append to a log that is not running")
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        if not records:
            fut.set_result(None)
            return fut
        self._enqueue((encode_records(records, self._pack), len(records), fut))
        return fut

    def append_lazily(self, records: Sequence[LogRecord]) -> None:
        """Queue records that nobody waits for (a node's PUBLISHED records): they ride with the
        next commit instead of forcing one, and are written within ``LAZY_DELAY`` seconds
        when no other append comes. A crash may lose them, as any unacknowledged append.
        Raises as ``append_nowait`` does (a closed or failed log, a bad record)."""
        if self._failure is not None:
            raise self._failure
        if not self._running or self._closing:
            raise LogClosedError("append to a log that is not running")
        if not records:
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        fut.add_done_callback(_consume)
        self._lazy.append((encode_records(records, self._pack), len(records), fut))
        if self._lazy_timer is None:
            self._lazy_timer = self._loop.call_later(LAZY_DELAY, self._flush_lazy)

    def _flush_lazy(self) -> None:
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        lazy, self._lazy = self._lazy, []
        for entry in lazy:
            self._enqueue_now(entry)

    async def append(self, records: Sequence[LogRecord]) -> None:
        """Return once the records are durable on disk (group-committed with other appends)."""
        await self.append_nowait(records)

    def append_columns_nowait(
        self,
        kind: int | Sequence[int],
        op_id: Sequence[str],
        table: str | Sequence[str],
        key: str | Sequence[str],
        delta: int | Sequence[int],
        origin: str | Sequence[str],
        p: int | Sequence[int],
        n: int | Sequence[int],
        ts: float | Sequence[float],
    ) -> asyncio.Future[None]:
        """``append_nowait`` for records given as columns, encoded with one msgpack call.

        ``op_id`` is a list with one id per record; every other field is either a list or
        tuple of the same length or one value shared by all the records (a node's APPLY batch
        shares kind, origin and ts). Replay yields the same ``LogRecord`` values, in order,
        as ``append_nowait`` of the rows would. The records of one call are one frame on
        disk (split only past 64 KiB), so a torn tail drops them together.
        """
        if self._failure is not None:
            raise self._failure
        if not self._running or self._closing:
            raise LogClosedError("append to a log that is not running")
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        data = encode_columns((kind, op_id, table, key, delta, origin, p, n, ts), self._pack)
        if not data:
            fut.set_result(None)
            return fut
        self._enqueue((data, len(op_id), fut))
        return fut

    async def append_columns(
        self,
        kind: int | Sequence[int],
        op_id: Sequence[str],
        table: str | Sequence[str],
        key: str | Sequence[str],
        delta: int | Sequence[int],
        origin: str | Sequence[str],
        p: int | Sequence[int],
        n: int | Sequence[int],
        ts: float | Sequence[float],
    ) -> None:
        """Return once the records are durable (see ``append_columns_nowait``)."""
        await self.append_columns_nowait(kind, op_id, table, key, delta, origin, p, n, ts)

    def barrier(self) -> asyncio.Future[None]:
        """Resolves once every record appended before this call is durable (lazy ones too)."""
        if self._failure is not None:
            raise self._failure
        if not self._running or self._closing:
            raise LogClosedError("barrier on a log that is not running")
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        if not self._unacked and not self._lazy:
            fut.set_result(None)
        else:  # an empty entry: it commits with (or right after) what was queued before it
            self._enqueue((b"", 0, fut))
        return fut

    async def write_snapshot(self, make_blob: Callable[[], bytes | SnapshotCut]) -> None:
        """Rotate and call ``make_blob()`` at that same instant, store it, drop covered segments.

        The blob must reflect every record whose append was called before this call (those go
        to the old segments, which are deleted); records appended later land in the new
        segment and are replayed on top of the snapshot. ``make_blob`` may instead return a
        ``SnapshotCut``, finished after the rotation while appends go on: its blob may then
        also reflect records appended meanwhile, so the snapshot file is written only once
        every record appended before ``finish`` returned is durable (``barrier``). Replay
        must be idempotent over such state (the node's is: pairs max-merge).
        """
        if not self._running or self._closing:
            raise LogClosedError("snapshot of a log that is not running")
        assert self._loop is not None and self._snapshot_lock is not None
        async with self._snapshot_lock:
            if self._failure is not None:
                raise self._failure
            if not self._running or self._closing:  # the writer may be gone: nobody would rotate
                raise LogClosedError("snapshot of a log that is not running")
            made = make_blob()  # no await from here to the marker: the cut is exact
            rotation = _Rotation(self._loop.create_future())
            self._enqueue(rotation)
            seq = await rotation.future
            blob: bytes | Sequence[bytes | memoryview]
            if isinstance(made, bytes | bytearray | memoryview):
                blob = bytes(made)
            else:
                blob = await made.finish()
                await self.barrier()
            try:
                # Default executor: a large blob must not delay the log writer's fsyncs.
                path = await self._loop.run_in_executor(
                    None, _write_snapshot_file, self._dir, seq, blob, self._fsync
                )
                self._snapshot = (seq, path)
                await self._loop.run_in_executor(
                    None, _delete_covered, self._dir, seq, self._archive, self._fsync)
            except OSError as exc:  # the segments are intact: appends go on, retry later
                raise LogError(f"snapshot {seq} in {self._dir}: {exc}") from exc

    # The writer: the thread (``_thread_main``), or the end of the loop turn (``_write_turn``),
    # runs ``_write_items`` over what was queued, in order; the loop learns the outcome through
    # ``_committed``, ``_rotated``, ``_fail`` and ``_stopped``, called on the loop.

    def _enqueue(self, item: _Entry | _Rotation) -> None:
        if self._lazy:  # they were appended first, and ride with this commit
            self._flush_lazy()
        self._enqueue_now(item)

    def _enqueue_now(self, item: _Entry | _Rotation) -> None:
        if item is not _STOP:  # the stop marker is answered by ``_stopped``
            self._unacked.append(item)
        if self._threaded:
            self._q.put(item)  # wakes the thread if it waits; else it takes it after its fsync
            return
        if not self._turn:
            assert self._loop is not None
            self._loop.call_soon(self._write_turn)
        self._turn.append(item)

    def _write_turn(self) -> None:
        items, self._turn = self._turn, []
        if self._running and not self._aborted:
            self._write_items(items, _call)

    def _thread_main(self) -> None:
        assert self._loop is not None
        loop, q = self._loop, self._q

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
                if self._aborted or not self._write_items(items, post):
                    return
        finally:
            post(self._stopped)

    def _write_items(self, items: Iterable[_Entry | _Rotation],
                     post: Callable[..., None]) -> bool:
        """Write ``items`` in order (entries in batches of at most ``max_batch_records``,
        each one write and one fsync); False once the writer must end (stopped or failed)."""
        chunk: list[bytes] = []
        count = 0
        try:
            for item in items:
                if isinstance(item, tuple):
                    if chunk and count + item[1] > self._max_batch:
                        self._commit_io(chunk, count, post)
                        chunk, count = [], 0
                    chunk.append(item[0])
                    count += item[1]
                    continue
                if chunk:
                    self._commit_io(chunk, count, post)
                    chunk, count = [], 0
                if item is _STOP:
                    if not self._threaded:
                        post(self._stopped)
                    return False
                assert self._segment is not None
                self._segment.rotate()
                post(self._rotated, self._segment.seq)
            if chunk:
                self._commit_io(chunk, count, post)
        except Exception as exc:  # noqa: BLE001 - poisons the log: every waiter hears it
            if not self._aborted:
                post(self._fail, exc)
            if not self._threaded:
                post(self._stopped)
            return False
        return True

    def _commit_io(self, chunk: list[bytes], count: int, post: Callable[..., None]) -> None:
        data = b"".join(chunk)
        segment = self._segment
        assert segment is not None
        seconds = segment.write(data)
        post(self._committed, len(chunk), count, len(data), seconds)
        if segment.size >= self._segment_bytes:
            segment.rotate()

    def _committed(self, entries: int, count: int, nbytes: int, seconds: float) -> None:
        """On the loop: the next ``entries`` queued appends are durable."""
        if self._aborted or self._failure is not None:
            return
        self._stats.add_batch(count, nbytes, seconds if self._fsync else None)
        unacked = self._unacked
        for _ in range(entries):
            fut = unacked.popleft()[2]  # type: ignore[index]
            if not fut.done():  # a cancelled append still got written; nothing to tell
                fut.set_result(None)

    def _rotated(self, seq: int) -> None:
        """On the loop: the next queued item, a snapshot's rotation, is done."""
        if self._aborted or self._failure is not None:
            return
        rotation = self._unacked.popleft()
        assert isinstance(rotation, _Rotation)
        if not rotation.future.done():
            rotation.future.set_result(seq)

    def _stopped(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        """Poison the log: fail every waiting append, refuse new ones (on the loop)."""
        if self._failure is not None:
            return
        if isinstance(exc, LogError):
            failure = LogWriteError(str(exc))
        else:
            where = self._segment.path if self._segment is not None else self._dir
            failure = LogWriteError(f"write to {where}: {exc}")
        failure.__cause__ = exc
        self._failure = failure
        log.error("durable log failed, refusing further appends: %s", exc)
        for item in self._unacked:
            fut = item.future if isinstance(item, _Rotation) else item[2]
            if not fut.done():
                fut.set_exception(failure)
        self._unacked.clear()


def _call(fn: Callable[..., None], *args: Any) -> None:
    """``post`` for the writer that runs on the loop: call at once."""
    fn(*args)


def _consume(fut: asyncio.Future[None]) -> None:
    """A lazy append's outcome: nobody waits for it (no "exception never retrieved")."""
    if not fut.cancelled():
        fut.exception()
