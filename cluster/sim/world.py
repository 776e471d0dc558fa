"""The simulated cluster: one ``Host`` per node id (its disk survives crashes), each running a
real ``Node`` on simulated links, log and clocks, with the loops ``cluster.server`` starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any, cast

from cluster.core.config import NodeConfig, from_mapping
from cluster.core.membership import Membership
from cluster.roles.antientropy import antientropy_loop
from cluster.roles.expiry import expiry_loop
from cluster.roles.failure import heartbeat_loop
from cluster.roles.member import Node
from cluster.roles.membership import VoteStore, depart, move_loop
from cluster.roles.settle import settle_loop
from cluster.roles.shed import shed_loop
from cluster.sim.disk import SimDisk, SimLog
from cluster.sim.loop import Held, owned, run_as, thaw
from cluster.sim.net import SimLink, SimNet
from cluster.transport.peer import PeerLink
from cluster.wal import DurableLog

log = logging.getLogger("cluster.sim")

EPOCH = 1_800_000_000.0  # the wall clock's reading at virtual time 0


class Host:
    """A machine: a disk that outlives crashes, and the node instance running on it, if any."""

    def __init__(self, node_id: str, config: NodeConfig) -> None:
        self.id, self.config = node_id, config
        self.disk = SimDisk(node_id)
        self.node: Node | None = None
        self.up = False  # a node instance listens (after recover(), as the real server)
        self.paused = False  # frozen whole (SIGSTOP): its callbacks wait in ``held``
        self.held: list[Held] = []
        self.epoch = 0  # bumped at every start and crash: stale frames are told apart
        self.skew = 0.0  # this machine's wall clock offset (seconds); a clock jump moves it
        self.worst = 0.0  # the largest offset it reached (the checker's margin)
        self.drift = 0.0  # and how fast it runs ahead (+) or behind (-): seconds per second
        self.inbox: list[Callable[[], None]] = []
        self.outbox: list[tuple[str, Callable[[], None]]] = []
        self.tasks: dict[asyncio.Task[Any], None] = {}  # ordered: cancelled in start order
        self.restarts = 0
        self.retired = False  # left the cluster (or was replaced): never started again

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as this machine's work: frozen with it, cancelled by its crash."""
        task = asyncio.get_running_loop().create_task(coro, context=owned(self))
        self.tasks[task] = None
        task.add_done_callback(lambda t: self.tasks.pop(t, None))
        return task

    async def call(self, work: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """``work()`` run as a request to this machine: its work (``spawn``), which goes on if
        the caller gives up (a client's timeout closes its connection; the node's handler still
        runs, as the real edge's does). To a frozen machine the request waits in its socket
        and is read when it wakes. A crash under it resets the caller's connection
        (``ConnectionError``)."""
        epoch = self.epoch
        if self.paused:
            request = _Request(self, work)
            self.inbox.append(request)
            task = await asyncio.shield(request.started)
        else:
            task = self.spawn(work())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self.epoch == epoch or (me is not None and me.cancelling()):
                raise
            raise ConnectionError("connection reset: the node crashed") from None


class _Request:
    """A request waiting in a frozen machine's socket: read (spawned) when it wakes, or reset
    by its crash."""

    def __init__(self, host: Host, work: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.host, self.work = host, work
        self.started: asyncio.Future[asyncio.Task[Any]] = (
            asyncio.get_running_loop().create_future())

    def __call__(self) -> None:
        if not self.started.done():
            self.started.set_result(self.host.spawn(self.work()))

    def reset(self) -> None:
        if not self.started.done():
            self.started.set_exception(ConnectionError("connection reset: the node crashed"))
            self.started.exception()


class World:
    """``n`` members from the start, and ``spares`` machines a membership change may add
    (``join``): their ids follow the members' (n6, n7, ... for n = 5)."""

    def __init__(self, n: int, rf: int, net: SimNet, *, disk_rng: random.Random | None = None,
                 spares: int = 0, **overrides: Any) -> None:
        self.net = net
        self.disk_rng = disk_rng  # None: a crash loses the unsynced tail whole
        ids = [f"n{i + 1}" for i in range(n)]
        peers = ",".join(f"{nid}=127.0.0.1:{7101 + i}" for i, nid in enumerate(ids))
        # rate: the filters sized for 1,000 op ids a second per table (the clients send a few):
        # a tenth of the production default's bits to shift at every epoch and to snapshot
        base: dict[str, Any] = {"rf": rf, "fsync": False, "peers": peers, "rate": 1000.0,
                                **overrides}
        self.hosts = {nid: Host(nid, from_mapping({
            **base, "node_id": nid, "listen": f"127.0.0.1:{7101 + i}",
            "peers": peers if i < n else f"{peers},{nid}=127.0.0.1:{7101 + i}",
            "data_dir": f"/nonexistent/idc-sim/{nid}"}))
            for i, nid in enumerate(ids + [f"n{n + j + 1}" for j in range(spares)])}
        net.hosts = self.hosts
        self.members = ids  # the hosts in the cluster now: started, not retired
        self.errors: list[str] = []

    @property
    def ids(self) -> list[str]:
        return list(self.members)

    def spares(self) -> list[Host]:
        """Machines never started (a join or a replacement takes one)."""
        return [h for h in self.hosts.values()
                if h.id not in self.members and not h.retired and h.node is None]

    def join(self, host: Host, ms: Membership) -> None:
        """Start ``host`` as a new member under ``ms`` (what the claimant answered); nothing if
        it is one already (a second answer to the same join: the operator started it once)."""
        if host.id in self.members:
            return
        host.disk.ring = ms
        self.members.append(host.id)
        self.boot(host)

    def retire(self, host: Host) -> None:
        """``host`` left the cluster (or its disk died): stopped for good."""
        self.crash(host)
        host.retired = True
        if host.id in self.members:
            self.members.remove(host.id)

    def wall(self, host: Host) -> Callable[[], float]:
        loop = asyncio.get_running_loop()
        return lambda: EPOCH + loop.time() * (1.0 + host.drift) + host.skew

    def unretire(self, host: Host) -> None:
        """Undo ``retire`` of a member that is still in the cluster: start it again."""
        host.retired = False
        if host.id not in self.members:
            self.members.append(host.id)
        self.restart(host)

    def boot(self, host: Host) -> None:
        """Start a node instance on ``host`` from what its disk kept."""
        run_as(host, self._boot, host)

    def _boot(self, host: Host) -> None:
        host.epoch += 1
        loop = asyncio.get_running_loop()
        cfg = host.config
        ms = host.disk.ring or Membership.bootstrap(cfg.peers, rf=cfg.rf, vnodes=cfg.vnodes)
        links = {pid: SimLink(self.net, host, pid) for pid in ms.reachable if pid != host.id}
        node = Node(host.config, clock=self.wall(host), monotonic=loop.time,
                    links=cast(dict[str, PeerLink], links),
                    log=cast(DurableLog, SimLog(host.disk)),
                    incarnation=host.disk.next_incarnation, members=ms,
                    dial=lambda pid: cast(PeerLink, SimLink(self.net, host, pid)),
                    keep_ring=lambda kept: setattr(host.disk, "ring", kept),
                    votes=VoteStore.kept_on(host.disk))
        host.node = node
        host.spawn(self._serve(host, node))

    async def _serve(self, host: Host, node: Node) -> None:
        """What ``NodeServer.start`` does, in its order: recover, listen, heartbeats, settle
        and catch up (bounded by ``reconcile_timeout``), ready, then the background loops."""
        try:
            await self._start(host, node)
        except Exception as exc:  # the real process would exit: so does this instance
            self.errors.append(f"{host.id} failed to start: {exc!r}")
            self.crash(host)

    async def _start(self, host: Host, node: Node) -> None:
        cfg = host.config
        await node.recover()
        host.up = True
        node.use_detector()
        host.spawn(heartbeat_loop(node, node.detector, cfg.heartbeat_interval))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(node.prepare(), cfg.reconcile_timeout)
        node.ready = True
        host.spawn(settle_loop(node, cfg.quorum_timeout))
        host.spawn(antientropy_loop(node, cfg.antientropy_interval))
        host.spawn(_snapshot_loop(node, cfg.snapshot_interval))
        host.spawn(_sweep_loop(node, 4 * cfg.quorum_timeout))
        host.spawn(move_loop(node, node.changes))
        host.spawn(shed_loop(node))
        host.spawn(expiry_loop(node))
        host.spawn(self._depart(host, node))

    async def _depart(self, host: Host, node: Node) -> None:
        """What ``NodeServer`` does once its node left: hand off, then stop for good."""
        await depart(node)
        if host.node is node:
            asyncio.get_running_loop().call_soon(self.retire, host)

    def crash(self, host: Host) -> None:
        """kill -9 and power loss: unsynced appends gone, every connection to it broken."""
        if host.node is None:
            return
        host.up = host.paused = False
        host.epoch += 1
        for waiting in host.inbox:
            if isinstance(waiting, _Request):
                waiting.reset()
        host.inbox.clear()
        host.outbox.clear()
        tasks = list(host.tasks)
        for task in tasks:
            task.cancel()
        thaw(host)  # a frozen node's held steps run, to end their cancelled tasks
        _reap(tasks)
        if self.disk_rng is not None:
            cast(SimLog, host.node.log).abort(self._tear)
        host.node.abort()
        host.node = None
        for other in self.hosts.values():
            if other.node is not None:
                link = other.node.links.get(host.id)
                if isinstance(link, SimLink):
                    link.lose("peer crashed")

    def _tear(self, waiting: bytes) -> bytes:
        """What of the unsynced bytes a power loss leaves on the disk: nothing, a prefix cut
        anywhere, or all of it with one byte flipped (a third each)."""
        rng = self.disk_rng
        assert rng is not None
        how = rng.random()
        if how < 1 / 3 or len(waiting) < 2:
            return b""
        if how < 2 / 3:
            return waiting[:rng.randrange(1, len(waiting))]
        at = rng.randrange(len(waiting))
        return waiting[:at] + bytes([waiting[at] ^ (1 << rng.randrange(8))]) + waiting[at + 1:]

    def restart(self, host: Host) -> None:
        if host.node is None and not host.retired and host.id in self.members:
            host.restarts += 1
            self.boot(host)

    def pause(self, host: Host) -> None:
        """SIGSTOP: the node's loop, timers and tasks stop; frames to it queue."""
        if host.node is not None:
            host.paused = True

    def resume(self, host: Host) -> None:
        """SIGCONT: what was ready runs, then the frames and requests that waited are read,
        stale, then the overdue timers run (``thaw``)."""
        if not host.paused:
            return
        host.paused = False
        inbox, outbox = host.inbox, host.outbox
        host.inbox, host.outbox = [], []
        for dst, deliver in outbox:
            self.net.transmit(host.id, dst, deliver)
        thaw(host, inbox)

    def heal(self) -> None:
        self.net.blocked.clear()
        for host in self.hosts.values():
            self.resume(host)
            self.restart(host)

    def live_nodes(self) -> list[Node]:
        return [h.node for h in self.hosts.values()
                if h.node is not None and h.up and h.id in self.members]


def _reap(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel again until they end: Python 3.11's ``wait_for`` drops a cancellation that lands
    while its inner future completes (here: a link failed by the same crash), and a loop that
    catches the inner error (``antientropy.sync_all``) would outlive its node."""
    alive = [t for t in tasks if not t.done()]
    if alive:
        for task in alive:
            task.cancel()
        asyncio.get_running_loop().call_later(0.01, _reap, alive)


async def _snapshot_loop(node: Node, interval: float) -> None:
    last = node.log.stats().bytes_appended
    while True:
        await asyncio.sleep(interval)
        grown = node.log.stats().bytes_appended - last
        if grown > 0:
            last = node.log.stats().bytes_appended
            await node.log.write_snapshot(node.state.make_blob)


async def _sweep_loop(node: Node, max_age: float) -> None:
    while True:
        await asyncio.sleep(1.0)
        for link in node.links.values():
            link.sweep(max_age=max_age)
