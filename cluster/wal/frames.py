"""The frame, the log's unit of checksumming: ``[u32 length][u32 crc32(payload)][payload]``.

Little-endian. Pure: bytes in, offsets out, no I/O. What makes a frame good is decided in one
place, ``_iter_frames``; ``scan``, ``_frame_end``, the segment decoder and recovery's search
for a record after a bad frame all go through it.

Inside ``cluster.wal`` a leading underscore marks a name the package's modules share but do
not export; the package's ``__all__`` is the public surface.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

__all__ = ["MAX_COMMIT_BYTES", "MAX_RECORD_BYTES", "scan"]

_FRAME = struct.Struct("<II")  # payload length, crc32 of payload
MAX_RECORD_BYTES = 64 * 1024  # per payload; also bounds how far a garbage length can reach
# Bytes one commit (one write + fdatasync) writes at most, unless one append alone is larger: so
# a crash mid-commit tears at most this many bytes, which recovery relies on (``files``).
MAX_COMMIT_BYTES = 1 << 20


def _iter_frames(buf: bytes, off: int = 0) -> Iterator[tuple[int, int]]:
    """(start, end) of each good frame from ``off`` on, in order, stopping before the first
    frame that is not good; the payload is ``buf[start + _FRAME.size : end]``.

    The one rule: a frame is good when its header is whole, its length is 1 to
    ``MAX_RECORD_BYTES``, its payload lies within ``buf``, and the payload's crc32 matches.
    """
    size, n = _FRAME.size, len(buf)
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
            return
        yield off, end
        off = end


def scan(buf: bytes, start: int = 0) -> int:
    """Offset of the first frame in ``buf`` from ``start`` on that is not good (a tail shorter
    than a header counts as one), or ``len(buf)`` when every frame is good. ``buf[:scan(buf)]``
    is the part of a headerless segment that holds whole frames; a segment with a header
    (``cluster.wal.segments``) has its frames from ``start`` = the header's size."""
    good = start
    for _start, end in _iter_frames(buf, start):
        good = end
    return good


def _frame_end(buf: bytes, off: int) -> int:
    """End offset of the good frame at ``off``, or -1 when the frame there is not good."""
    for _start, end in _iter_frames(buf, off):
        return end
    return -1
