"""Elastic membership, the pure part: the agreed member list (a numbered ``Membership``), the
one-at-a-time changes on it, and the placement of keys while a change moves them.

A change is three versions (docs/membership.md):

- **start** (join, leave, replace): the new member is ``joining``, the departing one ``leaving``.
  Leaders, reads and retry checks keep the *old* replica sets (normal + leaving members); writes
  also go to the members of the *new* sets (normal + joining), and an ack needs one more durable
  copy for each extra member (``Placement.write_set``). So every op acked during the move has W
  copies in its old set and W in its new one.
- **the new sets serve** (``reads_new``), at least one dedup window (plus the clock skew) later,
  once the members gaining ranges caught up: the new sets lead, read and check; writes still
  reach both. An op acked before the move began is past its window by then (a retry of it is
  refused as expired, as it would be without any change), and one acked during it is on W
  replicas of its new set: a retry is recognised by the checks of whichever replica leads it.
- **finish**: joining -> normal, leaving -> left. Any two consecutive versions share W replicas
  for whatever either acknowledges, so nodes one version apart never miss each other's writes.

Each key's set changes by at most one member per change, so a move never has more than one
extra member per key. Pure: no I/O, no clock (times are arguments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from cluster.core.ring import Ring
from cluster.core.tables import TableError, TableSettings
from cluster.core.versions import PROTOCOL_MAX, newer

NORMAL, JOINING, LEAVING, LEFT = "normal", "joining", "leaving", "left"
STATES = (NORMAL, JOINING, LEAVING, LEFT)


class MembershipError(ValueError):
    """A change the current membership does not allow (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Member:
    id: str
    host: str
    port: int
    state: str = NORMAL
    since: int = 1  # the version that admitted it: an id that comes back is a new member

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class Membership:
    """One version of the member list. Left members stay listed (their ids' history)."""

    version: int
    members: tuple[Member, ...]
    rf: int
    vnodes: int
    moving_since: float = 0.0  # wall time the current move (or its phase) started; 0: none
    reads_new: bool = False  # a move's second phase: the new sets serve, writes still go to both
    # the tables' agreed settings (cluster.core.tables), by name; versioned with the members
    tables: tuple[TableSettings, ...] = ()
    # the finalized protocol (cluster.core.versions): what every member sends and writes. It
    # only rises, by ``set_protocol`` once every member speaks the new version
    protocol: int = 1

    @classmethod
    def bootstrap(cls, peers: Iterable[tuple[str, str, int]], *, rf: int,
                  vnodes: int) -> Membership:
        """Version 1: the ``--peers`` list, every member normal."""
        members = _sorted(Member(pid, host, port) for pid, host, port in peers)
        return cls(1, members, rf, vnodes)

    # -- reading ---------------------------------------------------------------------------

    def get(self, node_id: str) -> Member | None:
        for m in self.members:
            if m.id == node_id:
                return m
        return None

    def ids(self, *states: str) -> tuple[str, ...]:
        return tuple(m.id for m in self.members if m.state in states)

    @property
    def moving(self) -> bool:
        return any(m.state in (JOINING, LEAVING) for m in self.members)

    @property
    def reachable(self) -> tuple[str, ...]:
        """Every member not gone: the nodes that hold or receive keys."""
        return self.ids(NORMAL, JOINING, LEAVING)

    def claimant(self, subject: str | None = None,
                 is_live: Callable[[str], bool] | None = None) -> str:
        """The one member that issues versions: the lowest normal id. A change about that very
        member, while it is down, is issued by the next one (so a dead claimant can be
        replaced)."""
        normal = self.ids(NORMAL)
        if not normal:
            raise MembershipError("no normal member to issue the change")
        first = normal[0]
        if subject == first and len(normal) > 1 and is_live is not None and not is_live(first):
            return normal[1]
        return first

    def table(self, name: str) -> TableSettings | None:
        for t in self.tables:
            if t.name == name:
                return t
        return None

    def set_table(self, settings: TableSettings) -> Membership:
        """The next version with ``settings`` for its table (the same version when they are
        the ones it holds: a request asked again). Allowed during a move: placement is not
        touched."""
        old = self.table(settings.name)
        if old is not None and old.ttl_s == settings.ttl_s:
            return self
        tables = tuple(sorted([t for t in self.tables if t.name != settings.name] + [settings],
                              key=lambda t: t.name))
        return dataclasses.replace(self, version=self.version + 1, tables=tables)

    def set_protocol(self, protocol: int) -> Membership:
        """The next version with ``protocol`` finalized (itself when that is the one it
        holds). A finalized version is never lowered: members may already have written it."""
        if protocol < self.protocol:
            raise MembershipError(f"the cluster finalized protocol {self.protocol}; it is never "
                                  f"lowered (asked {protocol})")
        if protocol == self.protocol:
            return self
        return dataclasses.replace(self, version=self.version + 1, protocol=protocol)

    def moves(self) -> dict[str, str]:
        """The move under way: {"joining": id, "leaving": id} (either may be absent)."""
        return {m.state: m.id for m in self.members if m.state in (JOINING, LEAVING)}

    def placement(self) -> Placement:
        return Placement(self)

    # -- changes (each returns the next version, or itself when already applied) -------------

    def _next(self, members: Iterable[Member], moving_since: float) -> Membership:
        return dataclasses.replace(self, version=self.version + 1, members=_sorted(members),
                                   moving_since=moving_since, reads_new=False)

    def _idle(self, what: str) -> None:
        if self.moving:
            moves = ", ".join(f"{i} {s}" for s, i in self.moves().items())
            raise MembershipError(f"cannot {what}: a move is under way ({moves}, version "
                                  f"{self.version}); one change at a time")

    def join(self, node_id: str, host: str, port: int, now: float) -> Membership:
        old = self.get(node_id)
        if old is not None and old.state == JOINING and (old.host, old.port) == (host, port):
            return self  # asked again (the first answer was lost): already joining
        self._idle(f"add {node_id}")
        if old is not None and old.state != LEFT:
            raise MembershipError(
                f"{node_id} is already a member ({old.state}); a node that lost its data joins "
                f"with a new id and --replace {node_id}")
        new = Member(node_id, host, port, JOINING, self.version + 1)
        return self._next([m for m in self.members if m.id != node_id] + [new], now)

    def leave(self, node_id: str, now: float) -> Membership:
        """Decommission ``node_id``; of a joining member, the join is aborted instead."""
        m = self.get(node_id)
        if m is None or m.state == LEFT:
            raise MembershipError(f"{node_id} is not a member")
        if m.state == JOINING:
            return self.abort()
        if m.state == LEAVING:
            return self  # asked again: already leaving
        self._idle(f"remove {node_id}")
        if len(self.ids(NORMAL)) - 1 < self.rf:
            raise MembershipError(f"cannot remove {node_id}: {len(self.ids(NORMAL)) - 1} "
                                  f"members would be left for rf {self.rf}")
        return self._next([dataclasses.replace(x, state=LEAVING) if x.id == node_id else x
                           for x in self.members], now)

    def replace(self, old_id: str, node_id: str, host: str, port: int,
                now: float) -> Membership:
        """``node_id`` (new, empty) takes the place of ``old_id`` (normal, usually dead)."""
        prior = self.get(node_id)
        old = self.get(old_id)
        if (prior is not None and prior.state == JOINING and old is not None
                and old.state == LEAVING and (prior.host, prior.port) == (host, port)):
            return self  # asked again: already replacing
        self._idle(f"replace {old_id}")
        if old is None or old.state != NORMAL:
            raise MembershipError(f"cannot replace {old_id}: not a normal member")
        if prior is not None and prior.state != LEFT:
            raise MembershipError(f"{node_id} is already a member ({prior.state})")
        members = [dataclasses.replace(x, state=LEAVING) if x.id == old_id else x
                   for x in self.members if x.id != node_id]
        return self._next(members + [Member(node_id, host, port, JOINING, self.version + 1)],
                          now)

    def finish(self, now: float = 0.0) -> Membership:
        """The next step of the move: first the new sets serve (lead, read, answer checks)
        while writes still reach both (``reads_new``); then joining -> normal, leaving ->
        left. A node one version behind then always shares W replicas with the writers."""
        if self.moving and not self.reads_new:
            return dataclasses.replace(self, version=self.version + 1, moving_since=now,
                                       reads_new=True)
        return self._end("finish", {JOINING: NORMAL, LEAVING: LEFT})

    def abort(self) -> Membership:
        """Undo the move: the joining member is dropped (left), the leaving one stays."""
        return self._end("abort", {JOINING: LEFT, LEAVING: NORMAL})

    def _end(self, what: str, step: dict[str, str]) -> Membership:
        if not self.moving:
            raise MembershipError(f"no move to {what}")
        return self._next([dataclasses.replace(m, state=step.get(m.state, m.state))
                           for m in self.members], 0.0)

    # -- wire ------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        wire = {"version": self.version, "rf": self.rf, "vnodes": self.vnodes,
                "moving_since": self.moving_since, "reads_new": self.reads_new,
                "members": [[m.id, m.host, m.port, m.state, m.since] for m in self.members],
                "tables": [t.to_wire() for t in self.tables]}
        if self.protocol > 1:  # absent at 1: the ring file stays what release 0.4.0 reads
            wire["protocol"] = self.protocol
        return wire

    @classmethod
    def from_wire(cls, data: Any) -> Membership:
        try:
            members = _sorted(Member(str(i), str(h), int(p), str(s), int(v))
                              for i, h, p, s, v in data["members"])
            tables = tuple(TableSettings.from_wire(t) for t in data.get("tables", ()))
            protocol = data.get("protocol", 1)
            if type(protocol) is not int or protocol < 1:
                raise ValueError(f"protocol {protocol!r}")
            ms = cls(int(data["version"]), members, int(data["rf"]), int(data["vnodes"]),
                     float(data.get("moving_since", 0.0)), bool(data.get("reads_new", False)),
                     tables, protocol)
        except (KeyError, TypeError, ValueError, TableError) as exc:
            raise MembershipError(f"not a membership: {exc!r}") from exc
        if protocol > PROTOCOL_MAX:
            raise newer(f"membership version {ms.version} finalized protocol", protocol)
        if any(m.state not in STATES for m in ms.members) or not ms.reachable:
            raise MembershipError("not a membership: bad member states")
        return ms


def _sorted(members: Iterable[Member]) -> tuple[Member, ...]:
    return tuple(sorted(members, key=lambda m: m.id))


class Placement:
    """Where keys live under one ``Membership``: the ``Ring`` interface of the old (voting)
    sets, plus ``write_set``: the old set and, while a move changes the key's set, the member
    gaining it. Every process with the same membership computes the same placement."""

    __slots__ = ("membership", "version", "old", "new", "moving", "members", "vnodes", "rf",
                 "replicates_everywhere", "preference_list", "leader", "cached_prefs", "_unions",
                 "_other")

    def __init__(self, ms: Membership) -> None:
        self.membership = ms
        self.version = ms.version
        self.old = Ring(ms.ids(NORMAL, LEAVING), vnodes=ms.vnodes, rf=ms.rf)
        future = ms.ids(NORMAL, JOINING)
        self.moving = set(future) != set(self.old.members)
        self.new = Ring(future, vnodes=ms.vnodes, rf=ms.rf) if self.moving else self.old
        # the sets that lead, serve reads and answer checks; the other ones are written too
        serving, self._other = ((self.new, self.old) if self.moving and ms.reads_new
                                else (self.old, self.new))
        self.members, self.vnodes, self.rf = serving.members, ms.vnodes, serving.rf
        self.replicates_everywhere = serving.replicates_everywhere and not self.moving
        self.preference_list = serving.preference_list
        self.leader = serving.leader
        # the serving ring's cache of preference lists by (table, key), read in place by the
        # compiled routing (``batch_kernel.by_leader``): an entry there is what
        # ``preference_list`` answers, without a Python call an op
        self.cached_prefs = serving._cache
        self._unions: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}

    def write_set(self, table: str, key: str) -> tuple[str, ...]:
        """The serving set, then the members of the other set not in it (an ack needs W + one
        more copy for each of those: W in the old set and W in the new)."""
        serving = self.preference_list(table, key)
        if not self.moving:
            return serving
        other = self._other.preference_list(table, key)
        union = self._unions.get((serving, other))
        if union is None:
            union = self._unions[(serving, other)] = serving + tuple(
                m for m in other if m not in serving)
        return union

    def gainers(self) -> set[str]:
        """The members that hold keys in the new sets they do not hold in the old ones: the
        ones that must catch up before the move finishes. Each arc between two tokens of
        either ring maps to one preference list per ring, so the tokens of both cover every
        key."""
        if not self.moving:
            return set()
        out: set[str] = set()
        for t in set(self.old.tokens) | set(self.new.tokens):
            out.update(set(self.new.owners_at(t)) - set(self.old.owners_at(t)))
        return out

    def __repr__(self) -> str:
        return f"Placement(version={self.version}, members={list(self.members)})"
