"""One seed end to end: boot, workload under the nemesis, heal, quiet, final reads, check.

Everything random is drawn from ``random.Random`` instances seeded from the seed (network,
nemesis, each client), and every clock is the ``SimLoop``'s, so a seed replays byte for byte
(given one ``PYTHONHASHSEED``: ``python -m cluster.sim`` pins it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from client.checker import CounterReport, check
from cluster.core import store_kernel
from cluster.core.entry import FLOOR, LAST
from cluster.core.membership import LEAVING, LEFT, Membership
from cluster.core.shards import ShardStore
from cluster.roles.admission import Admission
from cluster.roles.member import Node
from cluster.roles.replica import Replica
from cluster.sim.clients import TTL_TABLE, History, Workload, client_tasks, final_reads
from cluster.sim.disk import SimLog
from cluster.sim.loop import SimLoop
from cluster.sim.net import Faults, SimNet
from cluster.sim.world import Host, World

# torn: half the crashes land right after a log append is queued and before its fsync, and a
# crash leaves the unsynced tail lost, torn or corrupt (``World._tear``)
DEFAULT_FAULTS = ("drop", "delay", "duplicate", "partition", "crash", "pause", "torn")
# opt-in: skew, each node's wall clock offset and drift; clock, a node's wall clock steps
# forward or back (within max_clock_skew or beyond it) and is stepped back later, as NTP does;
# membership, joins, decommissions and replacements of dead members (one change at a time;
# spare machines to join)
FAULTS = (*DEFAULT_FAULTS, "skew", "clock", "membership")
SPARES = 3  # machines a run with the membership fault may add
# test-only switches that must make the checker fail
BREAKS = ("dedup", "hide", "floors", "wake")
# the op mix's shares (``--mix``): adds take the rest
# hedge: adds whose first attempt goes to two nodes at once (a client that hedges, not the SDK)
MIX = {"read": 0.2, "delete": 0.0, "multiget": 0.0, "scan": 0.0, "hedge": 0.0}
# with deletes or a ttl: a short grace, so that tombstones are collected within a run (the
# config requires more than window + 2 * max_clock_skew, 12 s), and a sweep pass every second.
# Without them the sweep has nothing to do, and the defaults keep the timers (so the histories)
# of the seeds run before these existed.
SWEEP = {"tombstone_grace": 15.0, "sweep_interval": 3.0}


@dataclass
class Options:
    seed: int = 0
    nodes: int = 5
    rf: int = 3
    ops: int = 200
    faults: tuple[str, ...] = DEFAULT_FAULTS
    breaks: tuple[str, ...] = ()
    clients: int = 6
    keys: int = 4
    quiet: float = 15.0  # virtual seconds of calm after healing, before the final reads
    mix: tuple[tuple[str, float], ...] = ()  # shares other than ``MIX``'s (``--mix``)
    ttl: float | None = None  # seconds: a second table with this ttl (``--ttl``)

    def shares(self) -> dict[str, float]:
        return {**MIX, **dict(self.mix)}

    def sweeps(self) -> bool:
        """Tombstones or expiry to sweep: deletes or a ttl (``SWEEP``)."""
        return bool(self.ttl or self.shares()["delete"])

    def command(self) -> str:
        cmd = (f"python -m cluster.sim --nodes {self.nodes} --rf {self.rf} --seed {self.seed} "
               f"--ops {self.ops} --faults {','.join(self.faults) or 'none'}")
        if self.mix:
            cmd += " --mix " + ",".join(f"{k}={v:g}" for k, v in self.mix)
        if self.ttl:
            cmd += f" --ttl {self.ttl:g}"
        return cmd + (f" --break {','.join(self.breaks)}" if self.breaks else "")


@dataclass
class Result:
    options: Options
    history: list[dict[str, Any]]
    report: CounterReport
    virtual_s: float
    real_s: float
    trace: list[str] = field(default_factory=list)  # the nemesis' actions, with times
    errors: list[str] = field(default_factory=list)
    world: World | None = None  # what the disks kept, for a post-mortem

    @property
    def ok(self) -> bool:
        return self.report.valid and not self.errors

    def line(self) -> str:
        r = self.report
        more = ""
        if r.deletes or r.multigets or r.scans or r.expired_reads:
            more = (f" deletes={r.deletes_ok}/{r.deletes} multigets={r.multigets} "
                    f"scans={r.scans} expired={r.expired_reads}")
        head = (f"seed {self.options.seed}: {'ok' if self.ok else 'VIOLATION'} ops={r.ops} "
                f"acked={r.acknowledged} info={r.indeterminate} reads={r.reads}{more} "
                f"virtual={self.virtual_s:.1f}s real={self.real_s:.2f}s")
        if self.ok:
            return head
        probs = "; ".join(r.problems + self.errors)
        return f"{head}\n  {probs}\n  replay: {self.options.command()}"


class _Nemesis:
    """Fault episodes (at most two at a time), drawn from the nemesis' own random stream."""

    def __init__(self, world: World, rng: random.Random, faults: tuple[str, ...]) -> None:
        self.world, self.rng = world, rng
        self.kinds = [f for f in ("partition", "crash", "pause", "clock", "membership")
                      if f in faults]
        self.mid_write = "torn" in faults
        self.cuts: list[set[tuple[str, str]]] = []
        self.trace: list[str] = []
        self.stopping = False

    def note(self, what: str) -> None:
        self.trace.append(f"{asyncio.get_running_loop().time():9.3f} {what}")

    async def run(self) -> None:
        running: set[asyncio.Task[None]] = set()
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(0.3, 2.0))
            if self.kinds and len(running) < 2 and not self.stopping:
                task = asyncio.ensure_future(self.episode(self.rng.choice(self.kinds)))
                running.add(task)
                task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def episode(self, kind: str) -> None:
        w, rng = self.world, self.rng
        ids = w.ids
        hold = rng.uniform(0.5, 5.0)
        if kind == "membership":
            await self.membership()
            return
        if kind == "partition":
            cut = self.cut(rng.choice(("isolate", "halves", "oneway")), ids)
            self.cuts.append(cut)
            w.net.blocked = set().union(*self.cuts)
            self.note(f"partition {sorted(cut)} for {hold:.2f}s")
            await asyncio.sleep(hold)
            self.cuts.remove(cut)
            w.net.blocked = set().union(*self.cuts)
            self.note(f"heal {sorted(cut)}")
            return
        host = w.hosts[rng.choice(ids)]
        if host.node is None or host.paused:
            return
        if kind == "clock":
            skew = host.config.max_clock_skew
            step = rng.choice((-1, 1)) * skew * (rng.uniform(0.2, 0.9) if rng.random() < 0.5
                                                 else rng.uniform(1.5, 4.0))
            host.skew += step
            host.worst = max(host.worst, abs(host.skew))
            self.note(f"clock {host.id} {step:+.2f}s for {hold:.2f}s")
            await asyncio.sleep(hold)
            host.skew -= step
            self.note(f"clock {host.id} back")
        elif kind == "crash":
            how = await self.crash(host)
            self.note(f"crash {host.id}{how} for {hold:.2f}s")
            await asyncio.sleep(hold)
            w.restart(host)
            self.note(f"restart {host.id}")
        else:
            if rng.random() < 0.2:  # now and then longer than the window (a VM stolen, a GC)
                hold = rng.uniform(1.0, 1.5) * host.config.window
            w.pause(host)
            self.note(f"pause {host.id} for {hold:.2f}s")
            await asyncio.sleep(hold)
            w.resume(host)
            self.note(f"resume {host.id}")

    async def membership(self) -> None:
        """One change, asked of the claimant as ``python -m cluster`` would: a spare machine
        joins, a member is decommissioned, or a member's disk dies (it never comes back) and
        a spare replaces it. The move finishes by itself (``move_loop``), a window later."""
        w, rng = self.world, self.rng
        live = [n for n in w.live_nodes() if n.ready]
        if not live:
            return
        ms = max((n.membership for n in live), key=lambda m: m.version)
        if ms.moving or any(m not in w.members for m in ms.reachable):
            return  # one change at a time; a departing node still handing off
        spares, normal = w.spares(), list(ms.ids("normal"))
        choices = (["join", "replace"] if spares else []) + (
            ["leave"] if len(normal) > ms.rf else [])
        if not choices:
            return
        what = rng.choice(choices)
        spare = spares[0] if spares else None
        victim = rng.choice(normal)
        if what == "join" and spare is not None:
            req = {"change": "join", "id": spare.id, "addr": _addr(spare)}
        elif what == "replace" and spare is not None:
            w.retire(w.hosts[victim])  # its disk is gone; the operator sees it down, then acts
            await asyncio.sleep(2 * w.hosts[victim].config.failure_timeout)
            req = {"change": "replace", "id": spare.id, "addr": _addr(spare),
                   "replaces": victim}
        else:
            req = {"change": "leave", "id": victim}
        up = lambda m: w.hosts[m].node is not None and w.hosts[m].up  # noqa: E731
        claimant = w.hosts[ms.claimant(req.get("replaces") or req["id"], up)]
        node = claimant.node
        self.note(f"membership {req} via {claimant.id}")
        try:
            if node is None or not claimant.up:
                raise ConnectionError(f"claimant {claimant.id} is down")
            got = await asyncio.wait_for(claimant.call(lambda: node.changes.change(req)), 10.0)
        except Exception as exc:  # noqa: BLE001 - refused, or lost on the way
            self.note(f"membership change failed: {exc!r}")
            new = await self.made(req, ms, 20.0)
            if new is None:  # the cluster is unchanged
                if what == "replace":  # nobody took its place: it was not dead after all
                    w.unretire(w.hosts[victim])
                return
            self.note("the operator reads /v1/ring: the change was made")
        else:
            new = Membership.from_wire(got)
        self.note(f"membership version {new.version}: {new.moves()}")
        if what in ("join", "replace") and spare is not None:
            w.join(spare, new)

    async def made(self, req: dict[str, Any], before: Membership, wait: float
                   ) -> Membership | None:
        """The newest membership any disk holds once it shows ``req`` made (a join or a
        replace: its new member, not in ``before``, is in it; a replace: its victim is leaving
        or gone too): a change whose answer was lost (its claimant crashed after writing it, or
        the operator's command timed out while the members still agreed on it) that the
        operator, reading ``/v1/ring`` for ``wait`` seconds, finds made. None if it is not by
        then, and for a decommission (the member leaves by itself)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        joiner, victim = req.get("id", ""), req.get("replaces")
        while req["change"] in ("join", "replace") and before.get(joiner) is None:
            rings = [h.disk.ring for h in self.world.hosts.values() if h.disk.ring is not None]
            newest = max(rings, key=lambda m: m.version, default=None)
            gone = victim is None or (newest is not None and (
                (m := newest.get(victim)) is None or m.state in (LEAVING, LEFT)))
            if newest is not None and newest.get(joiner) is not None and gone:
                return newest
            if loop.time() >= deadline:
                break
            await asyncio.sleep(1.0)
        return None

    async def crash(self, host: Host) -> str:
        """Crash ``host`` now, or (half the time) right after its next log append is queued
        and before its fsync (between an apply and its replication, say): the unsynced tail
        is then lost, torn or corrupt (``World._tear``). Waits at most 2 s for that append."""
        node = host.node
        if node is None or not self.mid_write or self.rng.random() < 0.5:
            self.world.crash(host)
            return ""
        log = cast(SimLog, node.log)
        log.on_write = lambda: self.world.crash(host) if host.node is node else None
        for _ in range(200):
            await asyncio.sleep(0.01)
            if host.node is not node:
                return " (mid-write)"
        log.on_write = None
        self.world.crash(host)
        return ""

    def cut(self, how: str, ids: list[str]) -> set[tuple[str, str]]:
        rng = self.rng
        if how == "isolate":
            one = rng.choice(ids)
            return {(a, b) for a in ids for b in ids if a != b and one in (a, b)}
        side = set(rng.sample(ids, rng.randint(1, len(ids) - 1)))
        pairs = {(a, b) for a in side for b in ids if b not in side}
        if how == "halves":
            return pairs | {(b, a) for a, b in pairs}
        return pairs  # one way: side's frames to the others vanish, the others' still arrive


def _addr(host: Host) -> str:
    return "{}:{}".format(*host.config.listen)


async def _until_ready(world: World, limit: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while loop.time() < deadline:
        nodes = world.live_nodes()
        if len(nodes) == len(world.ids) and all(n.ready for n in nodes):
            return
        await asyncio.sleep(0.1)


async def _quiet(world: World, least: float, limit: float) -> None:
    """Calm for ``least`` seconds, then until every node is ready with nothing in doubt."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(least)
    deadline = loop.time() + limit
    while loop.time() < deadline:
        nodes = world.live_nodes()
        if (len(nodes) == len(world.ids) and all(n.ready and not n.pending for n in nodes)
                and not any(n.membership.moving for n in nodes)
                and len({n.membership.version for n in nodes}) == 1
                and set(world.ids) == set(nodes[0].membership.reachable)):  # departed: gone
            return
        await asyncio.sleep(0.5)


async def _main(opts: Options, world: World, history: History, nemesis: _Nemesis) -> None:
    skew = random.Random(f"{opts.seed}:skew")
    for host in [world.hosts[nid] for nid in world.ids]:  # the spares wait for a join
        if "skew" in opts.faults:  # each machine's wall clock off by up to 0.3 max_clock_skew
            # and drifting up to 1 ms a second: two nodes stay within max_clock_skew of each
            # other for 150 virtual seconds (the guarantee's assumption)
            host.skew = skew.uniform(-0.3, 0.3) * host.config.max_clock_skew
            host.drift = skew.uniform(-0.001, 0.001)
        world.boot(host)
    await _until_ready(world, 30.0)
    if opts.ttl:
        await _set_ttl(world, TTL_TABLE, opts.ttl, 30.0)
    net = world.net
    net.faults = Faults(drop=0.02 if "drop" in opts.faults else 0.0,
                        duplicate=0.02 if "duplicate" in opts.faults else 0.0,
                        delay=0.05 if "delay" in opts.faults else 0.0)
    work = _workload(opts)
    chaos = asyncio.ensure_future(nemesis.run())
    await asyncio.gather(*client_tasks(world, work, opts.seed, history))
    nemesis.stopping = True
    await chaos
    net.faults = Faults()
    world.heal()
    nemesis.note("heal all")
    await _quiet(world, opts.quiet, 120.0)
    await final_reads(world, work, history)
    await _shed(world, 60.0)


def _workload(opts: Options) -> Workload:
    share = opts.shares()
    return Workload(clients=opts.clients, ops=opts.ops, keys=opts.keys,
                    read_ratio=share["read"], delete_ratio=share["delete"],
                    multiget_ratio=share["multiget"], scan_ratio=share["scan"],
                    hedge_ratio=share["hedge"], ttl=opts.ttl)


async def _set_ttl(world: World, table: str, ttl: float, limit: float) -> None:
    """``PUT /v1/tables/{table}`` as an operator would, before any write: asked of a member
    (which hands it to the membership's claimant), then until every member has installed it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    asked = False
    while loop.time() < deadline:
        nodes = world.live_nodes()
        if all(n.state.tables.get(table) is not None for n in nodes) and nodes:
            return
        if not asked and nodes:
            try:
                first = nodes[0]
                change = functools.partial(first.changes.change,
                                           {"change": "table", "name": table, "ttl_s": ttl})
                await asyncio.wait_for(world.hosts[first.id].call(change), 10.0)
                asked = True
            except Exception:  # noqa: BLE001 - nothing changed: ask again
                pass
        await asyncio.sleep(0.1)
    world.errors.append(f"the ttl of table {table} did not reach every member in {limit} s")


def margins(world: World, virtual: float) -> tuple[float, float]:
    """For the checker's expiry rules: (margin, in_flight). margin: how far the clock of the
    node judging a key expired and the clock that stamped its last change can be from each
    other, and from virtual time: the nodes' max_clock_skew plus the largest offset any
    machine's clock reached in the run. in_flight: how long after its invocation an add not
    acknowledged can still be applied: its window (births are checked against it) plus that
    margin."""
    config = next(iter(world.hosts.values())).config
    offset = max((max(h.worst, abs(h.skew)) + abs(h.drift) * virtual
                  for h in world.hosts.values()), default=0.0)
    margin = config.max_clock_skew + offset
    return margin, config.window + margin


def _foreign(node: Node) -> int:
    """Keys ``node`` holds and does not replicate."""
    shards, prefs = node.state.shards, node.ring.preference_list
    return sum(node.id not in prefs(t, k) for t in shards.tables() for k in shards.keys_of(t))


async def _shed(world: World, limit: float) -> None:
    """Every key ends on exactly RF replicas: the members that lost keys to a move drop them
    (``cluster.roles.shed``) within ``limit`` seconds of the final reads."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while (held := {n.id: c for n in world.live_nodes() if (c := _foreign(n))}):
        if loop.time() > deadline:
            world.errors.append(f"keys held by members that do not replicate them: {held}")
            return
        await asyncio.sleep(1.0)


def _floor(origin: str) -> bool:
    return origin.startswith(FLOOR) and origin != LAST


@contextlib.contextmanager
def _broken(breaks: tuple[str, ...]) -> Iterator[None]:
    """``hide``: unpublished deltas become visible at once (``ShardStore.hide`` a no-op, and
    ``apply_hidden`` a plain ``apply_local``, also in its batch form's Python method).
    ``floors``: the floor pairs of deletes (origins ``~<origin>``) reach a replica only in the
    delete's own REPLICATE frame: read repair, anti-entropy, a move's hand-off and the other
    REPAIRs (``Replica.on_repair``) and hinted handoff (``Replica.shareable``) drop them. A
    replica that missed the delete keeps the pairs it removed, and shows them again.
    ``wake``: a leader woken from a freeze acts on what it believed before it: ``Node.lead``
    does not look at its failure detector first (it takes every peer for live, itself for in
    the majority, and leads the requests that waited in its sockets unchecked), and
    ``Admission.before_apply`` ignores the ops' time limits (it applies an op however long it
    waited)."""
    before_apply, lead = Admission.before_apply, Node.lead
    if "wake" in breaks:
        def blind(self: Node, ops: Any, births: Any = None) -> Any:
            self.detector.check_all = lambda: None  # type: ignore[method-assign]
            self.in_minority = lambda count=1: False  # type: ignore[method-assign]
            try:
                return lead(self, ops, births)
            finally:
                del self.detector.check_all
                del self.in_minority

        Node.lead = blind  # type: ignore[method-assign]
        Admission.before_apply = (  # type: ignore[method-assign]
            lambda self, ops, limits=None: before_apply(self, ops, None))
    names = ("hide", "apply_hidden", "apply_hidden_items")
    saved = [ShardStore.__dict__[name] for name in names]
    replica = [(name, Replica.__dict__[name]) for name in ("on_repair", "shareable")]
    if "hide" in breaks:
        ShardStore.hide = lambda self, table, key, origin, delta: None  # type: ignore[method-assign]
        ShardStore.apply_hidden = ShardStore.apply_local  # type: ignore[method-assign]
        ShardStore.apply_hidden_items = store_kernel.PYTHON[  # type: ignore[method-assign]
            "apply_hidden_items"]
    if "floors" in breaks:
        on_repair, shareable = Replica.on_repair, Replica.shareable

        def repair(self: Replica, items: list[list[Any]], op_id: str = "") -> Any:
            return on_repair(self, [[t, k, {o: pn for o, pn in e.items() if not _floor(o)}]
                                    for t, k, e in items], op_id)

        def share(self: Replica, items: list[Any]) -> list[Any]:
            return shareable(self, [it for it in items if not _floor(it[3])])

        Replica.on_repair = repair  # type: ignore[method-assign]
        Replica.shareable = share  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, method in zip(names, saved, strict=True):
            setattr(ShardStore, name, method)
        for name, method in replica:
            setattr(Replica, name, method)
        Node.lead = lead  # type: ignore[method-assign]
        Admission.before_apply = before_apply  # type: ignore[method-assign]


def run_seed(opts: Options) -> Result:
    overrides: dict[str, Any] = {"dedup": "none"} if "dedup" in opts.breaks else {}
    net = SimNet(random.Random(f"{opts.seed}:net"))
    disk_rng = random.Random(f"{opts.seed}:disk") if "torn" in opts.faults else None
    spares = SPARES if "membership" in opts.faults else 0
    if opts.sweeps():
        overrides.update(SWEEP)
    world = World(opts.nodes, opts.rf, net, disk_rng=disk_rng, spares=spares, **overrides)
    history = History()
    nemesis = _Nemesis(world, random.Random(f"{opts.seed}:nemesis"), opts.faults)
    loop = SimLoop()
    started = time.perf_counter()
    errors: list[str] = []
    logging.disable(logging.CRITICAL)
    try:
        with _broken(opts.breaks):
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(asyncio.wait_for(
                    _main(opts, world, history, nemesis), 3600.0))
            except TimeoutError:
                errors.append("the run did not finish within 3600 virtual seconds")
            finally:
                virtual = loop.time()
                _shutdown(loop, world)
    finally:
        logging.disable(logging.NOTSET)
        asyncio.set_event_loop(None)
    margin, in_flight = margins(world, virtual)
    report = check(history.events, nodes=world.ids,
                   ttl={TTL_TABLE: opts.ttl} if opts.ttl else None, margin=margin,
                   in_flight=in_flight)
    return Result(opts, history.events, report, virtual, time.perf_counter() - started,
                  nemesis.trace, errors + world.errors, world)


async def _crash_all(world: World) -> None:
    for host in world.hosts.values():
        world.crash(host)


def _shutdown(loop: SimLoop, world: World) -> None:
    loop.run_until_complete(_crash_all(world))
    for _ in range(100):  # cancelled again while one swallows it (see world._reap)
        tasks = asyncio.all_tasks(loop)
        if not tasks:
            break
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.wait(tasks, timeout=0.01))
    loop.close()
