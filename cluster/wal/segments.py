"""Reading the log's directory: file names, the listing, and the records in segment files.

    <dir>/log-<seq:08d>.wal          frames (``cluster.wal.frames``) of records
                                     (``cluster.wal.records``), in append order
    <dir>/snapshot-<seq:08d>.snap    a snapshot (``cluster.wal.files``); seq names the first
                                     segment it does NOT cover
    <dir>/archive/log-<seq:08d>.wal  segments a snapshot covered, kept by
                                     ``DurableLog(archive=True)`` instead of deleted

The public reader, for the log's own replay and for tools that read a log they do not own
(``client.chaos.forensics``): ``list_dir``, ``scan``, ``decode_segment``, ``read_segments``.
``decode_segment`` is pure; ``list_dir`` and ``read_segments`` only read the disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgpack

from cluster.wal.errors import LogCorruptError
from cluster.wal.frames import _FRAME, _iter_frames, scan
from cluster.wal.records import LogRecord, _decode_payload

__all__ = ["LogFiles", "decode_segment", "list_dir", "read_segments"]

_SEGMENT_RE = re.compile(r"log-(\d{8,})\.wal")
_SNAPSHOT_RE = re.compile(r"snapshot-(\d{8,})\.snap")
_ARCHIVE = "archive"


def _segment_name(seq: int) -> str:
    return f"log-{seq:08d}.wal"


def _snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:08d}.snap"


class LogFiles(NamedTuple):
    """The segment and snapshot files of one log directory, each by its seq."""

    segments: dict[int, Path]
    snapshots: dict[int, Path]


def list_dir(directory: str | Path) -> LogFiles:
    """The segments and snapshots directly in ``directory`` (not in ``archive/``), by seq;
    other files are ignored."""
    segments: dict[int, Path] = {}
    snapshots: dict[int, Path] = {}
    for path in Path(directory).iterdir():
        if m := _SEGMENT_RE.fullmatch(path.name):
            segments[int(m.group(1))] = path
        elif m := _SNAPSHOT_RE.fullmatch(path.name):
            snapshots[int(m.group(1))] = path
    return LogFiles(segments, snapshots)


def decode_segment(path: str | Path, buf: bytes) -> Iterator[LogRecord]:
    """Every record in ``buf``, which must be whole good frames (a segment's bytes up to
    ``scan``); ``path`` only names the file in errors.

    Lazy: records are yielded frame by frame, and ``LogCorruptError`` is raised on reaching a
    frame that is not good or whose payload does not decode to records.
    """
    size, unpackb, decode = _FRAME.size, msgpack.unpackb, _decode_payload
    view = memoryview(buf)
    good = 0
    for off, end in _iter_frames(buf):
        try:
            recs = decode(unpackb(view[off + size : end], use_list=False))
        except Exception as exc:  # passed crc32 but is not ours: a bug or a foreign file
            raise LogCorruptError(path, off, f"undecodable record: {exc}") from exc
        yield from recs
        good = end
    if good != len(buf):
        raise LogCorruptError(path, good, "record changed since start() checked it")


def read_segments(directory: str | Path, *, archived: bool = True) -> Iterator[LogRecord]:
    """Every whole record in the segments of the log in ``directory``, in append order.

    Read-only, and without the recovery ``DurableLog.start`` does: each segment is read up to
    its first bad frame (a torn tail is skipped, not truncated). Snapshots are not read, so a
    log that deleted the segments its snapshots cover yields only the records after them.
    With ``archived``, the segments in ``archive/`` come first (a live segment wins over an
    archived one of the same seq). ``LogCorruptError`` for a good frame that is not records.
    """
    directory = Path(directory)
    segments = list_dir(directory).segments
    if archived and (directory / _ARCHIVE).is_dir():
        segments = {**list_dir(directory / _ARCHIVE).segments, **segments}
    for seq in sorted(segments):
        buf = segments[seq].read_bytes()
        yield from decode_segment(segments[seq], buf[: scan(buf)])
