"""The membership's pure part: versions, one change at a time, and where keys live during and
after a move (cluster/core/membership.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.membership import (
    JOINING,
    LEAVING,
    LEFT,
    NORMAL,
    Membership,
    MembershipError,
)
from cluster.core.ring import Ring

KEYS = [("t", f"k{i}") for i in range(300)]


def boot(n: int = 3, rf: int = 3) -> Membership:
    return Membership.bootstrap([(f"n{i}", "127.0.0.1", 7100 + i) for i in range(1, n + 1)],
                                rf=rf, vnodes=16)


def test_a_join_is_two_versions_and_the_joiner_holds_keys_only_after_the_second() -> None:
    ms = boot()
    started = ms.join("n4", "127.0.0.1", 7104, now=100.0)
    assert (started.version, started.get("n4").state, started.moving_since) == (2, JOINING, 100.0)
    during = started.placement()
    assert during.members == ("n1", "n2", "n3")  # leaders, reads, checks: the old sets
    gains = [k for k in KEYS if "n4" in during.write_set(*k)]
    assert gains, "the joiner gains some keys"
    assert during.gainers() == {"n4"}  # a join moves keys to the joiner only
    for k in gains:
        ws = during.write_set(*k)
        assert ws[:3] == during.preference_list(*k) and ws[3] == "n4"
    serving = started.finish(now=120.0)  # the new sets serve; writes still reach both
    assert (serving.version, serving.get("n4").state, serving.reads_new) == (3, JOINING, True)
    middle = serving.placement()
    assert "n4" in middle.members and serving.moving_since == 120.0
    for k in gains:  # led and read by the new set, written to the old one as well
        ws = middle.write_set(*k)
        assert "n4" in middle.preference_list(*k)
        assert set(ws) == set(during.write_set(*k)) and len(ws) == 4
    done = serving.finish()
    assert (done.version, done.get("n4").state, done.moving) == (4, NORMAL, False)
    assert not done.reads_new
    after = done.placement()
    assert {k for k in KEYS if "n4" in after.preference_list(*k)} == set(gains)
    assert after.write_set(*KEYS[0]) == after.preference_list(*KEYS[0])


def test_one_change_at_a_time_and_clear_refusals() -> None:
    ms = boot().join("n4", "h", 1, now=0.0)
    with pytest.raises(MembershipError, match="a move is under way"):
        ms.join("n5", "h", 2, now=0.0)
    with pytest.raises(MembershipError, match="a move is under way"):
        ms.leave("n1", now=0.0)
    with pytest.raises(MembershipError, match="already a member"):
        boot().join("n2", "h", 1, now=0.0)
    with pytest.raises(MembershipError, match="would be left for rf 3"):
        boot().leave("n1", now=0.0)
    with pytest.raises(MembershipError, match="not a member"):
        boot().leave("n9", now=0.0)
    with pytest.raises(MembershipError, match="no move to finish"):
        boot().finish()


def test_a_change_asked_again_changes_nothing() -> None:
    ms = boot(4).join("n5", "h", 5, now=0.0)
    assert ms.join("n5", "h", 5, now=9.0) is ms  # the joiner lost the first answer
    with pytest.raises(MembershipError, match="a move is under way"):
        ms.join("n5", "other", 5, now=9.0)  # not the same node
    leaving = boot(4).leave("n2", now=0.0)
    assert leaving.leave("n2", now=1.0) is leaving
    replacing = boot(4).replace("n2", "n9", "h", 9, now=0.0)
    assert replacing.replace("n2", "n9", "h", 9, now=1.0) is replacing


def test_finishing_a_version_is_the_same_whoever_computes_it() -> None:
    ms = boot(4).replace("n2", "n9", "h", 9, now=0.0)
    again = Membership.from_wire(ms.to_wire())
    assert ms.finish() == again.finish()  # two drivers at once install one version


def test_leaving_a_joining_member_aborts_its_join() -> None:
    ms = boot().join("n4", "h", 1, now=0.0)
    aborted = ms.leave("n4", now=1.0)
    assert aborted.get("n4").state == LEFT and not aborted.moving
    assert aborted.placement().members == ("n1", "n2", "n3")


def test_an_id_that_left_comes_back_as_a_new_member() -> None:
    ms = boot(4).leave("n4", now=0.0).finish().finish()
    back = ms.join("n4", "h", 9, now=5.0)
    assert back.get("n4").since == back.version > 1  # its origins are n4@<since>.<incarnation>


def test_replace_moves_the_old_members_keys_to_the_new_one() -> None:
    ms = boot(4).replace("n2", "n9", "h", 9, now=0.0)
    assert ms.get("n2").state == LEAVING and ms.get("n9").state == JOINING
    done = ms.finish().finish()
    assert done.get("n2").state == LEFT and done.ids(NORMAL) == ("n1", "n3", "n4", "n9")
    assert "n2" not in done.placement().members


def test_the_claimant_is_the_lowest_normal_member_unless_it_is_the_dead_subject() -> None:
    ms = boot()
    assert ms.claimant() == "n1"
    assert ms.claimant("n1", is_live=lambda n: True) == "n1"
    assert ms.claimant("n1", is_live=lambda n: n != "n1") == "n2"
    assert boot(4).leave("n1", now=0.0).claimant() == "n2"  # a leaving member issues nothing


def test_wire_round_trip_and_refusals() -> None:
    ms = boot(4).replace("n2", "n9", "h", 9, now=3.5)
    assert Membership.from_wire(ms.to_wire()) == ms
    for bad in ({}, {"version": 1}, {**ms.to_wire(), "members": [["n1", "h", 1, "odd", 1]]},
                {**ms.to_wire(), "members": []}):
        with pytest.raises(MembershipError):
            Membership.from_wire(bad)


CHANGES = st.lists(st.tuples(st.sampled_from(["join", "leave", "replace", "finish", "abort"]),
                             st.integers(0, 9)), max_size=14)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 5), rf=st.integers(1, 3), changes=CHANGES)
def test_every_key_keeps_rf_replicas_and_a_move_changes_a_set_by_one_member(
        n: int, rf: int, changes: list[tuple[str, int]]) -> None:
    ms = boot(n, rf)
    fresh = iter(f"x{i}" for i in range(100))
    for what, pick in changes:
        live = ms.ids(NORMAL)
        try:
            if what == "join":
                ms = ms.join(next(fresh), "h", 1, now=0.0)
            elif what == "leave":
                ms = ms.leave(live[pick % len(live)], now=0.0)
            elif what == "replace":
                ms = ms.replace(live[pick % len(live)], next(fresh), "h", 1, now=0.0)
            elif what == "finish":
                ms = ms.finish()
            else:
                ms = ms.abort()
        except MembershipError:
            continue
        p = ms.placement()
        want = min(rf, len(ms.ids(NORMAL, LEAVING)))
        for k in KEYS[:60]:
            old, ws = p.preference_list(*k), p.write_set(*k)
            assert len(old) == want and len(set(ws)) == len(ws)
            assert ws[:len(old)] == old and len(ws) - len(old) <= 1
            if ms.moving:
                new = p.new.preference_list(*k)
                assert set(new) <= set(ws) and len(set(old) - set(new)) <= 1
                assert set(new) - set(old) <= p.gainers()
        if not ms.moving:  # the same placement as a static ring of the normal members
            static = Ring(ms.ids(NORMAL), vnodes=16, rf=rf)
            assert all(p.preference_list(*k) == static.preference_list(*k) for k in KEYS[:60])
