"""The agreement on a membership version (``cluster.core.paxos``): acceptor transitions, the
proposer's reading of promises, and, under hypothesis, safety: whatever the interleaving of
messages among 3 or 5 acceptors and 2 or 3 proposers, with messages lost and duplicated, no
two different values are chosen for one version, and once a value is chosen every later
ballot proposes that same value."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.membership import Membership, MembershipError
from cluster.core.paxos import (
    NO_BALLOT,
    Promise,
    Proposal,
    Slot,
    ballot_of,
    majority,
    next_ballot,
    voters,
)


def test_an_acceptor_promises_only_higher_ballots_and_answers_what_it_accepted() -> None:
    s = Slot()
    s, p = s.prepare((1, "n1"))
    assert p.ok and p.promised == (1, "n1") and p.accepted == NO_BALLOT and p.value is None
    s, p = s.prepare((1, "n1"))  # the same request again: the same answer
    assert p.ok
    s, p = s.prepare((1, "n0"))  # lower: refused, with the ballot it promised
    assert not p.ok and p.promised == (1, "n1")
    s, ok = s.accept((1, "n1"), "A")
    assert ok and s.accepted == (1, "n1") and s.value == "A"
    s, ok = s.accept((0, "n9"), "B")  # below the promise
    assert not ok and s.value == "A"
    s, p = s.prepare((2, "n2"))
    assert p.ok and p.accepted == (1, "n1") and p.value == "A"
    assert Slot.from_wire(s.to_wire()) == s
    assert Promise.from_wire(p.to_wire()) == p


def test_a_proposer_adopts_the_value_accepted_under_the_highest_ballot() -> None:
    prop = Proposal((5, "n2"), "mine", ("n1", "n2", "n3"))
    prop.promised("n1", Promise(True, (5, "n2"), (3, "n1"), "old"))
    assert not prop.prepared
    prop.promised("n3", Promise(True, (5, "n2"), (4, "n3"), "newer"))
    prop.promised("n9", Promise(True, (5, "n2"), (9, "n9"), "not a voter"))
    assert prop.prepared and prop.value() == "newer"
    fresh = Proposal((1, "n1"), "mine", ("n1", "n2", "n3"))
    fresh.promised("n1", Promise(True, (1, "n1")))
    fresh.promised("n2", Promise(True, (1, "n1")))
    assert fresh.value() == "mine"
    refused = Proposal((1, "n1"), "mine", ("n1", "n2", "n3"))
    refused.promised("n2", Promise(False, (7, "n3")))
    assert not refused.prepared and next_ballot(refused.higher(), "n1") == (8, "n1")


def test_voters_are_the_normal_and_leaving_members_and_ballots_are_checked() -> None:
    ms = Membership.bootstrap([(f"n{i}", "h", 7000 + i) for i in (1, 2, 3)], rf=3, vnodes=8)
    ms = ms.join("n4", "h", 7004, 1.0)
    assert voters(ms) == ("n1", "n2", "n3")  # a joining member does not vote yet
    ms = ms.finish(2.0).finish()
    ms = ms.leave("n1", 3.0)
    assert voters(ms) == ("n1", "n2", "n3", "n4")  # the leaving one still does
    assert majority(3) == 2 and majority(4) == 3 and majority(5) == 3
    assert ballot_of([3, "n2"]) == (3, "n2")
    for bad in ([1], ["1", "n1"], [-1, "n1"], None, [1, 2]):
        with pytest.raises(MembershipError):
            ballot_of(bad)


# -- safety under any interleaving ---------------------------------------------------------

@dataclasses.dataclass
class World:
    """Acceptors, proposers and the messages in flight between them."""

    acceptors: dict[str, Slot]
    proposers: dict[str, Proposal | None]
    network: list[tuple[str, str, str, Any]]  # (kind, from, to, payload)
    accepted_by: dict[tuple[tuple[int, str], Any], set[str]]  # (ballot, value) -> acceptors
    sent: list[tuple[tuple[int, str], Any]]  # every accept request (ballot, value) sent
    seen: dict[str, list[tuple[int, str]]]  # the ballots each proposer saw refused

    def chosen(self) -> dict[tuple[int, str], Any]:
        need = majority(len(self.acceptors))
        return {b: v for (b, v), who in self.accepted_by.items() if len(who) >= need}


KINDS = ["propose", "deliver", "deliver", "deliver", "deliver", "drop", "dup"]
actions = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 1000)), max_size=200)


@settings(max_examples=500, deadline=None)
@given(n=st.sampled_from([3, 5]), p=st.sampled_from([2, 3]), steps=actions)
def test_no_two_values_are_chosen_for_one_version(n: int, p: int,
                                                  steps: list[tuple[str, int]]) -> None:
    run(n, p, steps)


def test_long_random_schedules_choose_one_value() -> None:
    """Longer schedules than hypothesis draws (seeded): proposers keep starting new ballots
    while messages are delivered out of order, lost and duplicated."""
    for seed in range(300):
        rng = random.Random(seed)
        steps = [(rng.choice(KINDS), rng.randrange(1000)) for _ in range(rng.randrange(400))]
        run(rng.choice([3, 5]), rng.choice([2, 3]), steps)


def run(n: int, p: int, steps: list[tuple[str, int]]) -> World:
    """Play ``steps`` among ``n`` acceptors and ``p`` proposers, checking safety after each;
    then deliver everything in flight and let one proposer finish."""
    acc = [f"a{i}" for i in range(n)]
    props = [f"p{i}" for i in range(p)]
    w = World({a: Slot() for a in acc}, dict.fromkeys(props), [], {}, [],
              {q: [] for q in props})
    proposal_values = {q: f"value of {q}" for q in props}
    # every proposer's own acceptor is one of the acceptors (a member proposes and votes)
    own_acceptor = {q: acc[i % n] for i, q in enumerate(props)}

    def start(q: str) -> None:
        seen = [*w.seen[q], w.acceptors[own_acceptor[q]].promised]
        prop = w.proposers[q] = Proposal(next_ballot(seen, q), proposal_values[q], tuple(acc))
        for a in acc:
            w.network.append(("prepare", q, a, prop.ballot))

    def deliver(msg: tuple[str, str, str, Any]) -> None:
        kind, src, dst, payload = msg
        if kind == "prepare":
            w.acceptors[dst], promise = w.acceptors[dst].prepare(payload)
            w.network.append(("promise", dst, src, promise))
        elif kind == "accept":
            ballot, value = payload
            w.acceptors[dst], ok = w.acceptors[dst].accept(ballot, value)
            if ok:
                w.accepted_by.setdefault((ballot, value), set()).add(dst)
            w.network.append(("accepted", dst, src, (ballot, ok, w.acceptors[dst].promised)))
        elif kind == "promise":
            prop = w.proposers[dst]
            if prop is None:
                return
            if not payload.ok:
                w.seen[dst].append(payload.promised)
            was = prop.prepared
            prop.promised(src, payload)
            if prop.prepared and not was:  # a majority promised: ask them to accept
                value = prop.propose()
                w.sent.append((prop.ballot, value))
                for a in acc:
                    w.network.append(("accept", dst, a, (prop.ballot, value)))
        else:
            prop = w.proposers[dst]
            ballot, ok, promised = payload
            if prop is None or ballot != prop.ballot:
                return
            if not ok:
                w.seen[dst].append(promised)
            prop.accepted(src, ok, promised)

    for what, i in steps:
        if what == "propose":
            start(props[i % p])
        elif w.network:
            j = i % len(w.network)
            if what == "deliver":
                deliver(w.network.pop(j))
            elif what == "drop":
                w.network.pop(j)
            else:
                w.network.append(w.network[j])
        chosen = w.chosen()
        assert len(set(chosen.values())) <= 1, f"two values chosen: {chosen}"
        # once chosen under b, every accept request of a higher ballot carries the same value
        for b, v in chosen.items():
            assert all(value == v for ballot, value in w.sent if ballot > b)
        for q, prop in w.proposers.items():  # a proposer that sees its value chosen is right
            if prop is not None and prop.chosen:
                assert chosen.get(prop.ballot) == prop.value(), q
    # then let every message in flight arrive, and one proposer finish: still one value
    while w.network:
        deliver(w.network.pop(0))
    for _ in range(3):
        start(props[0])
        while w.network:
            deliver(w.network.pop(0))
        if w.proposers[props[0]].chosen:  # type: ignore[union-attr]
            break
    chosen = w.chosen()
    assert len(set(chosen.values())) == 1, chosen
    prop = w.proposers[props[0]]
    assert prop is not None and prop.chosen and prop.value() in chosen.values()
    return w
