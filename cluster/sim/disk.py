"""The simulated disk: ``SimLog`` has ``DurableLog``'s API over an in-memory ``SimDisk``.

Group commit as the real writer does it: appends queue, and one fsync a few virtual
milliseconds later makes every queued frame durable at once and resolves their futures. A crash
(``abort``) loses what was queued and not yet synced, or, when handed a ``tear``, leaves part of
it behind as the tail: a prefix cut anywhere (a torn write) or a copy with one byte flipped (a
corrupt sector). Recovery (``start``) keeps the whole good frames before the first bad one and
truncates the rest, as the real log's recovery does (``cluster.wal.scan``). Records are encoded
and decoded by the real ``cluster.wal`` code (``encode_records``, ``encode_columns``,
``decode_segment``), so a record that would not survive the real log does not survive this one
either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from cluster.core.membership import Membership
from cluster.core.versions import writable
from cluster.roles.checks import consume
from cluster.wal import LogRecord, decode_segment, encode_columns, encode_records, scan
from cluster.wal.errors import LogClosedError
from cluster.wal.stats import LogStats, _MutableStats

__all__ = ["SimDisk", "SimLog"]

_SNAPSHOT = object()  # queue marker: a snapshot cut


class SimDisk:
    """What survives a crash of one node: fsynced frames after the latest durable snapshot,
    that snapshot, the incarnation counter and the membership (``ring.json``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ring: Membership | None = None
        self.frames: list[bytes] = []
        self.snapshot: bytes | None = None
        self.incarnation = 0
        self.format = 1  # the format its log last wrote in (``SimLog.set_format``)
        self.fsyncs = 0
        self.truncated = 0  # torn or corrupt tails cut off at a recovery
        # every frame ever synced, with the virtual time of its fsync (post-mortems only)
        self.archive: list[tuple[float, bytes]] = []

    def next_incarnation(self) -> int:
        self.incarnation += 1  # the real counter is fsynced before recover() goes on
        return self.incarnation


class SimLog:
    """``DurableLog`` on a ``SimDisk``: start, stop, abort, replay, load_snapshot,
    write_snapshot, append_nowait, append_columns_nowait, the lazy appends, stats,
    set_format."""

    def __init__(self, disk: SimDisk, *, fsync_delay: float = 0.002) -> None:
        self.disk = disk
        self.fsync_delay = fsync_delay
        self._pack = msgpack.Packer().pack
        self._queue: list[tuple[object, int, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._started = False
        self._on_disk: list[bytes] = []
        self._snapshot: bytes | None = None
        self._format = 1
        self._stats = _MutableStats()
        # called (once, at the next loop turn) after the next append is queued, before its
        # fsync: the nemesis crashes the node there
        self.on_write: Callable[[], None] | None = None

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("SimLog.start() called twice")
        self._started = self._running = True
        self._loop = asyncio.get_running_loop()
        disk = self.disk
        if disk.frames:  # a torn or corrupt tail: keep its whole good frames, truncate the rest
            last = disk.frames[-1]
            good = scan(last)
            if good < len(last):
                disk.truncated += 1
                disk.frames[-1:] = [last[:good]] if good else []
        self._on_disk, self._snapshot = list(disk.frames), disk.snapshot

    def set_format(self, version: int) -> None:
        """``DurableLog.set_format``: the format of the segments written from now on. The
        simulated disk holds frames, not segment files, so it only records the number (a new
        log starts at 1, as ``DurableLog`` does; the disk keeps the last one set)."""
        self._format = self.disk.format = writable(version, "log format")

    @property
    def format(self) -> int:
        return self._format

    async def stop(self) -> None:
        if self._running:
            self._sync()
        self._running = False

    def abort(self, tear: Callable[[bytes], bytes] | None = None) -> None:
        """A crash: what was not fsynced is gone, its appends fail. ``tear``, given the bytes
        that were still waiting for their fsync, returns what of them reached the disk anyway
        (a torn or corrupt tail: never acknowledged, maybe partly readable)."""
        if tear is not None and self._running:
            waiting = b"".join(d for d, count, _ in self._queue
                               if count >= 0 and isinstance(d, bytes))
            if waiting:
                tail = tear(waiting)
                if tail:
                    self.disk.frames.append(tail)
                    loop = self._loop
                    self.disk.archive.append((loop.time() if loop is not None else 0.0, tail))
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
        closed = LogClosedError("log aborted before the records were durable")
        for _, _, fut in self._queue:
            if not fut.done():
                fut.set_exception(closed)
                fut.exception()
        self._queue.clear()

    def load_snapshot(self) -> bytes | None:
        if not self._started:
            raise LogClosedError("load_snapshot() before start()")
        return self._snapshot

    def replay(self) -> Iterator[LogRecord]:
        if not self._started:
            raise LogClosedError("replay() before start()")
        path = Path(f"sim:{self.disk.name}")
        for data in self._on_disk:
            yield from decode_segment(path, data)

    def stats(self) -> LogStats:
        return self._stats.freeze()

    def append_nowait(self, records: Sequence[LogRecord]) -> asyncio.Future[None]:
        data = encode_records(records, self._pack) if records else b""
        return self._enqueue(data, len(records))

    def append_lazily(self, records: Sequence[LogRecord]) -> None:
        """As ``append_nowait`` here: the simulated disk syncs on a timer anyway."""
        self.append_nowait(records).add_done_callback(consume)

    def append_columns_nowait(self, kind: int | Sequence[int], op_id: Sequence[str],
                              table: str | Sequence[str], key: str | Sequence[str],
                              delta: int | Sequence[int], origin: str | Sequence[str],
                              p: int | Sequence[int], n: int | Sequence[int],
                              ts: float | Sequence[float]) -> asyncio.Future[None]:
        data = encode_columns((kind, op_id, table, key, delta, origin, p, n, ts), self._pack)
        return self._enqueue(data, len(op_id))

    def append_columns_lazily(self, *columns: Any) -> None:
        """As ``append_columns_nowait`` here (see ``append_lazily``)."""
        self.append_columns_nowait(*columns).add_done_callback(consume)

    async def write_snapshot(self, make_blob: Callable[[], bytes]) -> None:
        """The blob covers every record appended before this call; it replaces them on the
        disk at the fsync that makes it durable (records appended later stay)."""
        blob = make_blob()
        await self._enqueue(_SNAPSHOT, 0, blob)

    def _enqueue(self, data: object, count: int, blob: bytes = b"") -> asyncio.Future[None]:
        if not self._running or self._loop is None:
            raise LogClosedError("append to a log that is not running")
        fut: asyncio.Future[None] = self._loop.create_future()
        if data == b"":
            fut.set_result(None)
            return fut
        if self.on_write is not None and data is not _SNAPSHOT:  # one shot (a crash mid-write)
            on_write, self.on_write = self.on_write, None
            self._loop.call_soon(on_write)
        self._queue.append((blob if data is _SNAPSHOT else data, -1 if data is _SNAPSHOT
                            else count, fut))
        if self._timer is None:
            self._timer = self._loop.call_later(self.fsync_delay, self._sync)
        return fut

    def _sync(self) -> None:
        """One group commit: everything queued becomes durable, in order."""
        self._timer = None
        if not self._running:
            return
        disk, queue = self.disk, self._queue
        self._queue = []
        now = self._loop.time() if self._loop is not None else 0.0
        disk.fsyncs += 1
        for data, count, fut in queue:
            assert isinstance(data, bytes)
            if count < 0:  # a snapshot: it covers every frame before it
                disk.snapshot, disk.frames = data, []
            else:
                disk.frames.append(data)
                disk.archive.append((now, data))
                self._stats.add_batch(count, len(data), None)
            if not fut.done():
                fut.set_result(None)
