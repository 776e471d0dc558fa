"""On-disk formats across releases: what 0.4.0 wrote is read, what is newer is refused.

``tests/fixtures/v0.4.0/node`` is a data directory made by release 0.4.0 (its README says
how). The node reads it; at format 1 it writes segments byte-compatible with it (0.4.0's own
reader reads them, when git has the tag); at format 2 segments start with a header. A segment,
a record, a snapshot or a ``FORMAT`` file of a newer format refuses the start in one line
(``FormatError``, exit 2 for a node process), and leaves every file as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.errors import ConfigurationError
from client.opids import OpIdSource
from cluster.core.config import from_mapping
from cluster.core.errors import ConfigError
from cluster.core.versions import PROTOCOL_MAX, FormatError
from cluster.local import free_ports
from cluster.roles.member import Node
from cluster.roles.state import NodeState
from cluster.wal import (
    DurableLog,
    LogRecord,
    make_record,
    read_format,
    read_segments,
    segment_format,
    write_format,
)
from cluster.wal.files import _SNAP_HEADER
from cluster.wal.segments import _SEG_HEADER, _SEG_MAGIC, _segment_header

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "v0.4.0"
EXPECTED: dict[str, int] = json.loads((FIXTURE / "expected.json").read_text())


def copy_fixture(tmp: Path) -> Path:
    data = tmp / "n1"
    shutil.copytree(FIXTURE / "node", data)
    return data


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def config(data: Path) -> Any:
    ports = free_ports(3)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    return from_mapping({"node_id": "n1", "listen": f"127.0.0.1:{ports[0]}", "peers": peers,
                         "data_dir": str(data), "fsync": False, "quorum_timeout": 0.5})


async def recovered_values(data: Path) -> dict[str, int]:
    """Recover node n1 on ``data`` in this process (no listening) and read every counter the
    fixture holds."""
    node = Node(config(data))
    try:
        await node.recover()
        shards = node.state.shards
        return {name: shards.value(*name.split("/", 1)) for name in EXPECTED}
    finally:
        await node.close()


def rec(i: int) -> LogRecord:
    return make_record(1, f"c:{i}", "t", f"k{i % 7}", i + 1, "n1@1", i + 1, 0, 1.5)


def frame(obj: Any) -> bytes:
    payload = msgpack.packb(obj)
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def newer_header(version: int) -> bytes:
    head = _SEG_HEADER.pack(_SEG_MAGIC, version, 0, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def node_process(data: Path) -> subprocess.CompletedProcess[str]:
    """``python -m cluster.node`` on ``data``, expected to refuse to start."""
    ports = free_ports(3)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    return subprocess.run(
        [sys.executable, "-m", "cluster.node", "--id", "n1", "--listen",
         f"127.0.0.1:{ports[0]}", "--peers", peers, "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_refused(proc: subprocess.CompletedProcess[str], found: int) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in line
    assert f"version {found}" in line and f"versions 1 to {PROTOCOL_MAX}" in line, line
    return line


# ---------------------------------------------------------------- what 0.4.0 wrote


def test_fixture_is_what_the_readme_says() -> None:
    log = FIXTURE / "node" / "log"
    assert sorted(p.name for p in log.iterdir()) == ["log-00000002.wal",
                                                      "snapshot-00000002.snap"]
    assert segment_format(log / "log-00000002.wal") == 1  # 0.4.0 wrote no header
    assert len(list(read_segments(log))) > 0  # records after the snapshot
    assert read_format(FIXTURE / "node") == 1  # no FORMAT file


async def test_the_node_recovers_what_0_4_0_wrote(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    assert await recovered_values(data) == EXPECTED


async def test_level_2_segments_after_0_4_0_ones_recover_every_record(tmp_path: Path) -> None:
    """The fixture's log, opened at format 2: new segments carry the header, the old one
    keeps none, and a reopen (at either format) reads them all, the counts unchanged."""
    data = copy_fixture(tmp_path)
    logdir = data / "log"
    async with DurableLog(logdir, fsync=True) as log:
        before = list(log.replay())
        log.set_format(2)
        await log.append([rec(0)])  # the current segment (0.4.0's) keeps its format
        await log.write_snapshot(lambda: log.load_snapshot() or b"")
        await log.append([rec(1), rec(2)])
    segs = sorted(logdir.glob("log-*.wal"))
    assert [segment_format(p) for p in segs] == [2]  # the snapshot covered the old one
    assert segs[0].read_bytes()[:16] == _segment_header(2)
    async with DurableLog(logdir) as log:
        assert list(log.replay()) == [rec(1), rec(2)]
    assert list(read_segments(logdir)) == [rec(1), rec(2)]
    assert before  # what 0.4.0 logged was read (and is in the snapshot now)


async def test_format_1_writes_no_header_and_format_2_does(tmp_path: Path) -> None:
    async with DurableLog(tmp_path / "a", fsync=True) as log:
        await log.append([rec(0)])
    raw = (tmp_path / "a" / "log-00000001.wal").read_bytes()
    assert raw == frame(tuple(rec(0)))  # 0.4.0's bytes: the frame, nothing before it
    log = DurableLog(tmp_path / "b", fsync=True)
    log.set_format(2)  # before start: the segment start creates is of format 2
    async with log:
        await log.append([rec(0)])
    raw = (tmp_path / "b" / "log-00000001.wal").read_bytes()
    assert raw == _segment_header(2) + frame(tuple(rec(0)))
    assert segment_format(tmp_path / "b" / "log-00000001.wal") == 2
    with pytest.raises(ValueError, match="1 to 2"):
        log.set_format(PROTOCOL_MAX + 1)


def _old_tree(tmp: Path) -> Path | None:
    """Release 0.4.0's ``cluster`` package, from git (None without git or the tag)."""
    out = tmp / "v040"
    out.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "v0.4.0", "cluster"],
                                 capture_output=True, timeout=60, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out


_OLD_READ = """
import asyncio, sys
import cluster
from cluster.wal import DurableLog
assert cluster.__file__.startswith(sys.argv[2]), cluster.__file__
async def main():
    async with DurableLog(sys.argv[1]) as log:
        print(len(list(log.replay())))
asyncio.run(main())
"""


async def test_release_0_4_0_reads_what_format_1_writes(tmp_path: Path) -> None:
    """A node rolled back to 0.4.0 (its own recovery and replay, run from the tag's tree)
    reads every record of a log written at format 1, rotations and a snapshot included."""
    old = _old_tree(tmp_path)
    if old is None:
        pytest.skip("git archive v0.4.0 is not available")
    logdir = tmp_path / "log"
    async with DurableLog(logdir, fsync=True, segment_bytes=200) as log:
        log.set_format(1)
        await log.append([rec(i) for i in range(5)])
        await log.write_snapshot(lambda: b"blob")
        for i in range(5, 40):
            await log.append([rec(i)])
    assert len(list(logdir.glob("log-*.wal"))) > 2
    before = files_of(logdir)
    proc = subprocess.run([sys.executable, "-c", _OLD_READ, str(logdir), str(old)],
                          capture_output=True, text=True, timeout=60, cwd=old,
                          env={**os.environ, "PYTHONPATH": str(old)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == 35
    assert files_of(logdir) == before  # nothing torn off by the old recovery


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["append", "format1", "format2", "snap"]),
                                st.integers(1, 4)), min_size=1, max_size=12),
       segment_bytes=st.sampled_from([60, 300, 1 << 20]))
def test_any_mix_of_formats_recovers_every_record(tmp_path_factory: pytest.TempPathFactory,
                                                  steps: list[tuple[str, int]],
                                                  segment_bytes: int) -> None:
    """Formats switched at any point, rotations and snapshots between: a reopen replays every
    record after the last snapshot, in order, and every segment is of a format that was set
    when it was created."""
    logdir = tmp_path_factory.mktemp("mix")

    async def run() -> tuple[list[LogRecord], list[LogRecord]]:
        after_snap: list[LogRecord] = []
        n = 0
        async with DurableLog(logdir, fsync=False, segment_bytes=segment_bytes) as log:
            for op, count in steps:
                if op == "append":
                    batch = [rec(n + i) for i in range(count)]
                    n += count
                    await log.append(batch)
                    after_snap += batch
                elif op == "snap":
                    await log.write_snapshot(lambda: b"s")
                    after_snap = []
                else:
                    log.set_format(int(op[-1]))
        async with DurableLog(logdir, fsync=False) as log:
            return after_snap, list(log.replay())

    want, got = asyncio.run(run())
    assert got == want
    assert all(segment_format(p) in (1, 2) for p in logdir.glob("log-*.wal"))


# ---------------------------------------------------------------- what is newer: refused


async def _refused(logdir: Path, match: str) -> None:
    before = files_of(logdir)
    with pytest.raises(FormatError, match=match) as info:
        async with DurableLog(logdir) as log:
            for _ in log.replay():
                pass
    assert "\n" not in str(info.value)
    assert (f"versions 1 to {PROTOCOL_MAX}" in str(info.value)
            or "reads (version 1," in str(info.value))
    assert files_of(logdir) == before  # nothing truncated, deleted or zero-filled


async def test_a_segment_of_a_newer_format_is_refused_not_cut(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    logdir = data / "log"
    # the last segment, as a later release would start it: a torn tail to a reader that does
    # not know headers, so it must not be taken for one
    (logdir / "log-00000003.wal").write_bytes(newer_header(3) + frame(tuple(rec(0))))
    await _refused(logdir, r"log segment .*log-00000003\.wal is version 3")
    # alone too: a header of format 3 and nothing after it
    (logdir / "log-00000003.wal").write_bytes(newer_header(3))
    await _refused(logdir, "version 3")


async def test_a_damaged_segment_header_is_corruption(tmp_path: Path) -> None:
    from cluster.wal import LogCorruptError

    logdir = tmp_path / "log"
    logdir.mkdir()
    bad = bytearray(_segment_header(2))
    bad[-1] ^= 0xFF
    (logdir / "log-00000001.wal").write_bytes(bytes(bad) + frame(tuple(rec(0))))
    with pytest.raises(LogCorruptError, match="header"):
        async with DurableLog(logdir):
            pass


async def test_a_record_of_a_newer_form_is_refused_not_cut(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    logdir = data / "log"
    seg = logdir / "log-00000002.wal"
    newer_record = frame([3, "a later form", {"x": 1}])
    seg.write_bytes(seg.read_bytes() + newer_record)
    await _refused(logdir, r"a record in log segment .*log-00000002\.wal .* is version 3")
    # last in the segment after a torn frame's worth of garbage: still not a torn tail
    seg.write_bytes(seg.read_bytes()[: -len(newer_record)] + b"\x07\0\0\0junk" + newer_record)
    await _refused(logdir, "version 3")


async def test_a_snapshot_file_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    logdir = data / "log"
    snap = logdir / "snapshot-00000002.snap"
    raw = bytearray(snap.read_bytes())
    magic, _version, flags, seq, length, _crc = _SNAP_HEADER.unpack_from(raw)
    head = _SNAP_HEADER.pack(magic, 2, flags, seq, length, 0)[:-4]
    crc = zlib.crc32(memoryview(raw)[_SNAP_HEADER.size:], zlib.crc32(head))
    snap.write_bytes(head + struct.pack("<I", crc) + raw[_SNAP_HEADER.size:])
    # not skipped for an older snapshot or none: refused, whatever else is there
    await _refused(logdir, r"snapshot .*snapshot-00000002\.snap is version 2")


def test_a_snapshot_blob_of_a_newer_version_is_refused() -> None:
    state = NodeState(config(Path("/nonexistent")))
    with pytest.raises(FormatError, match="snapshot contents is version 2") as info:
        state.load_blob(msgpack.packb({"version": 2, "shards": b"?"}))
    assert "newer than this node reads (version 1," in str(info.value)
    with pytest.raises(ValueError, match="is not 1"):  # not a number: damage, as before
        state.load_blob(msgpack.packb({"version": "x"}))


def test_a_node_refuses_a_newer_segment_in_one_line(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    (data / "log" / "log-00000003.wal").write_bytes(newer_header(3) + frame(tuple(rec(0))))
    before = files_of(data / "log")
    line = assert_refused(node_process(data), 3)
    assert "log-00000003.wal" in line
    assert files_of(data / "log") == before


def test_a_node_refuses_a_newer_snapshot_blob_in_one_line(tmp_path: Path) -> None:
    """The snapshot file is whole and valid; what it holds is of a later version."""
    from cluster.wal.files import _write_snapshot_file

    data = copy_fixture(tmp_path)
    logdir = data / "log"
    (logdir / "snapshot-00000002.snap").unlink()
    _write_snapshot_file(logdir, 2, msgpack.packb({"version": 2}), fsync=False)
    before = files_of(logdir)
    proc = node_process(data)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert "snapshot contents is version 2" in proc.stderr
    assert files_of(logdir) == before


# ---------------------------------------------------------------- the FORMAT file


def test_format_file_reads_writes_and_never_lowers(tmp_path: Path) -> None:
    assert read_format(tmp_path) == 1
    assert read_format(tmp_path / "missing") == 1
    write_format(tmp_path, 1)
    assert not (tmp_path / "FORMAT").exists()  # at 1 the directory stays 0.4.0's
    write_format(tmp_path, 2)
    assert (tmp_path / "FORMAT").read_text() == "2\n" and read_format(tmp_path) == 2
    write_format(tmp_path, 1)
    assert read_format(tmp_path) == 2
    with pytest.raises(ValueError):
        write_format(tmp_path, PROTOCOL_MAX + 1)


@pytest.mark.parametrize("content", [b"", b"two\n", b"0\n", b"-1", b"2\n3\n", b"\xff\xfe",
                                     b"9" * 100])
def test_a_garbage_format_file_is_a_one_line_config_error(tmp_path: Path,
                                                          content: bytes) -> None:
    (tmp_path / "FORMAT").write_bytes(content)
    with pytest.raises(ConfigError) as info:
        read_format(tmp_path)
    assert not isinstance(info.value, FormatError)
    assert "\n" not in str(info.value) and "FORMAT" in str(info.value)
    with pytest.raises(ConfigError):
        write_format(tmp_path, 2)
    assert (tmp_path / "FORMAT").read_bytes() == content


def test_a_newer_format_file_refuses_the_node_and_changes_nothing(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    (data / "FORMAT").write_text("3\n")
    with pytest.raises(FormatError, match="FORMAT file"):
        read_format(data)
    with pytest.raises(FormatError):
        write_format(data, 2)
    before = files_of(data)
    line = assert_refused(node_process(data), 3)
    assert "FORMAT" in line
    assert files_of(data) == before


# ---------------------------------------------------------------- the SDK's state file


def test_op_id_state_file_names_its_format_and_refuses_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "c.seq"
    path.write_text(json.dumps({"client_id": "app", "next_seq": 7}))  # 0.4.0's, no format
    src = OpIdSource("app", path, block=10)
    assert src.next() == "app:7"
    # layout 1 is written as 0.4.0 wrote it (no "format"): a client can go back on its file
    assert json.loads(path.read_text()) == {"client_id": "app", "next_seq": 17}
    assert OpIdSource("app", path).next_seq == 17
    path.write_text(json.dumps({"format": 1, "client_id": "app", "next_seq": 20}))
    assert OpIdSource("app", path).next_seq == 20
    path.write_text(json.dumps({"format": 2, "client_id": "app", "next_seq": 99}))
    with pytest.raises(ConfigurationError, match="format 2, newer than this SDK reads") as info:
        OpIdSource("app", path)
    assert "\n" not in str(info.value)
    assert json.loads(path.read_text())["next_seq"] == 99
    path.write_text(json.dumps({"format": "x", "client_id": "app", "next_seq": 1}))
    with pytest.raises(ConfigurationError, match="not a client state file"):
        OpIdSource("app", path)


def test_a_node_on_a_damaged_log_says_so_in_one_line(tmp_path: Path) -> None:
    """Corruption (``LogCorruptError``) refuses the start as a newer format does: exit 2, one
    line, no traceback."""
    data = copy_fixture(tmp_path)
    bad = bytearray(_segment_header(2))
    bad[-1] ^= 0xFF
    (data / "log" / "log-00000003.wal").write_bytes(bytes(bad) + frame(tuple(rec(0))))
    proc = node_process(data)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("error: ") and "log-00000003.wal" in proc.stderr
    assert "corrupt" in proc.stderr and "Traceback" not in proc.stderr
