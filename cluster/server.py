"""A running node process: recover, listen (HTTP and peers on one port), serve, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from cluster.core import batch_kernel, store_kernel
from cluster.core.clock import OFFSET_ENV, injected_offset, offset_clock
from cluster.core.config import NodeConfig
from cluster.core.errors import ClusterError, ConfigError, Departed
from cluster.core.fbf import hotpath
from cluster.core.membership import Membership
from cluster.core.metrics import Histogram
from cluster.edge.http_api import Edge, http_protocol, load_tokens, make_app
from cluster.edge.listener import Listener, server_ssl
from cluster.edge.raw import RawServer
from cluster.roles.antientropy import antientropy_loop
from cluster.roles.expiry import expiry_loop
from cluster.roles.failure import heartbeat_loop
from cluster.roles.member import Node
from cluster.roles.membership import depart, gone, move_loop
from cluster.roles.settle import settle_loop
from cluster.roles.shed import shed_loop
from cluster.transport.peer import close_all
from cluster.wal import LogCorruptError, read_format

log = logging.getLogger("cluster.server")


def _node_clock(node_id: str) -> Callable[[], float]:
    """The node's wall clock: the machine's, moved by ``IDC_CLOCK_OFFSET`` seconds when that is
    set (test only: the chaos driver's clock nemesis, tests/test_clock_skew.py)."""
    try:
        offset = injected_offset()
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if offset:
        log.warning("test-only clock offset injected", extra={"fields": {
            "node": node_id, "env": OFFSET_ENV, "offset_s": offset}})
    return offset_clock(offset)


class NodeServer:
    """Owns the node, its listening socket and its background tasks (an async context manager)."""

    def __init__(self, config: NodeConfig, *, ready_stream: TextIO | None = None,
                 raw_http: bool = True, members: Membership | None = None) -> None:
        self.config = config
        self.node = Node(config, clock=_node_clock(config.node_id), members=members)
        self.listener: Listener | None = None
        self.raw_http = raw_http  # False: aiohttp serves every request (tests compare the two)
        self.raw: RawServer | None = None
        self.ready_stream = ready_stream
        self.address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._inbound: set[asyncio.Protocol] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    async def __aenter__(self) -> NodeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        """Recover, listen, then settle and catch up with the replicas, and only then serve
        (READY): the order that keeps a restarted node from answering out of date."""
        started = time.monotonic()
        cfg = self.config
        if self.node.departed.is_set():  # decommissioned, then started again
            raise gone(self.node.id, self.node.membership)
        try:
            replayed = await self.node.recover()
        except OSError as exc:  # not a directory, read-only, full disk: say so in one line
            why = _why(exc, str(cfg.data_dir))
            raise ConfigError(f"data_dir: cannot use {cfg.data_dir}: {why}") from exc
        host, port = await self._listen()
        self._freeze_recovered_state()
        node = self.node
        for link in node.links.values():
            link.connect_soon()
        node.use_detector()
        self._tasks = [
            asyncio.create_task(heartbeat_loop(node, node.detector, cfg.heartbeat_interval),
                                name="heartbeats"),
            asyncio.create_task(lag_loop(node.metrics.loop_lag), name="loop-lag")]
        await self._prepare()
        self._tasks += [
            asyncio.create_task(self._snapshot_loop(), name="snapshots"),
            asyncio.create_task(self._sweep_loop(), name="sweep"),
            asyncio.create_task(settle_loop(node, cfg.quorum_timeout), name="in-doubt"),
            asyncio.create_task(antientropy_loop(node, cfg.antientropy_interval),
                                name="anti-entropy"),
            asyncio.create_task(move_loop(node, node.changes), name="moves"),
            asyncio.create_task(shed_loop(node), name="shedding"),
            asyncio.create_task(expiry_loop(node), name="expiry"),
            asyncio.create_task(self._depart_when_left(), name="departure")]
        log.info("node ready", extra={"fields": {
            "node": node.id, "address": f"{host}:{port}", "replayed": replayed,
            "counters": node.state.shards.keys, "in_doubt": len(node.pending),
            "recovery_s": round(time.monotonic() - started, 3), "fbf_kernel": hotpath.KERNEL,
            "store_kernel": store_kernel.KERNEL, "batch_kernel": batch_kernel.KERNEL,
            "log_writer": node.log.stats().writer}})
        if self.ready_stream is not None:
            self.ready_stream.write(f"READY {node.id} {host}:{port}\n")
            self.ready_stream.flush()

    async def _listen(self) -> tuple[str, int]:
        """The HTTP app and the port's listener (peers and clients); the bound address."""
        cfg = self.config
        self.listener = listener = Listener(
            self._http_protocol, self.node.handle_peer, self._inbound, auth=self.node.auth,
            header_timeout=cfg.header_timeout,
            max_connections_per_client=cfg.max_connections_per_client)
        tokens = load_tokens(cfg.token_file) if cfg.token_file else frozenset()
        edge = Edge(listener, self.node.auth, tokens)
        # after an early answer (413, 408) keep reading what the client still sends for at most
        # this long, then close
        lingering_time = min(cfg.body_timeout, 1.0)
        self._runner = web.AppRunner(make_app(self.node, edge), handle_signals=False,
                                     access_log=None, shutdown_timeout=cfg.drain_timeout,
                                     keepalive_timeout=cfg.idle_timeout,
                                     lingering_time=lingering_time)
        await self._runner.setup()
        if self.raw_http:  # the hot routes without aiohttp; the rest is handed to the app
            self.raw = RawServer(self.node, edge, listener, lingering_time=lingering_time)
            listener.raw_factory = self.raw.protocol
        loop = asyncio.get_running_loop()
        host, port = cfg.listen
        try:
            self._server = await loop.create_server(
                listener.protocol, host, port, reuse_address=True, backlog=2048,
                ssl=server_ssl(cfg))
        except OSError as exc:  # the port is taken (another node, `cluster up`, compose)
            raise ConfigError(f"listen: cannot listen on {host}:{port}: {_why(exc)}") from exc
        if not self.node.auth.enabled:
            log.warning("no --secret-file: peer traffic is not authenticated; anyone who can "
                        "reach this port can forge replication (tests and trusted hosts only)")
        self.address = (host, self._server.sockets[0].getsockname()[1])
        return self.address

    @staticmethod
    def _freeze_recovered_state() -> None:
        """Recovered state lives as long as the process: keep the cyclic GC from rescanning it,
        and collect the young generation less often (the hot path allocates many short-lived
        containers, none of them cyclic)."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(int(os.environ.get("IDC_GC_THRESHOLD", "20000")), 20, 100)

    async def _prepare(self) -> None:
        """Settle in-doubt ops and pull the replicas' state before serving; replicas that do
        not answer in time are caught up later (the in-doubt ops stay pending meanwhile)."""
        node, cfg = self.node, self.config
        try:
            await asyncio.wait_for(node.prepare(), cfg.reconcile_timeout)
        except TimeoutError:
            log.warning("recovery exchange not finished in %ss; serving, in-doubt ops: %d",
                        cfg.reconcile_timeout, len(node.pending))
        node.ready = True
        for link in node.links.values():
            link.forget_failure()

    def _http_protocol(self) -> asyncio.Protocol:
        assert self._runner is not None and self._runner.server is not None
        return http_protocol(self._runner.server)

    async def _snapshot_loop(self) -> None:
        cfg = self.config
        last = self.node.log.stats().bytes_appended
        last_at = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, cfg.snapshot_interval))
            grown = self.node.log.stats().bytes_appended - last
            due = time.monotonic() - last_at >= cfg.snapshot_interval
            if grown >= cfg.snapshot_log_bytes or (due and grown > 0):
                try:
                    await self.snapshot()
                except ClusterError as exc:  # the log keeps everything: try again later
                    log.warning("snapshot failed: %s", exc)
                    continue
                except Exception:  # a bug; the loop must outlive it (the log keeps everything)
                    log.exception("snapshot failed")
                    continue
                last = self.node.log.stats().bytes_appended
                last_at = time.monotonic()

    async def snapshot(self) -> None:
        started = time.perf_counter()
        await self.node.log.write_snapshot(self.node.state.snapshot_cut)
        self.node.metrics.snapshots += 1
        log.info("snapshot written", extra={"fields": {
            "seconds": round(time.perf_counter() - started, 3),
            "counters": self.node.state.shards.keys}})

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for link in self.node.links.values():
                link.sweep(max_age=4 * self.config.quorum_timeout)

    async def _depart_when_left(self) -> None:
        """Once the node left the cluster and handed off (``membership.depart``): exit 0."""
        await depart(self.node)
        self.request_stop()

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self._stopping.wait()
        log.info("stopping: draining in-flight requests")

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (drain_timeout), flush the log, close."""
        if self._server is not None:
            self._server.close()
        drains = [self.raw.drain(self.config.drain_timeout)] if self.raw is not None else []
        if self._runner is not None:
            drains.append(self._runner.cleanup())
        await asyncio.gather(*drains)
        await _cancel_all(self._tasks)
        close_all(self._inbound)
        await self.node.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def abort(self) -> None:
        """Stop at once, as close to kill -9 as one process allows: no drain, no flush, every
        connection (HTTP ones included) closed."""
        if self._server is not None:
            self._server.close()
        if self.raw is not None:
            self.raw.abort()
        http = self._runner.server if self._runner is not None else None
        for conn in http.connections if http is not None else ():
            conn.force_close()
            if conn.transport is not None:
                conn.transport.close()
        for task in self._tasks:
            task.cancel()
        close_all(self._inbound)
        self.node.abort()


async def lag_loop(histogram: Histogram, interval: float = 0.1) -> None:
    """Observe how late a timer of ``interval`` fires: every stall of the event loop (a long
    synchronous step) shows as a late wake-up. Ten wake-ups a second cost next to nothing.
    With ``IDC_STALL_TRACE=<file>`` a watcher thread also writes the loop thread's stack to
    ``<file>`` whenever the loop is stuck 50 ms past a wake-up: what the stall was."""
    loop = asyncio.get_running_loop()
    beat = [time.monotonic()]
    trace = os.environ.get("IDC_STALL_TRACE")
    if trace:
        threading.Thread(target=_watch_stalls, args=(beat, interval, trace,
                                                     threading.get_ident()),
                         name="stall-watch", daemon=True).start()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        histogram.observe(max(0.0, loop.time() - due))
        beat[0] = time.monotonic()


def _watch_stalls(beat: list[float], interval: float, path: str, loop_thread: int,
                  threshold: float = 0.05) -> None:
    """Sample the loop thread's stack while it is stuck (a diagnostic: ``lag_loop``)."""
    reported = 0.0
    while True:
        time.sleep(threshold / 2)
        late = time.monotonic() - beat[0] - interval
        if late > threshold and beat[0] != reported:
            reported = beat[0]
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame)[-14:]) if frame else "?\n"
            with open(path, "a") as f:
                f.write(f"--- pid {os.getpid()} stuck {late * 1e3:.0f} ms at {time.time():.3f}\n"
                        f"{stack}")


def _why(exc: OSError, path: str | None = None) -> str:
    """An OSError as its cause in words, naming the file when it is not ``path`` itself."""
    if isinstance(exc, FileExistsError | NotADirectoryError) and path and Path(path).is_file():
        return "exists and is not a directory"  # (the log directory made below it, or it)
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"{text}: {exc.filename}" if exc.filename and exc.filename != path else text


def run(config: NodeConfig, join: str | None = None, replaces: str | None = None) -> int:
    """Run a node until SIGTERM/SIGINT, or until it left the cluster; the exit status.
    ``join``: seeds (HOST:PORT,...) of a running cluster to join, ``replaces`` the dead member
    this node takes the place of (``cluster.admin.join``)."""

    async def main() -> None:
        nonlocal config
        # Before anything is written to the data directory: a directory a later release raised
        # (its FORMAT file) is refused here, in one line, with every file left as it was.
        read_format(Path(config.data_dir))
        members = None
        if join:
            from cluster import admin

            advertise = config.advertise or "{}:{}".format(*config.listen)
            members = await admin.join(config, admin.parse_seeds(join), advertise, replaces)
            config = admin.configured(config, members)
        server = NodeServer(config, ready_stream=sys.stdout, members=members)
        # Handlers before start: READY is printed inside start(), and a SIGTERM sent right after
        # it (a launcher stopping the nodes it started) must drain and exit 0, not kill.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        try:
            await server.start()
        except BaseException:
            # close what started (the log, peer links) before the error is reported
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.stop(), 5.0)
            raise
        try:
            await server.serve_until_signal()
        finally:
            await server.stop()

    # The log's fsync runs in a worker thread; when it returns it needs the GIL, which a busy
    # event loop yields only every switch interval (5 ms by default). Every group commit waits
    # that long twice (start and finish); 0.5 ms keeps the handoff off the ack latency.
    sys.setswitchinterval(float(os.environ.get("IDC_SWITCH_INTERVAL", "0.0005")))
    profile_path = os.environ.get("IDC_PROFILE")  # e.g. IDC_PROFILE=/tmp/prof: cProfile dump
    profiler = None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU time: idle waits do not count
        profiler.enable()
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported OS
        asyncio.run(main())
    except (ConfigError, LogCorruptError) as exc:  # a secret, token or certificate file
        # that does not load, a port in use, a data dir it cannot use, files of a later
        # release (FormatError) or damaged ones: one line, no traceback
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Departed as exc:  # it left the cluster: stopped for good, not a failure
        print(f"{exc}", file=sys.stderr)
        return 0
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile_path}.{config.node_id}")
    return 0


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a path or a reason may hold a newline)."""
    return " ".join(str(exc).splitlines())


async def _cancel_all(tasks: list[asyncio.Task[None]], rounds: int = 100) -> None:
    """Cancel ``tasks`` and wait for them to end, cancelling again while one is still running:
    on Python 3.11 ``asyncio.wait_for`` drops a cancellation that lands in the turn its inner
    future completes, and a loop that catches the inner error (anti-entropy's) goes on. A
    single cancel-then-await made ``stop`` hang on such a task (seen as a rare test timeout)."""
    for _ in range(rounds):
        alive = [t for t in tasks if not t.done()]
        if not alive:
            break
        for task in alive:
            task.cancel()
        await asyncio.wait(alive, timeout=0.05)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a loop that ended with an error was logged already
