"""Elastic membership, the node's part: the ring file, RING frames, the agreement on each
version (single-decree Paxos, ``cluster.core.paxos``), the driver that finishes a move, and
what a joining or departing node does.

Agreement (docs/membership.md): a change is proposed by the *claimant* (the lowest normal id;
``Membership.claimant``; any member forwards to it while it is live, and proposes itself when
it is not). Version v + 1 is one Paxos instance among the voters of version v (normal and
leaving members): prepare / promise, then accept / accepted, each acceptor writing its promise
or acceptance durably (``votes.json``) before it answers. Only a value chosen by a majority is
installed, pushed to every member and answered; a proposer that finds no majority answers
``NoMajority`` and installs nothing. A member installs a version only if it is newer than its
own (every installed version was chosen), writes it durably first, and carries its version in
every heartbeat both ways, so one that missed a push pulls the ring from the first peer that
shows a newer one. Writes from a peer known to be behind are refused (``Node.behind_ring``);
the sender learns the ring at its next heartbeat and the op is retried with the same id.

RING frame items (peer traffic: signed like REPLICATE, so a client cannot change membership):

    {"op": "get"}                                   -> the membership (``to_wire``)
    {"op": "install", "ring": {...}}                -> this node's version after
    {"op": "change", "change": "join"|"leave"|"replace"|"table", "id", "addr"?,
     "replaces"?}                                   -> the membership after the change
    {"op": "prepare", "version": v, "ballot": [round, id]}
                                                    -> a promise (``Promise.to_wire``), or
                                                       {"installed": ring} when this node
                                                       holds version v or newer already
    {"op": "accept", "version": v, "ballot": [round, id], "value": ring}
                                                    -> {"ok": bool, "promised": [round, id]}
                                                       or {"installed": ring}
    {"op": "sync", "version": v}                    -> True once this node has exchanged
                                                       entries with every live member
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cluster.core.config import NodeConfig, parse_hostport
from cluster.core.errors import ConfigError, Departed
from cluster.core.membership import LEFT, Membership, MembershipError
from cluster.core.paxos import (
    NoMajority,
    Promise,
    Proposal,
    Slot,
    ballot_of,
    majority,
    next_ballot,
    voters,
)
from cluster.core.tables import TableError, TableSettings
from cluster.core.versions import FormatError, speaks
from cluster.roles import antientropy, protocol, settle
from cluster.transport.peer import PeerLink
from cluster.transport.wire import Kind
from cluster.wal.files import write_durably

log = logging.getLogger("cluster.membership")

RING_FILE = "ring.json"


class Node(Protocol):
    id: str
    membership: Membership
    links: dict[str, PeerLink]
    clock: Callable[[], float]
    config: Any
    state: Any
    hints: Any
    ready: bool
    departed: asyncio.Event
    metrics: Any
    peer_speaks: dict[str, tuple[int, int]]
    log: Any

    def install(self, ms: Membership) -> bool: ...

    def saw_ring(self, peer: str, version: Any) -> None: ...

    def is_live(self, node: str) -> bool: ...

    def move_hold(self) -> float: ...


# -- the ring file -------------------------------------------------------------------------

def load_ring(data_dir: Path) -> Membership | None:
    """The membership saved in ``data_dir``; None when there is none (or no directory to
    hold one: the node's recovery says what is wrong with it)."""
    path = data_dir / RING_FILE
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return Membership.from_wire(json.loads(text))
    except FormatError:
        raise
    except (ValueError, MembershipError) as exc:
        raise ConfigError(f"data_dir: {path} is not a membership ({exc}); restore it from "
                          f"another member's /v1/ring or move it away to rejoin") from exc


def save_ring(data_dir: Path, ms: Membership) -> None:
    """Write the ring durably (temp file, fsync, rename, fsync of the directory)."""
    write_durably(data_dir / RING_FILE, json.dumps(ms.to_wire(), sort_keys=True) + "\n")


def initial(data_dir: Path | None, config: NodeConfig, given: Membership | None) -> Membership:
    """A node's membership at start: ``given`` (a join's), else the ring file once the
    membership changed (version > 1), else ``--peers`` (version 1), which stays the way to
    change a static cluster (restart every node with a new list). Written to the ring file
    at recovery (``persist``; ``data_dir`` None: kept in memory, the simulator)."""
    saved = load_ring(data_dir) if data_dir is not None else None
    if given is not None:
        return given
    boot = Membership.bootstrap(config.peers, rf=config.rf, vnodes=config.vnodes)
    if saved is not None and saved.version > 1:
        if {m.id for m in boot.members} != set(saved.reachable):
            log.warning("--peers differs from the membership this node saved (version %d): "
                        "using the saved one", saved.version)
        return saved
    return boot


def persist(data_dir: Path, ms: Membership) -> None:
    """Write ``ms`` to the ring file unless it holds it already (at recovery)."""
    try:
        same = load_ring(data_dir) == ms
    except ConfigError:
        same = False
    if not same:
        save_ring(data_dir, ms)


def view(node: Node) -> dict[str, Any]:
    """``GET /v1/ring``: the contract's shape, plus the move under way."""
    ms = node.membership
    members = [{"id": m.id, "addr": m.addr,
                "state": m.state if m.state == LEFT or m.id == node.id or node.is_live(m.id)
                else "down", "since": m.since} for m in ms.members]
    move = None
    if ms.moving:
        move = {**ms.moves(), "since": ms.moving_since, "reads": "new" if ms.reads_new
                else "old", "next_step_after": ms.moving_since + step_hold(node, ms)}
    m = node.metrics
    return {"version": ms.version, "members": members, "rf": ms.rf, "vnodes": ms.vnodes,
            "claimant": ms.claimant(), "move": move,
            "shed": {"done_version": m.shed_version, "foreign_keys": m.foreign_keys,
                     "dropped_keys": m.shed_keys}}


# -- RING frames ---------------------------------------------------------------------------

VOTES_FILE = "votes.json"


class VoteStore:
    """Where this node's acceptor states (``Slot`` by version number) are kept durably: the
    data directory's ``votes.json`` (written like the ring file: temp file, fsync, rename), or,
    with no directory (the simulator), memory that the caller keeps beside its disk."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.path = data_dir / VOTES_FILE if data_dir is not None else None
        self.slots: dict[int, Slot] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.slots = {int(v): Slot.from_wire(s) for v, s in data.items()}
            except (ValueError, AttributeError, MembershipError) as exc:
                raise ConfigError(f"data_dir: {self.path} is not an acceptor state ({exc})"
                                  ) from exc

    @classmethod
    def kept_on(cls, holder: Any) -> VoteStore:
        """The store kept as ``holder.votes``, made at first use: the simulator keeps it on a
        machine's disk, which outlives the node instances started on it."""
        store = getattr(holder, "votes", None)
        if not isinstance(store, cls):
            store = cls()
            setattr(holder, "votes", store)  # noqa: B010 - any holder
        return store

    def get(self, version: int) -> Slot:
        return self.slots.get(version, Slot())

    def put(self, version: int, slot: Slot, installed: int) -> None:
        """Keep ``slot`` for ``version`` durably (before the answer that depends on it);
        versions up to ``installed`` are decided, and forgotten."""
        if self.slots.get(version) == slot:
            return
        self.slots = {v: s for v, s in self.slots.items() if v > installed}
        self.slots[version] = slot
        if self.path is not None:
            write_durably(self.path, json.dumps(
                {str(v): s.to_wire() for v, s in self.slots.items()}, sort_keys=True) + "\n")


PROPOSE_ATTEMPTS = 4  # times a change is applied again on top of another proposer's value
AGREE_BUDGET = 4  # quorum timeouts a proposer tries to complete a version it sent accepts for


class Changes:
    """The RING frames' handler: a member's acceptor for each version, and the proposer side
    of the claimant (or of whoever issues a change): one change at a time (``lock``), agreed
    by a majority of the voters, then pushed to every member."""

    def __init__(self, node: Node, votes: VoteStore | None = None) -> None:
        self.node = node
        self.lock = asyncio.Lock()
        self.votes = votes if votes is not None else VoteStore()

    async def on_ring(self, peer: str, items: list[Any]) -> list[Any]:
        return [await self._one(peer, item) for item in items]

    async def _one(self, peer: str, item: Any) -> Any:
        node = self.node
        if not isinstance(item, dict):
            raise MembershipError("RING item must be a map")
        op = item.get("op")
        if op == "get":
            return node.membership.to_wire()
        if op == "install":
            node.install(Membership.from_wire(item.get("ring")))
            return node.membership.version
        if op in ("prepare", "accept"):
            return self.vote(peer, item)
        if op == "change":
            if item.get("change") not in ("join", "leave", "replace", "table", "protocol"):
                # finish is the driver's own, after the hold: asked for early, it would break
                # the guarantee
                raise MembershipError("a change is join, leave, replace, table or protocol; a "
                                      "move finishes by itself")
            return await self.change(item)
        if op == "sync":
            return await catch_up(node)
        if op == "incarnation":  # a node that lost its disk: the last life we saw of it
            return node.state.shards.last_incarnation(str(item.get("id", "")))
        raise MembershipError(f"unknown RING op {op!r}")

    # -- the acceptor --------------------------------------------------------------------

    def vote(self, peer: str, item: dict[str, Any]) -> dict[str, Any]:
        """Answer a prepare or an accept for one version, the new state written durably
        first. A version this node installed already was chosen: the answer is its ring."""
        node = self.node
        version, ballot = item.get("version"), ballot_of(item.get("ballot"))
        if type(version) is not int:
            raise MembershipError(f"not a version: {version!r}")
        installed = node.membership.version
        if version <= installed:
            return {"installed": node.membership.to_wire()}
        if version > installed + 1 and peer != node.id:
            node.saw_ring(peer, version - 1)  # the proposer holds a version we missed
        slot = self.votes.get(version)
        if item["op"] == "prepare":
            slot, promise = slot.prepare(ballot)
            self.votes.put(version, slot, installed)
            return promise.to_wire()
        value = item.get("value")
        Membership.from_wire(value)  # a membership, or refused before anything is kept
        slot, ok = slot.accept(ballot, value)
        self.votes.put(version, slot, installed)
        return {"ok": ok, "promised": list(slot.promised)}

    # -- the proposer --------------------------------------------------------------------

    async def change(self, req: dict[str, Any]) -> dict[str, Any]:
        """Hand ``req`` to its claimant while that one is live, else propose it here."""
        node = self.node
        if req.get("change") == "protocol":  # proposed here, by a node that speaks it (the
            return await self.apply(req)  # claimant may run an older release that does not)
        subject = str(req.get("replaces") or req.get("id") or "")
        claimant = node.membership.claimant(subject, node.is_live)
        link = node.links.get(claimant)
        if claimant != node.id and link is not None and node.is_live(claimant):
            got = (await asyncio.wait_for(link.call(Kind.RING, [{**req, "op": "change"}]),
                                          (AGREE_BUDGET + 6) * node.config.quorum_timeout))[0]
            node.install(Membership.from_wire(got))
            return got
        return await self.apply(req)

    async def apply(self, req: dict[str, Any]) -> dict[str, Any]:
        """Apply ``req`` to this node's membership, have a majority of its voters agree on
        the next version, install it and push it to every member; a request already applied
        (a joiner asking again after a lost answer) changes nothing. When another proposer's
        value took the version, ``req`` is applied again on top of it (and refused if that
        one is a move under way)."""
        node = self.node
        async with self.lock:
            if req.get("change") == "protocol":  # judged here, by what the peers speak now
                heard = await protocol.ask_speaks(node, node.config.quorum_timeout)
                req = {**req, "to": protocol.finalizable(node, req.get("protocol"), heard)}
            for _ in range(PROPOSE_ATTEMPTS):
                ms = node.membership
                new = _apply(ms, req, node.clock())
                if new is ms:
                    return ms.to_wire()
                chosen = await self.agree(ms, new)
                if chosen == new:
                    break
            else:
                raise NoMajority(f"the membership kept changing under {_describe(req)}: "
                                 f"change not made, ask again")
            log.info("membership version %d: %s", new.version, _describe(req),
                     extra={"fields": {"version": new.version, "change": req.get("change")}})
        await push(node, new)
        return new.to_wire()

    async def agree(self, base: Membership, new: Membership) -> Membership:
        """Single-decree Paxos for version ``new.version`` among the voters of ``base``: the
        chosen membership (``new``, or a value another proposer had accepted), installed
        here. ``NoMajority`` when no majority answered: at once when no value was accepted
        for the version anywhere we heard of (nothing can take effect from this attempt),
        else after trying to complete it for ``AGREE_BUDGET`` quorum timeouts."""
        node = self.node
        version, who = new.version, voters(base)
        seen = [self.votes.get(version).promised]
        qt = node.config.quorum_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AGREE_BUDGET * qt
        sent_accept = False
        attempt = 0

        def phase() -> float:  # 2 quorum timeouts, less once the budget runs out (not < qt/2)
            return max(qt / 2, min(2 * qt, deadline - loop.time()))

        while True:
            if attempt:  # a competing proposer, or a majority out of reach: the lower ids
                # retry first (no random draw: the simulator replays a seed byte for byte)
                rank = (sorted(who).index(node.id) + 1) / len(who) if node.id in who else 1.0
                await asyncio.sleep(max(0.0, min(rank * qt, deadline - loop.time())))
            attempt += 1
            prop = Proposal(next_ballot(seen, node.id), new.to_wire(), who)
            ballot = list(prop.ballot)
            answers = await self._ask(who, {"op": "prepare", "version": version,
                                            "ballot": ballot}, phase(), prop.needed)
            if (done := self._decided(answers, version)) is not None:
                return done
            promises = {voter: Promise.from_wire(a) for voter, a in answers.items()}
            for voter, promise in promises.items():
                prop.promised(voter, promise)
            seen += prop.higher()
            pending = sent_accept or any(p.value is not None for p in promises.values())
            if not prop.prepared:
                if not pending and not prop.refused_by or loop.time() >= deadline:
                    raise self._no_majority(who, answers, version, pending)
                continue
            value = prop.propose()
            sent_accept = True
            answers = await self._ask(who, {"op": "accept", "version": version,
                                            "ballot": ballot, "value": value},
                                      phase(), prop.needed)
            if (done := self._decided(answers, version)) is not None:
                return done
            for voter, a in answers.items():
                prop.accepted(voter, a.get("ok") is True, ballot_of(a.get("promised")))
            if prop.chosen:
                chosen = Membership.from_wire(value)
                node.install(chosen)
                return chosen
            seen += prop.higher()
            if loop.time() >= deadline:
                raise self._no_majority(who, answers, version, True)

    async def complete(self, ms: Membership) -> None:
        """A version this node accepted and no majority confirmed (its proposer answered "not
        confirmed"): propose it again once a majority is back, so that it takes effect now
        rather than at the next change. The move driver's, every round."""
        node = self.node
        pending = self.votes.get(ms.version + 1).value
        if pending is None or self.lock.locked() or node.membership is not ms:
            return
        who = voters(ms)
        if sum(1 for v in who if v == node.id or node.is_live(v)) < majority(len(who)):
            return  # not before a majority is back
        try:
            async with self.lock:
                if node.membership is ms:
                    chosen = await self.agree(ms, Membership.from_wire(pending))
                    log.info("membership version %d completed", chosen.version)
                    await push(node, chosen)
        except Exception as exc:  # noqa: BLE001 - next round
            log.info("version %d not completed yet: %r", ms.version + 1, exc)

    def _decided(self, answers: dict[str, Any], version: int) -> Membership | None:
        """A voter that installed ``version`` or newer answered its ring: that version was
        chosen, and this node was behind. It installs the newest such ring."""
        rings = [Membership.from_wire(a["installed"]) for a in answers.values()
                 if "installed" in a]
        rings = [r for r in rings if r.version >= version]
        if not rings:
            return None
        newest = max(rings, key=lambda r: r.version)
        self.node.install(newest)
        return newest

    def _no_majority(self, who: tuple[str, ...], answers: dict[str, Any], version: int,
                     pending: bool) -> NoMajority:
        what = ("change not confirmed (a value is accepted for this version: a majority may "
                "still complete it; ask again, or see /v1/ring)" if pending
                else "change not made")
        return NoMajority(f"no majority: {what}; {len(answers)} of the {len(who)} voters of "
                          f"version {version - 1} answered ({', '.join(sorted(answers))}), "
                          f"{majority(len(who))} needed")

    async def _ask(self, who: tuple[str, ...], item: dict[str, Any], timeout: float,
                   needed: int) -> dict[str, Any]:
        """``item`` to every voter at once (this node's own acceptor directly), sent again
        every quarter of ``timeout`` to those that did not answer (a frame lost; a duplicate
        gets the same answer): the answers by voter, once ``needed`` of them said yes, too
        many refused for that, every one answered, or ``timeout``."""
        node = self.node
        answers: dict[str, Any] = {}
        own = self.vote(node.id, item)  # a proposer that does not vote (joining) keeps its
        if node.id in who:  # ballot too: never the same one twice, across a restart
            answers[node.id] = own
        loop = asyncio.get_running_loop()
        deadline, resend = loop.time() + timeout, timeout / 4
        calls: dict[asyncio.Future[Any], str] = {}
        next_send = loop.time()
        while _yes(answers) < needed and len(answers) - _yes(answers) <= len(who) - needed:
            now = loop.time()
            if now >= deadline or len(answers) == len(who):
                break
            if now >= next_send:
                for voter in who:
                    link = node.links.get(voter)
                    if voter not in answers and link is not None:
                        calls[asyncio.ensure_future(link.call(Kind.RING, [item]))] = voter
                next_send = now + resend
            waiting = [f for f in calls if not f.done()]
            wake = min(next_send, deadline) - now
            if waiting:
                await asyncio.wait(waiting, timeout=wake, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(wake)
            for f in [f for f in calls if f.done()]:
                voter = calls.pop(f)
                if f.exception() is None and isinstance(got := f.result()[0], dict):
                    answers.setdefault(voter, got)
        for f in calls:
            f.cancel()
        return answers


def _yes(answers: dict[str, Any]) -> int:
    return sum(1 for a in answers.values() if a.get("ok") is True or "installed" in a)


def _apply(ms: Membership, req: dict[str, Any], now: float) -> Membership:
    kind, node_id = req.get("change"), str(req.get("id", ""))
    if kind in ("join", "replace"):
        _check_speaks(ms, node_id, req.get("speaks"))
    if kind == "join":
        host, port = parse_hostport(str(req.get("addr", "")), name="addr")
        return ms.join(node_id, host, port, now)
    if kind == "replace":
        host, port = parse_hostport(str(req.get("addr", "")), name="addr")
        return ms.replace(str(req.get("replaces", "")), node_id, host, port, now)
    if kind == "leave":
        return ms.leave(node_id, now)
    if kind == "finish":
        if req.get("version") != ms.version:
            raise MembershipError(f"finish of version {req.get('version')}, now {ms.version}")
        return ms.finish(now)
    if kind == "abort":
        return ms.abort()
    if kind == "table":  # a table's settings (cluster.core.tables), issued with the claimant's
        try:  # clock as their since_ms
            settings = TableSettings.from_wire({**req, "since_ms": int(now * 1000)})
        except TableError as exc:
            raise MembershipError(str(exc)) from exc
        return ms.set_table(settings)
    if kind == "protocol":  # "to": what ``protocol.finalizable`` allowed at the proposer
        return ms.set_protocol(int(req["to"]))
    raise MembershipError(f"unknown change {kind!r}")


def _check_speaks(ms: Membership, node_id: str, value: Any) -> None:
    """A node joins only if it speaks the cluster's finalized protocol (a joiner of release
    0.4.0 says nothing: protocol 1 only)."""
    try:
        lo, hi = speaks(value)
    except ValueError as exc:
        raise MembershipError(f"{node_id}: {exc}") from exc
    if not lo <= ms.protocol <= hi:
        raise MembershipError(f"{node_id} speaks protocol {lo} to {hi}; the cluster finalized "
                              f"{ms.protocol}: run a release that speaks it")


def _describe(req: dict[str, Any]) -> str:
    kind = req.get("change")
    if kind == "table":
        return f"table {req.get('name')} ttl_s={req.get('ttl_s')}"
    if kind == "protocol":
        return f"protocol {req.get('to', req.get('protocol'))} finalized"
    if kind == "replace":
        return f"{req.get('id')} replaces {req.get('replaces')}"
    return f"{kind} {req.get('id', '')}".strip()


async def push(node: Node, ms: Membership, timeout: float | None = None) -> int:
    """Send ``ms`` to every other member still holding keys; how many installed it. Those not
    reached pull it at their next heartbeat with anyone who has it."""
    return len(await _ask_all(node, {"op": "install", "ring": ms.to_wire()},
                              timeout or 2 * node.config.quorum_timeout))


async def _ask_all(node: Node, item: dict[str, Any], timeout: float,
                   probe: bool = False) -> list[Any]:
    """One RING ``item`` to every peer at once; the answers of those that answered within
    ``timeout`` (the others are given up)."""
    futs = [link.call(Kind.RING, [item], probe=probe) for link in list(node.links.values())]
    if not futs:
        return []
    done, pending = await asyncio.wait(futs, timeout=timeout)
    for f in pending:
        f.cancel()
    return [f.result()[0] for f in done if f.exception() is None]


async def pull(node: Node, peer: str) -> None:
    """Take ``peer``'s ring if it is newer (a heartbeat showed a higher version)."""
    link = node.links.get(peer)
    if link is None:
        return
    try:
        got = (await asyncio.wait_for(link.call(Kind.RING, [{"op": "get"}]),
                                      2 * node.config.quorum_timeout))[0]
        node.install(Membership.from_wire(got))
    except Exception as exc:  # noqa: BLE001 - the next heartbeat tries again
        log.debug("ring pull from %s failed: %r", peer, exc)


async def last_incarnation(node: Node, timeout: float) -> int:
    """The highest incarnation of this node's id any reachable peer holds pairs of (0: none
    answered one). A node starting on an empty disk asks, so that it never raises a pair of
    a past life again: its value is the peers' to keep, and a counter that restarted from 0
    under the same origin would lose every increment to their higher copy (max-merge)."""
    seen = await _ask_all(node, {"op": "incarnation", "id": node.id}, timeout, probe=True)
    return max([s for s in seen if type(s) is int] or [0])


async def catch_up(node: Node) -> bool:
    """Before a move finishes: settle this node's in-doubt ops, hand off its hints, and run a
    whole exchange of its own with every live member (the digests are grouped by the write
    sets, so the ranges it gains or gives are included). True when every exchange ran."""
    await settle.settle_all(node)  # type: ignore[arg-type]
    for peer in list(node.links):
        await node.hints.deliver(node, peer)
    ok = True
    for peer in list(node.links):
        if node.membership.get(peer) is None or not node.is_live(peer):
            continue
        try:  # the finish makes this node's copies the ones read
            ok = await antientropy.converge(node, peer, 20.0) and ok  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the driver asks again
            log.info("move catch-up with %s failed: %r", peer, exc)
            ok = False
    return ok


async def depart(node: Node) -> None:
    """Once the membership says this node left (a decommission finished): settle what it
    still holds in doubt, hand off its hints and swap entries once more; then its process
    stops (``NodeServer``, the simulator's world)."""
    await node.departed.wait()
    log.info("this node left the cluster: handing off, then stopping")
    try:
        await asyncio.wait_for(catch_up(node), 4 * node.config.reconcile_timeout)
    except Exception as exc:  # noqa: BLE001 - the others' anti-entropy holds every pair
        log.warning("hand-off before leaving not finished: %r", exc)


# -- the move driver (runs on every node; acts on the claimant) ---------------------------

async def move_loop(node: Node, changes: Changes, interval: float = 1.0) -> None:
    """Finish the move under way once it has lasted ``move_hold`` and every member of the
    new sets caught up. A member that is down holds the move (it resumes when the member is
    back; ``python -m cluster decommission`` of a joining member aborts it instead)."""
    while True:
        await asyncio.sleep(interval)
        ms = node.membership
        if _driver(ms, node) == node.id:
            await changes.complete(ms)
        if not ms.moving or _driver(ms, node) != node.id:
            continue
        if node.clock() < ms.moving_since + step_hold(node, ms):
            continue
        try:
            if ms.reads_new:
                await changes.apply({"change": "finish", "version": ms.version})
            else:
                await finish_move(node, changes, ms)
        except Exception as exc:  # noqa: BLE001 - next round
            log.info("move not finished yet: %r", exc)


def step_hold(node: Node, ms: Membership) -> float:
    """How long the current step of a move lasts at least: the first, ``move_hold`` (a dedup
    window and more); the second (the new sets serve), two failure timeouts, so that every
    node has had the first step (pushed, or pulled at a heartbeat; a node still behind after
    a failure timeout is fenced)."""
    return 2 * node.config.failure_timeout if ms.reads_new else node.move_hold()


async def finish_move(node: Node, changes: Changes, ms: Membership) -> None:
    """Have every member gaining keys (and the leaving one, if up) catch up, then finish."""
    gainers = ms.placement().gainers()
    gaining = sorted(gainers - {node.id})
    leaving = [m for m in ms.ids("leaving") if node.is_live(m)]
    asks = {m: node.links[m].call(Kind.RING, [{"op": "sync", "version": ms.version}])
            for m in gaining + leaving if m in node.links}
    if len(asks) < len(gaining):
        raise MembershipError(f"no link to every member of the new sets: {gaining}")
    timeout = max(30.0, 10 * node.config.quorum_timeout)
    own = await catch_up(node) if node.id in gainers else True  # the driver's own share
    results = await asyncio.gather(*(asyncio.wait_for(f, timeout) for f in asks.values()),
                                   return_exceptions=True)
    failed = [m for m, r in zip(asks, results, strict=True)
              if m in gaining and (isinstance(r, BaseException) or r != [True])]
    if not own or failed:
        raise MembershipError(f"members not caught up yet: {failed or [node.id]}")
    if node.membership is ms:  # ``finish`` refuses a version that moved on meanwhile
        await changes.apply({"change": "finish", "version": ms.version})


def _driver(ms: Membership, node: Node) -> str | None:
    """Who finishes the move: the claimant, or while it is down the next live normal member.
    Two drivers at once are harmless: the finish of a version is one and the same next
    version whoever computes it (``Membership.finish`` is deterministic)."""
    for m in ms.ids("normal"):
        if m == node.id or node.is_live(m):
            return m
    return None


def departed(ms: Membership, node_id: str) -> bool:
    m = ms.get(node_id)
    return m is not None and m.state == LEFT


def gone(node_id: str, ms: Membership) -> Departed:
    """The error a node that left gives when it is started again (it exits 0)."""
    return Departed(f"{node_id} left the cluster (membership version {ms.version}): not "
                    f"starting again; to add it back, start it with an empty --data-dir")
