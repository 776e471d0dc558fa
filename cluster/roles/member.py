"""A cluster member: wires its roles (coordinator, leader, replica, checks, settle,
anti-entropy, reads, failure detection) around one state, one log and its peer links.

The write path, end to end (docs/architecture.md draws it):

    HTTP edge (cluster.edge.http_api) -> Node.submit -> Coordinator (FORWARD to the key's leader)
      -> Node.lead -> [cluster.roles.checks for retries] -> Leader.submit -> dedup, apply, log,
         REPLICATE -> Replica.on_replicate on the other replicas -> W durable copies -> ack

Run as ``python -m cluster.node`` (``cluster/node.py``; the CLI is ``cluster.cli``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster.core.clock import PeerClocks
from cluster.core.config import NodeConfig
from cluster.core.errors import Unavailable
from cluster.core.membership import LEFT, Membership, Placement
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import Item, ItemFields, Op
from cluster.core.paxos import majority, voters
from cluster.core.ring import RING_HASH
from cluster.core.shards import CounterEntry
from cluster.core.versions import release
from cluster.roles import antientropy, checks, deletes, membership, protocol, scans, settle
from cluster.roles.admission import any_needs_check, stale_after_ms
from cluster.roles.antientropy import Hints
from cluster.roles.claims import Claims
from cluster.roles.coordinator import Coordinator, unstamped
from cluster.roles.failure import FailureDetector
from cluster.roles.leader import Leader
from cluster.roles.quorum import next_incarnation, quorum_future
from cluster.roles.reads import on_read, read_counter, read_values
from cluster.roles.replica import Replica
from cluster.roles.state import NodeState
from cluster.transport.auth import PeerAuth, load_secret
from cluster.transport.peer import PeerLink, peer_ssl
from cluster.transport.wire import SPEAKS, Kind, Status
from cluster.wal import DurableLog, RecordKind, read_format

__all__ = ["Node", "next_incarnation", "quorum_future"]

APPLY, REPLICA = int(RecordKind.APPLY), int(RecordKind.REPLICA)
PUBLISHED, WITHDRAW = int(RecordKind.PUBLISHED), int(RecordKind.WITHDRAW)
DROP, STAGED = int(RecordKind.DROP), int(RecordKind.STAGED)
_UNAVAILABLE = int(Status.UNAVAILABLE)

log = logging.getLogger("cluster.node")


class Node:
    """One cluster member: owns the log, the peer links and the state; the HTTP layer calls it."""

    def __init__(self, config: NodeConfig, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 links: Mapping[str, PeerLink] | None = None, log: DurableLog | None = None,
                 incarnation: Callable[[], int] | None = None,
                 members: Membership | None = None,
                 dial: Callable[[str], PeerLink] | None = None,
                 keep_ring: Callable[[Membership], None] | None = None,
                 votes: membership.VoteStore | None = None) -> None:
        """``clock`` (wall) and ``monotonic`` are every clock the roles read; ``links``, ``log``
        and ``incarnation`` (the counter ``recover`` bumps) replace the TCP links, the log
        directory and the incarnation file when given (the simulator, ``cluster.sim``).
        ``members``: the membership to start from; else the data directory's ring file
        (``cluster.roles.membership``) or, for a new cluster, ``--peers`` (version 1).
        ``dial`` (a link to a new member) and ``keep_ring`` (store a membership durably)
        replace the TCP link and the ring file (the simulator), ``votes`` the acceptor state
        file (``votes.json``)."""
        self.config = config
        self.id = config.node_id
        self.clock = clock
        self.monotonic = monotonic
        data_dir = Path(config.data_dir)
        self._data_dir = data_dir if log is None else None  # None: keep_ring keeps it
        self._keep_ring = keep_ring or (lambda ms: None)
        self._incarnation = incarnation or (lambda: next_incarnation(data_dir))
        if self._data_dir is not None:  # before anything is read or written: not a newer
            read_format(self._data_dir)  # release's directory (FormatError, one line)
        self.membership = membership.initial(self._data_dir, config, members)
        self.ring: Placement = self.membership.placement()
        self.peer_versions: dict[str, int] = {}  # the ring version each peer last showed
        # the protocol range each peer last said it speaks (heartbeats; cluster.roles.protocol)
        self.peer_speaks: dict[str, tuple[int, int]] = {}
        self.installed_at = monotonic()
        self.departed = asyncio.Event()  # set once this node's state is ``left``
        if membership.departed(self.membership, self.id):  # it left while it was down
            self.departed.set()
        self.state = NodeState(config, clock=clock)
        self.state.use_tables(self.membership.tables)
        self.origin = self.id  # becomes "<id>@<incarnation>" in recover()
        self.log = log if log is not None else DurableLog(
            data_dir / "log", fsync=config.fsync, archive=config.keep_log)
        secret = load_secret(config.secret_file) if config.secret_file else None
        self.auth = PeerAuth(self.id, secret, skew=config.peer_auth_skew, clock=clock)
        self._link_ssl: Any = None  # _dial's TLS context for links to peers
        self.links: dict[str, PeerLink] = (dict(links) if links is not None
                                           else self._dial(config))
        self._dial_one = dial or self._link
        self.metrics = NodeMetrics()
        # the peers' clocks as heartbeats measure them; beyond ``max_clock_skew`` from a
        # majority, this node refuses to count (docs/node.md, "Clocks")
        self.clocks = PeerClocks(config.max_clock_skew, monotonic=monotonic)
        self.clocks.on_change = self._clock_changed
        # (table, key, origin) -> resolved when the settle pass under way for it ends
        self.settling: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        self.detector = FailureDetector(
            list(self.links), interval=config.heartbeat_interval,
            threshold=config.phi_threshold, timeout=config.failure_timeout, clock=monotonic)
        self.detector.on_change = self._peer_changed
        # Every member counts as live until heartbeats run (the server starts them): a guess
        # from one failed connection would move a key's leader for no good reason.
        self.is_live: Callable[[str], bool] = lambda _node: True
        self.ready = False  # set once in-doubt ops are settled and dedup state pulled
        self.checked = checks.Checked(config.window, clock)
        # Ops claimed here for a node checking them (or by this node's own check)
        self.claims = Claims(monotonic)
        self.hints = Hints(config.max_hints)
        self._degraded_until = 0.0  # a restart sets it (recover), so does a peer gone silent
        self._silent: set[str] = set()
        self._bg: set[asyncio.Task[Any]] = set()
        self.leader = Leader(
            config, self.ring, self.state, self.log, self.links, self.metrics, self.claims,
            self.hints, clock=clock, monotonic=monotonic, spawn=self.spawn,
            settle_key=lambda t, k, o: settle.settle_key(self, t, k, o),
            settle_one=lambda item: settle.settle_one(self, item),
            release_claims=lambda t, k, op_id: checks.release_claims(self, t, k, op_id),
            confirm=lambda ops: checks.confirm_duplicates(self, ops))
        self.replica = Replica(self.state, self.log, self.claims, self.metrics, clock=clock)
        self.coordinator = Coordinator(self.id, config, self.ring, self.links, self.metrics,
                                       lead=self.lead, is_live=lambda: self.is_live,
                                       clock=clock, lead_deletes=self.lead_deletes)
        self.changes = membership.Changes(
            self, votes if votes is not None else membership.VoteStore(self._data_dir))
        self.metrics.ring_version = self.membership.version
        protocol.adopt(self, self.membership.protocol, self._data_dir)

    def _dial(self, config: NodeConfig) -> dict[str, PeerLink]:
        """One TCP ``PeerLink`` per member holding keys (the production transport)."""
        self._link_ssl = peer_ssl(config)
        return {pid: self._link(pid) for pid in self.membership.reachable if pid != self.id}

    def _link(self, pid: str) -> PeerLink:
        config = self.config
        via = {v[0]: (v[1], v[2]) for v in config.connect_via}
        member = self.membership.get(pid)
        assert member is not None
        host, port = via.get(pid, (member.host, member.port))
        return PeerLink(self.id, pid, host, port, connect_timeout=config.peer_connect_timeout,
                        max_inflight_frames=config.max_inflight_frames, auth=self.auth,
                        ssl_context=self._link_ssl)

    # -- membership ------------------------------------------------------------------------

    def install(self, ms: Membership) -> bool:
        """Take a newer membership: write it durably, place keys by it, link to new members
        and drop departed ones. False (nothing done) when it is not newer."""
        current = self.membership
        if ms.version <= current.version:
            if ms.version == current.version and ms != current:
                self.metrics.ring_conflicts += 1
                log.error("two memberships with version %d: keeping ours", ms.version)
            return False
        if ms.protocol != current.protocol:  # the FORMAT file before the ring that needs it
            protocol.adopt(self, ms.protocol, self._data_dir)
            log.info("protocol %d finalized: frames and new files are written in it",
                     ms.protocol)
        if self._data_dir is not None:
            membership.save_ring(self._data_dir, ms)
        self._keep_ring(ms)
        self.membership = ms
        self.installed_at = self.monotonic()
        self.state.use_tables(ms.tables)
        if _placed(ms) != _placed(current):  # a version of table settings alone moves nothing
            self.use_placement(ms.placement())
        for m in ms.members:
            if m.id == self.id:
                continue
            if m.state != LEFT and m.id not in self.links:
                link = self.links[m.id] = self._dial_one(m.id)
                link.form = ms.protocol
                link.connect_soon()
                self.detector.add(m.id)
            elif m.state == LEFT and m.id in self.links:
                self.spawn(self.links.pop(m.id).stop())
                self.detector.remove(m.id)
                self.hints.queues.pop(m.id, None)  # its ranges moved: anti-entropy has them
        self.metrics.ring_version = ms.version
        log.info("membership version %d installed", ms.version, extra={"fields": {
            "version": ms.version, "moves": ms.moves()}})
        if membership.departed(ms, self.id):
            self.departed.set()
        return True

    def use_placement(self, placement: Placement) -> None:
        """Place keys by ``placement`` from now on. When leaders change (a move finished or was
        aborted), every op is checked on the replicas for one window: a key's previous leader
        may have applied a copy the new one has not seen."""
        before = self.ring
        self.ring = self.leader.ring = self.coordinator.ring = placement
        self.leader.use_ring(placement)
        if before.members != placement.members:
            self._degraded_until = self.monotonic() + self.config.window

    def saw_ring(self, peer: str, version: Any) -> None:
        """A peer showed its ring version (heartbeats): pull its ring when newer."""
        if type(version) is not int:
            return
        self.peer_versions[peer] = version
        if version > self.membership.version:
            self.spawn(membership.pull(self, peer))

    def behind_ring(self, peer: str) -> bool:
        """``peer`` still showed an older ring than ours a failure timeout after we installed
        ours (it is cut off from whoever has it): its writes may miss a new replica. Within
        that grace (a push or a heartbeat brings it the new version) its writes count: a move
        lasts two failure timeouts longer than the window for them."""
        version = self.membership.version
        return (self.peer_versions.get(peer, version) < version
                and self.monotonic() - self.installed_at > self.config.failure_timeout)

    def move_hold(self) -> float:
        """How long a move lasts at least: the longest dedup window, the clock skew allowed,
        and two failure timeouts (a peer behind on the ring learns it within one)."""
        windows = [d.window for d in self.state.dedups.values()]
        return (max([self.config.window, *windows]) + self.config.max_clock_skew
                + 2 * self.config.failure_timeout)

    @property
    def pending(self) -> dict[str, ItemFields]:
        """In-doubt ops: applied here as leader, not known to be on a quorum (op id -> item)."""
        return self.state.pending

    @property
    def inflight(self) -> dict[str, asyncio.Future[bool]]:
        """Quorum waits under way (op id -> its outcome), the leader's."""
        return self.leader._inflight

    # The roles' entry points other parts of the node call (checks, settle, anti-entropy).
    @property
    def leases(self) -> dict[str, float]:
        return self.leader.leases

    @property
    def behind(self) -> set[str]:
        return self.leader.behind

    def targets_of(self, table: str, key: str) -> tuple[str, ...]:
        return self.leader.targets_of(table, key)

    def lead_plain(self, ops: Sequence[Op], limits: list[float] | None = None
                   ) -> asyncio.Future[list[int]]:
        return self.leader.submit(ops, limits)

    def release(self, op_ids: Iterable[str]) -> None:
        self.leader.release(op_ids)

    def replicate(self, targets: tuple[str, ...], items: list[ItemFields]
                  ) -> asyncio.Future[bool]:
        return self.leader.replicate(targets, items)

    def learn(self, table: str, key: str, op_id: str, entry: CounterEntry
              ) -> asyncio.Future[None]:
        return self.replica.learn(table, key, op_id, entry)

    def on_repair(self, items: list[list[Any]], op_id: str = "") -> asyncio.Future[None]:
        return self.replica.on_repair(items, op_id)

    def shareable(self, items: list[ItemFields]) -> list[ItemFields]:
        return self.replica.shareable(items)

    async def submit(self, ops: Sequence[Op], births: Sequence[float] | None = None
                     ) -> list[int]:
        """Route every op to its leader (one FORWARD frame per leader); statuses in op order.
        ``births``: when the client first sent each op (wall clock; now when not given)."""
        if self.refuses_clock(len(ops)):  # its births would be stamped by a wrong clock
            return [_UNAVAILABLE] * len(ops)
        return await self.coordinator.submit(ops, births)

    def use_detector(self) -> None:
        self.is_live = self.detector.is_live

    def recently_degraded(self) -> bool:
        """A peer was down (or this node restarted) within the window: another leader may
        have applied ops this one never saw, so non-primary leads are checked on the replicas."""
        return self.monotonic() < self._degraded_until

    def _peer_changed(self, peer: str, live: bool) -> None:
        # A peer that said it is recovering was not leading: no reason to check ops. One that
        # stopped leading because its clock is off may have led our keys until then: as if cut
        # off. So may one never heard from: it may be up and leading, only unreachable from
        # here (a one-way cut), and a first attempt sent to both would count twice unchecked.
        d = self.detector.peers[peer]
        silent = not live and (not d.heard or d.ready or peer in self.clocks.skewed())
        if silent or live and peer in self._silent:
            self._degraded_until = self.monotonic() + self.config.window
        if live:
            self._silent.discard(peer)
            self.spawn(self._caught_up(peer))
        elif silent:
            self._silent.add(peer)

    async def _caught_up(self, peer: str) -> None:
        await self.hints.deliver(self, peer)
        await antientropy.sync_all(self, [peer])

    def _clock_changed(self, refusing: bool) -> None:
        self.metrics.clock_skew_episodes += refusing
        if refusing:
            log.warning("clock off from a majority of the peers: refusing to count",
                        extra={"fields": {"node": self.id, "tolerance_s": self.clocks.tolerance,
                                          "peer_offsets_s": self.clocks.offsets()}})
        else:
            log.warning("clock back within the tolerance of a majority: counting again",
                        extra={"fields": {"node": self.id,
                                          "peer_offsets_s": self.clocks.offsets()}})

    def in_minority(self, count: int = 1) -> bool:
        """True (and ``count`` refusals counted) while this node hears from no majority of the
        membership's voters, itself counted. The other side may then agree on a new version
        and move keys away; writes acknowledged here, at the old version, would miss the move
        (a 2 | 3 cut of 5 nodes lost acknowledged adds and counted others twice). Memberships
        are agreed by a majority, so exactly one side of any cut may go on."""
        who = voters(self.membership)
        if len(who) > 1:
            live = self.is_live
            heard = sum(1 for v in who if v == self.id or live(v))
            if heard < majority(len(who)):
                self.metrics.minority_refusals += count
                return True
        return False

    def refuses_clock(self, count: int = 1) -> bool:
        """True (and ``count`` refusals counted) while this node's clock disagrees with a
        majority of its peers': an op judged by a wrong clock could be counted twice."""
        clocks = self.clocks
        if clocks.watch(self.clock(), self.monotonic()):
            log.warning("this node's wall clock stepped: it counts again once a peer's clock "
                        "says where it stands")
        if clocks.refusing:
            self.metrics.clock_skew_refusals += count
            return True
        return False

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- lifecycle -------------------------------------------------------------------------

    async def recover(self) -> int:
        """Open the log, load the snapshot, replay the log; returns the records replayed.

        Each start is a new incarnation with its own origin id (``n1@7``), so this node never
        raises a pair that peers may know a higher value of: a record replicated but lost from
        our own log tail in a crash cannot collide with what we apply after the restart.
        A member admitted by a join carries the version that admitted it (``n4@12.1``): an
        id that left and comes back, even on an empty disk, never reuses an origin.
        """
        # the log first: a segment or snapshot of a newer format refuses the start before the
        # incarnation or the ring file is written (nothing in the directory changes)
        await self.log.start()
        incarnation = self._incarnation()
        if incarnation == 1 and self._data_dir is not None and self.links:
            # an empty data dir: a new cluster, or this node lost its disk and the peers
            # still hold pairs of its past lives (never reuse one)
            seen = await membership.last_incarnation(
                self, self.config.peer_connect_timeout + self.config.quorum_timeout)
            if seen >= incarnation:
                incarnation = next_incarnation(self._data_dir, at_least=seen + 1)
                log.warning("empty data dir, but the peers hold pairs of %s@%d: starting as "
                            "incarnation %d", self.id, seen, incarnation)
        me = self.membership.get(self.id)
        since = me.since if me is not None else 1
        life = f"{since}.{incarnation}" if since > 1 else str(incarnation)
        self.origin = f"{self.id}@{life}"
        self.state.set_origin(self.origin)
        if self._data_dir is not None:
            membership.persist(self._data_dir, self.membership)
        blob = self.log.load_snapshot()
        if blob is not None:
            self.state.load_blob(blob)
        count = 0
        newest = 0.0
        replay, pending = self.state.replay, dict(self.state.pending)
        with self.state.shards.loading():  # digests: one whole pass after, in steps
            for rec in self.log.replay():
                kind = rec.kind
                if kind in (APPLY, REPLICA, WITHDRAW, STAGED):
                    # a compensation is no change of the key's (no LAST raised: it is not live);
                    # a staged copy stays hidden until a visible pair covers it
                    replay(rec.op_id if kind != WITHDRAW else "", rec.table, rec.key,
                           rec.origin, rec.p, rec.n, rec.ts, rec.delta, staged=kind == STAGED)
                    count += 1
                    if rec.ts > newest:
                        newest = rec.ts
                if kind == APPLY:  # the item it logged (the other way round from record_fields)
                    pending[rec.op_id] = Item(rec.op_id, rec.table, rec.key, rec.origin, rec.p,
                                              rec.n, rec.delta, rec.ts)
                elif kind == DROP and rec.table:
                    self.state.shards.drop(rec.table, (rec.key,))
                elif kind == DROP:  # no key: since when keys wait for their hand-off
                    self.state.foreign_since = rec.ts or None
                elif kind in (PUBLISHED, WITHDRAW):
                    pending.pop(rec.op_id, None)
                    if kind == WITHDRAW:
                        self.state.withdrawn[rec.op_id] = rec.ts
            self.state.set_pending(list(pending.values()))  # unpublished: hidden until settled
        self.metrics.replayed = count
        away = self.clock() - newest
        if count and away > self.config.tombstone_grace:
            log.warning("this node's newest record is %.0f s old, more than tombstone_grace "
                        "(%g s): its replicas may have collected deletes it never saw, which "
                        "its copies would bring back. Unless the whole cluster was stopped, "
                        "start it on an empty data dir with --replace %s (docs/deletes.md)",
                        away, self.config.tombstone_grace, self.id,
                        extra={"fields": {"away_s": round(away), "grace_s":
                                          self.config.tombstone_grace}})
        if count or blob is not None:  # a restart: others may have led our keys meanwhile
            self._degraded_until = self.monotonic() + self.config.window
        if incarnation > 1:  # the claims given before the crash are gone (claims.Claims)
            life = max([self.config.window, *(d.window for d in self.state.dedups.values())])
            self.claims.forget(life, self.clock() + self.config.max_clock_skew)
        return count

    async def prepare(self) -> None:
        """Before serving: pull the replicas' dedup state and entries, settle in-doubt ops."""
        await antientropy.pull_dedup(self)
        await antientropy.sync_all(self, list(self.links))
        await settle.settle_all(self)

    async def close(self) -> None:
        for task in list(self._bg):
            task.cancel()
        for link in list(self.links.values()):
            await link.stop()
        await self.log.stop()

    def abort(self) -> None:
        for task in list(self._bg):
            task.cancel()
        for link in self.links.values():
            link.abort()
        self.log.abort()

    def health(self) -> dict[str, Any]:
        state = self.state
        return {
            "node": self.id,
            "origin": self.origin,
            "status": "ok" if self.ready else "recovering",
            "members": list(self.ring.members),
            "rf": self.ring.rf,
            "write_quorum": self.config.quorum,
            "window_s": min([d.window for d in state.dedups.values() if d.window > 0]
                            or [self.config.window]),
            "dedup": {"default": self.config.dedup, **dict(self.config.dedup_tables)},
            "tables": {t: {"strategy": d.name, "window_s": d.window,
                           "estimated_fpp": d.estimated_fpp()}
                       for t, d in state.dedups.items()},
            "peers": {pid: link.connected for pid, link in self.links.items()},
            "addresses": {m.id: m.addr for m in self.membership.members if m.state != LEFT},
            "left": {m.id: m.addr for m in self.membership.members if m.state == LEFT},
            "ring_version": self.membership.version,
            "ring": {"vnodes": self.ring.vnodes, "hash": RING_HASH,
                     "key": "<table>/<key>"},
            "counters": state.shards.keys,
            "max_reads": self.config.max_reads,
            "max_scan_limit": self.config.max_scan_limit,
            "tombstone_grace_s": self.config.tombstone_grace,
            "table_settings": {t: s.to_wire() for t, s in state.tables.items()},
            "live": {pid: self.is_live(pid) for pid in self.links},
            "in_doubt": len(state.pending),
            "hints": {pid: self.hints.pending(pid) for pid in self.links},
            "clock": {"refusing": self.clocks.refusing, "tolerance_s": self.clocks.tolerance,
                      "peer_offsets_s": {p: round(o, 4)
                                         for p, o in self.clocks.offsets().items()}},
            "release": release(),
            "protocol": {"speaks": list(SPEAKS), "cluster": self.membership.protocol,
                         "peers": {p: list(r) for p, r in sorted(self.peer_speaks.items())}},
        }

    def save_collected(self, table: str, high: int) -> None:
        """Before keys of ``table`` are collected: the highest count this origin's pairs of
        them reached (``cluster.roles.expiry``). Kept in memory only: a restarted node raises
        a new origin (``<id>@<incarnation>``), of which no replica holds an old pair."""
        self.state.collected[table] = max(high, self.state.collected.get(table, 0))

    # -- leading -----------------------------------------------------------------------

    def lead(self, ops: Sequence[Op], births: Sequence[float] | None = None
             ) -> asyncio.Future[list[int]]:
        """Lead ``ops``; merged with every other batch led in this loop turn. Statuses in order.
        Retries, and every op while a peer was recently down, are first checked on the replicas
        (``cluster.roles.checks``); a node still recovering leads nothing."""
        if self.is_live == self.detector.is_live:
            self.detector.check_all()  # after a pause, see the silence before leading anything
        if not self.ready or self.refuses_clock(len(ops)) or self.in_minority(len(ops)):
            done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            done.set_result([_UNAVAILABLE] * len(ops))
            return done
        if self.state.ttl_tables and any(deletes.expire_ops(self, ops)):
            return asyncio.ensure_future(self._lead_expired(ops, births))
        return self._lead_checked(ops, births)

    def _lead_checked(self, ops: Sequence[Op], births: Sequence[float] | None
                      ) -> asyncio.Future[list[int]]:
        degraded = self.recently_degraded()
        suspected = self.state.suspected if self.state.pulled else None
        if any_needs_check(ops, degraded, suspected):
            return asyncio.ensure_future(checks.lead_checked(self, list(ops), births))
        return self.leader.submit(
            ops, None if births is None else checks.birth_limits(self, ops, births))

    async def _lead_expired(self, ops: Sequence[Op], births: Sequence[float] | None
                            ) -> list[int]:
        """Ops on keys that expired here: each key is deleted by time first, so the op
        starts its counter from 0 (``cluster.roles.deletes.expire_first``)."""
        if not await deletes.expire_first(self, ops):
            return [_UNAVAILABLE] * len(ops)
        return await self._lead_checked(ops, births)

    def lead_deletes(self, ops: Sequence[Op], births: Sequence[float] | None = None
                     ) -> asyncio.Future[list[int]]:
        """Lead deletes (``cluster.roles.deletes``); a node still recovering leads none. As
        adds are: retries, stale copies and every delete while a peer was recently down are
        first checked on the replicas, and none applies past its time limit."""
        if self.is_live == self.detector.is_live:
            self.detector.check_all()  # after a pause, see the silence before leading anything
        if not self.ready or self.refuses_clock(len(ops)) or self.in_minority(len(ops)):
            done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
            done.set_result([_UNAVAILABLE] * len(ops))
            return done
        lead = functools.partial(deletes.lead_deletes, self)
        degraded = self.recently_degraded()
        suspected = self.state.suspected if self.state.pulled else None
        if any_needs_check(ops, degraded, suspected):
            return asyncio.ensure_future(checks.lead_checked(self, list(ops), births, lead))
        return asyncio.ensure_future(
            lead(ops, None if births is None else checks.birth_limits(self, ops, births)))

    async def delete(self, ops: Sequence[Op], births: Sequence[float] | None = None
                     ) -> list[int]:
        """Route deletes to their leaders (the edge's entry, as ``submit`` is for adds)."""
        return await self.coordinator.submit_deletes(ops, births)

    def handle_peer(self, peer_id: str, kind: int, body: Any) -> Any:
        """Dispatch one inbound peer frame (the ``PeerProtocol`` handler)."""
        if kind == Kind.REPLICATE:
            if self.behind_ring(peer_id):  # its write sets may miss a member gaining the key
                self.metrics.stale_ring_refusals += len(body)
                return False
            return self.replica.on_replicate(body)  # None once durable, False if refused
        if kind == Kind.STAGE:  # a leader's new op, hidden here until published (W > 2)
            if self.behind_ring(peer_id):
                self.metrics.stale_ring_refusals += len(body)
                return False
            return self.replica.on_stage(body)
        if kind == Kind.FORWARD:
            if self.behind_ring(peer_id):  # routed by an old ring: the client retries
                self.metrics.stale_ring_refusals += len(body)
                return [_UNAVAILABLE] * len(body)
            return self.lead(*unstamped(body, stale_after_ms(self.config), self.clock()))
        if kind == Kind.DELETE:
            if self.behind_ring(peer_id):  # routed by an old ring: the client retries
                self.metrics.stale_ring_refusals += len(body)
                return [_UNAVAILABLE] * len(body)
            return self.lead_deletes(*unstamped(body, stale_after_ms(self.config),
                                                self.clock()))
        if kind == Kind.SCAN:
            return [scans.on_scan(self, b) for b in body]
        if kind == Kind.READ:
            return on_read(self, body)
        if kind == Kind.REPAIR:
            return self.on_repair(body)
        if kind == Kind.PING:
            link = self.links.get(peer_id)
            if link is not None and not link.connected:
                link.forget_failure()  # it reached us: the way back is worth trying at once
            if body and isinstance(body[-1], dict):
                self.saw_ring(peer_id, body[-1].get("ring"))
                protocol.saw(self, peer_id, body[-1].get("speaks"))
            # a node refusing for its clock says so: its peers take it as down and lead its keys
            return [{"ready": self.ready, "t": self.clock(), "ring": self.membership.version,
                     "clock_skew": self.clocks.refusing, "speaks": list(SPEAKS)}] * len(body)
        if kind == Kind.RING:
            return self.changes.on_ring(peer_id, body)
        if kind == Kind.HOLDS:
            if self.clocks.refusing:  # no claim, no "not held" judged on a wrong clock
                return self._holds_refused(body, peer_id)
            return checks.on_holds(self, body, peer_id)
        if kind == Kind.DIGEST:
            return antientropy.on_digest(self, peer_id, body[0] if body else {})
        if kind == Kind.ENTRIES:
            return antientropy.on_entries(self, peer_id, body)
        if kind == Kind.DEDUP:
            return [antientropy.on_dedup(self, b) for b in body]
        raise ValueError(f"unknown peer frame kind {kind}")

    def _holds_refused(self, body: list[list[Any]], peer_id: str) -> list[list[Any]]:
        """HOLDS while refusing for the clock: FORGOT (which checks and settles count as no
        answer) to queries and claims; a release still frees the asker's claim."""
        out = []
        for item in body:
            if len(item) > 3 and item[3] == checks.RELEASE:
                out.extend(checks.on_holds(self, [item], peer_id))
            else:
                entry = self.state.shards.entry(item[0], item[1]).to_wire()
                out.append([checks.FORGOT, False, entry])
        return out

    # -- reads -----------------------------------------------------------------------------

    def refuse_minority_read(self, consistency: str) -> None:
        """A read above ``one`` promises every write acknowledged before it: not from a node
        that hears from no majority of the voters (the other side may have moved the key's
        replicas and acknowledged writes there): 503."""
        if consistency != "one" and self.in_minority():
            raise Unavailable("this node hears from no majority of the members, which may be "
                              f"changing the membership: a {consistency} read here could miss "
                              "acknowledged writes. Read at another node, or with "
                              "consistency=one")

    async def read(self, table: str, key: str, consistency: str) -> int:
        """Merge the entries of ``consistency`` many replicas; repair the stale ones seen."""
        self.metrics.reads += 1
        self.refuse_minority_read(consistency)
        return await read_counter(self, table, key, consistency)

    async def read_many(self, reads: Sequence[tuple[str, str]], consistency: str) -> list[int]:
        """``read`` of many counters: one READ frame per replica of each replica set."""
        self.metrics.reads += len(reads)
        self.refuse_minority_read(consistency)
        return await read_values(self, reads, consistency)


def _placed(ms: Membership) -> tuple[Any, ...]:
    """What a membership's placement of keys is built from."""
    return ms.members, ms.rf, ms.vnodes, ms.reads_new

