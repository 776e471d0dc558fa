"""The log's counters: what the writer updates per batch, and the frozen copy it hands out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["FSYNC_BUCKETS", "LogStats"]

# Prometheus-style upper bounds (seconds); the last bucket catches everything slower.
FSYNC_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, math.inf,
)  # fmt: skip


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
    # what writes and fsyncs: "c" (the writer thread's compiled loop, without the GIL),
    # "python" (its Python loop) or "loop" (no thread: fsync off, or fsync_in_loop)
    writer: str = "loop"

    def fsync_cumulative(self) -> list[tuple[float, int]]:
        """(le, count of fsyncs <= le) pairs, the shape a Prometheus histogram exports."""
        total, out = 0, []
        for bound, count in zip(self.fsync_buckets, self.fsync_counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass(slots=True)
class _MutableStats:
    """The live counters the writer bumps per batch; ``freeze`` makes the ``LogStats``."""

    records_appended: int = 0
    bytes_appended: int = 0
    batches: int = 0
    fsyncs: int = 0
    last_fsync_seconds: float = 0.0
    fsync_seconds_total: float = 0.0
    fsync_counts: list[int] = field(default_factory=lambda: [0] * len(FSYNC_BUCKETS))
    writer: str = "loop"

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
            writer=self.writer,
        )
