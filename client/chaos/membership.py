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
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from client.chaos.history import History
from client.chaos.topology import Topology
from cluster.admin import AdminError, ask
from cluster.core.membership import Membership, MembershipError
from cluster.core.paxos import majority
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

    async def _decommission(self, node_id: str, via: list[str] | None = None
                            ) -> asyncio.subprocess.Process:
        """``python -m cluster decommission node_id`` through ``via`` (default: the other live
        members); its output goes to ``decommission-<id>.log`` in the cluster's data
        directory."""
        cluster = self.topo.cluster
        assert cluster is not None
        via_addrs = ",".join(cluster.nodes[i].address
                             for i in (via if via is not None else self._live(but=node_id)))
        argv = [sys.executable, "-m", "cluster", "decommission", node_id, "--via", via_addrs,
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


# -- the split play: a partition, a different change asked on each side ---------------------

class SplitPlays(MembershipPlays):
    """The ``split-membership`` nemesis's plays (``client.chaos.nemesis.SplitMembership`` cuts
    the peer links between the two sides, then calls ``begin``; it heals them, then calls
    ``finish``).

    On each side a member is asked a different change while the cut holds (a join of a new
    node on one side and the decommission of a member on the other when the cluster has more
    than rf normal members, else a join on each; a node that joined in an earlier play is the
    one decommissioned, if any), both at once: the one RING change request
    that ``--join`` and ``python -m cluster decommission`` send (``cluster.admin.ask``), asked
    once, through one member of that side. Each side's answer goes into the history. A join
    that was admitted is then started (``--join`` through the same member: it is already
    joining, so it is answered the ring); an admitted decommission is waited for with
    ``python -m cluster decommission`` (the node leaves, then exits 0).

    Membership versions are agreed by a majority of the normal and leaving members (the
    voters): a side that reaches fewer than a majority of them must be refused ("no
    majority"), a side that reaches a majority must be answered. After the heal every live
    member must show one and the same membership, in which the changes that took effect are
    exactly the ones answered: at most one, and exactly one when a side had a majority
    (``problems`` in the heal's detail otherwise; the run is then not valid)."""

    async def begin_split(self, rng: random.Random, sides: tuple[list[str], list[str]],
                          bridges: list[str]) -> dict[str, Any]:
        """Ask a change on each side of the cut (already made); the play's detail."""
        views = await self.topo.ring_views(self._live())
        version, rf = await self._ring()
        ring: dict[str, Any] = max((v for v in views.values() if v),
                                   key=lambda v: int(v.get("version", 0)),
                                   default={"members": []})
        held = {str(m["id"]): _held_state(ring, str(m["id"])) for m in ring["members"]}
        voters = [i for i, st in held.items() if st in ("normal", "leaving")]
        normal = [i for i, st in held.items() if st == "normal"]
        play: dict[str, Any] = {"kind": "split", "version_before": version,
                                "started": time.monotonic(), "sides": [sorted(s) for s in sides],
                                "bridges": sorted(bridges), "voters": sorted(voters)}
        self.play = play
        seen = await self._wait_cut(sides, 15.0)
        self._step("split", "cut", sides=play["sides"], bridges=play["bridges"],
                   version=version, sees_other_side_down=seen)
        # which change on which side: a decommission needs more than rf normal members and a
        # side of two (a member asked to remove another), or a bridge to remove
        order = [0, 1]
        rng.shuffle(order)
        leave_side = next((i for i in order
                           if len(sides[i]) >= 2 or set(bridges) & set(normal)), None)
        if len(normal) <= rf:
            leave_side = None
        need = majority(len(voters))
        changes: list[dict[str, Any]] = []
        for i, side in enumerate(sides):
            reach = sorted(set(side) | set(bridges))
            change: dict[str, Any] = {
                "side": sorted(side), "reaches": len([v for v in reach if v in voters]),
                "majority": len([v for v in reach if v in voters]) >= need}
            if i == leave_side:  # a node that joined during the run first (a bridge: the
                # cluster goes back to members the cut separates)
                target = rng.choice(sorted(set(bridges) & set(normal)) or sorted(side))
                change.update(change="decommission", node=target,
                              via=rng.choice(sorted(set(side) - {target})))
            else:
                change.update(change="join", node=self._new_id(), via=rng.choice(sorted(side)))
            changes.append(change)
        play["changes"] = changes
        play["needed"] = need
        answers = await asyncio.gather(*(self._ask_side(c) for c in changes))
        for change, answer in zip(changes, answers, strict=True):
            change.update(answer)
            self._step("split", "answer", **{k: v for k, v in change.items()})
        for change in changes:  # carry out what was admitted
            if not change["accepted"]:
                continue
            if change["change"] == "join":
                await self._start_joiner(change)
            else:
                play.setdefault("_decommissions", []).append(
                    (change["node"], await self._decommission(
                        change["node"], via=[i for i in change["side"] if i != change["node"]])))
        return {k: v for k, v in play.items() if k != "started" and not k.startswith("_")}

    async def _wait_cut(self, sides: tuple[list[str], list[str]], timeout: float) -> bool:
        """Until every member of each side shows every member of the other side down (a side
        then asks its own members, not a claimant across the cut)."""
        deadline = time.monotonic() + timeout
        while True:
            views = await self.topo.ring_views([i for s in sides for i in s])
            ok = True
            for i, side in enumerate(sides):
                other = set(sides[1 - i])
                for member in side:
                    view = views.get(member)
                    states = {m.get("id"): m.get("state")
                              for m in (view or {}).get("members", [])}
                    ok = ok and view is not None and all(
                        states.get(o) in ("down", "left", None) for o in other)
            if ok:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)

    async def _ask_side(self, change: dict[str, Any]) -> dict[str, Any]:
        """The change's RING request, once, to its side's member: its answer."""
        cluster = self.topo.cluster
        assert cluster is not None
        node_id, via = change["node"], cluster.nodes[change["via"]]
        if change["change"] == "join":
            joiner = cluster.add_node(node_id, join=[change["via"]])  # started once admitted
            own, item = node_id, {"op": "change", "change": "join", "id": node_id,
                                  "addr": joiner.address}
        else:
            own, item = f"admin-{os.getpid()}", {"op": "change", "change": "leave",
                                                 "id": node_id}
        secret = str(cluster.secret_file) if cluster.secret_file is not None else None
        self._step("split", "ask", change=change["change"], node=node_id, via=change["via"])
        started = time.monotonic()
        try:
            got = await ask([(via.host, via.port)], own, secret, item, timeout=30.0)
            ms = Membership.from_wire(got)
        except (AdminError, MembershipError) as exc:
            return {"accepted": False, "answer": str(exc)[:400],
                    "no_majority": "no majority" in str(exc),
                    "answer_s": round(time.monotonic() - started, 2)}
        m = ms.get(node_id)
        return {"accepted": True, "answer": f"{node_id} {m.state if m else '?'} at version "
                                            f"{ms.version}",
                "version": ms.version, "answer_s": round(time.monotonic() - started, 2)}

    async def _start_joiner(self, change: dict[str, Any]) -> None:
        assert self.topo.cluster is not None
        node_id = change["node"]
        try:
            await self.topo.start_member(self.topo.cluster.nodes[node_id])
        except (StartError, RuntimeError) as exc:
            self._step("split", "start-failed", node=node_id, error=str(exc)[:300])
            raise
        self._step("split", "started", node=node_id)

    async def _completed_later(self, play: dict[str, Any], timeout: float = 10.0) -> None:
        """A change refused as "not confirmed" (its proposer sent accepts, no majority
        answered) may still be chosen, and the move driver completes it once a majority is
        back: look for it in the rings for ``timeout`` after the heal, and carry it out if it
        took effect (start the joiner, wait for the decommission)."""
        pending = [c for c in play.get("changes", [])
                   if not c.get("accepted") and "not confirmed" in str(c.get("answer"))]
        deadline = time.monotonic() + timeout
        while pending:
            views = await self.topo.ring_views(self._live())
            for c in list(pending):
                if any(v is not None and _took_effect(c, v) for v in views.values()):
                    pending.remove(c)
                    c["completed_later"] = True
                    self._step("split", "completed", change=c["change"], node=c["node"])
                    if c["change"] == "join":
                        await self._start_joiner(c)
                    else:
                        play.setdefault("_decommissions", []).append((c["node"], (
                            await self._decommission(c["node"], via=self._live(but=c["node"])))))
            if not pending or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.3)

    async def finish(self) -> dict[str, Any]:
        """After the heal: wait for an admitted decommission, then until every live member
        shows the same settled ring; judge the play (``problems``)."""
        play, self.play = self.play, None
        if play is None:
            return {}
        out: dict[str, Any] = {}
        try:
            await self._completed_later(play)
            for node_id, proc in play.get("_decommissions", []):
                out["decommission_rc"] = await self._await_decommission("split", node_id, proc)
                if node_id in self.topo.ids:
                    out["exit_code"] = await self._await_exit("split", node_id)
                    await self.topo.drop_member(node_id)
        finally:
            view = await self.topo.wait_ring_settled(self.heal_timeout)
        took = round(time.monotonic() - play["started"], 2)
        views = await self.topo.ring_views([i for i in self.topo.ids
                                            if i not in self.topo.killed])
        forms = {i: _ring_form(v) for i, v in views.items()}
        one = view is not None and len(set(forms.values())) == 1 and None not in forms.values()
        changes = play.get("changes", [])
        final = view or {"members": []}
        effect = [c for c in changes if _took_effect(c, final)]
        problems = judge(changes, effect, one, final, bridged=bool(play.get("bridges")))
        members = [m["id"] for m in final.get("members", []) if m.get("state") != "left"]
        detail = {"settled": view is not None, "one_membership": one,
                  "version": final.get("version"), "members": members,
                  "took_effect": [_what(c) for c in effect], "seconds": took,
                  **({"problems": problems} if problems else {}), **out}
        if not one:
            detail["rings"] = {i: _brief(v) for i, v in views.items()}
        self._step("split", "finished" if view is not None else "stuck", **detail)
        return detail


def _held_state(ring: dict[str, Any], node_id: str) -> str | None:
    """A member's state in the membership (``/v1/ring`` shows ``down`` for one not live):
    a down member of a settled ring counts as the voter it is (normal, or leaving while its
    move is under way)."""
    move = ring.get("move") or {}
    for m in ring.get("members", []):
        if m.get("id") == node_id:
            state = m.get("state")
            if state == "down":
                return "leaving" if move.get("leaving") == node_id else (
                    "joining" if move.get("joining") == node_id else "normal")
            return str(state)
    return None


def _ring_form(view: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What a member's ``/v1/ring`` says of the membership itself (not of liveness or
    shedding): version, rf, vnodes, claimant, every member with its address, state and the
    version it joined at."""
    if view is None:
        return None
    return (view.get("version"), view.get("rf"), view.get("vnodes"), view.get("claimant"),
            tuple(sorted((str(m.get("id")), str(m.get("addr")), str(m.get("state")),
                          str(m.get("since"))) for m in view.get("members", []))))


def _took_effect(change: dict[str, Any], ring: dict[str, Any]) -> bool:
    states = {m.get("id"): m.get("state") for m in ring.get("members", [])}
    if change["change"] == "join":
        return states.get(change["node"]) not in (None, "left")
    return states.get(change["node"]) in (None, "left", "leaving")


def _what(change: dict[str, Any]) -> str:
    return f"{change['change']} {change['node']}"


def judge(changes: list[dict[str, Any]], effect: list[dict[str, Any]], one: bool,
          ring: dict[str, Any], *, bridged: bool = False) -> list[str]:
    """What is wrong with a split play's end (nothing: an empty list): not one membership on
    the live members, more than one change in it, a change answered but not in it or in it
    though refused, a side without a majority answered or refused for another reason than
    that, the only side with one refused. ``bridged``: some member saw both sides (it joined after
    the cluster started, so its links bypass the proxies), and a side without a majority may
    have learnt the other side's version through it before its own change was asked: then
    any refusal will do (a move under way, say). Through bridges both sides may reach a
    majority: then one of them at most is answered (the voters they share choose), and a
    change refused as not confirmed may be completed after the heal (``completed_later``)."""
    problems = []
    if not one:
        problems.append("the live members do not show one settled membership")
    if len(effect) > 1:
        problems.append("both sides' changes took effect: "
                        + ", ".join(_what(c) for c in effect))
    for c in changes:
        took = c in effect
        if c.get("accepted") and not took:
            problems.append(f"{_what(c)} was answered (version {c.get('version')}) but is not "
                            f"in the final membership v{ring.get('version')}")
        if not c.get("accepted") and took and not c.get("completed_later"):
            problems.append(f"{_what(c)} was refused but took effect")
        if c.get("majority") and not c.get("accepted") and sum(
                1 for x in changes if x.get("majority")) == 1:
            problems.append(f"{_what(c)} was refused on the side with a majority "
                            f"({' '.join(c['side'])}): {c.get('answer')}")
        if not c.get("majority") and (c.get("accepted")
                                      or not (c.get("no_majority") or bridged)):
            problems.append(f"{_what(c)} on the side without a majority "
                            f"({' '.join(c['side'])}) was not refused for want of one: "
                            f"{c.get('answer')}")
    return problems
