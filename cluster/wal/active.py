"""The active segment: the one file the log appends to, and its writes, fsyncs and rotations.

Synchronous I/O only, run by the log's writer thread (or on the loop when there is none,
``cluster.wal.committer``). Every use of the fd holds ``lock``, so ``close`` (a crash-like abort
on the loop) never closes the fd under a running fsync, and a reused fd number can never
receive our bytes.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cluster.wal import files
from cluster.wal.errors import LogClosedError
from cluster.wal.segments import _segment_name


class ActiveSegment:
    """Segment ``seq`` of ``directory``, open for appends, ``size`` bytes long so far."""

    def __init__(self, directory: Path, seq: int, size: int, *, fsync: bool,
                 create: bool) -> None:
        self.dir, self.fsync = directory, fsync
        self.lock = threading.Lock()
        self.fd = self._open(seq, create)
        self.seq, self.size = seq, size

    @property
    def path(self) -> Path:
        return self.dir / _segment_name(self.seq)

    def write(self, data: bytes) -> float:
        """Append ``data`` and make it durable; the seconds the fsync took (0 without)."""
        with self.lock:
            if self.fd < 0:
                raise LogClosedError("log closed during a write")
            view = memoryview(data)
            while view:  # a regular file may take a large write in pieces
                view = view[os.write(self.fd, view) :]
            self.size += len(data)
            if not self.fsync:
                return 0.0
            t0 = time.perf_counter()
            files._datasync(self.fd)
            return time.perf_counter() - t0

    def rotate(self) -> None:
        """Close this segment and go on in the next one. The last write was fsynced before
        this is called, so the old segment is complete."""
        fd = self._open(self.seq + 1, True)
        with self.lock:
            if self.fd < 0:
                os.close(fd)
                raise LogClosedError("log closed during a rotation")
            os.close(self.fd)
            self.fd, self.seq, self.size = fd, self.seq + 1, 0

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def _open(self, seq: int, create: bool) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.dir / _segment_name(seq), flags | (os.O_EXCL if create else 0), 0o644)
        if create and self.fsync:
            files._fsync_dir(self.dir)  # the new name must survive a crash like its contents
        return fd
