"""A local cluster of real node processes on loopback: used by ``cluster up``, the demo,
the benchmarks and the multi-process tests.

Each node is ``python -m cluster.node`` with its own data directory; ``start`` waits for every
``READY`` line with a deadline; ``stop`` sends SIGTERM and kills whatever outlives the timeout.
A node runs this code by default, or another release's (``NodeCode``: a python executable and a
source tree put first on its import path), so a rolling upgrade can stop a node and start it
again on the same data directory and port with the other code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.transport.auth import write_secret


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux), so a launcher that
    is itself killed -9 (a test runner timing out) leaves no node behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports free right now, for nodes started a moment later.

    They are drawn below the kernel's ephemeral range: a port the OS hands out for port 0
    is handed out again to the next socket that binds port 0 (a proxy, a client), which
    could take it before the node that was told to listen there starts (CI saw it: "n2 ...
    cannot listen on 127.0.0.1:43535: Address already in use"). Each is test-bound, all
    held together so they are distinct; port 0 is the fallback when that range is small.
    """
    low = _ephemeral_low()
    rng = random.Random()
    socks: list[socket.socket] = []
    try:
        tries = 0
        while len(socks) < count and low > 11024 and tries < 50 * count:
            tries += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, rng.randrange(10000, low - 1)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class StartError(RuntimeError):
    """A node exited before READY; the message carries the node's own ``error:`` line (a port
    in use, a secret it cannot read, a data dir it cannot use) when its log has one."""

    def __init__(self, node_id: str, code: int | None, log_path: Path) -> None:
        self.node_id, self.code, self.log_path = node_id, code, log_path
        self.cause = last_error_line(log_path)
        why = f": {self.cause}" if self.cause else f"; see {log_path}"
        super().__init__(f"{node_id} exited with {code} before READY{why}")


def last_error_line(log_path: Path) -> str | None:
    """The last ``error: ...`` line a node wrote to its stderr log, without the prefix."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return None
    found = [ln[len("error: "):] for ln in lines if ln.startswith("error: ")]
    return found[-1] if found else None


def ports_in_use(ports: Sequence[int], host: str = "127.0.0.1") -> list[int]:
    """Those of ``ports`` that a node could not listen on now (bound the way a node binds,
    with SO_REUSEADDR, so a port left in TIME_WAIT by an earlier run counts as free)."""
    taken = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                taken.append(port)
    return taken


@dataclass(frozen=True, kw_only=True)
class NodeCode:
    """The code a node process runs: ``python -m cluster.node`` with ``python``, and, when
    ``tree`` is given, that source tree first on the import path (the process's working
    directory and its only ``PYTHONPATH`` entry: ``-m`` puts the working directory ahead of
    ``PYTHONPATH``, and both ahead of an editable install's finder); ``env`` is added to the
    node's environment (test-only switches). ``NodeCode()`` is this code, as before.

    A release's tree run under this venv's python (``git archive v0.4.0``) uses its Python
    reference kernels; a venv of its own (``pip install -e`` of the tree) compiles them."""

    python: str = sys.executable
    tree: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    label: str = "current"

    @property
    def cwd(self) -> str | None:
        return str(self.tree) if self.tree is not None else None

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) as a node of this code sees it."""
        env = dict(os.environ if base is None else base)
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        env.update(self.env)
        return env

    def module_file(self, module: str = "cluster") -> Path:
        """Where ``module`` is imported from in a process of this code (run one to see)."""
        out = subprocess.run(
            [self.python, "-c", f"import {module}; print({module}.__file__)"], cwd=self.cwd,
            env=self.environ(), capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{self.label}: {self.python} cannot import {module}: "
                               f"{out.stderr.strip()[-300:]}")
        return Path(out.stdout.strip()).resolve()

    def check(self) -> Path:
        """The ``cluster`` package this code's processes import; a ``RuntimeError`` when a
        ``tree`` was given and the package comes from elsewhere (an installed copy won)."""
        found = self.module_file()
        if self.tree is not None and not found.is_relative_to(Path(self.tree).resolve()):
            raise RuntimeError(f"{self.label}: {self.python} imports cluster from {found}, "
                               f"not from {self.tree}")
        return found


class NodeProcess:
    def __init__(self, node_id: str, host: str, port: int, args: list[str], data_dir: Path,
                 log_path: Path, code: NodeCode | None = None) -> None:
        self.id, self.host, self.port = node_id, host, port
        self.args = args
        self.data_dir = data_dir
        self.log_path = log_path
        # the code the next start runs (a rolling upgrade changes it between starts)
        self.code = code or NodeCode()
        self.proc: asyncio.subprocess.Process | None = None
        # extra environment for the next start (tests: IDC_CLOCK_OFFSET, cluster.core.clock)
        self.env: dict[str, str] = {}
        self._drain: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, timeout: float = 20.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                self.code.python, "-m", "cluster.node", *self.args,
                stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                env={**self.code.environ(), "PYTHONUNBUFFERED": "1", **self.env},
                cwd=self.code.cwd, preexec_fn=_die_with_parent,
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), max(left, 0.01))
            except TimeoutError:
                await self.kill()
                raise RuntimeError(
                    f"{self.id}: no READY within {timeout}s; see {self.log_path}") from None
            if not line:
                code = await self.proc.wait()
                raise StartError(self.id, code, self.log_path)
            if line.startswith(b"READY "):
                break
        self._drain = asyncio.create_task(self._drain_stdout())

    async def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while await self.proc.stdout.readline():
            pass

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                return await self.kill()
        await self._finish()
        return self.proc.returncode

    async def kill(self) -> int | None:
        """kill -9: no drain, no flush."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._finish()
        return self.proc.returncode

    async def _finish(self) -> None:
        if self._drain is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._drain, 2.0)
            self._drain = None


class LocalCluster:
    """N node processes with ids n1..nN on consecutive or free loopback ports.

    Peers authenticate with a secret (``secret=True``, the default): a random one is written to
    ``<data_dir>/cluster.secret`` (mode 600) unless that file exists, and every node gets
    ``--secret-file`` for it. ``secret=False`` runs them unauthenticated. ``code``: what every
    node runs (default this code; each ``NodeProcess.code`` can change before a restart)."""

    def __init__(self, nodes: int = 3, *, rf: int = 3, base_port: int | None = None,
                 data_dir: str | os.PathLike[str] | None = None, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (),
                 node_args: Mapping[str, Sequence[str]] | None = None,
                 secret: bool = True, code: NodeCode | None = None) -> None:
        self._own_dir = data_dir is None
        # absolute: a node of another tree runs in that tree's directory
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="idemcount-")).absolute()
        self.code = code or NodeCode()
        self.secret_file: Path | None = None
        if secret:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.secret_file = self.data_dir / "cluster.secret"
            if not self.secret_file.exists():
                write_secret(self.secret_file)
            extra_args = ["--secret-file", str(self.secret_file), *extra_args]
        ports = ([base_port + i for i in range(nodes)] if base_port else free_ports(nodes, host))
        ids = [f"n{i + 1}" for i in range(nodes)]
        peers = ",".join(f"{i}={host}:{p}" for i, p in zip(ids, ports, strict=True))
        self.host, self.extra_args = host, list(extra_args)
        self.nodes: dict[str, NodeProcess] = {}
        for node_id, port in zip(ids, ports, strict=True):
            args = ["--id", node_id, "--listen", f"{host}:{port}", "--peers", peers,
                    "--data-dir", str(self.data_dir / node_id), "--rf", str(min(rf, nodes)),
                    *extra_args, *(node_args or {}).get(node_id, ())]
            self.nodes[node_id] = NodeProcess(node_id, host, port, args, self.data_dir / node_id,
                                              self.data_dir / f"{node_id}.log", self.code)

    def add_node(self, node_id: str, *, join: Sequence[str], replaces: str | None = None,
                 port: int | None = None, args: Sequence[str] = ()) -> NodeProcess:
        """A node that joins the running cluster through ``join`` (member ids), taking the
        place of ``replaces`` if given (``--replace``); started by its ``start()``."""
        port = port or free_ports(1, self.host)[0]
        seeds = ",".join(self.nodes[j].address for j in join)
        argv = ["--id", node_id, "--listen", f"{self.host}:{port}", "--join", seeds,
                "--data-dir", str(self.data_dir / node_id), *self.extra_args, *args]
        if replaces:
            argv += ["--replace", replaces]
        node = self.nodes[node_id] = NodeProcess(node_id, self.host, port, argv,
                                                 self.data_dir / node_id,
                                                 self.data_dir / f"{node_id}.log", self.code)
        return node

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes.values()]

    async def start(self, timeout: float = 30.0) -> None:
        """Start every node and wait for each READY; if one fails, stop the others (SIGTERM,
        then kill) and raise the first failure (a ``StartError`` names the node's cause)."""
        try:
            results = await asyncio.gather(*(n.start(timeout) for n in self.nodes.values()),
                                           return_exceptions=True)
        except BaseException:  # cancelled while starting
            await self.abort()
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            try:
                await asyncio.gather(*(n.stop(5.0) for n in self.nodes.values()),
                                     return_exceptions=True)
            finally:
                await self.abort()
            raise failures[0]

    async def stop(self, timeout: float = 10.0) -> dict[str, int | None]:
        codes = await asyncio.gather(*(n.stop(timeout) for n in self.nodes.values()))
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return dict(zip(self.nodes, codes, strict=True))

    async def abort(self) -> None:
        await asyncio.gather(*(n.kill() for n in self.nodes.values()), return_exceptions=True)

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.stop()
        finally:
            await self.abort()
