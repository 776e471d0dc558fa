"""The durable log: round trips, group commit, torn tails vs corruption, snapshots, kill -9."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cluster.wal as wal
import cluster.wal.active as wal_active
import cluster.wal.committer as wal_committer
import cluster.wal.files as wal_files
import cluster.wal.writer as wal_writer
from cluster.core.errors import ClusterError, ConfigError
from cluster.core.versions import FormatError
from cluster.wal import (
    DurableLog,
    LogClosedError,
    LogCorruptError,
    LogError,
    LogRecord,
    LogWriteError,
    RecordKind,
)

pytestmark = pytest.mark.timeout(60)

I64_MIN, I64_MAX, U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def rec(i: int, *, kind: int = RecordKind.APPLY, prefix: str = "c") -> LogRecord:
    return LogRecord(kind, f"{prefix}:{i}", "t1", f"key-{i % 7}", 1, "n1", i, 0, 1.7e9 + i)


def recs(n: int, *, start: int = 0, prefix: str = "c") -> list[LogRecord]:
    return [rec(i, prefix=prefix) for i in range(start, start + n)]


def frames(records: Iterable[LogRecord]) -> bytes:
    return wal._encode(list(records), msgpack.Packer().pack)


def segment(d: Path, seq: int = 1) -> Path:
    return d / f"log-{seq:08d}.wal"


async def reopen(d: Path, **kw: object) -> tuple[bytes | None, list[LogRecord]]:
    async with DurableLog(d, **kw) as log:  # type: ignore[arg-type]
        return log.load_snapshot(), list(log.replay())


async def write(d: Path, records: list[LogRecord], **kw: object) -> None:
    async with DurableLog(d, **kw) as log:  # type: ignore[arg-type]
        await log.append(records)


@pytest.fixture(params=["compiled", "python"])
def writer_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The writer thread's two loops (``cluster.wal.committer``): the compiled one, which runs
    without the GIL, and the Python one. Tests with a writer thread (``fsync=True``) run on
    both and must see the same outcomes."""
    if request.param == "compiled":
        if wal_committer._native is None:
            pytest.skip(f"cluster.wal._writer: {wal_committer.NATIVE_WHY_NOT}")
    else:
        monkeypatch.setattr(wal_committer, "_native", None)
    return str(request.param)


threaded = pytest.mark.usefixtures("writer_loop")


# ---------------------------------------------------------------- round trip, group commit


async def test_round_trip_many_records_and_edge_values(tmp_path: Path) -> None:
    edge = [
        LogRecord(RecordKind.REPLICA, "ü-ñ:0", "tä", "k€y", I64_MIN, "n2", U64_MAX, 0, 0.0),
        LogRecord(RecordKind.PUBLISHED, "", "", "", I64_MAX, "", 0, U64_MAX, -1.5),
        LogRecord(99, "x" * 256, "t", "k", -1, "n3", 1 << 40, 1 << 63, 1.7e9 + 0.123456789),
    ]
    body = recs(20_000)
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append(edge)
        for i in range(0, len(body), 1000):
            await log.append(body[i : i + 1000])
        assert log.stats().records_appended == len(body) + len(edge)
    snap, replayed = await reopen(tmp_path)
    assert snap is None
    assert replayed == edge + body
    assert replayed[0].kind == RecordKind.REPLICA


@threaded
async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        await asyncio.gather(*(log.append([rec(i)]) for i in range(500)))
        stats = log.stats()
    assert stats.records_appended == 500
    assert stats.fsyncs == stats.batches
    assert 1 <= stats.fsyncs <= 50, "group commit should batch 500 concurrent appends"
    assert sum(stats.fsync_counts) == stats.fsyncs
    assert stats.fsync_cumulative()[-1] == (float("inf"), stats.fsyncs)
    assert stats.fsync_seconds_total >= stats.last_fsync_seconds > 0
    _, replayed = await reopen(tmp_path)
    assert sorted(r.op_id for r in replayed) == sorted(r.op_id for r in recs(500))


async def test_max_batch_records_bounds_each_write(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False, max_batch_records=10) as log:
        await asyncio.gather(*(log.append([rec(i)]) for i in range(100)))
        await log.append(recs(25, start=100))  # one append is never split, even if larger
        stats = log.stats()
    assert stats.batches >= 11
    assert stats.fsyncs == 0
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(125)


@threaded
async def test_append_nowait_pipelines_in_order(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        futures = [log.append_nowait(recs(3, start=3 * i)) for i in range(50)]
        empty = log.append_nowait([])
        assert empty.done()
        await asyncio.gather(*futures)
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(150)


async def test_bad_input_and_lifecycle_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        DurableLog(tmp_path, max_batch_records=0)
    log = DurableLog(tmp_path, fsync=False)
    with pytest.raises(LogClosedError):
        log.append_nowait([rec(0)])
    with pytest.raises(LogClosedError):
        log.replay()
    await log.start()
    for bad in (
        LogRecord(1, "a", "t", "k", I64_MAX + 1, "n", 0, 0, 0.0),
        LogRecord(1, "a", "t", "k", 0, "n", -1, 0, 0.0),
        LogRecord(1, "a", "t", "k", 0, "n", 0, U64_MAX + 1, 0.0),
        LogRecord(1, "a", "t", "k" * (70 * 1024), 0, "n", 0, 0, 0.0),
    ):
        with pytest.raises(ValueError):
            log.append_nowait([rec(1), bad])
    await log.append([rec(2)])
    await log.stop()
    await log.stop()  # idempotent
    with pytest.raises(LogClosedError):
        await log.append([rec(3)])
    assert issubclass(LogCorruptError, ClusterError) and not LogCorruptError.retriable
    _, replayed = await reopen(tmp_path)
    assert replayed == [rec(2)]  # nothing of a rejected call was queued


# ---------------------------------------------------------------- torn tails vs corruption


@pytest.mark.parametrize("cut", [1, 5, 8, 9, 20])
async def test_torn_tail_is_truncated_and_log_keeps_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: int
) -> None:
    await write(tmp_path, recs(100))
    path = segment(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - cut)  # every record is longer than 20 bytes: the last is torn
    with caplog.at_level(logging.WARNING, logger="cluster.wal"):
        _, replayed = await reopen(tmp_path)
    assert replayed == recs(99)
    assert "torn tail" in caplog.text
    assert path.stat().st_size == len(frames(recs(99)))
    await write(tmp_path, recs(5, start=500))
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(99) + recs(5, start=500)


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 4096, b"\xff" * 3, random.Random(7).randbytes(1000), b"\x10\x00\x00\x00junk"],
    ids=["zeros", "short", "random", "plausible-length"],
)
async def test_garbage_after_the_last_record_is_dropped(tmp_path: Path, garbage: bytes) -> None:
    await write(tmp_path, recs(50))
    with open(segment(tmp_path), "ab") as f:
        f.write(garbage)
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(50)
    await write(tmp_path, recs(1, start=50))
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(51)


async def test_bad_record_followed_by_valid_ones_is_corruption(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await write(tmp_path, recs(100))
    path = segment(tmp_path)
    offset = len(frames(recs(40)))
    data = bytearray(path.read_bytes())
    data[offset + 12] ^= 0x01  # a payload byte of record 40
    path.write_bytes(bytes(data))
    # valid records more than one commit's reach after the bad one: not a torn commit
    reach = len(frames(recs(20)))
    assert len(data) - offset > 2 * reach
    monkeypatch.setattr(wal_files, "MAX_COMMIT_BYTES", reach)
    with pytest.raises(LogCorruptError) as err:
        await reopen(tmp_path)
    assert err.value.offset == offset
    assert err.value.path == str(path)
    assert str(path) in str(err.value) and f"offset {offset}" in str(err.value)
    assert path.read_bytes() == bytes(data), "corruption must not be 'repaired' by truncation"


async def test_a_torn_commit_may_hold_valid_records_after_a_bad_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A commit overwrites zeros, so a crash can leave any of its pages written: a bad record
    followed by valid ones within one commit's reach, then zeros, is a torn tail."""
    await write(tmp_path, recs(60))
    path = segment(tmp_path)
    durable = len(frames(recs(50)))
    data = bytearray(path.read_bytes())
    assert len(data) == len(frames(recs(60)))  # a clean stop trims the zeros
    page = len(frames(recs(53)))
    data[durable:page] = bytes(page - durable)  # records 50-52 never reached the disk
    path.write_bytes(bytes(data) + bytes(5000))  # records 53-59 did, then the zeros ahead
    with caplog.at_level(logging.WARNING, logger="cluster.wal"):
        _, replayed = await reopen(tmp_path)
    assert replayed == recs(50)
    assert "torn tail" in caplog.text
    assert path.stat().st_size == durable


@threaded
async def test_zeros_are_kept_ahead_of_the_records_and_trimmed_at_a_clean_stop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With fsync, a commit overwrites zeros (its fdatasync then has no file size to write);
    a crash leaves them, and recovery ends the segment there without a warning."""
    log = DurableLog(tmp_path, segment_bytes=1 << 30)
    await log.start()
    for i in range(20):
        await log.append(recs(10, start=10 * i))
    path = segment(tmp_path)
    assert path.stat().st_size >= len(frames(recs(200))) + wal_active.ZERO_AHEAD // 2
    log.abort()  # as kill -9 would: the zeros stay
    assert path.read_bytes()[len(frames(recs(200))):].count(0) == (
        path.stat().st_size - len(frames(recs(200))))
    with caplog.at_level(logging.WARNING, logger="cluster.wal"):
        _, replayed = await reopen(tmp_path)
    assert replayed == recs(200)
    assert "torn tail" not in caplog.text
    assert path.stat().st_size == len(frames(recs(200)))  # reopen's clean stop trimmed


@threaded
async def test_a_rotated_segment_ends_with_its_records(tmp_path: Path) -> None:
    """The zeros stop at the segment size, and a rotation cuts them (durably) before the next
    segment begins: only the last segment may end in zeros."""
    log = DurableLog(tmp_path, segment_bytes=2000)
    await log.start()
    for i in range(120):
        await log.append([rec(i)])
    segs = sorted(tmp_path.glob("log-*.wal"))
    assert len(segs) > 2
    for path in segs[:-1]:
        data = path.read_bytes()
        assert wal.scan(data) == len(data) >= 2000
    assert segs[-1].stat().st_size <= 2000 + len(frames([rec(0)]))
    log.abort()
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(120)


async def test_bad_tail_of_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False, segment_bytes=500) as log:
        for i in range(30):
            await log.append([rec(i)])
    assert segment(tmp_path, 3).exists()
    first = segment(tmp_path, 1)
    os.truncate(first, first.stat().st_size - 3)
    with pytest.raises(LogCorruptError) as err:
        await reopen(tmp_path)
    assert err.value.path == str(first)


async def test_record_that_passes_crc_but_does_not_decode_fails_replay(tmp_path: Path) -> None:
    payload = msgpack.packb([1, 2, 3])  # three fields, not nine
    bogus = wal._FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    segment(tmp_path).write_bytes(frames(recs(3)) + bogus + frames(recs(2, start=3)))
    async with DurableLog(tmp_path, fsync=False) as log:
        with pytest.raises(LogCorruptError) as err:
            list(log.replay())
    assert err.value.offset == len(frames(recs(3)))


async def test_missing_segment_is_corruption(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False, segment_bytes=300) as log:
        for i in range(20):
            await log.append([rec(i)])
    segment(tmp_path, 2).unlink()
    with pytest.raises(LogCorruptError, match="segment missing"):
        await reopen(tmp_path)


# ---------------------------------------------------------------- segments and snapshots


async def test_segments_rotate_by_size_and_replay_in_order(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False, segment_bytes=2000) as log:
        for i in range(0, 300, 3):
            await log.append(recs(3, start=i))
    assert len(list(tmp_path.glob("log-*.wal"))) > 5
    _, replayed = await reopen(tmp_path, segment_bytes=2000)
    assert replayed == recs(300)


@threaded
async def test_snapshot_covers_records_before_the_cut_only(tmp_path: Path) -> None:
    cut = asyncio.Event()
    async with DurableLog(tmp_path, fsync=True, segment_bytes=1000) as log:
        await log.append(recs(100))  # several segments, all covered
        before = log.append_nowait(recs(10, prefix="before"))  # queued, not yet written

        def make_blob() -> bytes:
            cut.set()
            return b"state-at-cut"

        snap = asyncio.create_task(log.write_snapshot(make_blob))
        await cut.wait()
        after = log.append_nowait(recs(10, prefix="after"))
        await asyncio.gather(snap, before, after)
        await log.append(recs(5, prefix="later"))
    segs = sorted(p.name for p in tmp_path.glob("log-*.wal"))
    snaps = sorted(p.name for p in tmp_path.glob("snapshot-*"))
    assert len(snaps) == 1 and snaps[0].endswith(".snap")
    first_kept = int(snaps[0].split("-")[1].split(".")[0])
    assert segs[0] == f"log-{first_kept:08d}.wal", "segments covered by the snapshot are gone"
    blob, replayed = await reopen(tmp_path)
    assert blob == b"state-at-cut"
    assert replayed == recs(10, prefix="after") + recs(5, prefix="later")


async def test_a_finished_cut_is_written_only_once_what_it_may_hold_is_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``SnapshotCut`` is finished while appends go on, so its blob may hold records
    appended during ``finish``: the snapshot file must not be written before those are durable
    (a crash would keep state the log lost). The writer's fsync of the record appended during
    ``finish`` is held until the test lets it go; the snapshot file's write says whether the
    record was durable by then."""
    import threading

    entered, release = threading.Event(), threading.Event()
    real_sync, real_write = wal_files._datasync, wal_writer._write_snapshot_file
    hold = False
    during: list[asyncio.Future[None]] = []
    durable_at_write: list[bool] = []

    def slow(fd: int) -> None:
        if hold and threading.current_thread().name.startswith("wal-writer"):  # not the snapshot's
            entered.set()
            release.wait(10)
        real_sync(fd)

    def write(*args: Any) -> Path:
        durable_at_write.append(during[0].done())
        return real_write(*args)

    monkeypatch.setattr(wal_files, "_datasync", slow)
    monkeypatch.setattr(wal_writer, "_write_snapshot_file", write)
    monkeypatch.setattr(wal_committer, "_native", None)  # the Python loop calls ``_datasync``
    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append(recs(3))

        class Cut:
            async def finish(self) -> bytes:
                nonlocal hold
                hold = True  # the next commit, of the record below, waits for ``release``
                during.append(log.append_nowait(recs(1, prefix="during")))
                return b"holds-during"

        snap = asyncio.create_task(log.write_snapshot(Cut))
        await asyncio.to_thread(entered.wait, 10)
        for _ in range(20):  # the snapshot task gets every chance to run ahead
            await asyncio.sleep(0)
        hold = False
        release.set()
        await snap
    assert durable_at_write == [True]
    blob, replayed = await reopen(tmp_path)
    assert blob == b"holds-during" and replayed == recs(1, prefix="during")


@threaded
async def test_rotations_between_commits_reach_the_log_in_queue_order(tmp_path: Path) -> None:
    """Snapshots (rotation markers) among a stream of appends: each commit and each rotation
    reaches the log in queue order. (The compiled loop once delivered a commit queued after a
    rotation before the rotation itself, failing the log's bookkeeping in a callback.)"""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    stop = False

    async with DurableLog(tmp_path, fsync=True, segment_bytes=4096) as log:
        async def worker(w: int) -> int:
            i = 0
            while not stop:
                await asyncio.wait_for(log.append(recs(1 + i % 3, start=i, prefix=f"w{w}")), 10)
                i += 1 + i % 3
            return i

        workers = [asyncio.create_task(worker(w)) for w in range(8)]
        for _ in range(150):
            await asyncio.wait_for(log.write_snapshot(lambda: b"cut"), 10)
        stop = True
        counts = await asyncio.gather(*workers)
    assert not errors, errors[0]  # and every append above resolved within its 10 s
    _, replayed = await reopen(tmp_path)  # what the last snapshot does not cover, in order:
    for w in range(8):
        ids = [int(r.op_id.split(":")[1]) for r in replayed if r.op_id.startswith(f"w{w}:")]
        assert ids == sorted(ids) and all(i < counts[w] for i in ids)


@threaded
async def test_a_barrier_waits_for_every_earlier_append(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        assert log.barrier().done()  # nothing queued: nothing to wait for
        first = log.append_nowait(recs(5))
        log.append_lazily(recs(1, prefix="lazy"))
        await log.barrier()
        assert first.done()
    assert (await reopen(tmp_path))[1] == recs(5) + recs(1, prefix="lazy")


async def test_second_snapshot_replaces_the_first(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append(recs(3))
        await log.write_snapshot(lambda: b"one")
        await log.append(recs(3, start=3))
        await log.write_snapshot(lambda: b"two")
        assert log.load_snapshot() == b"two"
        await log.append(recs(3, start=6))
    assert len(list(tmp_path.glob("snapshot-*"))) == 1
    assert await reopen(tmp_path) == (b"two", recs(3, start=6))


async def test_corrupt_snapshot_falls_back_only_while_its_segments_exist(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append(recs(3))
        await log.write_snapshot(lambda: b"one")
        await log.append(recs(3, start=3))
    (snap,) = tmp_path.glob("snapshot-*.snap")
    (tmp_path / "snapshot-00000001.snap.tmp").write_bytes(b"half-written")
    data = bytearray(snap.read_bytes())
    data[-1] ^= 0xFF
    snap.write_bytes(bytes(data))
    # Segment 1 was deleted with the snapshot: no older state can stand in for it.
    with pytest.raises(LogCorruptError, match="checksum"):
        await reopen(tmp_path)
    assert not (tmp_path / "snapshot-00000001.snap.tmp").exists()


async def test_crash_before_covered_segments_were_deleted(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append(recs(3))
    saved = segment(tmp_path).read_bytes()
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.write_snapshot(lambda: b"blob")
        await log.append(recs(2, start=3))
    segment(tmp_path).write_bytes(saved)  # as if the deletion never happened
    assert await reopen(tmp_path) == (b"blob", recs(2, start=3))
    assert not segment(tmp_path).exists()


# ---------------------------------------------------------------- failures and crashes


@threaded
async def test_fsync_error_fails_waiters_and_poisons_the_log(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append([rec(0)])
        # the segment's fd becomes /dev/null: writes go through, fdatasync fails (EINVAL), on
        # either writer loop
        null = os.open("/dev/null", os.O_WRONLY)
        try:
            assert log._segment is not None
            os.dup2(null, log._segment.fd)
            results = await asyncio.gather(
                *(log.append([rec(i)]) for i in range(1, 20)), return_exceptions=True
            )
        finally:
            os.close(null)
        assert all(isinstance(r, LogWriteError) for r in results), results
        assert isinstance(results[0].__cause__, OSError)  # type: ignore[union-attr]
        with pytest.raises(LogWriteError):
            log.append_nowait([rec(99)])
        with pytest.raises(LogWriteError):
            await log.write_snapshot(lambda: b"x")


@threaded
async def test_a_failed_write_fails_waiters_and_poisons_the_log(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append([rec(0)])
        full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
        try:
            assert log._segment is not None
            os.dup2(full, log._segment.fd)
        finally:
            os.close(full)
        results = await asyncio.gather(
            *(log.append([rec(i)]) for i in range(1, 20)), return_exceptions=True
        )
        assert all(isinstance(r, LogWriteError) for r in results), results
        assert "No space left" in str(results[0])


@threaded
async def test_each_commit_on_the_writer_thread_is_bounded_and_rotates_by_size(
        tmp_path: Path) -> None:
    """The writer thread's commits: at most ``max_batch_records`` records each (one append is
    never split), more entries than one ``writev`` takes (1,024) in order, and segments
    rotated by size between commits."""
    commits: list[int] = []
    log = DurableLog(tmp_path, fsync=True, max_batch_records=10, segment_bytes=1500)
    committed = log._committer._committed

    def record(entries: int, count: int, nbytes: int, seconds: float) -> None:
        commits.append(count)
        committed(entries, count, nbytes, seconds)

    log._committer._committed = record
    async with log:
        await asyncio.gather(*(log.append([rec(i)]) for i in range(100)))
        await log.append(recs(25, start=100))
    assert max(commits) == 25 and sorted(commits)[-2] <= 10 and sum(commits) == 125
    assert len(list(tmp_path.glob("log-*.wal"))) > 2
    assert (await reopen(tmp_path))[1] == recs(125)

    async with DurableLog(tmp_path, fsync=True) as log:
        await asyncio.gather(*(log.append([rec(i, prefix="many")]) for i in range(3000)))
    assert (await reopen(tmp_path))[1][125:] == recs(3000, prefix="many")


@threaded
async def test_failed_snapshot_keeps_every_record_and_the_log_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*args: object) -> Path:
        raise OSError(28, "No space left on device")

    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append(recs(5))
        monkeypatch.setattr(wal_writer, "_write_snapshot_file", disk_full)
        with pytest.raises(LogError, match="No space left"):
            await log.write_snapshot(lambda: b"lost")
        await log.append(recs(5, start=5))
    assert await reopen(tmp_path) == (None, recs(10))


@threaded
async def test_abort_fails_pending_appends_and_the_log_reopens(tmp_path: Path) -> None:
    log = DurableLog(tmp_path, fsync=True)
    await log.start()
    await log.append(recs(10))
    pending = [log.append_nowait([rec(i)]) for i in range(10, 20)]
    log.abort()
    for fut in pending:
        with pytest.raises(LogClosedError):
            await fut
    with pytest.raises(LogClosedError):
        log.append_nowait([rec(0)])
    _, replayed = await reopen(tmp_path)
    # as after a crash, pending records may be on disk or not (the compiled writer loop runs
    # beside the loop, without the GIL, and may have written some): never acknowledged, and
    # never anything but a prefix of what was appended
    assert replayed[:10] == recs(10) and replayed == recs(len(replayed)) and len(replayed) <= 20


CHILD = textwrap.dedent(
    """
    import asyncio, sys, msgpack
    from cluster.wal import DurableLog, LogRecord

    async def main(directory):
        appended = []  # every id whose append was called: what a snapshot must cover
        async with DurableLog(directory, fsync=True, segment_bytes=16384) as log:
            async def worker(w):
                i = 0
                while True:
                    batch = [LogRecord(1, f"{w}:{i + j}", "t", "k", 1, "n1", i + j, 0, 0.0)
                             for j in range(1 + i % 7)]
                    appended.extend(r.op_id for r in batch)
                    await log.append(batch)
                    print(" ".join(r.op_id for r in batch), flush=True)
                    i += len(batch)

            async def snapshots():
                while True:
                    await asyncio.sleep(0.01)
                    await log.write_snapshot(lambda: msgpack.packb(appended))

            await asyncio.gather(snapshots(), *(worker(w) for w in range(16)))

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.parametrize("kill_after", [1, 700, 4000])
async def test_every_acknowledged_record_survives_kill_9(tmp_path: Path, kill_after: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(tmp_path), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    acked: set[str] = set()
    deadline = time.monotonic() + 30
    try:
        while len(acked) < kill_after:
            line = await asyncio.wait_for(proc.stdout.readline(), deadline - time.monotonic())
            assert line, "child exited early"
            acked.update(line.decode().split())
    finally:
        proc.send_signal(signal.SIGKILL)
    rest = await asyncio.wait_for(proc.stdout.read(), 10)  # printed before it died: acked too
    acked.update(rest.decode().split())
    assert await proc.wait() == -signal.SIGKILL
    blob, replayed = await reopen(tmp_path)
    durable = set(msgpack.unpackb(blob)) if blob else set()
    durable.update(r.op_id for r in replayed)
    assert acked <= durable, f"{len(acked - durable)} acknowledged records lost"


# ---------------------------------------------------------------- hypothesis: damaged files


def _recover_sync(d: Path) -> list[LogRecord]:
    async def run() -> list[LogRecord]:
        async with DurableLog(d, fsync=False) as log:
            return list(log.replay())

    return asyncio.run(run())


_SAMPLE = recs(12) + [LogRecord(2, "ö:1", "t", "é", I64_MIN, "n2", U64_MAX, 7, -0.5)]
_SAMPLE_BYTES = frames(_SAMPLE)
_STARTS = [len(frames(_SAMPLE[:i])) for i in range(len(_SAMPLE) + 1)]
_QUIET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_QUIET
@given(data=st.binary(max_size=3000))
def test_random_segment_bytes_never_crash_the_reader(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        segment(d).write_bytes(data)
        try:
            replayed = _recover_sync(d)
        except LogCorruptError:
            return
        assert segment(d).stat().st_size <= len(data)
        assert len(replayed) <= len(data) // 9


@_QUIET
@given(cut=st.integers(0, len(_SAMPLE_BYTES)))
def test_truncated_segment_replays_the_whole_records_before_the_cut(cut: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        segment(d).write_bytes(_SAMPLE_BYTES[:cut])
        whole = sum(1 for s in _STARTS[1:] if s <= cut)
        assert _recover_sync(d) == _SAMPLE[:whole]


@_QUIET
@given(bit=st.integers(0, len(_SAMPLE_BYTES) * 8 - 1), tail=st.binary(max_size=64))
def test_bit_flip_is_corruption_unless_it_hits_the_last_record(bit: int, tail: bytes) -> None:
    data = bytearray(_SAMPLE_BYTES)
    data[bit // 8] ^= 1 << (bit % 8)
    hit = max(i for i, s in enumerate(_STARTS[:-1]) if s <= bit // 8)
    # a commit's reach of one byte: any valid record after a bad one is corruption (the reach
    # itself: test_a_torn_commit_may_hold_valid_records_after_a_bad_one)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(wal_files, "MAX_COMMIT_BYTES", 1):
        d = Path(tmp)
        segment(d).write_bytes(bytes(data) + tail)
        if hit < len(_SAMPLE) - 1:
            with pytest.raises(LogCorruptError) as err:
                _recover_sync(d)
            assert err.value.offset == _STARTS[hit]
        else:
            assert _recover_sync(d) == _SAMPLE[:-1]


_RECORD = st.builds(
    LogRecord,
    kind=st.integers(0, 255),
    op_id=st.text(max_size=40),
    table=st.text(max_size=10),
    key=st.text(max_size=40),
    delta=st.integers(I64_MIN, I64_MAX),
    origin=st.text(max_size=8),
    p=st.integers(0, U64_MAX),
    n=st.integers(0, U64_MAX),
    ts=st.floats(allow_nan=False),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_RECORD, max_size=20))
def test_encoding_round_trips_any_valid_record(records: list[LogRecord]) -> None:
    buf = frames(records)
    assert wal._scan(buf) == len(buf)
    assert list(wal._decode_segment(Path("x"), buf)) == records


# ---------------------------------------------------------------- LogRecord, columnar frames (v2)


def test_log_record_compares_like_the_dataclass_it_replaced() -> None:
    a = rec(1)
    assert a == rec(1) and (a != rec(1)) is False
    assert a != rec(2) and (a == rec(2)) is False
    assert a != tuple(a) and tuple(a) != a  # never equal to a plain tuple with the same fields
    assert hash(a) == hash(tuple(a))  # the frozen dataclass hashed its field tuple too
    assert a.kind == RecordKind.APPLY and a.op_id == "c:1" and a.ts == 1.7e9 + 1
    with pytest.raises(AttributeError):
        a.delta = 5  # type: ignore[misc]
    assert LogRecord._fields == ("kind", "op_id", "table", "key", "delta", "origin", "p", "n", "ts")


def columns(records: list[LogRecord]) -> Any:
    return [list(col) for col in zip(*records, strict=True)] if records else [[]] * 9


_RECORDS = st.lists(_RECORD, max_size=30)


@settings(max_examples=100, deadline=None)
@given(_RECORDS, st.sets(st.sampled_from([0, 2, 5, 8])))
def test_columnar_encoding_round_trips_with_shared_fields(
    records: list[LogRecord], shared: set[int]
) -> None:
    # a "shared" field takes the first record's value for every record
    if records:
        first = records[0]
        records = [
            LogRecord._make([first[i] if i in shared else r[i] for i in range(9)]) for r in records
        ]
    cols = columns(records)
    for i in shared:
        if records:
            cols[i] = records[0][i]
    buf = wal._encode_columns(cols, msgpack.Packer().pack)
    assert wal._scan(buf) == len(buf)
    assert list(wal._decode_segment(Path("x"), buf)) == records
    if len(records) >= wal._COLUMNAR_MIN:
        assert len(buf) < len(frames(records)) + 64  # one frame, not one per record


@threaded
async def test_append_columns_replays_like_append_and_mixes_with_v1(tmp_path: Path) -> None:
    node_batch = [
        LogRecord(RecordKind.APPLY, f"a:{i}", "t", f"k{i}", i - 50, "n1@2", i, 50, 5.5)
        for i in range(100)
    ]
    replica_batch = recs(7, prefix="r")
    async with DurableLog(tmp_path, fsync=True, segment_bytes=3000) as log:
        await log.append(recs(2))  # v1 frames
        c = columns(node_batch)
        await log.append_columns(RecordKind.APPLY, c[1], c[2], c[3], c[4], "n1@2", c[6], c[7], 5.5)
        await log.append_columns(*columns(replica_batch))
        await log.append_columns(*columns(recs(1, start=9)))  # one record: written as v1
        await log.append_columns(1, [], "t", "k", 0, "o", 0, 0, 0.0)  # nothing at all
        stats = log.stats()
    assert stats.records_appended == 2 + 100 + 7 + 1
    _, replayed = await reopen(tmp_path)
    assert replayed == recs(2) + node_batch + replica_batch + recs(1, start=9)


async def test_append_columns_refuses_bad_input_and_queues_nothing(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False) as log:
        ids = ["a", "b", "c", "d"]
        for bad in (
            (1, ids, "t", "k", [0, 0, I64_MAX + 1, 0], "n", 0, 0, 0.0),
            (1, ids, "t", "k", I64_MIN - 1, "n", 0, 0, 0.0),
            (1, ids, "t", "k", 0, "n", [0, -1, 0, 0], 0, 0.0),
            (1, ids, "t", "k", 0, "n", 0, U64_MAX + 1, 0.0),
            (1, ids, "t", ["k"] * 3, 0, "n", 0, 0, 0.0),  # a column of the wrong length
            (1, "abcd", "t", "k", 0, "n", 0, 0, 0.0),  # op_id must be a list
            (1, ["a"], "t", "k" * (70 * 1024), 0, "n", 0, 0, 0.0),  # one record over 64 KiB
            (1, ["a"], "t", ["k", "k2"], 0, "n", 0, 0, 0.0),  # one record, a column of two
            (1, ["a"], "t", "k", [I64_MAX + 1], "n", 0, 0, 0.0),  # one record out of range
            (1, ["a"], "t", "k", 0, "n", 0, -1, 0.0),
        ):
            with pytest.raises(ValueError):
                log.append_columns_nowait(*bad)
        assert log.stats().records_appended == 0
    assert (await reopen(tmp_path))[1] == []


async def test_a_large_columnar_append_is_split_under_the_frame_limit(tmp_path: Path) -> None:
    big = [LogRecord(1, f"op-{i}", "t", "k" * 200 + str(i), 1, "n", i, 0, 0.0) for i in range(800)]
    buf = wal._encode_columns(columns(big), msgpack.Packer().pack)
    assert len(buf) > wal.MAX_RECORD_BYTES and wal._scan(buf) == len(buf)
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append_columns(*columns(big))
    assert (await reopen(tmp_path))[1] == big


def test_a_large_columnar_append_is_cut_before_it_is_encoded() -> None:
    """Columns estimated past the frame limit are cut first: no payload is encoded too big and
    then again in halves (the leader's turns of many batches made every log append twice)."""
    big = [LogRecord(1, f"c{i:012d}:op", "t", f"k{i}", 1, "n", i, 0, 0.0) for i in range(6000)]
    packer = msgpack.Packer()
    sizes: list[int] = []

    def pack(obj: object) -> bytes:
        out = packer.pack(obj)
        sizes.append(len(out))
        return out

    buf = wal._encode_columns(columns(big), pack)
    assert len(sizes) > 1 and max(sizes) <= wal.MAX_RECORD_BYTES
    assert sum(sizes) < len(buf) + 16 * len(sizes)  # each record encoded once
    assert wal._scan(buf) == len(buf)


async def test_torn_columnar_frame_drops_the_whole_append(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=False) as log:
        await log.append(recs(3))
        await log.append_columns(*columns(recs(50, start=3)))
    os.truncate(segment(tmp_path), segment(tmp_path).stat().st_size - 5)
    assert (await reopen(tmp_path))[1] == recs(3)


def test_unknown_payload_versions_are_undecodable() -> None:
    """A payload that is no record form is corruption; one of a later form (an array led by
    an integer above 2) is a later release's, refused as such (tests/test_formats.py)."""
    payload = msgpack.packb([3, 1, ["a"], "t", "k", 0, "n", 0, 0, 0.0])
    buf = wal._FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    with pytest.raises(FormatError, match="version 3"):
        list(wal._decode_segment(Path("x"), buf))
    for obj in (
        [2, 1, "a", "t", "k", 0, "n", 0, 0, 0.0],  # no op_id array
        [2, 1, ["a", "b"], ["t"], "k", 0, "n", 0, 0, 0.0],  # columns of different lengths
        [1, 2, 3],
    ):
        payload = msgpack.packb(obj)
        buf = wal._FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        with pytest.raises(LogCorruptError):
            list(wal._decode_segment(Path("x"), buf))


async def test_fsync_in_loop_commits_on_the_loop_thread(tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True, fsync_in_loop=True) as log:
        await asyncio.gather(*(log.append(recs(3, start=3 * i)) for i in range(20)))
        stats = log.stats()
    assert stats.fsyncs >= 1 and stats.records_appended == 60
    assert stats.fsyncs < 20  # appends queued in one turn still share an fsync
    assert (await reopen(tmp_path))[1] == recs(60)


@threaded
async def test_lazy_records_ride_with_the_next_commit(tmp_path: Path) -> None:
    """``append_lazily`` (a node's PUBLISHED records) forces no fsync of its own: the records
    go with the next append's commit, in append order."""
    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append(recs(2))
        before = log.stats().fsyncs
        log.append_lazily(recs(3, start=2, prefix="p"))
        assert log.stats().records_appended == 2  # queued, not written
        await log.append(recs(1, start=5))
        stats = log.stats()
    assert stats.fsyncs == before + 1 and stats.records_appended == 6
    assert (await reopen(tmp_path))[1] == [*recs(2), *recs(3, start=2, prefix="p"),
                                           *recs(1, start=5)]


@threaded
async def test_lazy_columns_ride_with_the_next_commit_and_replay_as_records(
        tmp_path: Path) -> None:
    """``append_columns_lazily`` (the leader's PUBLISHED records, one frame a publication):
    queued like ``append_lazily``, written with the next commit, replayed record by record;
    refused, with nothing queued, for a bad column."""
    lazy = recs(5, start=1, prefix="p")
    async with DurableLog(tmp_path, fsync=True) as log:
        await log.append(recs(1))
        with pytest.raises(ValueError):
            log.append_columns_lazily(1, ["x", "y"], "t1", "k", 0, "n1", [1], 0, 0.0)
        log.append_columns_lazily(*zip(*lazy, strict=True))  # nine columns
        assert log.stats().records_appended == 1  # queued, not written
        await log.append(recs(1, start=6))
        assert log.stats().records_appended == 7
    assert (await reopen(tmp_path))[1] == [*recs(1), *lazy, *recs(1, start=6)]


@threaded
async def test_lazy_records_alone_are_written_within_the_delay_and_at_stop(
        tmp_path: Path) -> None:
    async with DurableLog(tmp_path, fsync=True) as log:
        log.append_lazily(recs(2, prefix="p"))
        deadline = time.monotonic() + 5.0
        while log.stats().records_appended < 2:
            assert time.monotonic() < deadline, "lazy records never written"
            await asyncio.sleep(wal_writer.LAZY_DELAY / 5)
        log.append_lazily(recs(1, start=2, prefix="p"))  # stop() writes it
    assert (await reopen(tmp_path))[1] == recs(3, prefix="p")


@threaded
async def test_a_lazy_record_is_lost_by_abort_like_any_unacknowledged_one(
        tmp_path: Path) -> None:
    log = DurableLog(tmp_path, fsync=True)
    await log.start()
    await log.append(recs(1))
    log.append_lazily(recs(1, start=1, prefix="p"))
    log.abort()
    assert (await reopen(tmp_path))[1] == recs(1)


def test_the_compiled_writer_loop_is_switched_off_by_its_variable() -> None:
    """``IDC_WAL_KERNEL=0`` keeps the writer thread's Python loop, and says why."""
    import subprocess

    code = ("import cluster.wal.committer as c; "
            "print(c._native is None, c.NATIVE_WHY_NOT)")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "IDC_WAL_KERNEL": "0", "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["True", "switched", "off", "(IDC_WAL_KERNEL=0)"]
