"""Nemeses (Jepsen's families, as CHAOS.md lists them) and the schedule that plays them.

Each nemesis starts a fault and heals it; the schedule alternates quiet and faulty intervals,
one fault at a time, going round the chosen nemeses in a shuffled order so every one plays.

    lost-ack        client proxies lose answers after the node processed the request
    drop            client proxies lose requests (some hang, some close the connection)
    duplicate       client proxies deliver requests twice, at once or up to 2 s later
    late-duplicate  (not a default) requests replayed 12 s later, past the default window
    delay           requests held longer than the client's attempt timeout (the original
                    races its retry at another coordinator) and reordered
    reset           connections reset (TCP RST) shortly after they open
    down            one node's client proxy down (connections closed and refused), then up
    kill            kill -9 one node, restart it on the same data directory at heal (with
                    --compose-project: docker kill -s KILL, docker start)
    pause           SIGSTOP one node, SIGCONT at heal (it then sends stale messages; with
                    --compose-project: docker pause, docker unpause)
    clock           (not a default) restart one node with its wall clock moved (IDC_CLOCK_OFFSET,
                    test only), in turn within max_clock_skew and well beyond it (it must refuse
                    to count, 503 clock_skew), then restart it with the machine's clock
    partition       peer links cut (down or blackholed): one node isolated, a minority from a
                    majority, a bridge node seeing both halves, or one node cut one way
    peer-messages   peer frames dropped, duplicated, delayed and reordered; replication acks lost
    membership      (not a default) one change of the member list per play: a new node joins,
                    a member is decommissioned, a killed member is replaced (--replace), or the
                    joining or leaving node is killed -9 mid-move and restarted; each heal
                    waits until the move finished on every member (client.chaos.membership)
    split-membership  (not a default) the peer links between two halves of the members cut,
                    and a different change asked through a member of each half at once (a
                    join on one, a decommission on the other; two joins at rf members): the
                    half without a majority of the voters must be refused ("no majority"),
                    the other answered; healed, every live member must show one membership
                    holding exactly the answered change (the run is INVALID otherwise)
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from client.chaos.history import History
from client.chaos.membership import MembershipPlays, SplitPlays, move_hold, node_flag
from client.chaos.topology import Topology
from cluster.core.clock import OFFSET_ENV

TAG = "nemesis-"


class Nemesis(ABC):
    name = ""
    needs = ""  # "", "processes" or "peer-links"
    default = True
    history: History | None = None  # set by the schedule, for nemeses that record steps

    def lasts(self, topo: Topology) -> float:
        """Seconds a play takes at least (the schedule starts none that would end after the
        workload)."""
        return 0.0

    def missing(self, topo: Topology) -> str | None:
        if self.needs == "processes" and not topo.can_control_processes:
            return "needs a local cluster, or --nodes with --compose-project"
        if self.needs == "peer-links" and not topo.peer_links:
            return ("needs peer links through proxies: the node has no --connect-via flag yet"
                    if not topo.external else "needs a local cluster (not --nodes)")
        return None

    @abstractmethod
    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        """Begin the fault; the returned detail goes into the history."""

    @abstractmethod
    async def stop(self, topo: Topology) -> dict[str, Any] | None:
        """Heal this fault; a detail of how the heal went (recorded with the stop), if any."""


class ClientToxic(Nemesis):
    """Adds toxics to every client proxy; healing removes them."""

    @abstractmethod
    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        """The toxics to add to every client proxy."""

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        specs = self.toxics(rng)
        for proxy in topo.client_proxies.values():
            for i, spec in enumerate(specs):
                proxy.add_toxic({**spec, "name": f"{TAG}{self.name}-{i}"})
        return {"toxics": specs}

    async def stop(self, topo: Topology) -> None:
        for proxy in topo.client_proxies.values():
            for name in [n for n in proxy.toxics if n.startswith(f"{TAG}{self.name}-")]:
                proxy.remove_toxic(name)


class LostAck(ClientToxic):
    name = "lost-ack"

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "lost_ack", "toxicity": round(rng.uniform(0.1, 0.4), 2),
                 "attributes": {"mode": rng.choice(["close", "close", "hang"])}}]


class Drop(ClientToxic):
    name = "drop"

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "drop", "toxicity": round(rng.uniform(0.1, 0.3), 2),
                 "attributes": {"mode": rng.choice(["close", "hang"])}}]


class Duplicate(ClientToxic):
    name = "duplicate"

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "duplicate", "toxicity": round(rng.uniform(0.2, 0.5), 2)},
                {"type": "duplicate", "toxicity": 0.2,
                 "attributes": {"delay": rng.randint(200, 2000)}}]


class LateDuplicate(ClientToxic):
    """Replays requests after ``late_ms`` (default 12 s, past the default 10 s window): the copy
    carries its original age_ms, so no node can tell it is late. Shows the window's limit;
    not a default (a correct cluster may over-count under it)."""

    name = "late-duplicate"
    default = False
    late_ms = 12_000

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "duplicate", "toxicity": 0.2, "attributes": {"delay": self.late_ms}}]


class Delay(ClientToxic):
    name = "delay"

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "delay", "toxicity": 0.3,
                 "attributes": {"latency": rng.randint(600, 1500), "jitter": 300}},
                {"type": "reorder", "toxicity": 0.5, "attributes": {"count": 3, "window": 30}}]


class Reset(ClientToxic):
    name = "reset"

    def toxics(self, rng: random.Random) -> list[dict[str, Any]]:
        return [{"type": "reset_peer", "stream": "downstream", "toxicity": 0.3,
                 "attributes": {"timeout": rng.randint(5, 200)}}]


class Down(Nemesis):
    """A client proxy goes down (open connections closed, new ones refused), then comes back:
    the restart of a proxy, or a node unreachable from clients only."""

    name = "down"

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        victim = rng.choice([i for i in topo.ids if i not in topo.killed] or topo.ids)
        await topo.client_proxies[victim].disable()
        self.victim = victim
        return {"node": victim}

    async def stop(self, topo: Topology) -> None:
        victim = getattr(self, "victim", None)
        if victim is not None and victim not in topo.killed:
            await topo.client_proxies[victim].enable()


class Kill(Nemesis):
    name = "kill"
    needs = "processes"

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        victim = rng.choice(topo.ids)
        await topo.kill(victim)
        return {"node": victim}

    async def stop(self, topo: Topology) -> None:
        for node_id in list(topo.killed):
            await topo.restart(node_id)


class Pause(Nemesis):
    name = "pause"
    needs = "processes"

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        victim = rng.choice(topo.ids)
        await topo.pause(victim)
        return {"node": victim}

    async def stop(self, topo: Topology) -> None:
        for node_id in list(topo.paused):
            await topo.resume(node_id)


class Clock(Nemesis):
    """Restart one node with its wall clock ``offset`` seconds off (``IDC_CLOCK_OFFSET``, read
    once by the node at start), then restart it with the machine's clock. The offsets go round
    ``OFFSETS``: within the default ``max_clock_skew`` (1 s), where the node must count and
    count once, and well beyond it, where it must refuse rather than risk a double count (the
    SDK retries elsewhere). Not a default: each play is two restarts."""

    name = "clock"
    needs = "processes"
    default = False
    OFFSETS = (-0.4, 5.0, 0.3, -5.0, 2.5, -2.5)
    TOLERANCE = 1.0  # the node's default max_clock_skew

    def __init__(self) -> None:
        self.turn = 0
        self.victim: str | None = None

    def missing(self, topo: Topology) -> str | None:
        if topo.cluster is None:
            return "needs a local cluster (the node's environment is set at its start)"
        return super().missing(topo)

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        victim = rng.choice(topo.ids)
        offset = self.OFFSETS[self.turn % len(self.OFFSETS)]
        self.turn += 1
        self.victim = victim
        await topo.restart_with_env(victim, {OFFSET_ENV: str(offset)})
        # beyond the tolerance it must refuse; recorded, so the history shows it did
        beyond = abs(offset) > self.TOLERANCE
        refusing = await topo.wait_clock(victim, beyond, timeout=abs(offset) + 3.0)
        return {"node": victim, "offset_s": offset, "refusing": refusing}

    async def stop(self, topo: Topology) -> None:
        victim, self.victim = self.victim, None
        if victim is not None:
            await topo.restart_with_env(victim, {})


def partition_pairs(ids: Sequence[str], shape: str,
                    rng: random.Random) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Directed links to cut for a partition ``shape``: isolate (one node from the rest),
    halves (a minority from a majority), bridge (two halves, one node still sees both),
    one-way (the rest stop hearing one node, it still hears them)."""
    ids = list(ids)
    rng.shuffle(ids)
    if shape in ("isolate", "one-way"):
        side = ids[:1]
    elif shape == "bridge":
        side = ids[: (len(ids) - 1) // 2]
    else:
        side = ids[: max(1, len(ids) // 2)]
    bridge = ids[len(side)] if shape == "bridge" else None
    rest = [i for i in ids if i not in side and i != bridge]
    pairs = [(a, b) for a in side for b in rest]
    if shape != "one-way":
        pairs += [(b, a) for a in side for b in rest]
    detail = {"shape": shape, "side": sorted(side), "rest": sorted(rest), "bridge": bridge}
    return pairs, detail


class Partition(Nemesis):
    name = "partition"
    needs = "peer-links"

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        ids = topo.linked_ids  # a node that joined later has no link proxies
        shapes = ["isolate", "halves", "one-way"] + (["bridge"] if len(ids) >= 3 else [])
        pairs, detail = partition_pairs(ids, rng.choice(shapes), rng)
        mode = rng.choice(["down", "blackhole"])
        await topo.cut(pairs, mode=mode)
        return {**detail, "mode": mode}

    async def stop(self, topo: Topology) -> None:
        await topo.heal_network()


class PeerMessages(Nemesis):
    name = "peer-messages"
    needs = "peer-links"

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        specs = [{"type": "duplicate", "toxicity": 0.2},
                 {"type": "drop", "toxicity": 0.05},
                 {"type": "lost_ack", "toxicity": 0.05, "attributes": {"mode": "hang"}},
                 {"type": "delay", "toxicity": 0.1, "attributes": {"latency": 300}},
                 {"type": "reorder", "toxicity": 0.3, "attributes": {"count": 3, "window": 20}}]
        for proxy in topo.link_proxies.values():
            for i, spec in enumerate(specs):
                proxy.add_toxic({**spec, "name": f"{TAG}peer-{i}"})
        return {"toxics": specs}

    async def stop(self, topo: Topology) -> None:
        await topo.heal_network()


class Membership(Nemesis):
    """One change of the member list per play, healed by waiting until the move finished on
    every member (``client.chaos.membership``). Not a default: a play lasts at least a dedup
    window (the driver starts its nodes with ``--window`` 2 s when this nemesis is chosen)."""

    name = "membership"
    needs = "processes"
    default = False

    def __init__(self) -> None:
        self.plays: MembershipPlays | None = None

    def missing(self, topo: Topology) -> str | None:
        if topo.cluster is None:
            return "needs a local cluster (it starts new node processes)"
        return super().missing(topo)

    def lasts(self, topo: Topology) -> float:
        assert topo.cluster is not None
        return move_hold(list(topo.cluster.extra_args)) + 1.0

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        if self.plays is None or self.plays.topo is not topo:  # a new run
            self.plays = MembershipPlays(topo, self.history)
        self.plays.history = self.history
        return await self.plays.begin(rng)

    async def stop(self, topo: Topology) -> dict[str, Any] | None:
        return await self.plays.finish() if self.plays is not None else None


class SplitMembership(Nemesis):
    """A partition with a membership change asked on each side (``SplitPlays``): the peer
    links between two halves of the members cut (``partition_pairs``' halves, down or
    blackholed), a different change asked through a member of each half at once, the answers
    recorded, then healed and judged: one membership on every live member, the changes in it
    exactly the ones answered (at most one, one when a half had a majority of the voters).
    Not a default: a play lasts a move (``--window`` 2 s, as for ``membership``)."""

    name = "split-membership"
    needs = "peer-links"
    default = False

    def __init__(self) -> None:
        self.plays: SplitPlays | None = None

    def missing(self, topo: Topology) -> str | None:
        if topo.cluster is None:
            return "needs a local cluster (it starts new node processes)"
        if len(topo.linked_ids) < 3:
            return "needs 3 or more nodes"
        return super().missing(topo)

    def lasts(self, topo: Topology) -> float:
        assert topo.cluster is not None
        args = list(topo.cluster.extra_args)
        # the cut seen, the side without a majority refused (two quorum timeouts), a move
        return move_hold(args) + 2 * node_flag(args, "--quorum-timeout", 2.0) + 3.0

    async def start(self, topo: Topology, rng: random.Random) -> dict[str, Any]:
        if self.plays is None or self.plays.topo is not topo:  # a new run
            self.plays = SplitPlays(topo, self.history)
        self.plays.history = self.history
        live = [i for i in topo.ids if i not in topo.killed]
        linked = [i for i in topo.linked_ids if i in live]
        pairs, detail = partition_pairs(linked, "halves", rng)
        mode = rng.choice(["down", "blackhole"])
        await topo.cut(pairs, mode=mode)
        # members that joined later dial every peer directly: they see both halves
        bridges = [i for i in live if i not in linked]
        play = await self.plays.begin_split(rng, (detail["side"], detail["rest"]), bridges)
        return {**play, "mode": mode}

    async def stop(self, topo: Topology) -> dict[str, Any] | None:
        await topo.heal_network()
        return await self.plays.finish() if self.plays is not None else None


ALL: dict[str, Nemesis] = {n.name: n for n in (
    LostAck(), Drop(), Duplicate(), LateDuplicate(), Delay(), Reset(), Down(), Kill(), Pause(),
    Clock(), Partition(),
    PeerMessages(), Membership(), SplitMembership())}


def choose(names: Sequence[str] | None, topo: Topology) -> tuple[list[Nemesis], dict[str, str]]:
    """The nemeses to play and, for those left out, why."""
    wanted = list(names) if names else [n for n, x in ALL.items() if x.default]
    unknown = [n for n in wanted if n not in ALL]
    if unknown:
        raise ValueError(f"--nemesis: unknown {unknown}; choose from {sorted(ALL)}")
    chosen, skipped = [], {}
    for name in wanted:
        why = ALL[name].missing(topo)
        if why:
            skipped[name] = why
        else:
            chosen.append(ALL[name])
    return chosen, skipped


class Schedule:
    """Quiet, fault, heal, quiet, ... until ``stop_at``; one fault at a time."""

    def __init__(self, nemeses: Sequence[Nemesis], topo: Topology, history: History,
                 rng: random.Random, *, quiet: tuple[float, float] = (1.0, 2.0),
                 fault: tuple[float, float] = (2.0, 4.0)) -> None:
        self.nemeses = list(nemeses)
        self.topo, self.history, self.rng = topo, history, rng
        self.quiet, self.fault = quiet, fault
        self.current: Nemesis | None = None
        self.played: list[dict[str, Any]] = []
        for nemesis in self.nemeses:
            nemesis.history = history

    async def run(self, stop_at: float) -> None:
        if not self.nemeses:
            return
        order: list[Nemesis] = []
        try:
            while True:
                await _sleep_until(min(stop_at, time.monotonic()
                                       + self.rng.uniform(*self.quiet)))
                if time.monotonic() >= stop_at - 0.5:
                    return
                if not order:
                    order = list(self.nemeses)
                    self.rng.shuffle(order)
                # the next one that still ends before the workload does
                fits = [n for n in reversed(order)
                        if time.monotonic() + n.lasts(self.topo) < stop_at]
                if not fits:
                    return
                nemesis = fits[0]
                order.remove(nemesis)
                await self._play(nemesis, stop_at)
        finally:
            await self._heal_current()

    async def _play(self, nemesis: Nemesis, stop_at: float) -> None:
        self.current = nemesis
        detail = await nemesis.start(self.topo, self.rng)
        started = self.history.now()
        self.history.nemesis("start", nemesis.name, **detail)
        await _sleep_until(min(stop_at, time.monotonic() + self.rng.uniform(*self.fault)))
        healed = await self._heal_current()
        self.played.append({"nemesis": nemesis.name, "start": started,
                            "stop": self.history.now(), **detail,
                            **({"healed": healed} if healed else {})})

    async def _heal_current(self) -> dict[str, Any] | None:
        nemesis, self.current = self.current, None
        healed = None
        if nemesis is not None:
            healed = await nemesis.stop(self.topo)
            self.history.nemesis("stop", nemesis.name, **(healed or {}))
        return healed


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
