"""``python -m client.chaos.upgrade``: a rolling upgrade from a previous release, under load.

Any release can be the OLD code: what each side speaks is learned, not assumed. The NEW
code's range and release are its own ``cluster.core.versions`` (``PROTOCOL_MIN`` to
``PROTOCOL_MAX``, ``release()``, read by a process of that code); the OLD code's are what its
nodes' ``/v1/health`` say at the start: no ``protocol`` key is release 0.4.0 or before, speaking
1 only; otherwise ``protocol.speaks`` and ``release`` (checked against the old code's own
``cluster.core.versions``). The TARGET of finalize is the new code's ``PROTOCOL_MAX``.

Three nodes start on the OLD code (another source tree, ``--old-tree``, run under this venv's
python or ``--old-python``) and clients write throughout, through the chaos driver's proxies.
Then, a phase each, with ``--phase-seconds`` of load after each step: every node is replaced by
the NEW code (this tree, or ``--new-tree``) on its own data directory and port (SIGTERM, start,
wait until ready); one node is rolled back to the OLD code (finalize, tried then, must be
refused: exit 1; not tried, said so, when the old code speaks the target too, as it would then
be allowed) and forward again; the cluster is finalized (``python -m cluster finalize`` must exit
0, then every node's ``/v1/health`` say cluster protocol TARGET); the load runs on; one node is
restarted on the NEW code, reading back the log segments written in protocol TARGET (nodes
snapshot every second, and each snapshot starts a segment). Healed and quiet, every replica
is read and the history judged by the chaos checker.

VALID needs all of: the checker's verdict (no acknowledged op lost, none counted twice, every
read in bounds, the replicas equal); each phase acknowledged at least ``--min-ack`` of the adds
issued in it; no node's log shows a peer frame refused as undecodable or of a form it does not
speak; each node's ``/v1/health`` answers as the code it was started on (its release and range,
or no ``protocol`` key for 0.4.0; cluster protocol 1 until finalize, TARGET after it); finalize
exited 0; after it, every node's ``FORMAT`` file says TARGET and it holds a log segment with a
format-TARGET header. ``--plant`` starts the NEW nodes with ``IDC_TEST_FRAME_FORM=TARGET`` (test
only: every peer frame in form TARGET before any finalize, an incompatible frame change
planted): the play must fail. It is refused (exit 2) when the old code speaks TARGET too, as
the planted frames would then be read fine and prove nothing.

    python -m client.chaos.upgrade --old-tree .upgrade/v0.4.0 --seed 1
    python -m client.chaos.upgrade --old-tree .upgrade/v0.5.0 \\
        --old-python .upgrade/venv-0.5.0/bin/python --rate 300 --phase-seconds 8
    python -m client.chaos.upgrade --old-tree .upgrade/v0.4.0 --plant     # must fail

Exit status: 0 VALID, 1 a failure (each said in a line starting ``FAIL:``), 2 the play could not
be made (a tree that does not import, a node that does not start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from client.chaos.history import History
from client.chaos.nemesis import Schedule, choose
from client.chaos.runner import ChaosConfig, _final_reads, latencies
from client.chaos.topology import Topology
from client.chaos.workload import Workload, WorkloadConfig
from client.checker import CounterReport, check
from cluster.core import versions
from cluster.local import NodeCode
from cluster.wal import read_format, segment_format

# A frame header that does not parse: what a stream shows after a blackholed partition dropped
# bytes from the middle of it (the connection is then closed and dialed again). Not counted as a
# refused frame while such a partition may play; counted otherwise (a changed header would be).
DESYNC = re.compile(r"bad frame header")

# the form a planted frame change sends in (test only, cluster/transport/wire.py)
PLANT_ENV = "IDC_TEST_FRAME_FORM"
# what release 0.4.0 and those before it are called: their /v1/health has no protocol key
UNNAMED = "0.4.0 or before"

# A node's log line that says it refused a peer's frame for its encoding: release 0.4.0 closes
# the connection ("peer traffic refused", reason bad_frame, "undecodable frame: ..."); this
# code answers a frame of a form it does not speak with an error ("peer frame from X refused:
# ... newer than this node reads") and closes a connection whose HELLO shares no version
# (reason "version").
REFUSED = re.compile(r"undecodable|\"reason\": \"(bad_frame|version)\"|peer frame from .* refused"
                     r"|newer than this node reads")


@dataclass(frozen=True, slots=True)
class Speaks:
    """What a code speaks and says it is: protocols ``lo`` to ``hi`` and its ``release``;
    ``keyed``: its ``/v1/health`` has a ``protocol`` key (False: release 0.4.0 or before)."""

    lo: int
    hi: int
    release: str | None
    keyed: bool = True

    def words(self) -> str:
        if not self.keyed:
            return f"release {UNNAMED}, speaks protocol 1, no \"protocol\" in /v1/health"
        return f"release {self.release or '?'}, speaks protocol {self.lo} to {self.hi}"

    def answers_as(self, other: Speaks) -> bool:
        """The same range and key; the same release where both name one."""
        return ((self.lo, self.hi, self.keyed) == (other.lo, other.hi, other.keyed)
                and (self.release is None or other.release is None
                     or self.release == other.release))


OLDEST = Speaks(1, 1, UNNAMED, keyed=False)


def answered(health: dict[str, Any]) -> Speaks:
    """What a node's ``/v1/health`` says it speaks: no ``protocol`` key is release 0.4.0 or
    before (protocol 1 only); otherwise ``protocol.speaks`` and ``release``. ``ValueError``
    when the key is there but not understood."""
    proto = health.get("protocol")
    if proto is None:
        return OLDEST
    if not isinstance(proto, dict):
        raise ValueError(f"\"protocol\": {proto!r} is not an object")
    lo, hi = versions.speaks(proto.get("speaks"))
    rel = health.get("release")
    return Speaks(lo, hi, rel if isinstance(rel, str) else None)


# A process of the code itself says what it speaks: its cluster.core.versions (absent before
# 0.5.0: the oldest answer). Run with the code's python, tree and environment, as its nodes are.
PROBE = """import json
try:
    from cluster.core import versions as v
except ImportError:
    print(json.dumps(None))
else:
    print(json.dumps([v.PROTOCOL_MIN, v.PROTOCOL_MAX, v.release()]))
"""


def probe(code: NodeCode) -> Speaks:
    """What ``code`` speaks, from its own ``cluster.core.versions``; ``RuntimeError`` when its
    python cannot say."""
    out = subprocess.run([code.python, "-c", PROBE], cwd=code.cwd, env=code.environ(),
                         capture_output=True, text=True, timeout=60)
    try:
        got = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else ""
    except (ValueError, IndexError):
        got = ""
    if got is None:
        return OLDEST
    if (not isinstance(got, list) or len(got) != 3
            or not all(type(v) is int for v in got[:2]) or not isinstance(got[2], str)):
        raise RuntimeError(f"{code.label}: {code.python} cannot say what its cluster speaks: "
                           f"{(out.stderr.strip() or out.stdout.strip())[-300:]}")
    lo, hi = versions.speaks(got[:2])
    return Speaks(lo, hi, got[2])


@dataclass(frozen=True, kw_only=True)
class UpgradeConfig:
    """old/new: the two codes; phase_seconds: load after each step; min_ack: the fraction of
    the adds completed in a phase it must acknowledge; plant: ``IDC_TEST_FRAME_FORM`` (the new
    code's highest protocol) on the new nodes; data_dir: keep the nodes' data and logs there
    (default: a temporary directory, deleted)."""

    old: NodeCode
    new: NodeCode
    seed: int | None = None
    rate: float = 200.0
    keys: int = 50
    phase_seconds: float = 5.0
    min_ack: float = 0.8
    out_dir: str = "upgrade-out"
    data_dir: str | None = None
    plant: bool = False
    nemeses: tuple[str, ...] = ()  # network faults played throughout (``WITH_RESTARTS``)
    ready_timeout: float = 60.0
    finalize_timeout: float = 60.0
    quiet_timeout: float = 20.0


@dataclass(slots=True)
class Phase:
    name: str
    codes: dict[str, str]  # node -> the code it runs at the phase's end
    seconds: float
    invoked: int
    ok: int
    info: int
    fail: int
    refused: dict[str, int]  # node -> refused-frame log lines written during the phase
    note: str = ""

    @property
    def completed(self) -> int:
        return self.ok + self.info + self.fail

    @property
    def ack_fraction(self) -> float:
        """Acknowledged of the adds issued or completed in the phase, whichever is more (a
        phase whose adds hang completes none)."""
        asked = max(self.invoked, self.completed)
        return self.ok / asked if asked else 0.0

    def line(self, index: int, total: int) -> str:
        codes = " ".join(f"{n}={c}" for n, c in sorted(self.codes.items()))
        refused = ", ".join(f"{n} {k}" for n, k in sorted(self.refused.items()) if k)
        return (f"phase {index}/{total} {self.name:<12} [{codes}] {self.seconds:5.1f} s: "
                f"adds {self.invoked} ok {self.ok} info {self.info} fail {self.fail} "
                f"({100 * self.ack_fraction:.0f}% acked), "
                f"{self.ok / self.seconds if self.seconds else 0:.0f} acks/s"
                + (f"; refused frames: {refused}" if refused else "")
                + (f"; {self.note}" if self.note else ""))


@dataclass(slots=True)
class UpgradeResult:
    report: CounterReport
    phases: list[Phase]
    failures: list[str]
    finalize: str  # "ok", "skipped: ...", or "failed: ..."
    old_imports: str
    new_imports: str
    healthy: bool
    converged_after_s: float | None
    duration_s: float
    history_path: str
    latency_ms: dict[str, float] = field(default_factory=dict)
    old_speaks: str = ""  # what each code answered as (Speaks.words)
    new_speaks: str = ""
    target: int = 0  # the protocol finalize was to reach (the new code's highest)

    @property
    def valid(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k not in ("report", "phases")}
        out["valid"] = self.valid
        out["phases"] = [asdict(p) for p in self.phases]
        out["checker"] = self.report.to_dict()
        return out


class _Play:
    """The steps of one play, with the bookkeeping each phase reports."""

    def __init__(self, cfg: UpgradeConfig, topo: Topology, history: History,
                 load: asyncio.Future[None], total: int, echo: Callable[[str], None],
                 old: Speaks, new: Speaks) -> None:
        self.cfg, self.topo, self.history = cfg, topo, history
        self.load, self.total, self.echo = load, total, echo
        self.codes = {n: "old" for n in topo.ids}
        self.phases: list[Phase] = []
        self.failures: list[str] = []
        # what each code answers as: the old one's as its code says until its nodes' health
        # was read (learn_old), the new one's as its code says
        self.speaks = {"old": old, "new": new}
        self.target = new.hi  # what finalize is to reach
        self.new = (NodeCode(python=cfg.new.python, tree=cfg.new.tree, label="new",
                             env={**cfg.new.env, PLANT_ENV: str(self.target)})
                    if cfg.plant else cfg.new)
        self.finalized = False
        self._log_offsets: dict[str, int] = {}
        self.drops_bytes = "partition" in cfg.nemeses  # its blackhole mode desyncs streams
        self.refused_lines: dict[str, list[str]] = {}

    def code(self, label: str) -> NodeCode:
        return self.new if label == "new" else self.cfg.old

    async def phase(self, name: str, step: Callable[[], Awaitable[str]] | None = None) -> None:
        started = time.monotonic()
        before = dict(self.history.counts)
        note = await step() if step is not None else ""
        await self._let_it_write()
        c = self.history.counts
        ph = Phase(name=name, codes=dict(self.codes), seconds=round(time.monotonic() - started, 2),
                   invoked=c["add:invoke"] - before.get("add:invoke", 0),
                   ok=c["add:ok"] - before.get("add:ok", 0),
                   info=c["add:info"] - before.get("add:info", 0),
                   fail=c["add:fail"] - before.get("add:fail", 0),
                   refused=self.refused_since_last(), note=note)
        self.phases.append(ph)
        self.echo(ph.line(len(self.phases), self.total))
        if ph.ack_fraction < self.cfg.min_ack:
            self.fail(f"phase {name}: {ph.ok} adds acknowledged of {ph.invoked} issued and "
                      f"{ph.completed} completed ({100 * ph.ack_fraction:.0f}%, at least "
                      f"{100 * self.cfg.min_ack:.0f}% required)")
        for node, k in ph.refused.items():
            if k:
                self.fail(f"phase {name}: {node} refused peer frames ({k} log line(s); "
                          f"{describe(self.refused_lines[node][-1])})")

    def fail(self, why: str) -> None:
        self.failures.append(why)
        self.echo(f"  ! {why}")

    async def _let_it_write(self) -> None:
        """``phase_seconds`` of load (a duration, not a condition); the load must still run."""
        done, _ = await asyncio.wait({self.load}, timeout=self.cfg.phase_seconds)
        if done:
            raise RuntimeError(f"the load stopped early: {self.load.exception()!r}"
                               if self.load.exception() else "the load stopped early")

    def refused_since_last(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node_id in self.topo.ids:
            path = self.topo.node(node_id).log_path
            offset = self._log_offsets.get(node_id, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    text = f.read()
            except OSError:
                continue
            self._log_offsets[node_id] = offset + len(text)
            hits = [ln for ln in text.decode(errors="replace").splitlines()
                    if REFUSED.search(ln) and not (self.drops_bytes and DESYNC.search(ln))]
            self.refused_lines.setdefault(node_id, []).extend(hits)
            out[node_id] = len(hits)
        return out

    def formats_on_disk(self) -> str:
        """After finalize: every node's FORMAT file at the finalized version, and a log segment
        written in it (a failure otherwise); what was found, in words."""
        found = []
        for node_id in self.topo.ids:
            directory = self.topo.node(node_id).data_dir
            written = read_format(directory)
            segments = sorted((directory / "log").glob("*.wal"))
            headed = sum(1 for seg in segments if segment_format(seg) == self.target)
            if written != self.target or not headed:
                self.fail(f"{node_id}: FORMAT {written}, {headed} of {len(segments)} log "
                          f"segments in format {self.target} after finalize")
            found.append(f"{node_id} {headed}/{len(segments)}")
        return f"segments in format {self.target}: {', '.join(found)}"

    def restart_step(self, node_id: str, label: str) -> Callable[[], Awaitable[str]]:
        return lambda: self.restart(node_id, label)

    async def restart(self, node_id: str, label: str) -> str:
        """SIGTERM ``node_id``, start it on ``label``'s code, wait until it is ready and check
        that its health answers as that code's."""
        t0 = time.monotonic()
        self.history.nemesis("start", "upgrade", node=node_id, code=label)
        await self.topo.restart_with_code(node_id, self.code(label))
        if not await self.topo.wait_ready(node_id, self.cfg.ready_timeout):
            raise RuntimeError(f"{node_id} on the {label} code: not ready within "
                               f"{self.cfg.ready_timeout:g} s")
        self.codes[node_id] = label
        self.history.nemesis("stop", "upgrade", node=node_id, code=label)
        await self.check_codes()
        return f"{node_id} restarted on {label} in {time.monotonic() - t0:.1f} s"

    async def learn_old(self) -> None:
        """At the start, every node on the old code: what their ``/v1/health`` says is what
        the old code answers as from then on. They must agree, and agree with what the old
        code's own ``cluster.core.versions`` says."""
        said: dict[str, Speaks] = {}
        for node_id, health in (await self.healths()).items():
            if health is None:
                self.fail(f"{node_id} (old) did not answer /v1/health")
                continue
            try:
                said[node_id] = answered(health)
            except ValueError as exc:
                self.fail(f"{node_id} (old) /v1/health: {exc}")
        answers = set(said.values())
        if len(answers) > 1:
            self.fail("the old nodes' /v1/health disagree: " + "; ".join(
                f"{n} {s.words()}" for n, s in sorted(said.items())))
        elif answers:
            (learned,) = answers
            if not learned.answers_as(self.speaks["old"]):
                self.fail(f"the old nodes' /v1/health say {learned.words()}, but the old "
                          f"code's cluster.core.versions says {self.speaks['old'].words()}")
            self.speaks["old"] = learned
        old, new = self.speaks["old"], self.speaks["new"]
        self.echo(f"old code answers as {old.words()}; new code as {new.words()}; "
                  f"finalize to protocol {self.target}")
        if old.answers_as(new):
            self.echo("  (the two codes answer /v1/health alike: only their imports, checked "
                      "at the start, tell them apart)")

    async def check_codes(self) -> None:
        """Every node's ``/v1/health`` as the code it runs (its range and release, or no
        ``protocol`` key for 0.4.0), at cluster protocol 1 before finalize, the target
        after it."""
        want_cluster = self.target if self.finalized else 1
        for node_id, health in (await self.healths()).items():
            label = self.codes[node_id]
            if health is None:
                self.fail(f"{node_id} ({label}) did not answer /v1/health")
                continue
            want = self.speaks[label]
            try:
                said = answered(health)
            except ValueError as exc:
                self.fail(f"{node_id} ({label}) /v1/health: {exc}")
                continue
            if not said.answers_as(want):
                self.fail(f"{node_id} was started on the {label} code ({want.words()}) but its "
                          f"/v1/health says {said.words()}")
                continue
            proto = health.get("protocol")
            if isinstance(proto, dict) and proto.get("cluster") != want_cluster:
                when = "after finalize" if self.finalized else "before any finalize"
                self.fail(f"{node_id} ({label}) says cluster protocol "
                          f"{proto.get('cluster')!r} {when}, not {want_cluster}")

    async def healths(self) -> dict[str, dict[str, Any] | None]:
        async def one(s: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with s.get(f"{url}/v1/health") as resp:
                    body = await resp.json()
                    return body if isinstance(body, dict) else None
            return None

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
            ids = self.topo.ids
            got = await asyncio.gather(*(one(s, self.topo.node_urls[i]) for i in ids))
        return dict(zip(ids, got, strict=True))

    async def run_finalize(self, timeout: float) -> tuple[int | None, str]:
        """``python -m cluster finalize --via <every node> --timeout timeout`` on the new
        code: its exit status (None: it did not exit in time) and its last line."""
        code = self.new
        via = ",".join(self.topo.node(i).address for i in self.topo.ids)
        argv = [code.python, "-m", "cluster", "finalize", "--via", via,
                "--timeout", f"{timeout:g}"]
        assert self.topo.cluster is not None
        if self.topo.cluster.secret_file is not None:
            argv += ["--secret-file", str(self.topo.cluster.secret_file)]
        self.history.nemesis("start", "finalize", via=via)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=code.cwd, env=code.environ(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout + 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None, f"no exit within {timeout + 30:g} s"
        said = out.decode(errors="replace").strip().splitlines()
        last = said[-1].strip() if said else ""
        self.history.nemesis("stop", "finalize", code=proc.returncode, said=last[:200])
        return proc.returncode, last

    async def refused_finalize(self, old_node: str) -> str:
        """While ``old_node`` runs the old code, finalize must be refused (exit 1; given 5 s,
        as it may wait that long for members to install what it finalized). Not tried when
        the old code speaks the target too: finalize would then be allowed (said so)."""
        if not await has_finalize(self.new):
            return ""
        old = self.speaks["old"]
        if old.hi >= self.target:
            return (f"finalize not tried: the old code speaks protocol {self.target} too "
                    f"({old.words()}), so it would be allowed; no refusal expected")
        t0 = time.monotonic()
        status, last = await self.run_finalize(timeout=5.0)
        if status != 1:
            self.fail(f"finalize with {old_node} on the old code exited {status}, not 1 "
                      f"(refused): {last}")
        return (f"finalize refused in {time.monotonic() - t0:.1f} s (exit {status}: "
                f"{last[:160]})")

    async def finalize(self) -> str:
        """Finalize on the new code: exit 0, then every node's health says cluster protocol
        ``target``. Skipped (said so) when the new code has no such command."""
        if not await has_finalize(self.new):
            return (f"skipped: {self.new.tree or 'this tree'} has no "
                    "`python -m cluster finalize`")
        deadline = time.monotonic() + self.cfg.finalize_timeout
        tries = 0
        while True:  # under network faults a member may look down: asked again, as an
            tries += 1  # operator would (refused means nothing changed)
            status, last = await self.run_finalize(self.cfg.finalize_timeout)
            if status == 0 or not self.cfg.nemeses or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        if status != 0:
            self.fail(f"finalize exited {status}: {last}")
            return f"failed: exit {status}: {last}"
        asked = f", asked {tries} times" if tries > 1 else ""
        self.finalized = True
        problems = await self._wait_finalized(timeout=15.0)
        for p in problems:
            self.fail(p)
        return (f"ok ({last[:120]}{asked})" if not problems
                else "failed: " + "; ".join(problems))

    async def _wait_finalized(self, timeout: float) -> list[str]:
        """Until every node's health says ``protocol.cluster == target``; what is still wrong
        then."""
        deadline = time.monotonic() + timeout
        while True:
            problems = []
            for node_id, h in (await self.healths()).items():
                proto = (h or {}).get("protocol")
                if not isinstance(proto, dict):
                    problems.append(f"{node_id}: /v1/health has no protocol after finalize")
                elif proto.get("cluster") != self.target:
                    problems.append(f"{node_id}: /v1/health says cluster protocol "
                                    f"{proto.get('cluster')!r} after finalize, not "
                                    f"{self.target}")
            if not problems or time.monotonic() > deadline:
                return problems
            await asyncio.sleep(0.2)


async def _steps(play: _Play, rng: random.Random) -> str:
    """The phases, in order; what finalize came to."""
    ids = play.topo.ids
    await play.learn_old()
    await play.check_codes()
    await play.phase("old")
    for node_id in rng.sample(ids, len(ids)):
        await play.phase(f"upgrade {node_id}", play.restart_step(node_id, "new"))
    back = rng.choice(ids)

    async def rollback() -> str:
        said = await play.restart(back, "old")
        refused = await play.refused_finalize(back)
        return f"{said}; {refused}" if refused else said

    await play.phase(f"rollback {back}", rollback)
    await play.phase(f"forward {back}", play.restart_step(back, "new"))
    finalized = ""

    async def finalize() -> str:
        nonlocal finalized
        finalized = await play.finalize()
        return f"finalize {finalized}"

    await play.phase("finalize", finalize)
    await play.phase("finalized")
    again = rng.choice(ids)

    async def restart_finalized() -> str:  # recovers segments written in the new format
        said = await play.restart(again, "new")
        return f"{said}; {play.formats_on_disk()}"

    await play.phase(f"restart {again}", restart_finalized)
    return finalized


def describe(line: str) -> str:
    """A node's JSON log line, short: its message, reason, peer and detail."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line[:200]
    if not isinstance(rec, dict):
        return line[:200]
    parts = [str(rec.get("msg", ""))]
    parts += [f"{k} {rec[k]}" for k in ("reason", "peer") if rec.get(k)]
    if rec.get("detail"):
        parts.append(str(rec["detail"])[:160])
    return "log: " + ", ".join(p for p in parts if p)


def plants(code: NodeCode) -> bool:
    """Whether ``code``'s source reads ``IDC_TEST_FRAME_FORM`` (else ``--plant`` plants
    nothing)."""
    root = Path(code.tree) if code.tree is not None else Path(code.check()).parent.parent
    return any(PLANT_ENV in f.read_text(errors="replace")
               for f in (root / "cluster").rglob("*.py"))


async def has_finalize(code: NodeCode) -> bool:
    """Whether ``python -m cluster --help`` of ``code`` lists a ``finalize`` command."""
    proc = await asyncio.create_subprocess_exec(
        code.python, "-m", "cluster", "--help", cwd=code.cwd, env=code.environ(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL)
    out, _ = await proc.communicate()
    return b"finalize" in out


# The nemeses that can play while nodes are restarted on other code: faults of the network
# (client and peer links through the proxies). Killing, pausing or cutting a node off its
# clients would fight the play's own restarts.
WITH_RESTARTS = ("lost-ack", "drop", "duplicate", "late-duplicate", "delay", "reset",
                 "partition", "peer-messages")

PHASES = ("old", "upgrade", "upgrade", "upgrade", "rollback", "forward", "finalize",
          "finalized", "restart")
# Snapshots every second: each rotates the log, so segments in the finalized format are
# written, and read back by the last phase's restart, within a phase of a few seconds
NODE_ARGS = ("--snapshot-interval", "1")


async def run_upgrade(cfg: UpgradeConfig, echo: Callable[[str], None] = print) -> UpgradeResult:
    """The play (module docstring). Raises ``RuntimeError`` when it cannot be made."""
    started = time.monotonic()
    old_file, new_file = cfg.old.check(), cfg.new.check()
    if old_file == new_file:
        raise RuntimeError(f"the old and the new code both import {old_file}")
    old_speaks, new_speaks = probe(cfg.old), probe(cfg.new)
    target = new_speaks.hi
    if cfg.plant and not plants(cfg.new):
        raise RuntimeError(f"--plant: the new code ({new_file.parent}) never reads {PLANT_ENV}, "
                           "so nothing would be planted")
    if cfg.plant and old_speaks.hi >= target:
        raise RuntimeError(f"--plant: the old code ({old_speaks.words()}) speaks protocol "
                           f"{target} already, so frames of form {target} planted on the new "
                           "nodes would be read fine and prove nothing")
    echo(f"old code: {cfg.old.python} imports cluster from {old_file.parent}")
    echo(f"new code: {cfg.new.python} imports cluster from {new_file.parent}"
         + (f" (planted: {PLANT_ENV}={target} before finalize)" if cfg.plant else ""))
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    rng = random.Random(cfg.seed)
    # an upper bound: the play stops the load itself once its last phase is done
    bound = len(PHASES) * (cfg.phase_seconds + cfg.ready_timeout) + cfg.finalize_timeout
    wcfg = WorkloadConfig(clients=2, concurrency=4, rate=cfg.rate, duration=bound,
                          keys=cfg.keys, table="upgrade", total_timeout=10.0)
    data_dir = str(Path(cfg.data_dir).absolute()) if cfg.data_dir else None
    try:
        async with Topology(nodes=3, rf=3, seed=rng.randrange(1 << 30), data_dir=data_dir,
                            code=cfg.old, node_args=NODE_ARGS) as topo:
            workload = Workload(wcfg, topo.client_urls, history, seed=rng.randrange(1 << 30))
            history.start = time.monotonic()
            load = asyncio.ensure_future(workload.run())
            play = _Play(cfg, topo, history, load, len(PHASES), echo, old_speaks, new_speaks)
            faults = None
            if cfg.nemeses:
                chosen, skipped = choose(list(cfg.nemeses), topo)
                if skipped:
                    raise RuntimeError(f"--nemesis: cannot play {skipped}")
                schedule = Schedule(chosen, topo, history, random.Random(rng.random()))
                faults = asyncio.ensure_future(schedule.run(time.monotonic() + bound))
            try:
                finalized = await _steps(play, rng)
            finally:
                if faults is not None:
                    faults.cancel()
                    await asyncio.gather(faults, return_exceptions=True)
                    echo(f"nemeses played: {len(schedule.played)} "
                         f"({', '.join(sorted({p['nemesis'] for p in schedule.played}))})")
                workload.finish()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(load, wcfg.total_timeout + 30)
            history.nemesis("heal", "all")
            await topo.heal()
            healthy = await topo.wait_healthy()
            await topo.wait_delivered(cfg.quiet_timeout)
            chaos_cfg = ChaosConfig(workload=wcfg, quiet_timeout=cfg.quiet_timeout)
            converged, in_doubt = await _final_reads(topo, history, chaos_cfg)
            ids = topo.ids
            late = {n: k for n, k in play.refused_since_last().items() if k}
    finally:
        history.close()
    report = check(history.events, nodes=ids)
    failures = list(play.failures)
    if not report.valid:
        failures += [f"checker: {p}" for p in report.problems] or ["checker: INVALID"]
    if not healthy:
        failures.append("some node did not answer /v1/health after the heal")
    for node_id, k in late.items():
        failures.append(f"{node_id} refused peer frames after the last phase ({k} log line(s))")
    if in_doubt:
        failures.append(f"in-doubt ops left after the quiet: {in_doubt}")
    result = UpgradeResult(
        report=report, phases=play.phases, failures=failures, finalize=finalized,
        old_imports=str(old_file.parent), new_imports=str(new_file.parent), healthy=healthy,
        converged_after_s=converged, duration_s=round(time.monotonic() - started, 2),
        history_path=str(out / "history.jsonl"), latency_ms=latencies(history.events),
        old_speaks=play.speaks["old"].words(), new_speaks=play.speaks["new"].words(),
        target=play.target)
    (out / "report.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


def verdict(res: UpgradeResult) -> str:
    r = res.report
    facts = (f"{r.acknowledged} adds acknowledged, {r.indeterminate} outcome unknown, "
             f"{r.reads} reads; over-count {r.over_count}, under-count {r.under_count}; "
             f"{len(res.phases)} phases in {res.duration_s:g} s")
    if res.valid:
        skipped = f" (finalize {res.finalize})" if not res.finalize.startswith("ok") else ""
        return f"VALID: rolling upgrade{skipped}: {facts}"
    return f"INVALID: {len(res.failures)} failure(s): {facts}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m client.chaos.upgrade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-tree", required=True, help="source tree of the release to upgrade "
                    "from (e.g. `git archive v0.4.0` or `git archive v0.5.0` unpacked)")
    ap.add_argument("--old-python", default=sys.executable,
                    help="python of the old code (default: this one, with PYTHONPATH=OLD_TREE)")
    ap.add_argument("--new-tree", default=None,
                    help="source tree of the code to upgrade to (default: this one)")
    ap.add_argument("--new-python", default=sys.executable)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rate", type=float, default=200.0, help="target ops/s in total")
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--phase-seconds", type=float, default=5.0,
                    help="seconds of load after each step")
    ap.add_argument("--min-ack", type=float, default=0.8,
                    help="fraction of the adds completed in each phase it must acknowledge")
    ap.add_argument("--out", default="upgrade-out", help="directory for history and report")
    ap.add_argument("--data-dir", default=None,
                    help="keep the nodes' data and logs (<id>.log) here (default: deleted)")
    ap.add_argument("--nemesis", default="",
                    help="network faults played throughout, one at a time (comma list of "
                         f"{', '.join(WITH_RESTARTS)}); default none")
    ap.add_argument("--plant", action="store_true",
                    help=f"start the new nodes with {PLANT_ENV}=<the new code's highest "
                         "protocol> (test only: an incompatible frame change before finalize); "
                         "the play must fail; refused when the old code speaks that protocol")
    return ap


def _tree_code(tree: str | None, python: str, label: str) -> NodeCode:
    if os.sep in python:  # a path: made absolute, as the node runs in the tree's directory
        python = os.path.abspath(python)  # (not resolved: a venv's python is a symlink)
    if tree is None:
        import cluster

        here = Path(cluster.__file__).resolve().parent.parent
        return NodeCode(python=python, tree=here, label=label)
    path = Path(tree).absolute()
    if not (path / "cluster" / "__init__.py").is_file():
        raise ValueError(f"{tree}: no cluster/ package there")
    return NodeCode(python=python, tree=path, label=label)


def _nemeses(text: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n and n != "none")
    wrong = [n for n in names if n not in WITH_RESTARTS]
    if wrong:
        raise ValueError(f"--nemesis: {', '.join(wrong)} cannot play beside restarts; choose "
                         f"from {', '.join(WITH_RESTARTS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        old = _tree_code(args.old_tree, args.old_python, "old")
        new = _tree_code(args.new_tree, args.new_python, "new")
        if args.data_dir and any(Path(args.data_dir).glob("*/incarnation")):
            raise ValueError(f"--data-dir {args.data_dir} holds the nodes of an earlier run")
        cfg = UpgradeConfig(old=old, new=new, seed=args.seed, rate=args.rate, keys=args.keys,
                            phase_seconds=args.phase_seconds, min_ack=args.min_ack,
                            out_dir=args.out, data_dir=args.data_dir, plant=args.plant,
                            nemeses=_nemeses(args.nemesis))
        res = asyncio.run(run_upgrade(cfg, echo=lambda s: print(s, flush=True)))
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for why in res.failures:
        print(f"FAIL: {why}")
    print(verdict(res))
    print(f"report: {os.path.join(args.out, 'report.json')}")
    return 0 if res.valid else 1


if __name__ == "__main__":
    sys.exit(main())
