"""Single-decree Paxos for one membership version, the pure part: ballots, the acceptor's state
for one version number (a *slot*) and its transitions, and the proposer's reading of the
answers (docs/membership.md, "Agreement").

Version v + 1 is chosen among the voters of version v (``voters``): a proposer picks a ballot
higher than any it has seen, asks every voter to promise it (``Slot.prepare``; each answers
the value it already accepted for that version, if any), and with a majority of promises asks
them to accept a value: the one accepted under the highest ballot among the promises, else its
own (``Proposal.value``). A value accepted by a majority under one ballot is chosen, and any
later ballot that gathers a majority of promises meets at least one acceptor holding it, so it
proposes that same value again: two different values are never chosen for one version.

Pure: no I/O. The node writes every transition durably before it answers
(``cluster.roles.membership``); values are opaque here (a membership's wire form there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from cluster.core.membership import LEAVING, NORMAL, Membership, MembershipError

Ballot = tuple[int, str]  # (round, proposer id): totally ordered, unique per proposer and round
NO_BALLOT: Ballot = (0, "")


class NoMajority(MembershipError):
    """A proposer could not gather a majority of the voters: nothing was chosen by it."""


def voters(ms: Membership) -> tuple[str, ...]:
    """Who agrees on the version after ``ms``: its normal and leaving members (the ones that
    held keys before the change under way). A joining member votes once it is normal: a node
    that just started on an empty disk, and may be killed before its move finishes, would
    otherwise hold up every change (the abort of its own join among them)."""
    return ms.ids(NORMAL, LEAVING)


def majority(n: int) -> int:
    return n // 2 + 1


def ballot_of(data: Any) -> Ballot:
    """A ballot from its wire form ``[round, id]``."""
    try:
        r, who = data
        if type(r) is not int or not isinstance(who, str) or r < 0:
            raise ValueError(data)
    except (TypeError, ValueError) as exc:
        raise MembershipError(f"not a ballot: {data!r}") from exc
    return (r, who)


@dataclasses.dataclass(frozen=True)
class Promise:
    """An acceptor's answer to a prepare: ``ok`` (promised), the ballot it promised (or the
    higher one it had promised before, when refused) and what it accepted for the slot."""

    ok: bool
    promised: Ballot
    accepted: Ballot = NO_BALLOT
    value: Any = None

    def to_wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "promised": list(self.promised),
                "accepted": list(self.accepted), "value": self.value}

    @classmethod
    def from_wire(cls, data: Any) -> Promise:
        if not isinstance(data, dict):
            raise MembershipError(f"not a promise: {data!r}")
        return cls(bool(data.get("ok")), ballot_of(data.get("promised")),
                   ballot_of(data.get("accepted", list(NO_BALLOT))), data.get("value"))


@dataclasses.dataclass(frozen=True)
class Slot:
    """One acceptor's state for one version number: the highest ballot it promised, and the
    value it last accepted with that value's ballot (``NO_BALLOT``, None: nothing accepted)."""

    promised: Ballot = NO_BALLOT
    accepted: Ballot = NO_BALLOT
    value: Any = None

    def prepare(self, ballot: Ballot) -> tuple[Slot, Promise]:
        """Promise ``ballot`` unless a higher one was promised (the same one again is a
        duplicate of the request: promised again, with the same answer)."""
        if ballot >= self.promised:
            return (dataclasses.replace(self, promised=ballot),
                    Promise(True, ballot, self.accepted, self.value))
        return self, Promise(False, self.promised, self.accepted, self.value)

    def accept(self, ballot: Ballot, value: Any) -> tuple[Slot, bool]:
        """Accept ``value`` under ``ballot`` unless a higher ballot was promised."""
        if ballot >= self.promised:
            return Slot(ballot, ballot, value), True
        return self, False

    def to_wire(self) -> list[Any]:
        return [list(self.promised), list(self.accepted), self.value]

    @classmethod
    def from_wire(cls, data: Any) -> Slot:
        try:
            promised, accepted, value = data
        except (TypeError, ValueError) as exc:
            raise MembershipError(f"not an acceptor state: {data!r}") from exc
        return cls(ballot_of(promised), ballot_of(accepted), value)


def next_ballot(seen: Iterable[Ballot], proposer: str) -> Ballot:
    """A ballot of ``proposer`` higher than every one in ``seen``."""
    return (max((b[0] for b in seen), default=0) + 1, proposer)


@dataclasses.dataclass
class Proposal:
    """One proposer's round for one slot: the promises it gathered under ``ballot`` among
    ``voters``, then the acceptances of the value it asked them to accept."""

    ballot: Ballot
    own: Any
    voters: tuple[str, ...]
    promises: dict[str, Promise] = dataclasses.field(default_factory=dict)
    accepted_by: set[str] = dataclasses.field(default_factory=set)
    refused_by: dict[str, Ballot] = dataclasses.field(default_factory=dict)
    proposed: Any = None  # the value asked to be accepted under ``ballot`` (``propose``)

    @property
    def needed(self) -> int:
        return majority(len(self.voters))

    def promised(self, voter: str, promise: Promise) -> None:
        """Count a voter's answer to the prepare; late ones, once the value is proposed, change
        nothing (one value per ballot)."""
        if voter not in self.voters or self.proposed is not None:
            return
        if promise.ok and promise.promised == self.ballot:
            self.promises[voter] = promise
        elif not promise.ok:
            self.refused_by[voter] = promise.promised

    @property
    def prepared(self) -> bool:
        return len(self.promises) >= self.needed

    def value(self) -> Any:
        """What to ask the voters to accept: the value accepted under the highest ballot among
        the promises (it may have been chosen), else this proposer's own."""
        if self.proposed is not None:
            return self.proposed
        best = max(self.promises.values(), key=lambda p: p.accepted, default=None)
        if best is None or best.accepted == NO_BALLOT:
            return self.own
        return best.value

    def propose(self) -> Any:
        """The value to ask the voters to accept under this ballot, fixed from now on."""
        assert self.prepared, "propose only after a majority promised"
        self.proposed = self.value()
        return self.proposed

    def accepted(self, voter: str, ok: bool, promised: Ballot = NO_BALLOT) -> None:
        if voter not in self.voters:
            return
        if ok:
            self.accepted_by.add(voter)
        else:
            self.refused_by[voter] = promised

    @property
    def chosen(self) -> bool:
        return len(self.accepted_by) >= self.needed

    def higher(self) -> list[Ballot]:
        """The ballots that refused this one (the next attempt goes above them)."""
        return list(self.refused_by.values())
