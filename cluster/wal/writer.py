"""The group-commit log: ``DurableLog`` appends records durably, rotates and snapshots.

An op is acknowledged only after its record is on disk, so ``append`` returns only after an
fsync that covers it; many concurrent appends share one ``write`` and one fsync (group commit).
This module is the loop's side: the API, the queue of what is not yet answered (``_unacked``),
lazy appends, snapshots, and the callbacks through which the writer answers (``_committed``,
``_rotated``, ``_fail``, ``_stopped``). The writer side, the thread that writes and fsyncs
what was queued (or, without one, the write at the end of the loop turn), is
``cluster.wal.committer``; the segment file it appends to, ``cluster.wal.active``. Encoding
lives in ``cluster.wal.records``, segment names and reading in ``cluster.wal.segments``,
snapshot files and the recovery ``start`` runs in ``cluster.wal.files``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import msgpack

from cluster.core.errors import ConfigError
from cluster.core.versions import writable
from cluster.wal.active import ActiveSegment
from cluster.wal.committer import _STOP, Committer, _call, _Entry, _Rotation
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


LAZY_DELAY = 0.05  # seconds an ``append_lazily`` record waits at most for another commit


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
        self._segment_bytes = segment_bytes
        self._fsync_in_loop = fsync_in_loop
        self._archive = archive  # covered segments go to <dir>/archive/ instead of away
        self._format = 1  # of the segments created from now on (``set_format``)
        self._pack = msgpack.Packer().pack
        # Loop side: everything queued and not yet answered, in queue order (the writer
        # answers in that order). Writer side (``_committer``): the same items, handed over
        # through ``Committer.put`` (the thread) or ``_turn`` (written at the end of the loop
        # turn, no thread).
        self._unacked: deque[_Entry | _Rotation] = deque()
        self._turn: list[_Entry | _Rotation] = []
        self._threaded = fsync and not fsync_in_loop
        self._committer = Committer(
            max_batch_records=max_batch_records,
            threaded=self._threaded, committed=self._committed, rotated=self._rotated,
            fail=self._fail, stopped=self._stopped,
        )
        # ``append_lazily``: records that wait for the next commit (or LAZY_DELAY)
        self._lazy: list[_Entry] = []
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._running = False
        self._closing = False
        self._failure: LogWriteError | None = None
        self._recovered: _Recovered | None = None
        self._snapshot: tuple[int, Path] | None = None
        self._segment: ActiveSegment | None = None  # the file appended to (by the committer)
        self._done: asyncio.Future[None] | None = None  # the writer has stopped
        self._snapshot_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = _MutableStats(writer=(
            "loop" if not self._threaded else "c" if self._committer.native else "python"))

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running or self._recovered is not None:
            raise RuntimeError("DurableLog.start() called twice")
        self._loop = loop = asyncio.get_running_loop()
        rec = await loop.run_in_executor(None, _recover, self._dir, self._fsync)
        seq, size = rec.segments[-1] if rec.segments else (rec.next_seq, 0)
        self._segment = await loop.run_in_executor(
            None, lambda: ActiveSegment(self._dir, seq, size, fsync=self._fsync,
                                        create=not rec.segments, limit=self._segment_bytes,
                                        format=self._format)
        )
        self._recovered = rec
        self._snapshot = rec.snapshot
        self._snapshot_lock = asyncio.Lock()
        self._done = loop.create_future()
        self._running = True
        self._committer.start(self._segment, loop, f"wal-writer:{self._dir.name}")

    def set_format(self, version: int) -> None:
        """Create the segments from now on in format ``version`` (``cluster.wal.segments``):
        1 headerless, byte for byte what idemcount 0.4.0 writes; 2 with a header naming it.
        The segment being written keeps its format (a reader reads either); the next rotation
        (a snapshot's, or a full segment's) creates one in the new format. Called before
        ``start``, it also applies to a segment ``start`` creates. Reading never depends on it.
        ``ValueError`` for a version this code cannot write."""
        self._format = writable(version, "log format")
        if self._segment is not None:
            self._segment.format = version  # read by the writer thread at its next rotation

    @property
    def format(self) -> int:
        """The format segments are created in (``set_format``)."""
        return self._format

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
        self._close(trim=True)

    def abort(self) -> None:
        """Close now without writing what is queued, as a crash would; pending appends fail.

        Blocks at most for an fsync already running in the writer thread: closing the fd under
        it could hand its number to another file before the thread is done with it.
        """
        if not self._running:
            return
        self._committer.abort()
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
        self._close()

    def _close(self, *, trim: bool = False) -> None:
        self._running = False
        if self._segment is not None:
            self._segment.close(trim=trim)
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
        self._check_open("append to")
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
        self._check_open("append to")
        if records:
            self._append_lazy(encode_records(records, self._pack), len(records))

    def append_columns_lazily(self, *columns: Any) -> None:
        """``append_lazily`` for records given as the nine columns ``append_columns_nowait``
        takes: a node's PUBLISHED records, one columnar frame for a publication."""
        self._check_open("append to")
        data = encode_columns(columns, self._pack)
        if data:
            self._append_lazy(data, len(columns[1]))

    def _check_open(self, what: str) -> None:
        """Raise what a call on a failed, closing or stopped log must."""
        if self._failure is not None:
            raise self._failure
        if not self._running or self._closing:
            raise LogClosedError(f"{what} a log that is not running")

    def _append_lazy(self, data: bytes, count: int) -> None:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        fut.add_done_callback(_consume)
        self._lazy.append((data, count, fut))
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
        self._check_open("append to")
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
        self._check_open("barrier on")
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

    # The writer (``cluster.wal.committer``): its thread, or the end of the loop turn
    # (``_write_turn``), runs ``Committer.write_items`` over what was queued, in order; the loop
    # learns the outcome through ``_committed``, ``_rotated``, ``_fail`` and ``_stopped``,
    # called on the loop.

    def _enqueue(self, item: _Entry | _Rotation) -> None:
        if self._lazy:  # they were appended first, and ride with this commit
            self._flush_lazy()
        self._enqueue_now(item)

    def _enqueue_now(self, item: _Entry | _Rotation) -> None:
        if item is not _STOP:  # the stop marker is answered by ``_stopped``
            self._unacked.append(item)
        if self._threaded:
            self._committer.put(item)
            return
        if not self._turn:
            assert self._loop is not None
            self._loop.call_soon(self._write_turn)
        self._turn.append(item)

    def _write_turn(self) -> None:
        items, self._turn = self._turn, []
        if self._running and not self._committer.aborted:
            self._committer.write_items(items, _call)

    def _committed(self, entries: int, count: int, nbytes: int, seconds: float) -> None:
        """On the loop: the next ``entries`` queued appends are durable."""
        if self._committer.aborted or self._failure is not None:
            return
        self._stats.add_batch(count, nbytes, seconds if self._fsync else None)
        unacked = self._unacked
        for _ in range(entries):
            fut = unacked.popleft()[2]  # type: ignore[index]
            if not fut.done():  # a cancelled append still got written; nothing to tell
                fut.set_result(None)

    def _rotated(self, seq: int) -> None:
        """On the loop: the next queued item, a snapshot's rotation, is done."""
        if self._committer.aborted or self._failure is not None:
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


def _consume(fut: asyncio.Future[None]) -> None:
    """A lazy append's outcome: nobody waits for it (no "exception never retrieved")."""
    if not fut.cancelled():
        fut.exception()
