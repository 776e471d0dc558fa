"""Durable log: group-committed append throughput and latency with fsync on, and replay speed.

Run: ``python -m bench.bench_wal [--quick] [--duration S] [--replay-records N] [--dir PATH]``.
Each (appenders, records per append) cell runs for a fixed duration on a fresh log with fsync
on; every number comes from this run. ``--dir`` puts the logs on the disk you want to measure
(default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from cluster.wal import DurableLog, LogRecord, RecordKind

CELLS = [(1, 1), (1, 100), (16, 1), (16, 100), (256, 1), (256, 100)]


def _records(prefix: str, count: int, start: int = 0) -> list[LogRecord]:
    now = time.time()
    return [
        LogRecord(RecordKind.APPLY, f"{prefix}:{i}", "t1", f"key-{i % 1000}", 1, "n1", i, 0, now)
        for i in range(start, start + count)
    ]


async def append_cell(
    directory: Path, appenders: int, batch: int, duration: float
) -> dict[str, float]:
    """Records/s and append-call latency with ``appenders`` tasks appending ``batch`` records."""
    latencies: list[float] = []
    async with DurableLog(directory, fsync=True) as log:
        stop_at = time.perf_counter() + duration

        async def appender(w: int) -> int:
            records = _records(f"client-{w}", batch)  # content is irrelevant to the log's cost
            done = 0
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                await log.append(records)
                latencies.append(time.perf_counter() - t0)
                done += batch
            return done

        t0 = time.perf_counter()
        total = sum(await asyncio.gather(*(appender(w) for w in range(appenders))))
        elapsed = time.perf_counter() - t0
        stats = log.stats()
    lat = np.array(latencies) * 1e3
    return {
        "records/s": total / elapsed,
        "p50 ms": float(np.percentile(lat, 50)),
        "p99 ms": float(np.percentile(lat, 99)),
        "records/fsync": stats.records_appended / max(stats.fsyncs, 1),
        "fsync avg ms": 1e3 * stats.fsync_seconds_total / max(stats.fsyncs, 1),
    }


async def replay_cell(directory: Path, count: int) -> dict[str, float]:
    """Write ``count`` records (fsync off: only the reading is timed), then start + replay."""
    async with DurableLog(directory, fsync=False) as log:
        step = 10_000
        for i in range(0, count, step):
            await log.append(_records("client", min(step, count - i), i))
        size = log.stats().bytes_appended
    log = DurableLog(directory, fsync=False)
    t0 = time.perf_counter()
    await log.start()  # scans every frame's checksum, looking for a torn tail
    t1 = time.perf_counter()
    seen = sum(1 for _ in log.replay())
    t2 = time.perf_counter()
    await log.stop()
    assert seen == count, (seen, count)
    return {
        "records": count,
        "MB": size / 1e6,
        "start s": t1 - t0,
        "replay s": t2 - t1,
        "records/s": count / (t2 - t0),
    }


def _run(coro: Coroutine[Any, Any, dict[str, float]]) -> dict[str, float]:
    try:
        import uvloop  # the node runs on uvloop, so measure there when it is available
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short cells, 100k replay (smoke run)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per cell (default 2)")
    ap.add_argument("--replay-records", type=int, default=None, help="default 1,000,000")
    ap.add_argument("--dir", type=Path, default=None, help="where to put the logs")
    args = ap.parse_args(argv)
    duration = args.duration or (0.5 if args.quick else 2.0)
    replay_n = args.replay_records or (100_000 if args.quick else 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="bench_wal-", dir=args.dir))
    try:
        print(f"appends, fsync on, {duration:g} s per cell, logs in {root}")
        head = ["records/s", "p50 ms", "p99 ms", "records/fsync", "fsync avg ms"]
        print(f"{'appenders':>9s} {'batch':>5s} " + " ".join(f"{h:>13s}" for h in head))
        for appenders, batch in CELLS:
            cell = root / f"append-{appenders}-{batch}"
            row = _run(append_cell(cell, appenders, batch, duration))
            shutil.rmtree(cell)
            values = " ".join(f"{row[h]:13,.0f}" if h == "records/s" else f"{row[h]:13.3f}"
                              for h in head)  # fmt: skip
            print(f"{appenders:9d} {batch:5d} {values}")
        row = _run(replay_cell(root / "replay", replay_n))
        print(
            f"\nreplay {row['records']:,.0f} records ({row['MB']:.1f} MB): start (scan) "
            f"{row['start s']:.2f} s + replay (decode) {row['replay s']:.2f} s = "
            f"{row['records/s']:,.0f} records/s"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
