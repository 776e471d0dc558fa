"""The membership nemesis's plays: one change of the member list each, under load, through
the cluster's own tools (``--join``, ``--replace``, ``python -m cluster decommission``).

    join            a new node (n4, n5, ...: an id is never reused) joins
    decommission    a member leaves (only while more than rf members are normal)
    replace         a member is killed (-9), and once every other member sees it down a new
                    node takes its place (``--replace``, empty data directory)
    crash           a move starts (a decommission when there are more than rf members and the
                    last crash was not of a leaving node, else a join), and the moving node is
                    killed -9 mid-move; at heal it restarts on its data directory and the move
                    must resume and finish. If it cannot restart, the history says so
                    (``restart-failed``, with the node's own error) and a joining node's join
                    is aborted (decommission of a joining member) so that the cluster is whole
                    again

The first play of a run is a join (3 members and rf 3 leave nothing to remove), then the other
kinds in a shuffled order, then all four shuffled again. Each play is healed by waiting until
every live member's ``GET /v1/ring`` shows the same version, no move, and exactly the members
the topology holds, all normal: a move lasts at least the nodes' dedup window plus
max_clock_skew and two failure timeouts, so the chaos driver runs these clusters with a short
window (``runner.MEMBERSHIP_WINDOW``).

Every step is a nemesis event in the history: ``{"process": "nemesis", "f": "membership",
"value": <kind>, "detail": {"step": ..., "node": ..., "version": ..., ...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from client.chaos.history import History
from client.chaos.topology import Topology
from cluster.local import StartError

KINDS = ("join", "decommission", "replace", "crash")


def node_flag(args: list[str], flag: str, default: float) -> float:
    """The value of ``--flag X`` or ``--flag=X`` in a node's arguments (the last one wins)."""
    value = default
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = float(args[i + 1])
        elif a.startswith(flag + "="):
            value = float(a.split("=", 1)[1])
    return value


def move_hold(node_args: list[str]) -> float:
    """How long a move lasts at least on nodes started with ``node_args`` (the node's
    ``move_hold``: window + max_clock_skew + 2 failure timeouts), plus its driver's second."""
    return (node_flag(node_args, "--window", 10.0) + node_flag(node_args, "--max-clock-skew", 1.0)
            + 2 * node_flag(node_args, "--failure-timeout", 1.0) + 1.0)


class MembershipPlays:
    """The plays of one run against ``topo`` (which must be a local cluster)."""

    def __init__(self, topo: Topology, history: History | None) -> None:
        assert topo.cluster is not None
        self.topo, self.history = topo, history
        self.hold = move_hold(list(topo.cluster.extra_args))
        self.heal_timeout = max(60.0, 6 * self.hold)
        numbers = [int(m.group(1)) for i in topo.cluster.nodes
                   if (m := re.fullmatch(r"n(\d+)", i))]
        self.next_number = max(numbers, default=0) + 1
        self.order: list[str] = []
        self.rounds = 0
        self.play: dict[str, Any] | None = None  # the change under way
        self.steps: list[dict[str, Any]] = []
        self.last_crash: str | None = None

    # -- choosing --------------------------------------------------------------------------

    def _kind(self, rng: random.Random, rf: int) -> str:
        if not self.order:
            rest = list(KINDS[1:]) if self.rounds == 0 else list(KINDS)
            rng.shuffle(rest)
            self.order = (["join"] if self.rounds == 0 else []) + rest
            self.rounds += 1
        kind = self.order.pop(0)
        if kind == "decommission" and len(self.topo.ids) <= rf:
            self.order.insert(0, kind)  # first grow, then shrink
            kind = "join"
        return kind

    def _crash_variant(self, rf: int) -> str:
        """Which moving node a crash play kills: the leaving one whenever a decommission is
        allowed (more than rf members) and the last crash was not of a leaving one, else the
        joining one."""
        leaving = len(self.topo.ids) > rf and self.last_crash != "leaving"
        self.last_crash = "leaving" if leaving else "joining"
        return self.last_crash

    def _new_id(self) -> str:
        assert self.topo.cluster is not None
        while f"n{self.next_number}" in self.topo.cluster.nodes:
            self.next_number += 1
        node_id = f"n{self.next_number}"
        self.next_number += 1
        return node_id

    def _live(self, *, but: str | None = None) -> list[str]:
        return [i for i in self.topo.ids if i != but and i not in self.topo.killed]

    # -- history ---------------------------------------------------------------------------

    def _step(self, kind: str, step: str, **detail: Any) -> None:
        detail = {"step": step, **{k: v for k, v in detail.items() if v is not None}}
        if self.history is not None:
            self.history.nemesis("membership", kind, **detail)
            detail["time"] = self.history.now()
        self.steps.append({"kind": kind, **detail})

    async def _ring(self) -> tuple[int | None, int]:
        """The newest ring version the live members show, and its rf."""
        views = [v for v in (await self.topo.ring_views(self._live())).values() if v]
        if not views:
            return None, self.topo.rf
        newest = max(views, key=lambda v: int(v.get("version", 0)))
        return int(newest.get("version", 0)), int(newest.get("rf", self.topo.rf))

    async def _wait_state(self, node_id: str, states: tuple[str, ...], timeout: float,
                          *, everywhere: bool = False) -> int | None:
        """Until some live member's ring (``everywhere``: every live member's) lists
        ``node_id`` in one of ``states``; that ring's version (None: not within timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            views = await self.topo.ring_views(self._live(but=node_id))
            hits = [v for v in views.values() if v is not None and any(
                m.get("id") == node_id and m.get("state") in states
                for m in v.get("members", []))]
            if hits and (not everywhere or len(hits) == len(views)):
                return max(int(v.get("version", 0)) for v in hits)
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.2)

    # -- the plays -------------------------------------------------------------------------

    async def begin(self, rng: random.Random) -> dict[str, Any]:
        """Start one change; the detail the schedule records at its start."""
        version, rf = await self._ring()
        kind = self._kind(rng, rf)
        play: dict[str, Any] = {"kind": kind, "version_before": version,
                                "started": time.monotonic()}
        self.play = play
        if kind == "join":
            play["node"] = await self._join(kind, version)
        elif kind == "decommission":
            play["node"] = await self._leave(kind, rng.choice(self._live()), version)
        elif kind == "replace":
            play.update(await self._replace(rng, version))
        else:
            moving = self._crash_variant(rf)
            play["moving"] = moving
            if moving == "joining":
                play["node"] = await self._join(kind, version)
            else:
                play["node"] = await self._leave(kind, rng.choice(self._live()), version)
            await asyncio.sleep(rng.uniform(0.3, min(2.0, self.hold / 3)))
            views = await self.topo.ring_views(self._live())
            mid = any(v is not None and v.get("move") for v in views.values())
            await self.topo.kill(play["node"])
            self._step(kind, "killed", node=play["node"], moving=moving, mid_move=mid)
            play["killed_mid_move"] = mid
        return {k: v for k, v in play.items() if k != "started" and not k.startswith("_")}

    async def _join(self, kind: str, version: int | None) -> str:
        node_id = self._new_id()
        seeds = self._live()
        self._step(kind, "join", node=node_id, via=seeds, version=version)
        try:
            await self.topo.add_member(node_id, join=seeds)
        except (StartError, RuntimeError) as exc:
            self._step(kind, "start-failed", node=node_id, error=str(exc)[:300])
            raise
        got = await self._wait_state(node_id, ("joining", "normal"), 10.0)
        self._step(kind, "joining", node=node_id, version=got)
        return node_id

    async def _leave(self, kind: str, node_id: str, version: int | None) -> str:
        assert self.play is not None
        self._step(kind, "decommission", node=node_id, version=version)
        self.play["_decommission"] = await self._decommission(node_id)
        got = await self._wait_state(node_id, ("leaving", "left"), 15.0)
        self._step(kind, "leaving", node=node_id, version=got)
        return node_id

    async def _replace(self, rng: random.Random, version: int | None) -> dict[str, Any]:
        victim, new = rng.choice(self._live()), self._new_id()
        self._step("replace", "kill", node=victim, version=version)
        await self.topo.kill(victim)
        # --replace needs the claimant to take the change: wait until no member counts on
        # the dead one (it may have been the claimant itself)
        seen = await self._wait_state(victim, ("down",), 15.0, everywhere=True)
        self._step("replace", "down", node=victim, seen=seen is not None)
        await self.topo.drop_member(victim)
        seeds = self._live()
        self._step("replace", "replace", node=new, replaces=victim, via=seeds)
        try:
            await self.topo.add_member(new, join=seeds, replaces=victim)
        except (StartError, RuntimeError) as exc:
            self._step("replace", "start-failed", node=new, error=str(exc)[:300])
            raise
        got = await self._wait_state(new, ("joining", "normal"), 10.0)
        self._step("replace", "joining", node=new, replaces=victim, version=got)
        return {"node": new, "replaces": victim}

    async def _decommission(self, node_id: str) -> asyncio.subprocess.Process:
        """``python -m cluster decommission node_id`` through the other live members; its
        output goes to ``decommission-<id>.log`` in the cluster's data directory."""
        cluster = self.topo.cluster
        assert cluster is not None
        via = ",".join(cluster.nodes[i].address for i in self._live(but=node_id))
        argv = [sys.executable, "-m", "cluster", "decommission", node_id, "--via", via,
                "--timeout", f"{self.heal_timeout:g}"]
        if cluster.secret_file is not None:
            argv += ["--secret-file", str(cluster.secret_file)]
        log_path = Path(cluster.data_dir) / f"decommission-{node_id}.log"
        with open(log_path, "ab") as log:
            return await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL)

    # -- heal ------------------------------------------------------------------------------

    async def finish(self) -> dict[str, Any]:
        """Bring the change to its end (restart a crashed node, wait for the decommission, drop
        the members that left) and wait until every live member shows the same settled ring.
        The outcome, recorded with the schedule's stop."""
        play, self.play = self.play, None
        if play is None:
            return {}
        kind, node_id = play["kind"], play.get("node")
        out: dict[str, Any] = {}
        try:
            if kind == "crash" and node_id is not None:
                out.update(await self._restart(play))
            proc = play.get("_decommission")
            if proc is not None:
                out["decommission_rc"] = await self._await_decommission(kind, node_id, proc)
                if node_id in self.topo.ids:
                    out["exit_code"] = await self._await_exit(kind, node_id)
                    await self.topo.drop_member(node_id)
        finally:
            view = await self.topo.wait_ring_settled(self.heal_timeout)
        took = round(time.monotonic() - play["started"], 2)
        if view is None:
            views = await self.topo.ring_views()
            self._step(kind, "stuck", node=node_id, after_s=took,
                       rings={i: _brief(v) for i, v in views.items()})
            return {**out, "settled": False, "seconds": took}
        members = [m["id"] for m in view.get("members", []) if m.get("state") != "left"]
        self._step(kind, "finished", node=node_id, version=view.get("version"),
                   members=members, seconds=took)
        return {**out, "settled": True, "version": view.get("version"), "members": members,
                "seconds": took}

    async def _restart(self, play: dict[str, Any]) -> dict[str, Any]:
        """The crashed moving node starts again on its data directory."""
        kind, node_id, moving = play["kind"], play["node"], play["moving"]
        try:
            await self.topo.restart(node_id)
        except StartError as exc:
            if moving == "leaving" and exc.code == 0:  # the move finished while it was down:
                # it learnt that it left from its peers and stopped by itself, as it should
                self._step(kind, "restarted", node=node_id, moving=moving, left=True)
                await self.topo.drop_member(node_id)
                return {"restarted": True, "exit_code": 0}
            self._step(kind, "restart-failed", node=node_id, moving=moving, code=exc.code,
                       error=exc.cause or str(exc)[:300])
            if moving == "joining":  # the join holds the move while it is down: abort it
                self._step(kind, "abort", node=node_id)
                proc = await self._decommission(node_id)
                rc = await self._await_decommission(kind, node_id, proc)
                self._step(kind, "aborted", node=node_id, rc=rc)
            await self.topo.drop_member(node_id)
            return {"restarted": False, "restart_error": exc.cause or str(exc)[:300],
                    "restart_code": exc.code}
        self._step(kind, "restarted", node=node_id, moving=moving)
        return {"restarted": True}

    async def _await_decommission(self, kind: str, node_id: str | None,
                                  proc: asyncio.subprocess.Process) -> int | None:
        try:
            rc = await asyncio.wait_for(proc.wait(), self.heal_timeout + 10.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            rc = None
        self._step(kind, "decommissioned" if rc == 0 else "decommission-failed",
                   node=node_id, rc=rc)
        return rc

    async def _await_exit(self, kind: str, node_id: str) -> int | None:
        """A node that left exits 0 by itself; one that does not within 30 s is stopped."""
        node = self.topo.node(node_id)
        code: int | None = None
        if node.proc is not None:
            try:
                code = await asyncio.wait_for(node.proc.wait(), 30.0)
            except TimeoutError:
                self._step(kind, "no-exit", node=node_id)
            await node.stop(timeout=5.0)
        self._step(kind, "exited", node=node_id, code=code)
        return code


def _brief(view: dict[str, Any] | None) -> str:
    if view is None:
        return "no answer"
    members = " ".join(f"{m.get('id')}:{m.get('state')}" for m in view.get("members", []))
    return f"v{view.get('version')} {members}{' moving' if view.get('move') else ''}"
