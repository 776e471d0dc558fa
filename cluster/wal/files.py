"""The log directory on disk: snapshot files, durable renames, and recovery at start.

    snapshot-<seq:08d>.snap  ``[magic][version][flags][seq][blob length][crc32]`` then the
                             blob; seq names the first segment the snapshot does NOT cover

Recovery (``_recover``) takes the latest valid snapshot and the segments from its seq on.

- First, before it deletes or truncates anything: a snapshot, a segment header
  (``cluster.wal.segments``) or a record (``cluster.wal.records``) of a newer format than this
  code reads raises ``FormatError`` (a later release wrote it). Such a file is never taken for
  damage: not skipped for an older snapshot, not cut away as a torn tail.

- Zeros after the last good record of the last segment are the space the writer keeps ahead of
  its records (``cluster.wal.active``): they end the log and are cut away, silently.
- Any other bad record with no valid record after it is a torn tail (a crash mid-commit): it
  is truncated away with a warning.
- In the last segment, valid records may follow a bad one within ``MAX_COMMIT_BYTES`` of it
  and it is still a torn tail: one commit writes at most that many bytes, all after the last
  fsync, and since it overwrites zeros (the file's size is already durable) a crash can leave
  any of its pages written and others not. Earlier segments were trimmed and fsynced whole
  before the next one began, so there any valid record after a bad one counts.
- A valid record beyond that is corruption and raises ``LogCorruptError``, because dropping
  acknowledged records silently is worse than not starting.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cluster.core.versions import newer
from cluster.wal.errors import LogCorruptError
from cluster.wal.frames import _FRAME, MAX_COMMIT_BYTES, MAX_RECORD_BYTES, _frame_end, _iter_frames
from cluster.wal.records import NewerFormError, _decode
from cluster.wal.segments import (
    _ARCHIVE,
    _newer_record,
    _segment_name,
    _segment_start,
    _snapshot_name,
    list_dir,
)

__all__: list[str] = []

log = logging.getLogger("cluster.wal")  # the name the single-module log used; filters keep it

_SNAP_MAGIC = b"IDCSNAP\x00"
_SNAP_VERSION = 1
_SNAP_HEADER = struct.Struct("<8sHHQQI")  # magic, version, flags, seq, blob length, crc32


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    """Replace a small file atomically and durably: a temp file written and fsynced, renamed
    over ``path``, the directory fsynced (a crash leaves the old content or the new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


_datasync = getattr(os, "fdatasync", os.fsync)  # the size change is data for fdatasync too


# ---------------------------------------------------------------- snapshots


def _read_snapshot(path: Path, seq: int) -> bytes:
    data = path.read_bytes()
    if len(data) < _SNAP_HEADER.size:
        raise LogCorruptError(path, 0, "snapshot shorter than its header")
    magic, version, _flags, hseq, length, crc = _SNAP_HEADER.unpack_from(data)
    if magic == _SNAP_MAGIC and version > _SNAP_VERSION:  # a later release wrote it
        raise newer(f"snapshot {path}", version, _SNAP_VERSION)
    if magic != _SNAP_MAGIC or version != _SNAP_VERSION:
        raise LogCorruptError(path, 0, f"not a version {_SNAP_VERSION} snapshot")
    blob = memoryview(data)[_SNAP_HEADER.size :]
    if hseq != seq or length != len(blob):
        raise LogCorruptError(path, 0, "snapshot header does not match its file")
    if zlib.crc32(blob, zlib.crc32(memoryview(data)[: _SNAP_HEADER.size - 4])) != crc:
        raise LogCorruptError(path, _SNAP_HEADER.size, "snapshot checksum mismatch")
    return bytes(blob)


def _write_snapshot_file(directory: Path, seq: int, blob: bytes | Sequence[bytes | memoryview],
                         fsync: bool) -> Path:
    """Atomic: a crash leaves either no snapshot-<seq>.snap or a complete one. ``blob`` may come
    in parts, written one after the other (no copy of the whole: zlib and the writes release
    the GIL, so the loop runs meanwhile)."""
    parts = [blob] if isinstance(blob, bytes | bytearray | memoryview) else blob
    head = _SNAP_HEADER.pack(_SNAP_MAGIC, _SNAP_VERSION, 0, seq, sum(map(len, parts)), 0)[:-4]
    crc = zlib.crc32(head)
    for part in parts:
        crc = zlib.crc32(part, crc)
    final = directory / _snapshot_name(seq)
    tmp = final.with_name(final.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(head + struct.pack("<I", crc))
            for part in parts:
                f.write(part)
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


def _delete_covered(directory: Path, seq: int, archive: bool, fsync: bool) -> None:
    """After snapshot ``seq`` is durable: drop the segments and snapshots before it (segments
    go to ``<dir>/archive/`` instead with ``archive``)."""
    segments, snapshots = list_dir(directory)
    into = directory / _ARCHIVE
    for old, path in [*segments.items(), *snapshots.items()]:
        if old < seq:
            if archive and old in segments and path == segments[old]:
                into.mkdir(exist_ok=True)
                os.replace(path, into / path.name)
            else:
                path.unlink(missing_ok=True)
    if fsync:
        _fsync_dir(directory)


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


# ---------------------------------------------------------------- recovery


@dataclass(slots=True)
class _Recovered:
    snapshot: tuple[int, Path] | None  # (seq, path) of the snapshot replay starts from
    segments: list[tuple[int, int]]  # (seq, valid end offset) from the snapshot's seq on
    next_seq: int  # the segment to create when there is none yet


def _recover(directory: Path, fsync: bool) -> _Recovered:
    """Pick the snapshot, drop what it covers, truncate a torn tail, refuse corruption."""
    directory.mkdir(parents=True, exist_ok=True)
    for tmp in directory.glob("*.snap.tmp"):  # a snapshot write that never reached its rename
        tmp.unlink()
    segments, snapshots = list_dir(directory)
    snap_seq = _choose_snapshot(segments, snapshots)  # FormatError for a newer snapshot
    first = snap_seq or 1
    live = sorted(s for s in segments if s >= first)
    paths = [segments[s] for s in live]
    bufs = [p.read_bytes() for p in paths]
    # each segment's frames (header skipped) up to its first bad one; FormatError, before
    # anything is deleted or truncated, for a header or a record of a newer format
    spans = [_check_segment(p, b) for p, b in zip(paths, bufs, strict=True)]
    for seq, path in [*segments.items(), *snapshots.items()]:
        if seq < snap_seq:  # a crash interrupted the deletion that follows a snapshot
            path.unlink()
    expected = range(first, max(live, default=first - 1) + 1)
    if snap_seq and not live:
        expected = range(first, first + 1)  # the rotation creates it before the snapshot exists
    # live is sorted and within expected: a gap (or a missing first one) is a lost segment;
    # compared pairwise, so a stray log-99999999.wal costs nothing to notice
    for want, have in zip(expected, [*live, None], strict=False):
        if want != have:
            raise LogCorruptError(directory / _segment_name(want), 0, "segment missing")
    ends = _repair_tail(paths, bufs, spans, fsync)
    return _Recovered(
        snapshot=(snap_seq, snapshots[snap_seq]) if snap_seq else None,
        segments=list(zip(live, ends, strict=True)),
        next_seq=first,
    )


# A good frame's first two payload bytes when it is of a form this code reads: a msgpack array
# of 9 (v1), an array of 10 whose first item is 2 (v2). Any other frame is decoded to tell a
# newer form from garbage (rare: only those pay for it).
_V1_HEAD, _V2_HEAD = 0x99, b"\x9a\x02"


def _check_segment(path: Path, buf: bytes) -> tuple[int, int]:
    """(offset of the first frame, offset of the first frame that is not good) of a segment's
    bytes: ``scan`` past its header, also checking each good frame's form. ``FormatError``
    for a header or a record of a newer format; a frame of no form at all is left to replay
    (``LogCorruptError``), as it always was."""
    _version, start = _segment_start(path, buf)
    good, size = start, _FRAME.size
    for off, end in _iter_frames(buf, start):
        good = end
        head = off + size
        if buf[head] == _V1_HEAD or buf[head : head + 2] == _V2_HEAD:
            continue
        try:
            _decode(memoryview(buf)[head:end])
        except NewerFormError as exc:
            raise _newer_record(path, off, exc) from None
        except Exception:  # noqa: BLE001 - not records: replay says so
            pass
    return start, good


def _repair_tail(paths: list[Path], bufs: list[bytes], spans: list[tuple[int, int]],
                 fsync: bool) -> list[int]:
    """Valid end offset of each segment after cutting zeros and a torn tail; raises on
    corruption. ``spans``: each segment's (first frame, first bad frame), ``_check_segment``."""
    ends = [len(b) for b in bufs]
    for i, buf in enumerate(bufs):
        bad = spans[i][1]
        if bad == len(buf):
            continue
        last = i == len(bufs) - 1
        if last and buf.count(0, bad) == len(buf) - bad:  # the zeros kept ahead of the records
            ends[i] = bad
            _truncate(paths[i], bad, fsync)
            break
        for j in range(i, len(bufs)):  # a later release's record: not ours to judge or cut
            found = _find_record(bufs[j], bad + 1 if j == i else 0, newer_only=True)
            if found is not None:
                raise _newer_at(paths[j], bufs[j], found)
        reach = MAX_COMMIT_BYTES if last else 1  # a torn commit's pages, in any order
        for j in range(i, len(bufs)):
            found = _find_record(bufs[j], bad + reach if j == i else 0)
            if found is not None:
                raise LogCorruptError(
                    paths[i],
                    bad,
                    f"bad record followed by a valid one ({paths[j].name} "
                    f"offset {found}): not a torn tail",
                )
        dropped = len(buf.rstrip(b"\0")) - bad + sum(len(b.rstrip(b"\0")) for b in bufs[i + 1:])
        log.warning("torn tail in %s at offset %d: dropping %d bytes", paths[i], bad, dropped)
        for j in range(i, len(bufs)):
            ends[j] = bad if j == i else 0
            _truncate(paths[j], ends[j], fsync)
        break
    return ends


def _newer_at(path: Path, buf: bytes, off: int) -> Exception:
    """The ``FormatError`` for the record of a newer form at ``off`` (``_find_record``)."""
    try:
        _decode(memoryview(buf)[off + _FRAME.size : _frame_end(buf, off)])
    except NewerFormError as exc:
        return _newer_record(path, off, exc)
    raise AssertionError("not a newer record")  # pragma: no cover


def _find_record(buf: bytes, start: int, *, newer_only: bool = False) -> int | None:
    """First offset >= start holding a frame that passes its checksum and decodes to records
    with fields of the right types, or to a record of a newer form (``newer_only``: only
    such a record).

    A torn record's bytes hold client data, but an op id cannot hide a frame in them: a frame
    header holds a NUL byte (its length's high byte), and ``cluster.edge.validate`` refuses control
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
            end = _frame_end(buf, off)
            if end < 0:
                continue
            try:
                _decode(memoryview(buf)[off + _FRAME.size : end])
            except NewerFormError:  # a record all the same
                return off
            except Exception:  # garbage that happens to pass crc32 is not a record
                continue
            if not newer_only:
                return off
    return None


def _truncate(path: Path, size: int, fsync: bool) -> None:
    # Durable before new records land after it, or a crash could resurrect the torn bytes.
    with open(path, "r+b") as f:
        f.truncate(size)
        if fsync:
            os.fsync(f.fileno())
