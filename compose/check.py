"""`make compose-check`: compose/docker-compose.yml under a real container engine, end to end.

Builds the image, starts the five nodes and their proxies, waits until every service is healthy,
writes and reads through the proxies, runs the chaos service inside the compose network
(message faults), runs the chaos driver from the host with --compose-project (kill -9 and pause
of node containers through the docker CLI), checks the restart policy (a crashed node comes
back by itself, a `kill`ed one only when started), adds a sixth node the way compose/README.md
says (`up -d n6`: it joins the running cluster, the others are not restarted), decommissions it
(`exec n1 python -m cluster decommission n6 ...`: it exits 0 and stays down) with writes and
their retries going on throughout, checks every count on every replica, and removes everything
with `down -v`.

Every host port is a free one (the IDC_*_PORT variables of the compose file) and the project
name is fresh, so the check runs beside `python -m cluster up` or a compose cluster of one's own.
Needs a reachable engine and docker-compose (v1) or the compose plugin (v2); not part of
`make test` (CI has no engine). Exit status: 0 every step passed, 1 a step failed, 2 no engine.

    python compose/check.py [--compose "docker compose"] [--chaos-duration 40] [--keep]
                            [--steps smoke,chaos,faults,restart,elastic]

`--steps elastic` (what tests/test_compose.py runs when an engine is reachable) is build, up,
the elastic step and `down -v`: about a minute, plus the build when the image is not cached.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMPOSE_FILE = HERE / "docker-compose.yml"
NODES = [f"n{i}" for i in range(1, 6)]
JOINER = "n6"  # the service of profile `elastic` that joins the running cluster
PORT_VARS = ([f"IDC_N{i}_PORT" for i in range(1, 7)] + [f"IDC_PROXY_N{i}_PORT" for i in range(1, 6)]
             + [f"IDC_CONTROL_N{i}_PORT" for i in range(1, 6)])
# compose/README.md, "Removing a node" (there without -T: a terminal is fine by hand)
DECOMMISSION = ["exec", "-T", "n1", "python", "-m", "cluster", "decommission", JOINER, "--via",
                "n1:7101", "--secret-file", "/run/secrets/cluster_secret"]
STEPS = ("smoke", "chaos", "faults", "restart", "elastic")
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
T0 = time.monotonic()


class CheckFailed(Exception):
    pass


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def run(argv: list[str], *, timeout: float = 600, check: bool = True,
        env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=HERE,
                       env=env, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise CheckFailed(f"{shlex.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}"
                          f"\n{r.stderr[-3000:]}")
    if not quiet and r.returncode != 0:
        say(f"  ({shlex.join(argv[:4])}... exit {r.returncode})")
    return r


def wait_for(what: str, cond: Any, timeout: float, interval: float = 0.5) -> float:
    """Poll ``cond()`` until true; the seconds it took. Raises after ``timeout``."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
    return time.monotonic() - start


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http(method: str, url: str, body: dict[str, Any] | None = None,
         timeout: float = 5) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (OSError, ValueError):
        return 0, None


def find_compose(choice: str | None) -> list[str]:
    if choice:
        return shlex.split(choice)
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return ["docker", "compose"]
    raise SystemExit("error: neither docker-compose (v1) nor the docker compose plugin (v2) "
                     "is installed")


class Check:
    def __init__(self, compose: list[str], chaos_duration: float, tmp: Path) -> None:
        self.project = f"idccheck{secrets.token_hex(3)}"
        self.tmp = tmp
        ports = free_ports(len(PORT_VARS))
        self.ports = dict(zip(PORT_VARS, map(str, ports), strict=True))
        secret = tmp / "cluster_secret"
        secret.write_text(secrets.token_urlsafe(32) + "\n")
        # Compose bind-mounts the file with its host owner and mode; the nodes run as uid 10001
        if os.geteuid() == 0:
            os.chown(secret, 10001, 10001)
            secret.chmod(0o600)
        else:
            secret.chmod(0o644)  # inside a 0700 temp dir: only this user (and the nodes) read it
        self.env = {**os.environ, **self.ports, "IDC_SECRET_FILE": str(secret),
                    "COMPOSE_PROJECT_NAME": self.project}
        self.compose = [*compose, "-p", self.project, "-f", str(COMPOSE_FILE)]
        self.chaos_duration = chaos_duration
        self.results: dict[str, Any] = {}

    def dc(self, *args: str, timeout: float = 600, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
        return run([*self.compose, *args], timeout=timeout, check=check, env=self.env)

    def node_url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[f'IDC_{node.upper()}_PORT']}"

    def proxy_url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[f'IDC_PROXY_{node.upper()}_PORT']}"

    def containers(self) -> dict[str, str]:
        out = run(["docker", "ps", "--all", "--no-trunc", "--filter",
                   f"label={PROJECT_LABEL}={self.project}", "--format",
                   f'{{{{.ID}}}} {{{{.Label "{SERVICE_LABEL}"}}}}'], timeout=60).stdout
        return {svc: cid for cid, svc in (ln.split() for ln in out.splitlines() if ln.strip())}

    def state(self, cid: str) -> dict[str, Any]:
        out = run(["docker", "inspect", "--format", "{{json .State}}|{{.RestartCount}}", cid],
                  timeout=60).stdout.strip()
        state_json, _, restarts = out.rpartition("|")
        state: dict[str, Any] = json.loads(state_json)
        state["RestartCount"] = int(restarts)
        return state

    def healthy(self, services: list[str]) -> bool:
        found = self.containers()
        return all(s in found and (self.state(found[s]).get("Health") or {}).get("Status")
                   == "healthy" for s in services)

    # -- the steps -------------------------------------------------------------------------

    def build(self) -> None:
        start = time.monotonic()
        r = self.dc("build")
        # compose prints "Building <service>" for each service it builds (v1 and v2 alike)
        built = [ln for ln in (r.stdout + r.stderr).splitlines()
                 if re.fullmatch(r"(#\d+ \[)?Building [\w-]+\]?", ln.strip())]
        self.results["build_s"] = round(time.monotonic() - start, 1)
        say(f"build: {self.results['build_s']} s; built by {len(built) or '?'} service(s): "
            f"{', '.join(b.split()[1] for b in built) or '(see compose output)'}")
        if len(built) > 1:
            raise CheckFailed(f"the image was built {len(built)} times: {built}")

    def up(self) -> None:
        start = time.monotonic()
        self.dc("up", "-d")
        services = NODES + [f"proxy-{n}" for n in NODES]
        wait_for("every node and proxy healthy", lambda: self.healthy(services), 180, 1.0)
        self.results["healthy_s"] = round(time.monotonic() - start, 1)
        say(f"up: 5 nodes + 5 proxies healthy {self.results['healthy_s']} s after `up -d`")
        for n in NODES:
            status, body = http("GET", f"{self.node_url(n)}/v1/ready")
            if status != 200 or body != {"node": n, "ready": True}:
                raise CheckFailed(f"{n}: /v1/ready {status} {body}")
        say("ready: /v1/ready is 200 on every node's host port")
        self.quiet_start()

    def quiet_start(self) -> None:
        """Nodes started together refuse each other's first connections; that is routine and
        logged at debug level until a node is ready, not at info."""
        found, noisy = self.containers(), {}
        for n in NODES:
            r = run(["docker", "logs", found[n]], timeout=60)
            logs = (r.stdout + r.stderr).splitlines()  # the node logs JSON lines to stderr
            before_ready = []
            for line in logs:
                if '"msg": "node ready"' in line:
                    break
                before_ready.append(line)
            loud = [ln for ln in before_ready if '"level": "debug"' not in ln
                    and ("refused" in ln.lower() or "cannot connect" in ln)]
            if loud:
                noisy[n] = loud[:3]
        if noisy:
            raise CheckFailed(f"start-up logs connection failures above debug: {noisy}")
        say("start-up: no connection failure logged above debug before a node was ready")

    def smoke(self) -> None:
        status, body = http("POST", f"{self.proxy_url('n1')}/v1/counters/check/k",
                            {"op_id": "check:1", "delta": 5})
        if (status, body) != (200, {"applied": True}):
            raise CheckFailed(f"write via proxy-n1: {status} {body}")
        status, body = http("POST", f"{self.proxy_url('n2')}/v1/counters/check/k",
                            {"op_id": "check:1", "delta": 5})
        if status != 200 or body.get("duplicate") is not True:
            raise CheckFailed(f"retry via proxy-n2 not recognised: {status} {body}")
        status, body = http("GET", f"{self.proxy_url('n3')}/v1/counters/check/k?consistency=all")
        if (status, body) != (200, {"value": 5}):
            raise CheckFailed(f"read via proxy-n3: {status} {body}")
        say("smoke: write via proxy-n1, its retry via proxy-n2 a duplicate, read 5 via proxy-n3")

    def chaos_in_network(self) -> None:
        start = time.monotonic()
        r = self.dc("run", "--rm", "-T", "chaos", "--duration", str(self.chaos_duration / 2),
                    "--seed", "1", timeout=600, check=False)
        out = r.stdout
        self.results["chaos_service"] = {"exit": r.returncode,
                                         "s": round(time.monotonic() - start, 1)}
        say(f"chaos service (in the compose network, message faults): exit {r.returncode}")
        for line in _summary(out):
            say(f"    {line}")
        if r.returncode != 0:
            raise CheckFailed(f"chaos service exit {r.returncode}\n{out[-4000:]}\n"
                              f"{r.stderr[-2000:]}")

    def chaos_process_faults(self) -> None:
        out_dir = self.tmp / "chaos-host"
        urls = ",".join(self.proxy_url(n) for n in NODES)
        argv = [sys.executable, "-m", "client.chaos", "--nodes", urls, "--compose-project",
                self.project, "--nemesis", "kill,pause,lost-ack,duplicate", "--duration",
                str(self.chaos_duration), "--seed", "2", "--no-progress", "--out", str(out_dir)]
        start = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT,
                           env=self.env, stdin=subprocess.DEVNULL)
        say(f"chaos driver from the host, --compose-project (kill -9, pause of containers): "
            f"exit {r.returncode}")
        for line in _summary(r.stdout):
            say(f"    {line}")
        if r.returncode != 0:
            raise CheckFailed(f"host chaos exit {r.returncode}\n{r.stdout[-4000:]}\n"
                              f"{r.stderr[-3000:]}")
        report = json.loads((out_dir / "report.json").read_text())
        played = [p["nemesis"] for p in report["played"]]
        for needed in ("kill", "pause"):
            if needed not in played:
                raise CheckFailed(f"nemesis {needed} never played: {played}")
        checker = report["checker"]
        self.results["chaos_host"] = {
            "s": round(time.monotonic() - start, 1), "valid": report["valid"],
            "played": {n: played.count(n) for n in sorted(set(played))},
            "acknowledged": checker.get("acknowledged"),
            "converged_after_s": report.get("converged_after_s")}

    def restart_policy(self) -> None:
        found = self.containers()
        crashed, stopped = found["n3"], found["n4"]
        before = self.state(crashed)["RestartCount"]
        # a crash: every process of the container killed from inside (not `docker kill`)
        run(["docker", "exec", crashed, "python", "-c",
             "import os, signal; os.kill(-1, signal.SIGKILL)"], timeout=60, check=False,
            quiet=True)
        took = wait_for("n3 restarted by the engine and healthy again", lambda: (
            self.state(crashed)["RestartCount"] > before and self.healthy(["n3"])), 120)
        self.results["crash_restart_healthy_s"] = round(took, 1)
        say(f"restart policy: crashed n3 restarted by the engine, healthy after {took:.1f} s")
        self.dc("kill", "-s", "KILL", "n4")
        state = self.state(stopped)
        if state["Running"] or state.get("Restarting"):
            raise CheckFailed(f"n4 still running after `kill`: {state}")
        # The engine treats `kill` as a manual stop: nothing restarts it. Watched for twice the
        # time a crash took to come back (at least 5 s): still down.
        watch = max(5.0, 2 * took)
        deadline = time.monotonic() + watch
        while time.monotonic() < deadline:
            if self.state(stopped)["Running"]:
                raise CheckFailed("n4 came back after `kill`: the docs say it does not")
            time.sleep(0.5)
        self.dc("start", "n4")
        took = wait_for("n4 healthy after `start`", lambda: self.healthy(["n4"]), 120)
        say(f"restart policy: killed n4 stayed down {watch:.0f} s; `start n4` healthy after "
            f"{took:.1f} s")
        status, body = http("GET", f"{self.proxy_url('n4')}/v1/counters/check/k?consistency=one")
        if (status, body) != (200, {"value": 5}):
            raise CheckFailed(f"n4 lost its data across kill -9: {status} {body}")
        say("data: n4 reads the smoke write (5) from its own volume after kill -9 and start")

    def ring(self, node: str) -> dict[str, Any] | None:
        status, body = http("GET", f"{self.node_url(node)}/v1/ring")
        return body if status == 200 and isinstance(body, dict) else None

    def states_of(self, member: str, nodes: list[str]) -> dict[str, str | None]:
        """``member``'s state in each node's /v1/ring (None: no answer, or not listed)."""
        out: dict[str, str | None] = {}
        for n in nodes:
            ring = self.ring(n)
            listed = {m["id"]: m["state"] for m in ring["members"]} if ring else {}
            out[n] = listed.get(member)
        return out

    def elastic(self) -> None:
        """compose/README.md's "Adding a node" and "Removing a node", with writes (and a retry
        of each at another node) going on throughout, then every count checked on every
        replica."""
        found = self.containers()
        started = {n: self.state(found[n])["StartedAt"] for n in NODES}
        writer = Writer([self.node_url(n) for n in NODES])
        writer.burst(120, "before")
        say(f"elastic: {writer.acked} increments acknowledged before n6")
        writer.start()
        try:
            t0 = time.monotonic()
            self.dc("up", "-d", JOINER)
            wait_for("n6 healthy after `up -d n6`", lambda: self.healthy([JOINER]), 90)
            healthy_s = time.monotonic() - t0
            writer.urls.append(self.node_url(JOINER))  # it serves while it joins
            members = [*NODES, JOINER]
            wait_for("n6 normal in every member's /v1/ring", lambda: set(
                self.states_of(JOINER, members).values()) == {"normal"}, 120)
            normal_s = time.monotonic() - t0
            self.results["join"] = {"healthy_s": round(healthy_s, 1),
                                    "normal_everywhere_s": round(normal_s, 1)}
            say(f"add: `up -d n6`; n6 healthy after {healthy_s:.1f} s, `normal` in all six "
                f"/v1/ring after {normal_s:.1f} s")
            found = self.containers()
            restarted = {n: self.state(found[n])["StartedAt"] for n in NODES
                         if self.state(found[n])["StartedAt"] != started[n]}
            if restarted:
                raise CheckFailed(f"`up -d n6` restarted other nodes: {sorted(restarted)}")
            writer.burst(120, "with n6")
            status, health = http("GET", f"{self.node_url(JOINER)}/v1/health")
            held = health.get("counters") if status == 200 and health else None
            if not held:
                raise CheckFailed(f"n6 holds no counter after joining: {status} {health}")
            say(f"n6 holds {held} counters; {writer.acked} increments acknowledged so far, "
                f"writes continuing")
            t0 = time.monotonic()
            r = self.dc(*DECOMMISSION, "--timeout", "120", timeout=180, check=False)
            took = time.monotonic() - t0
            writer.urls.remove(self.node_url(JOINER))
            lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
            say(f"remove: `{' '.join(DECOMMISSION[3:])}` exit {r.returncode} after {took:.1f} s")
            for line in lines[:1] + lines[-1:]:
                say(f"    {line.strip()}")
            if r.returncode != 0:
                raise CheckFailed(f"decommission exit {r.returncode}\n{r.stdout[-3000:]}\n"
                                  f"{r.stderr[-3000:]}")
            n6 = found[JOINER]
            wait_for("n6 container exited", lambda: not self.state(n6)["Running"], 60)
            # the restart policy must leave it down: watched for 5 s
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                state = self.state(n6)
                if state["Running"] or state.get("Restarting") or state["RestartCount"]:
                    raise CheckFailed(f"n6 came back after its decommission: {state}")
                time.sleep(0.5)
            if state["ExitCode"] != 0:
                raise CheckFailed(f"n6 exited {state['ExitCode']} after its decommission")
            self.results["decommission"] = {"s": round(took, 1), "n6_exit": state["ExitCode"]}
            say("n6: exited 0, stayed down 5 s (restart: on-failure), RestartCount 0")
            left = self.states_of(JOINER, NODES)
            if set(left.values()) != {"left"}:
                raise CheckFailed(f"n6 not `left` in every remaining /v1/ring: {left}")
            writer.burst(60, "after")
        finally:
            writer.stop()
        if writer.problems:
            raise CheckFailed("writes: " + "; ".join(writer.problems[:5]))
        self.exact_on_every_replica(writer)

    def exact_on_every_replica(self, writer: Writer) -> None:
        """Every node reads every key at consistency=one (a node holding the key reads its own
        copy, so every replica is read) and at all: the acknowledged count, exactly."""
        expected = writer.expected

        def wrong() -> dict[str, Any]:
            bad: dict[str, Any] = {}
            for key, want in expected.items():
                for n in NODES:
                    status, body = http("GET", f"{self.node_url(n)}/v1/counters/elastic/{key}"
                                        "?consistency=one")
                    if (status, body) != (200, {"value": want}):
                        bad[f"{n}:{key}"] = (status, body, want)
            return bad

        try:
            took = wait_for("every replica at the exact count", lambda: not wrong(), 30, 1.0)
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}: {dict(list(wrong().items())[:8])}") from None
        for key, want in expected.items():
            status, body = http("GET", f"{self.node_url('n1')}/v1/counters/elastic/{key}"
                                "?consistency=all")
            if (status, body) != (200, {"value": want}):
                raise CheckFailed(f"consistency=all {key}: {status} {body}, expected {want}")
        ports = {self.ports[f"IDC_{n.upper()}_PORT"]: n for n in [*NODES, JOINER]}
        where = [f"{ports.get(f.split(':')[0], '?')} {f.split(':', 1)[1]}"
                 for f in writer.failed_at]
        failed = f" ({', '.join(where)})" if where else ""
        self.results["elastic_writes"] = {"acknowledged": writer.acked,
                                          "retries_recognised": writer.duplicates,
                                          "retries_failed": writer.retries_failed,
                                          "keys": len(expected)}
        say(f"counts: {writer.acked} increments over {len(expected)} keys, each retried at "
            f"another node: {writer.duplicates} recognised as duplicates, "
            f"{writer.retries_failed} retries failed{failed}, none counted twice; every key "
            f"exact on every node at consistency=one ({took:.1f} s after the last write) and "
            f"at all")

    def down(self) -> None:
        self.dc("down", "-v", "--remove-orphans", timeout=300)
        left = run(["docker", "ps", "-a", "-q", "--filter", f"label={PROJECT_LABEL}="
                    f"{self.project}"], timeout=60).stdout.split()
        vols = run(["docker", "volume", "ls", "-q", "--filter", f"label={PROJECT_LABEL}="
                    f"{self.project}"], timeout=60).stdout.split()
        if left or vols:
            raise CheckFailed(f"left after down -v: containers {left}, volumes {vols}")
        say("down -v: no container or volume of the project left")


class Writer:
    """Increments by 1 of keys in table ``elastic``, each with its own op id, sent to one node
    and, once acknowledged, retried with the same op id at another node (which must answer
    duplicate). An attempt that fails is sent again, same op id, to the next node; every
    attempt and retry is sent within 8 s of the first (inside the 10 s dedup window, where a
    retry must never count twice). ``burst`` writes in the caller's thread; ``start`` keeps
    writing in a thread of its own until ``stop``."""

    KEYS = 24

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.expected: dict[str, int] = {f"k{i}": 0 for i in range(self.KEYS)}
        self.acked = self.duplicates = self.retries_failed = 0
        self.problems: list[str] = []
        self.failed_at: list[str] = []  # "port:status error" of failed retries (0: no answer)
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def one(self, tag: str) -> None:
        with self._lock:
            self._seq += 1
            seq = self._seq
        key, op = f"k{seq % self.KEYS}", {"op_id": f"check-{tag}:{seq}", "delta": 1}
        start = time.monotonic()
        attempt = 0
        while True:
            urls = list(self.urls)
            url = urls[(seq + attempt) % len(urls)]
            status, body = http("POST", f"{url}/v1/counters/elastic/{key}", op, timeout=2)
            if status == 200:
                break
            attempt += 1
            if time.monotonic() - start > 5.5:
                self.problems.append(f"{op['op_id']} not acknowledged within 8 s: {status} "
                                     f"{body}")
                return
            time.sleep(0.2)
        with self._lock:
            self.expected[key] += 1
            self.acked += 1
        if time.monotonic() - start > 6:
            return  # a retry now might land after the window: not a fair test
        other = urls[(seq + attempt + 1) % len(urls)]
        status, retry = http("POST", f"{other}/v1/counters/elastic/{key}", op, timeout=2)
        if status == 200 and retry.get("duplicate") is True:
            with self._lock:
                self.duplicates += 1
        elif status == 200:
            self.problems.append(f"{op['op_id']}: retry at {other} counted again: {retry}")
        else:  # the retry itself got no answer: the op it repeats stays counted once
            with self._lock:
                self.retries_failed += 1
                err = retry.get("error") if isinstance(retry, dict) else None
                why = err.get("code", "") if isinstance(err, dict) else ""
                self.failed_at.append(f"{other.rsplit(':', 1)[1]}:{status} {why}".strip())

    def burst(self, n: int, tag: str) -> None:
        for _ in range(n):
            self.one(tag)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self.one("bg")
                self._stop.wait(0.05)

        self._thread = threading.Thread(target=loop, name="writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def _summary(out: str) -> list[str]:
    keep = ("VALID", "INVALID", "adds", "nemeses played", "ack latency",
            "converged", "skipped", "double", "lost")
    return [ln.strip() for ln in out.splitlines() if ln.strip().startswith(keep)
            or any(k in ln for k in ("VALID", "nemeses played"))][:12]


def _steps(text: str) -> list[str]:
    steps = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step(s) {unknown}; known: {','.join(STEPS)}")
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python compose/check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compose", default=os.environ.get("IDC_COMPOSE"),
                    help="compose command (default: docker-compose, else docker compose)")
    ap.add_argument("--chaos-duration", type=float, default=40.0,
                    help="seconds of the host chaos run (the in-network one gets half)")
    ap.add_argument("--keep", action="store_true", help="leave the project up (no down -v)")
    ap.add_argument("--steps", type=_steps, default=list(STEPS),
                    help=f"after build and up, these steps in this order (default: "
                         f"{','.join(STEPS)}; restart reads smoke's write); "
                         f"`--steps elastic` takes about a minute")
    args = ap.parse_args(argv)
    compose = find_compose(args.compose)
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        print(f"error: no container engine reachable (docker info: {info.stderr.strip()[:200]})",
              file=sys.stderr)
        return 2
    version = run([*compose, "version", "--short"], check=False, quiet=True).stdout.strip()
    say(f"engine {info.stdout.strip()}, compose: {shlex.join(compose)} {version}")
    with tempfile.TemporaryDirectory(prefix="idc-compose-check-") as tmp:
        check = Check(compose, args.chaos_duration, Path(tmp))
        say(f"project {check.project}; host ports {min(check.ports.values())}.."
            f"{max(check.ports.values())} (free ones)")
        failed = False
        try:
            steps = {"smoke": check.smoke, "chaos": check.chaos_in_network,
                     "faults": check.chaos_process_faults, "restart": check.restart_policy,
                     "elastic": check.elastic}
            for step in [check.build, check.up, *(steps[s] for s in args.steps)]:
                step()
        except CheckFailed as exc:
            failed = True
            say(f"FAILED: {exc}")
            # every node by name, n6 (a service of a profile) included
            logs = check.dc("logs", "--no-color", "--tail", "20", *NODES, JOINER, check=False)
            print(logs.stdout[-6000:], file=sys.stderr)
        finally:
            if not args.keep:
                try:
                    check.down()
                except CheckFailed as exc:
                    failed = True
                    say(f"FAILED: {exc}")
    if failed:
        return 1
    say("compose-check passed: " + json.dumps(check.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
