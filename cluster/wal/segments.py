"""Reading the log's directory: file names, the listing, and the records in segment files.

    <dir>/log-<seq:08d>.wal          [header] then frames (``cluster.wal.frames``) of records
                                     (``cluster.wal.records``), in append order
    <dir>/snapshot-<seq:08d>.snap    a snapshot (``cluster.wal.files``); seq names the first
                                     segment it does NOT cover
    <dir>/archive/log-<seq:08d>.wal  segments a snapshot covered, kept by
                                     ``DurableLog(archive=True)`` instead of deleted

The public reader, for the log's own replay and for tools that read a log they do not own
(``client.chaos.forensics``): ``list_dir``, ``scan``, ``decode_segment``, ``read_segments``.
``decode_segment`` is pure; ``list_dir`` and ``read_segments`` only read the disk.

A segment's format (``cluster.core.versions``, the protocol version it was written at):

    1  no header: the segment starts with its first frame (idemcount 0.4.0 and before, and any
       segment created while the cluster's finalized version is 1)
    2  a 16-byte header, ``[8s magic "IDCLOG\\0\\0"][u16 format][u16 flags = 0][u32 crc32 of
       the 12 bytes before]``, then frames. Read as a frame header, the magic's first four
       bytes are a length far above ``MAX_RECORD_BYTES``: no frame is ever taken for a header
       nor a header for a frame, and a reader that knows no header (0.4.0) finds no record in
       the segment.

A header naming a format above ``PROTOCOL_MAX`` raises ``FormatError`` wherever a segment is
read (never a torn tail: nothing is cut from such a segment); a header that fails its crc32 is
``LogCorruptError``. A file shorter than a header that starts with the magic is a header a crash
cut short: it holds no record, and recovery's torn-tail rules take it.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgpack

from cluster.core.versions import PROTOCOL_MAX, FormatError, newer
from cluster.wal.errors import LogCorruptError
from cluster.wal.frames import _FRAME, _iter_frames, scan
from cluster.wal.records import _COLUMNAR, LogRecord, NewerFormError, _decode_payload

__all__ = ["LogFiles", "decode_segment", "list_dir", "read_segments", "segment_format"]

_SEGMENT_RE = re.compile(r"log-(\d{8,})\.wal")
_SNAPSHOT_RE = re.compile(r"snapshot-(\d{8,})\.snap")
_ARCHIVE = "archive"


def _segment_name(seq: int) -> str:
    return f"log-{seq:08d}.wal"


def _snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:08d}.snap"


_SEG_MAGIC = b"IDCLOG\0\0"
_SEG_HEADER = struct.Struct("<8sHHI")  # magic, format, flags, crc32 of the 12 bytes before


def _segment_header(version: int) -> bytes:
    """What a segment of format ``version`` starts with: nothing at 1, the header from 2."""
    if version <= 1:
        return b""
    head = _SEG_HEADER.pack(_SEG_MAGIC, version, 0, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def _segment_start(path: str | Path, buf: bytes | memoryview) -> tuple[int, int]:
    """(format, offset of the first frame) of the segment whose bytes start ``buf``:
    (1, 0) without a header. ``FormatError`` for a format above ``PROTOCOL_MAX``,
    ``LogCorruptError`` for a header that fails its checksum."""
    if bytes(buf[:8]) != _SEG_MAGIC or len(buf) < _SEG_HEADER.size:
        return 1, 0
    _magic, version, _flags, crc = _SEG_HEADER.unpack_from(buf)
    if version > PROTOCOL_MAX:  # before the checksum: a later header may cover more bytes
        raise newer(f"log segment {path}", version)
    if zlib.crc32(buf[: _SEG_HEADER.size - 4]) != crc or version < 2:
        raise LogCorruptError(path, 0, "segment header checksum mismatch")
    return version, _SEG_HEADER.size


def segment_format(path: str | Path) -> int:
    """The format the segment at ``path`` was written in (1: no header). Raises as
    ``read_segments`` does for a newer or damaged header."""
    with open(path, "rb") as f:
        return _segment_start(path, f.read(_SEG_HEADER.size))[0]


def _newer_record(path: str | Path, off: int, exc: NewerFormError) -> FormatError:
    return newer(f"a record in log segment {path} (offset {off})", exc.form, _COLUMNAR)


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
    """Every record in ``buf``, which must be a segment's header, if it has one, then whole
    good frames (its bytes up to ``scan``); ``path`` only names the file in errors.

    Lazy: records are yielded frame by frame, and ``LogCorruptError`` is raised on reaching a
    frame that is not good or whose payload does not decode to records; ``FormatError`` for a
    header or a record of a newer format than this code reads.
    """
    size, unpackb, decode = _FRAME.size, msgpack.unpackb, _decode_payload
    view = memoryview(buf)
    _version, good = _segment_start(path, buf)
    for off, end in _iter_frames(buf, good):
        try:
            recs = decode(unpackb(view[off + size : end], use_list=False))
        except NewerFormError as exc:
            raise _newer_record(path, off, exc) from None
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
    archived one of the same seq). ``LogCorruptError`` for a good frame that is not records,
    ``FormatError`` for a segment or record of a newer format.
    """
    directory = Path(directory)
    segments = list_dir(directory).segments
    if archived and (directory / _ARCHIVE).is_dir():
        segments = {**list_dir(directory / _ARCHIVE).segments, **segments}
    for seq in sorted(segments):
        buf = segments[seq].read_bytes()
        _version, start = _segment_start(segments[seq], buf)
        yield from decode_segment(segments[seq], buf[: scan(buf, start)])
