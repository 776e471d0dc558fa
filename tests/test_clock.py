"""The node's clock offset (test-only injection) and the peers' offsets measured by heartbeats."""

from __future__ import annotations

import pytest

from cluster.core.clock import OFFSET_ENV, PeerClocks, injected_offset, offset_clock


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_injected_offset_is_read_from_the_environment() -> None:
    assert injected_offset({}) == 0.0
    assert injected_offset({OFFSET_ENV: " "}) == 0.0
    assert injected_offset({OFFSET_ENV: "2.5"}) == 2.5
    assert injected_offset({OFFSET_ENV: "-30"}) == -30.0
    for bad in ("soon", "nan", "inf"):
        with pytest.raises(ValueError, match=OFFSET_ENV):
            injected_offset({OFFSET_ENV: bad})


def test_offset_clock_moves_the_base_clock() -> None:
    base = FakeMonotonic()
    assert offset_clock(0.0, base) is base
    assert offset_clock(-4.0, base)() == 96.0


def exchange(clocks: PeerClocks, peer: str, true_offset: float, out: float, back: float,
             step: float = 0.0) -> float:
    """One PING to ``peer`` whose clock is ``true_offset`` ahead of our (unstepped) clock:
    ``out`` seconds on the way there, ``back`` on the way back; our wall clock reads 900 s more
    than the monotonic one, plus ``step``. Returns the sample's offset."""
    ours = 900.0 + step + clocks.monotonic() - (out + back)  # our wall clock when it left
    peer_wall = ours - step + out + true_offset  # the peer stamps its answer when it arrives
    return clocks.sample(peer, ours, out + back, peer_wall).offset


def test_offset_is_the_peer_time_less_half_the_round_trip() -> None:
    clocks = PeerClocks(1.0, monotonic=FakeMonotonic())
    assert exchange(clocks, "n2", 5.0, 0.01, 0.01) == pytest.approx(5.0)
    assert exchange(clocks, "n3", -2.0, 0.004, 0.004) == pytest.approx(-2.0)
    # an asymmetric trip errs by at most half the round trip
    assert exchange(clocks, "n2", 5.0, 0.3, 0.0) == pytest.approx(5.15)
    assert clocks.offsets() == pytest.approx({"n2": 5.0, "n3": -2.0})  # the shortest trip


def test_the_shortest_round_trip_of_the_fresh_samples_wins() -> None:
    mono = FakeMonotonic()
    clocks = PeerClocks(1.0, monotonic=mono, keep=4, stale_after=5.0)
    exchange(clocks, "n2", 0.0, 0.001, 0.001)
    for _ in range(3):
        exchange(clocks, "n2", 0.0, 2.0, 0.0)  # 1 s of error each, a skew that is not there
    assert clocks.offsets()["n2"] == pytest.approx(0.0)
    assert clocks.skewed() == []  # |1.0| - 2.0/2 is within the tolerance anyway
    mono.now += 6.0  # every sample stale
    assert clocks.offsets() == {}
    exchange(clocks, "n2", 0.0, 2.0, 0.0)
    assert clocks.offsets()["n2"] == pytest.approx(1.0)


def test_skewed_only_when_surely_beyond_the_tolerance() -> None:
    clocks = PeerClocks(1.0, monotonic=FakeMonotonic())
    exchange(clocks, "n2", 1.2, 0.25, 0.25)  # 1.2 +- 0.25: may be 0.95
    exchange(clocks, "n3", -1.3, 0.1, 0.1)  # -1.3 +- 0.1: surely beyond
    assert clocks.skewed() == ["n3"]


def test_refuses_while_a_majority_of_the_measured_peers_disagree() -> None:
    mono = FakeMonotonic()
    changes: list[bool] = []
    clocks = PeerClocks(1.0, monotonic=mono, stale_after=5.0)
    clocks.on_change = changes.append
    assert not clocks.update()  # nothing measured: no evidence
    exchange(clocks, "n2", 0.2, 0.001, 0.001)
    exchange(clocks, "n3", 5.0, 0.001, 0.001)
    assert not clocks.refusing  # one of two: n3 is the odd one out, not us
    exchange(clocks, "n4", -5.0, 0.001, 0.001)
    assert clocks.refusing and changes == [True]  # two of three disagree with us
    mono.now += 3.0
    exchange(clocks, "n2", 0.2, 0.001, 0.001)
    mono.now += 3.0  # n3 and n4 went quiet: only n2, which agrees, is fresh
    assert not clocks.update() and changes == [True, False]
    exchange(clocks, "n3", 5.0, 0.001, 0.001)
    assert not clocks.refusing  # one of two
    mono.now += 5.5  # n2 stale, n3 fresh and off: one of one
    exchange(clocks, "n3", 5.0, 0.001, 0.001)
    assert clocks.refusing and changes == [True, False, True]


def test_a_step_of_our_own_clock_voids_the_samples_and_refuses_until_a_fresh_one() -> None:
    """Before, the shortest-round-trip sample from before the step still said all was well
    for up to ``stale_after``: the node counted by a clock seconds off."""
    mono = FakeMonotonic()
    clocks = PeerClocks(1.0, monotonic=mono, stale_after=5.0)
    for peer in ("n2", "n3"):
        exchange(clocks, peer, 0.0, 0.001, 0.001)
    assert not clocks.refusing and not clocks.watch(900.0 + mono.now, mono.now)
    mono.now += 0.5
    assert not clocks.watch(900.0 + mono.now + 0.2, mono.now)  # within a quarter: a slew
    mono.now += 0.5
    assert clocks.watch(900.0 + mono.now - 3.0, mono.now)  # stepped 3 s back
    assert clocks.refusing and clocks.offsets() == {} and clocks.steps == 1
    # the first fresh sample says where our clock stands: 3 s behind its peers
    assert exchange(clocks, "n2", 0.0, 0.001, 0.001, step=-3.0) == pytest.approx(3.0)
    assert clocks.refusing
    mono.now += 2.0
    assert clocks.watch(900.0 + mono.now, mono.now)  # stepped back into line
    assert clocks.refusing
    exchange(clocks, "n2", 0.0, 0.001, 0.001)
    assert not clocks.refusing


def test_a_node_with_no_peer_to_measure_counts_again_after_a_step() -> None:
    mono = FakeMonotonic()
    clocks = PeerClocks(1.0, monotonic=mono, stale_after=5.0)
    clocks.watch(900.0 + mono.now, mono.now)
    mono.now += 1.0
    assert clocks.watch(900.0 + mono.now + 2.0, mono.now) and clocks.refusing
    mono.now += 5.5
    assert not clocks.update()
