"""The durable log's error tree. No retry of the same call helps with any of them.

    ClusterError (cluster.core.errors)     retriable?  code              caused by
    +-- LogError                      no          log_error         the disk (a snapshot write
        |                                                           failed; appends go on)
        +-- LogCorruptError           no          log_corrupt       the files: damage a crash
        |                                                           cannot explain
        +-- LogClosedError            no          log_closed        the caller: the log is not
        |                                                           running
        +-- LogWriteError             no          log_write_failed  the disk: a write or fsync
                                                                    failed; the log is poisoned

A record the encoders refuse (a field out of range, a payload over the size limit) is the
caller's bug, not the log's: the append raises ``ValueError`` and nothing is queued.
"""

from __future__ import annotations

from pathlib import Path

from cluster.core.errors import ClusterError

__all__ = ["LogClosedError", "LogCorruptError", "LogError", "LogWriteError"]


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
