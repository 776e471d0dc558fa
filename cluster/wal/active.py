"""The active segment: the one file the log writes to, and its writes, fsyncs and rotations.

Synchronous I/O only, run by the log's writer thread (or on the loop when there is none,
``cluster.wal.committer``). Every use of the fd holds ``lock``, so ``close`` (a crash-like abort
on the loop) never closes the fd under a running fsync, and a reused fd number can never
receive our bytes.

With fsync on, the file is kept zero-filled ahead of its records (``ZERO_AHEAD``, up to the
segment's size limit), and commits are positional writes into the zeros. A commit then
overwrites blocks the file already has, and its fdatasync flushes the data alone. An append
grew the file at every commit, so each fdatasync also wrote the inode (its size): a second
device write and wait per commit, a third of the writer thread's waits under load (``perf``
of ``sched_switch``). The zeros are not records: recovery ends a segment where they begin
(``cluster.wal.files``), and a segment is trimmed to its records when it is rotated or the log
stops (durably at a rotation, so that only the last segment can end in zeros).

``format``: the format of the segments this creates (``cluster.wal.segments``); from 2 a new
segment starts with its header, written and fdatasynced before any record (once per segment,
off the append path), so a segment that holds records always has its whole header. The log sets
it (``DurableLog.set_format``); a segment keeps the format it was created in.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from cluster.wal import files
from cluster.wal.errors import LogClosedError
from cluster.wal.segments import _segment_header, _segment_name

# Zeros kept ahead of the records; refilled (in one write) once half of them are used, so the
# file grows, and an fdatasync writes its inode, once per ZERO_AHEAD / 2 bytes of records.
ZERO_AHEAD = 1 << 20


class ActiveSegment:
    """Segment ``seq`` of ``directory``, open for writes; its records end at ``size``, the
    file at ``end`` (zeros between, with fsync on). ``limit``: the segment size at which the
    log rotates, which the zeros never pass."""

    def __init__(self, directory: Path, seq: int, size: int, *, fsync: bool,
                 create: bool, limit: int = 64 << 20, format: int = 1) -> None:
        self.dir, self.fsync, self.limit = directory, fsync, limit
        self.format = format  # of the segments created from now on (the loop may change it)
        self.lock = threading.Lock()
        self.fd = self._open(seq, create)
        self.seq, self.size = seq, size
        self.end = os.fstat(self.fd).st_size
        if size == 0:  # new, or holding no record (recovery cut it to nothing): a header first
            self.size = self._start(self.fd)
            self.end = max(self.end, self.size)

    @property
    def full(self) -> bool:
        """The records reached the segment's size: the log rotates."""
        return self.size >= self.limit

    def room(self) -> int:
        """Bytes the next commits may write before ``reserve`` should run again: half the
        zeros ahead (so that a last commit past the mark still lands in zeros), or up to the
        limit once the zeros reach it."""
        if not self.fsync or self.end >= self.limit:
            return self.limit - self.size
        return self.end - ZERO_AHEAD // 2 - self.size

    def reserve(self) -> None:
        """Zero-fill the file ``ZERO_AHEAD`` past its records (not past ``limit``) once fewer
        than half that many zeros are left; nothing without fsync."""
        if not self.fsync or self.end - self.size >= ZERO_AHEAD // 2 or self.end >= self.limit:
            return
        target = min(self.size + ZERO_AHEAD, self.limit)
        with self.lock:
            if self.fd < 0:
                raise LogClosedError("log closed during a write")
            self._pwrite(bytes(target - self.end), self.end)
            self.end = target

    @property
    def path(self) -> Path:
        return self.dir / _segment_name(self.seq)

    def write(self, data: bytes) -> float:
        """Write ``data`` after the records and make it durable; the seconds the fsync took
        (0 without)."""
        self.reserve()
        with self.lock:
            if self.fd < 0:
                raise LogClosedError("log closed during a write")
            self._pwrite(data, self.size)
            self.wrote(len(data))
            if not self.fsync:
                return 0.0
            t0 = time.perf_counter()
            files._datasync(self.fd)
            return time.perf_counter() - t0

    def wrote(self, nbytes: int) -> None:
        """``nbytes`` more were written after the records (``write``'s, or the compiled
        loop's)."""
        self.size += nbytes
        self.end = max(self.end, self.size)

    def rotate(self) -> None:
        """Close this segment and go on in the next one. The last write was fsynced before
        this is called, so the old segment is complete; its zeros are cut, durably, first: only
        the last segment may end in zeros after a crash (``cluster.wal.files``)."""
        with self.lock:
            if self.fd < 0:
                raise LogClosedError("log closed during a rotation")
            if self._trim() and self.fsync:
                files._datasync(self.fd)
        fd = self._open(self.seq + 1, True)
        try:
            size = self._start(fd)
        except BaseException:
            os.close(fd)
            raise
        with self.lock:
            if self.fd < 0:
                os.close(fd)
                raise LogClosedError("log closed during a rotation")
            os.close(self.fd)
            self.fd, self.seq, self.size, self.end = fd, self.seq + 1, size, size

    def _start(self, fd: int) -> int:
        """Write a new segment's header (none at format 1), durably; its size."""
        header = _segment_header(self.format)
        if header:
            os.pwrite(fd, header, 0)  # 16 bytes: one write
            if self.fsync:
                files._datasync(fd)
        return len(header)

    def close(self, *, trim: bool = False) -> None:
        """Close the file; ``trim``: cut the zeros after the records first (a clean stop; a
        crash leaves them, and recovery ends the segment where they begin)."""
        with self.lock:
            if self.fd >= 0:
                if trim:  # a failed log's file may refuse (a test's /dev/null): zeros stay
                    with contextlib.suppress(OSError):
                        self._trim()
                os.close(self.fd)
                self.fd = -1

    def _trim(self) -> bool:
        """Cut the zeros after the records; whether there were any. Not fsynced here: a
        rotation fsyncs it, and the last segment's zeros left by a crash are ended by recovery
        like any others."""
        if self.end <= self.size:
            return False
        os.ftruncate(self.fd, self.size)
        self.end = self.size
        return True

    def _pwrite(self, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:  # a regular file may take a large write in pieces
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def _open(self, seq: int, create: bool) -> int:
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.dir / _segment_name(seq), flags | (os.O_EXCL if create else 0), 0o644)
        if create and self.fsync:
            files._fsync_dir(self.dir)  # the new name must survive a crash like its contents
        return fd
