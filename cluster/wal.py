"""The node's durable log: checksummed records in segment files, group-committed, plus snapshots.

An op is acknowledged only after its record is on disk, so ``append`` returns only after an
fsync that covers it. Many concurrent appends share one ``write`` and one fsync (group commit):
a single writer task drains the queue, and the fsync runs in a worker thread so the event loop
keeps serving while the disk works.

On disk, in one directory:

    log-<seq:08d>.wal       records, each ``[u32 length][u32 crc32(payload)][payload]``
                            (little-endian); the payload is a msgpack array of the LogRecord
                            fields (measured: smaller and faster to encode than a struct layout)
    snapshot-<seq:08d>.snap ``[magic][version][flags][seq][blob length][crc32]`` then the blob;
                            seq names the first segment the snapshot does NOT cover

Recovery (``start``) takes the latest valid snapshot and the segments from its seq on. A bad
record with nothing valid after it is a torn tail (a crash mid-write): it is truncated away
with a warning. A bad record followed by any valid record is corruption and raises
``LogCorruptError``, because dropping acknowledged records silently is worse than not starting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import repeat
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import msgpack
import numpy as np

from cluster.errors import ClusterError, ConfigError

__all__ = [
    "FSYNC_BUCKETS",
    "MAX_RECORD_BYTES",
    "DurableLog",
    "LogClosedError",
    "LogCorruptError",
    "LogError",
    "LogRecord",
    "LogStats",
    "LogWriteError",
    "RecordKind",
]

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")  # payload length, crc32 of payload
MAX_RECORD_BYTES = 64 * 1024  # per payload; also bounds how far a garbage length can reach
_SNAP_MAGIC = b"IDCSNAP\x00"
_SNAP_VERSION = 1
_SNAP_HEADER = struct.Struct("<8sHHQQI")  # magic, version, flags, seq, blob length, crc32
_SEGMENT_RE = re.compile(r"log-(\d{8,})\.wal")
_SNAPSHOT_RE = re.compile(r"snapshot-(\d{8,})\.snap")
_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1

# Prometheus-style upper bounds (seconds); the last bucket catches everything slower.
FSYNC_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, math.inf,
)  # fmt: skip


class LogError(ClusterError):
    """Base of the durable log's errors; none of them is fixed by retrying the same call."""

    code = "log_error"


class LogCorruptError(LogError):
    """A record or snapshot failed its checksum where a crash cannot explain it."""

    code = "log_corrupt"

    def __init__(self, path: str | Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at offset {offset}: {reason}")
        self.path = str(path)
        self.offset = offset


class LogClosedError(LogError):
    """The log is not started, or was stopped or aborted; the append was not acknowledged."""

    code = "log_closed"


class LogWriteError(LogError):
    """A write or fsync failed. The log refuses all further appends: after a failed fsync the
    kernel may have dropped dirty pages, so nothing written since the last good fsync can be
    trusted. The node should stop and recover from disk."""

    code = "log_write_failed"


class RecordKind(IntEnum):
    APPLY = 1  # op applied here, this node is the origin
    REPLICA = 2  # entry merged from a peer
    PUBLISHED = 3  # op known to be replicated to a quorum
    WITHDRAW = 4


class LogRecord(NamedTuple):
    """One logged fact. A NamedTuple (building one costs about 0.4 us; the frozen dataclass it
    replaced cost about 3 us), but compared like the dataclass was: equal only to another
    ``LogRecord`` with equal fields, never to a plain tuple. Hash = hash of the field tuple."""

    kind: int
    op_id: str
    table: str
    key: str
    delta: int  # signed 64-bit
    origin: str  # node id whose entry this is
    p: int  # the origin's new P entry after this op (unsigned 64-bit)
    n: int  # the origin's new N entry (unsigned 64-bit)
    ts: float  # wall-clock seconds when applied

    def __eq__(self, other: object) -> bool:
        return type(other) is LogRecord and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not (type(other) is LogRecord and tuple.__eq__(self, other))

    def __hash__(self) -> int:
        return tuple.__hash__(self)


_FIELDS = LogRecord._fields
_make_record = LogRecord._make


@dataclass(frozen=True, slots=True)
class LogStats:
    """Counters since ``start``; the node exports them (fsync latency as a histogram)."""

    records_appended: int = 0
    bytes_appended: int = 0
    batches: int = 0  # writes; equals fsyncs when fsync is on
    fsyncs: int = 0
    last_fsync_seconds: float = 0.0
    fsync_seconds_total: float = 0.0
    fsync_buckets: tuple[float, ...] = FSYNC_BUCKETS  # upper bounds, the last is +Inf
    fsync_counts: tuple[int, ...] = (0,) * len(FSYNC_BUCKETS)  # per bucket, not cumulative

    def fsync_cumulative(self) -> list[tuple[float, int]]:
        """(le, count of fsyncs <= le) pairs, the shape a Prometheus histogram exports."""
        total, out = 0, []
        for bound, count in zip(self.fsync_buckets, self.fsync_counts, strict=True):
            total += count
            out.append((bound, total))
        return out


# ---------------------------------------------------------------- record encoding


def _encode(records: Sequence[LogRecord], pack: Callable[[Any], bytes]) -> bytes:
    """Format v1: one frame per record, the payload a msgpack array of the nine fields."""
    parts: list[bytes] = []
    frame, crc = _FRAME.pack, zlib.crc32
    for rec in records:
        # msgpack would silently store an out-of-range delta as unsigned, or a negative entry;
        # the on-disk format promises i64/u64, so refuse here rather than replay nonsense.
        if not (_I64_MIN <= rec.delta <= _I64_MAX and 0 <= rec.p <= _U64_MAX
                and 0 <= rec.n <= _U64_MAX):  # fmt: skip
            raise ValueError(f"record {rec.op_id!r}: delta/p/n out of the 64-bit range")
        payload = pack(tuple(rec))
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"record {rec.op_id!r}: {len(payload)} bytes > {MAX_RECORD_BYTES}")
        parts.append(frame(len(payload), crc(payload)))
        parts.append(payload)
    return b"".join(parts)


# Format v2 (columnar): one frame holds many records as the msgpack array
#     [2, kind, op_id, table, key, delta, origin, p, n, ts]
# where each field is either an array (one value per record, all arrays of one length) or a
# scalar shared by every record of the frame. A v1 payload is an array of 9, so the length
# tells the versions apart. A frame is all-or-nothing on replay, like the append it came from.
_COLUMNAR = 2
_COLUMN_TYPES = (list, tuple)
_DELTA, _P, _N = 4, 6, 7
_COLUMNAR_MIN = 3  # fewer records are written as v1 frames, cheaper to encode at that size


def _check_range(col: Any, lo: int, hi: int, name: str, op_ids: Sequence[str]) -> None:
    if isinstance(col, _COLUMN_TYPES):
        if lo <= min(col) and max(col) <= hi:
            return
        bad = next(i for i, v in enumerate(col) if not lo <= v <= hi)
        raise ValueError(f"record {op_ids[bad]!r}: delta/p/n out of the 64-bit range ({name})")
    if not lo <= col <= hi:
        raise ValueError(f"records {op_ids[0]!r}..: delta/p/n out of the 64-bit range ({name})")


def _encode_columns(columns: Sequence[Any], pack: Callable[[Any], bytes]) -> bytes:
    """Format v2 frames for the nine columns (``op_id`` must be a list, others may be shared
    scalars). One msgpack call per frame; split in halves while a frame exceeds the limit."""
    if len(columns) != 9:
        raise ValueError(f"9 columns expected, got {len(columns)}")
    op_ids = columns[1]
    if not isinstance(op_ids, _COLUMN_TYPES):
        raise ValueError("op_id must be a sequence, one per record")
    count = len(op_ids)
    is_col = []
    for col in columns:
        t = type(col)
        if t is list or t is tuple or isinstance(col, _COLUMN_TYPES):
            if len(col) != count:
                raise ValueError(f"a column has {len(col)} values for {count} records")
            is_col.append(True)
        else:
            is_col.append(False)
    if count < _COLUMNAR_MIN:  # v1 is cheaper for very few records (measured)
        pairs = list(zip(columns, is_col, strict=True))
        return _encode(
            [_make_record([c[i] if col else c for c, col in pairs]) for i in range(count)], pack
        )
    _check_range(columns[_DELTA], _I64_MIN, _I64_MAX, "delta", op_ids)
    _check_range(columns[_P], 0, _U64_MAX, "p", op_ids)
    _check_range(columns[_N], 0, _U64_MAX, "n", op_ids)
    return _pack_columns(columns, count, pack)


def _pack_columns(columns: Sequence[Any], count: int, pack: Callable[[Any], bytes]) -> bytes:
    payload = pack([_COLUMNAR, *columns])
    if len(payload) <= MAX_RECORD_BYTES:
        return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    if count == 1:
        raise ValueError(f"record {columns[1][0]!r}: {len(payload)} bytes > {MAX_RECORD_BYTES}")
    half = count // 2
    lo = [c[:half] if isinstance(c, _COLUMN_TYPES) else c for c in columns]
    hi = [c[half:] if isinstance(c, _COLUMN_TYPES) else c for c in columns]
    return _pack_columns(lo, half, pack) + _pack_columns(hi, count - half, pack)


# The type each field must have after decoding (ts: an int is fine too, msgpack keeps 0.0).
_FIELD_TYPES = (int, str, str, str, int, str, int, int, float)
_TYPE_OK: tuple[frozenset[type], ...] = tuple(
    frozenset({t, int}) if t is float else frozenset({t}) for t in _FIELD_TYPES)


def _decode_payload(obj: Any) -> list[LogRecord]:
    """The records of one unpacked frame payload (either format); ValueError if it is none:
    wrong shape, or a field of the wrong type (a foreign file, or bytes that merely look like a
    frame), so nothing replays that was never written."""
    if type(obj) is not tuple:
        raise ValueError(f"not a log record payload ({type(obj).__name__})")
    if len(obj) == 9:
        for value, ok in zip(obj, _TYPE_OK, strict=True):
            if type(value) not in ok:
                raise ValueError(f"log record field of type {type(value).__name__}")
        return [LogRecord(*obj)]
    if len(obj) != 10 or obj[0] != _COLUMNAR:
        raise ValueError(f"not a log record payload (array of {len(obj)})")
    op_ids = obj[2]
    if type(op_ids) is not tuple:
        raise ValueError("columnar frame without an op_id array")
    count = len(op_ids)
    cols: list[Any] = []
    for col, ok in zip(obj[1:], _TYPE_OK, strict=True):
        if type(col) is tuple:
            if len(col) != count:
                raise ValueError("columnar frame with columns of different lengths")
            if not set(map(type, col)) <= ok:  # C speed: a set of the types present
                raise ValueError("columnar frame with a field of the wrong type")
            cols.append(col)
        else:
            if type(col) not in ok:
                raise ValueError(f"columnar frame field of type {type(col).__name__}")
            cols.append(repeat(col, count))
    return list(map(_make_record, zip(*cols, strict=True)))


def _decode(payload: bytes | memoryview) -> list[LogRecord]:
    return _decode_payload(msgpack.unpackb(payload, use_list=False))


def _frame_at(buf: bytes, off: int) -> int:
    """End offset of the checksummed frame at ``off``, or -1 when it is short or bad."""
    if len(buf) - off < _FRAME.size:
        return -1
    length, crc = _FRAME.unpack_from(buf, off)
    end = off + _FRAME.size + length
    if length == 0 or length > MAX_RECORD_BYTES or end > len(buf):
        return -1
    return end if zlib.crc32(memoryview(buf)[off + _FRAME.size : end]) == crc else -1


def _scan(buf: bytes) -> int:
    """Offset of the first bad frame, or len(buf) when every frame is good."""
    off, size, n = 0, _FRAME.size, len(buf)
    unpack, crc, view = _FRAME.unpack_from, zlib.crc32, memoryview(buf)
    while n - off >= size:
        length, want = unpack(buf, off)
        end = off + size + length
        if (
            length == 0
            or length > MAX_RECORD_BYTES
            or end > n
            or crc(view[off + size : end]) != want
        ):
            return off
        off = end
    return off


def _find_record(buf: bytes, start: int) -> int | None:
    """First offset >= start holding a frame that passes its checksum and decodes to records
    with fields of the right types.

    A torn record's bytes hold client data, but an op id cannot hide a frame in them: a frame
    header holds a NUL byte (its length's high byte), and ``cluster.validate`` refuses control
    characters in op ids; a frame from a foreign source must also decode to well-typed fields.

    Only used after a bad frame, to tell a torn tail from corruption. Reading a u32 at every
    byte offset with numpy leaves only the few offsets whose length is plausible for the
    checksum test, so a large garbage or zero-filled tail costs milliseconds.
    """
    count = len(buf) - _FRAME.size - start
    chunk = 1 << 20
    for lo in range(0, max(count, 0), chunk):
        hi = min(count, lo + chunk)
        lengths = np.ndarray((hi - lo,), dtype="<u4", buffer=buf, offset=start + lo, strides=(1,))
        for i in np.flatnonzero((lengths >= 1) & (lengths <= MAX_RECORD_BYTES)).tolist():
            off = start + lo + i
            end = _frame_at(buf, off)
            if end < 0:
                continue
            try:
                _decode(memoryview(buf)[off + _FRAME.size : end])
            except Exception:  # garbage that happens to pass crc32 is not a record
                continue
            return off
    return None


# ---------------------------------------------------------------- files


def _segment_name(seq: int) -> str:
    return f"log-{seq:08d}.wal"


def _snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:08d}.snap"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_datasync = getattr(os, "fdatasync", os.fsync)  # the size change is data for fdatasync too


def _read_snapshot(path: Path, seq: int) -> bytes:
    data = path.read_bytes()
    if len(data) < _SNAP_HEADER.size:
        raise LogCorruptError(path, 0, "snapshot shorter than its header")
    magic, version, _flags, hseq, length, crc = _SNAP_HEADER.unpack_from(data)
    if magic != _SNAP_MAGIC or version != _SNAP_VERSION:
        raise LogCorruptError(path, 0, f"not a version {_SNAP_VERSION} snapshot")
    blob = memoryview(data)[_SNAP_HEADER.size :]
    if hseq != seq or length != len(blob):
        raise LogCorruptError(path, 0, "snapshot header does not match its file")
    if zlib.crc32(blob, zlib.crc32(memoryview(data)[: _SNAP_HEADER.size - 4])) != crc:
        raise LogCorruptError(path, _SNAP_HEADER.size, "snapshot checksum mismatch")
    return bytes(blob)


def _write_snapshot_file(directory: Path, seq: int, blob: bytes, fsync: bool) -> Path:
    """Atomic: a crash leaves either no snapshot-<seq>.snap or a complete one."""
    head = _SNAP_HEADER.pack(_SNAP_MAGIC, _SNAP_VERSION, 0, seq, len(blob), 0)[:-4]
    crc = zlib.crc32(blob, zlib.crc32(head))
    final = directory / _snapshot_name(seq)
    tmp = final.with_name(final.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(head + struct.pack("<I", crc))
            f.write(blob)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(directory)
    return final


@dataclass(slots=True)
class _Recovered:
    snapshot: tuple[int, Path] | None  # (seq, path) of the snapshot replay starts from
    segments: list[tuple[int, int]]  # (seq, valid end offset) from the snapshot's seq on
    next_seq: int  # the segment to create when there is none yet


def _list_dir(directory: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    segments: dict[int, Path] = {}
    snapshots: dict[int, Path] = {}
    for path in directory.iterdir():
        if m := _SEGMENT_RE.fullmatch(path.name):
            segments[int(m.group(1))] = path
        elif m := _SNAPSHOT_RE.fullmatch(path.name):
            snapshots[int(m.group(1))] = path
    return segments, snapshots


def _choose_snapshot(segments: dict[int, Path], snapshots: dict[int, Path]) -> int:
    """Seq of the latest valid snapshot whose uncovered segments all exist; 0 for none.

    A snapshot is renamed into place only once complete, so an invalid one is damage, not a
    crash; an older snapshot may stand in only while the segments after it are still there.
    """
    last = max(segments, default=0)
    bad: LogCorruptError | None = None
    for seq in sorted(snapshots, reverse=True):
        try:
            _read_snapshot(snapshots[seq], seq)
        except LogCorruptError as exc:
            log.warning("skipping invalid snapshot: %s", exc)
            bad = bad or exc
            continue
        if bad is None or all(s in segments for s in range(seq, last + 1)):
            return seq
        raise bad
    if bad is None or all(s in segments for s in range(1, last + 1)):
        return 0
    raise bad


def _recover(directory: Path, fsync: bool) -> _Recovered:
    """Pick the snapshot, drop what it covers, truncate a torn tail, refuse corruption."""
    directory.mkdir(parents=True, exist_ok=True)
    for tmp in directory.glob("*.snap.tmp"):  # a snapshot write that never reached its rename
        tmp.unlink()
    segments, snapshots = _list_dir(directory)
    snap_seq = _choose_snapshot(segments, snapshots)
    for seq, path in [*segments.items(), *snapshots.items()]:
        if seq < snap_seq:  # a crash interrupted the deletion that follows a snapshot
            path.unlink()
    first = snap_seq or 1
    live = sorted(s for s in segments if s >= first)
    expected = range(first, max(live, default=first - 1) + 1)
    if snap_seq and not live:
        expected = range(first, first + 1)  # the rotation creates it before the snapshot exists
    # live is sorted and within expected: a gap (or a missing first one) is a lost segment;
    # compared pairwise, so a stray log-99999999.wal costs nothing to notice
    for want, have in zip(expected, [*live, None], strict=False):
        if want != have:
            raise LogCorruptError(directory / _segment_name(want), 0, "segment missing")
    ends = _repair_tail([segments[s] for s in live], fsync)
    return _Recovered(
        snapshot=(snap_seq, snapshots[snap_seq]) if snap_seq else None,
        segments=list(zip(live, ends, strict=True)),
        next_seq=first,
    )


def _repair_tail(paths: list[Path], fsync: bool) -> list[int]:
    """Valid end offset of each segment after truncating a torn tail; raises on corruption."""
    bufs = [p.read_bytes() for p in paths]
    ends = [len(b) for b in bufs]
    for i, buf in enumerate(bufs):
        bad = _scan(buf)
        if bad == len(buf):
            continue
        for j in range(i, len(bufs)):
            found = _find_record(bufs[j], bad + 1 if j == i else 0)
            if found is not None:
                raise LogCorruptError(
                    paths[i],
                    bad,
                    f"bad record followed by a valid one ({paths[j].name} "
                    f"offset {found}): not a torn tail",
                )
        dropped = sum(ends[i:]) - bad
        log.warning("torn tail in %s at offset %d: dropping %d bytes", paths[i], bad, dropped)
        for j in range(i, len(bufs)):
            ends[j] = bad if j == i else 0
            _truncate(paths[j], ends[j], fsync)
        break
    return ends


def _truncate(path: Path, size: int, fsync: bool) -> None:
    # Durable before new records land after it, or a crash could resurrect the torn bytes.
    with open(path, "r+b") as f:
        f.truncate(size)
        if fsync:
            os.fsync(f.fileno())


# ---------------------------------------------------------------- the log


class _Rotation:
    """Queue marker: records before it go to the current segment, records after it to the next."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[int]) -> None:
        self.future = future


_Entry = tuple[bytes, int, "asyncio.Future[None]"]  # encoded frames, record count, ack


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
        self._queue: deque[_Entry | _Rotation] = deque()
        self._inflight: list[_Entry] = []
        self._running = False
        self._closing = False
        self._failure: LogWriteError | None = None
        self._recovered: _Recovered | None = None
        self._snapshot: tuple[int, Path] | None = None
        self._fd = -1
        self._seq = 0
        self._size = 0
        # Held around every use of the fd, so abort() never closes it under a running fsync
        # (and a reused fd number can never receive our bytes).
        self._io_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._writer: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._snapshot_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = _MutableStats()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running or self._recovered is not None:
            raise RuntimeError("DurableLog.start() called twice")
        self._loop = asyncio.get_running_loop()
        # One thread: writes must reach the file in queue order, and a slow snapshot on the
        # default executor must never hold up an fsync that acknowledgements wait on.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal")
        try:
            rec = await self._loop.run_in_executor(self._executor, _recover, self._dir, self._fsync)
            self._seq, self._size = rec.segments[-1] if rec.segments else (rec.next_seq, 0)
            self._fd = await self._loop.run_in_executor(
                self._executor, self._open_segment, self._seq, not rec.segments
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        self._recovered = rec
        self._snapshot = rec.snapshot
        self._wakeup = asyncio.Event()
        self._snapshot_lock = asyncio.Lock()
        self._running = True
        self._writer = asyncio.create_task(self._write_loop(), name=f"wal-writer:{self._dir}")

    async def stop(self) -> None:
        """Write and fsync everything appended so far, finish a running snapshot, close."""
        if not self._running:
            return
        assert self._writer is not None and self._wakeup is not None
        assert self._snapshot_lock is not None
        self._closing = True
        self._wakeup.set()
        try:
            await asyncio.shield(self._writer)
            async with self._snapshot_lock:
                pass
        except asyncio.CancelledError:
            self.abort()
            raise
        self._close()

    def abort(self) -> None:
        """Close now without writing what is queued, as a crash would; pending appends fail.

        Blocks at most for an fsync already running in the worker thread: closing the fd under
        it could hand its number to another file before the thread is done with it.
        """
        if not self._running:
            return
        if self._writer is not None:
            self._writer.cancel()
        closed = LogClosedError("log aborted before the records were durable")
        for item in [*self._inflight, *self._queue]:
            fut = item.future if isinstance(item, _Rotation) else item[2]
            if not fut.done():
                fut.set_exception(closed)
                fut.exception()  # the caller hears it when it awaits; no "never retrieved"
        self._queue.clear()
        self._close()

    def _close(self) -> None:
        self._running = False
        with self._io_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

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
            yield from _decode_segment(path, buf)

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
        assert self._loop is not None and self._wakeup is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        if not records:
            fut.set_result(None)
            return fut
        self._queue.append((_encode(records, self._pack), len(records), fut))
        self._wakeup.set()
        return fut

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
        assert self._loop is not None and self._wakeup is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        data = _encode_columns((kind, op_id, table, key, delta, origin, p, n, ts), self._pack)
        if not data:
            fut.set_result(None)
            return fut
        self._queue.append((data, len(op_id), fut))
        self._wakeup.set()
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

    async def write_snapshot(self, make_blob: Callable[[], bytes]) -> None:
        """Rotate and call ``make_blob()`` at that same instant, store it, drop covered segments.

        The blob must reflect every record whose append was called before this call (those go
        to the old segments, which are deleted); records appended later land in the new
        segment and are replayed on top of the snapshot.
        """
        if not self._running or self._closing:
            raise LogClosedError("snapshot of a log that is not running")
        assert self._loop is not None and self._snapshot_lock is not None
        assert self._wakeup is not None
        async with self._snapshot_lock:
            if self._failure is not None:
                raise self._failure
            if not self._running or self._closing:  # the writer may be gone: nobody would rotate
                raise LogClosedError("snapshot of a log that is not running")
            blob = make_blob()  # no await from here to the marker: the cut is exact
            rotation = _Rotation(self._loop.create_future())
            self._queue.append(rotation)
            self._wakeup.set()
            seq = await rotation.future
            try:
                # Default executor: a large blob must not delay the log writer's fsyncs.
                path = await self._loop.run_in_executor(
                    None, _write_snapshot_file, self._dir, seq, bytes(blob), self._fsync
                )
                self._snapshot = (seq, path)
                await self._loop.run_in_executor(None, self._delete_covered, seq)
            except OSError as exc:  # the segments are intact: appends go on, retry later
                raise LogError(f"snapshot {seq} in {self._dir}: {exc}") from exc

    def _delete_covered(self, seq: int) -> None:
        segments, snapshots = _list_dir(self._dir)
        archive = self._dir / "archive"
        for old, path in [*segments.items(), *snapshots.items()]:
            if old < seq:
                if self._archive and old in segments and path == segments[old]:
                    archive.mkdir(exist_ok=True)
                    os.replace(path, archive / path.name)
                else:
                    path.unlink(missing_ok=True)
        if self._fsync:
            _fsync_dir(self._dir)

    async def _write_loop(self) -> None:
        try:
            await self._drain_forever()
        except Exception as exc:  # a bug here must fail the waiters, not leave them hanging
            self._fail(exc)

    async def _drain_forever(self) -> None:
        assert self._wakeup is not None
        queue = self._queue
        while True:
            if not queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = queue[0]
            if isinstance(head, _Rotation):
                queue.popleft()
                if not await self._rotate(head.future):
                    return
                continue
            queue.popleft()
            batch, count = [head], head[1]
            while queue and not isinstance(nxt := queue[0], _Rotation):
                if count + nxt[1] > self._max_batch:
                    break
                queue.popleft()
                batch.append(nxt)
                count += nxt[1]
            if not await self._commit(batch, count):
                return
            if self._size >= self._segment_bytes and not await self._rotate(None):
                return

    async def _commit(self, batch: list[_Entry], count: int) -> bool:
        data = b"".join([entry[0] for entry in batch])
        self._inflight = batch
        try:
            if self._fsync and not self._fsync_in_loop:
                assert self._loop is not None
                seconds = await self._loop.run_in_executor(self._executor, self._write_io, data)
            else:
                seconds = self._write_io(data)  # page cache only or fsync_in_loop: no thread
        except Exception as exc:
            self._fail(exc)
            return False
        finally:
            self._inflight = []
        self._size += len(data)
        self._stats.add_batch(count, len(data), seconds if self._fsync else None)
        for entry in batch:
            if not entry[2].done():  # a cancelled append still got written; nothing to tell
                entry[2].set_result(None)
        return True

    def _write_io(self, data: bytes) -> float:
        with self._io_lock:
            if self._fd < 0:
                raise LogClosedError("log closed during a write")
            view = memoryview(data)
            while view:  # a regular file may take a large write in pieces
                view = view[os.write(self._fd, view) :]
            if not self._fsync:
                return 0.0
            t0 = time.perf_counter()
            _datasync(self._fd)
            return time.perf_counter() - t0

    async def _rotate(self, done: asyncio.Future[int] | None) -> bool:
        assert self._loop is not None
        try:
            await self._loop.run_in_executor(self._executor, self._rotate_io)
        except Exception as exc:
            if done is not None and not done.done():
                done.set_exception(LogWriteError(f"rotating segment: {exc}"))
            self._fail(exc)
            return False
        if done is not None and not done.done():
            done.set_result(self._seq)
        return True

    def _rotate_io(self) -> None:
        # The previous batch was fsynced before we got here, so the old segment is complete.
        fd = self._open_segment(self._seq + 1, True)
        with self._io_lock:
            if self._fd < 0:
                os.close(fd)
                raise LogClosedError("log closed during a rotation")
            os.close(self._fd)
            self._fd, self._seq, self._size = fd, self._seq + 1, 0

    def _open_segment(self, seq: int, create: bool) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._dir / _segment_name(seq), flags | (os.O_EXCL if create else 0), 0o644)
        if create and self._fsync:
            _fsync_dir(self._dir)  # the new name must survive a crash like its contents
        return fd

    def _fail(self, exc: BaseException) -> None:
        """Poison the log: fail every waiting append, refuse new ones."""
        if isinstance(exc, LogError):
            failure = LogWriteError(str(exc))
        else:
            failure = LogWriteError(f"write to {self._dir / _segment_name(self._seq)}: {exc}")
        failure.__cause__ = exc
        self._failure = failure
        log.error("durable log failed, refusing further appends: %s", exc)
        for item in [*self._inflight, *self._queue]:
            fut = item.future if isinstance(item, _Rotation) else item[2]
            if not fut.done():
                fut.set_exception(failure)
        self._queue.clear()


def _decode_segment(path: Path, buf: bytes) -> Iterator[LogRecord]:
    off, size, n = 0, _FRAME.size, len(buf)
    unpack, crc, view = _FRAME.unpack_from, zlib.crc32, memoryview(buf)
    unpackb, decode = msgpack.unpackb, _decode_payload
    while off < n:
        length, want = unpack(buf, off) if n - off >= size else (0, 0)
        end = off + size + length
        payload = view[off + size : end]
        if length == 0 or end > n or crc(payload) != want:
            raise LogCorruptError(path, off, "record changed since start() checked it")
        try:
            recs = decode(unpackb(payload, use_list=False))
        except Exception as exc:  # passed crc32 but is not ours: a bug or a foreign file
            raise LogCorruptError(path, off, f"undecodable record: {exc}") from exc
        yield from recs
        off = end


@dataclass(slots=True)
class _MutableStats:
    records_appended: int = 0
    bytes_appended: int = 0
    batches: int = 0
    fsyncs: int = 0
    last_fsync_seconds: float = 0.0
    fsync_seconds_total: float = 0.0
    fsync_counts: list[int] = field(default_factory=lambda: [0] * len(FSYNC_BUCKETS))

    def add_batch(self, records: int, nbytes: int, fsync_seconds: float | None) -> None:
        self.records_appended += records
        self.bytes_appended += nbytes
        self.batches += 1
        if fsync_seconds is None:
            return
        self.fsyncs += 1
        self.last_fsync_seconds = fsync_seconds
        self.fsync_seconds_total += fsync_seconds
        for i, bound in enumerate(FSYNC_BUCKETS):
            if fsync_seconds <= bound:
                self.fsync_counts[i] += 1
                break

    def freeze(self) -> LogStats:
        return LogStats(
            records_appended=self.records_appended,
            bytes_appended=self.bytes_appended,
            batches=self.batches,
            fsyncs=self.fsyncs,
            last_fsync_seconds=self.last_fsync_seconds,
            fsync_seconds_total=self.fsync_seconds_total,
            fsync_counts=tuple(self.fsync_counts),
        )
