"""Start-up failures say their cause in one line and exit non-zero, without a traceback:
``python -m cluster.node`` on a port in use, a data dir it cannot use or a secret it cannot
read; ``python -m cluster up`` on ports in use or a node that fails, after stopping the nodes
it had already started."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local import LocalCluster, StartError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something listens on (bound without SO_REUSEADDR, so no one else can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exactly one ``error:`` line and no traceback; that line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "READY" not in r.stdout, r.stdout
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def node(port: int | str, data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run("cluster.node", "--id", "n1", "--listen", f"127.0.0.1:{port}",
               "--peers", f"n1=127.0.0.1:{port}", "--data-dir", str(data_dir), *extra)


@pytest.mark.timeout(60)
def test_node_on_a_port_in_use(taken_port: int, tmp_path: Path) -> None:
    line = one_error_line(node(taken_port, tmp_path / "d"))
    assert line == f"error: listen: cannot listen on 127.0.0.1:{taken_port}: " \
                   "Address already in use", line


@pytest.mark.timeout(60)
def test_node_on_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    line = one_error_line(node(0, tmp_path / "file"))
    assert line == f"error: data_dir: cannot use {tmp_path / 'file'}: exists and is not a " \
                   "directory", line
    line = one_error_line(node(0, tmp_path / "file" / "below"))
    assert line.startswith(f"error: data_dir: cannot use {tmp_path / 'file' / 'below'}: "
                           "Not a directory"), line


@pytest.mark.timeout(60)
def test_node_with_a_corrupt_membership_file_or_a_bad_join(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ring.json").write_text('{"version": 3, "members": "x"')
    line = one_error_line(node(0, tmp_path / "d"))
    assert line.startswith(f"error: data_dir: {tmp_path / 'd' / 'ring.json'} is not a "
                           "membership"), line
    joins = [("--listen", "127.0.0.1:0", "--join", "127.0.0.1:1"),  # no fixed port to dial
             ("--listen", "127.0.0.1:7", "--join", "127.0.0.1:1", "--peers", "n1=h:1"),
             ("--listen", "127.0.0.1:7", "--replace", "n2")]  # --replace without --join
    for flags in joins:
        line = one_error_line(run("cluster.node", "--id", "n1", "--data-dir",
                                  str(tmp_path / "j"), *flags))
        assert "--join" in line or "--replace" in line, line
    line = one_error_line(run("cluster.node", "--id", "n9", "--listen", "127.0.0.1:7",
                              "--join", "127.0.0.1:1", "--data-dir", str(tmp_path / "j")))
    assert line.startswith("error: join: 127.0.0.1:1: no node answers"), line


@pytest.mark.timeout(60)
def test_node_with_a_secret_it_cannot_read(tmp_path: Path) -> None:
    line = one_error_line(node(0, tmp_path / "d", "--secret-file", str(tmp_path / "missing")))
    assert line.startswith(f"error: secret_file: cannot read {tmp_path / 'missing'}"), line


@pytest.mark.timeout(60)
def test_cluster_up_on_a_port_in_use(taken_port: int, tmp_path: Path) -> None:
    r = run("cluster", "up", "--nodes", "1", "--base-port", str(taken_port),
            "--data-dir", str(tmp_path / "c"))
    line = one_error_line(r)
    assert f"{taken_port}" in line and "already in use" in line, line
    assert not (tmp_path / "c").exists(), "checked before anything was created"


@pytest.mark.timeout(60)
def test_cluster_up_on_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = one_error_line(run("cluster", "up", "--nodes", "1", "--base-port", "0",
                              "--data-dir", str(tmp_path / "file")))
    assert line == f"error: --data-dir {tmp_path / 'file'}: exists and is not a directory"


@pytest.mark.timeout(90)
def test_cluster_up_reports_the_failing_nodes_cause(tmp_path: Path) -> None:
    """Every node gets a secret file that does not exist (a later flag wins): the first
    failure's own cause is the one line, and nothing is left running."""
    r = run("cluster", "up", "--nodes", "2", "--base-port", "0", "--data-dir",
            str(tmp_path / "c"), "--", "--secret-file", str(tmp_path / "missing"))
    line = one_error_line(r)
    assert " exited with 2 before READY: secret_file: cannot read " in line, line
    assert line.endswith("; the other nodes were stopped"), line


@pytest.mark.timeout(90)
async def test_local_cluster_stops_the_nodes_it_started_when_one_fails(tmp_path: Path) -> None:
    cluster = LocalCluster(3, data_dir=tmp_path, extra_args=["--reconcile-timeout", "1"],
                           node_args={"n2": ["--secret-file", str(tmp_path / "missing")]})
    try:
        with pytest.raises(StartError) as info:
            await cluster.start()
        assert info.value.node_id == "n2" and info.value.code == 2
        assert info.value.cause is not None
        assert info.value.cause.startswith("secret_file: cannot read"), info.value.cause
        for node_id in ("n1", "n3"):  # they reached READY, then got SIGTERM: a clean exit
            proc = cluster.nodes[node_id].proc
            assert proc is not None and proc.returncode == 0, (node_id, proc)
    finally:
        await cluster.abort()
