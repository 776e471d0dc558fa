"""`make compose-check`: compose/docker-compose.yml under a real container engine, end to end.

Builds the image, starts the five nodes and their proxies, waits until every service is healthy,
writes and reads through the proxies, runs the chaos service inside the compose network
(message faults), runs the chaos driver from the host with --compose-project (kill -9 and pause
of node containers through the docker CLI), checks the restart policy (a crashed node comes
back by itself, a `kill`ed one only when started), and removes everything with `down -v`.

Every host port is a free one (the IDC_*_PORT variables of the compose file) and the project
name is fresh, so the check runs beside `python -m cluster up` or a compose cluster of one's own.
Needs a reachable engine and docker-compose (v1) or the compose plugin (v2); not part of
`make test` (CI has no engine). Exit status: 0 every step passed, 1 a step failed, 2 no engine.

    python compose/check.py [--compose "docker compose"] [--chaos-duration 40] [--keep]
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
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMPOSE_FILE = HERE / "docker-compose.yml"
NODES = [f"n{i}" for i in range(1, 6)]
PORT_VARS = ([f"IDC_N{i}_PORT" for i in range(1, 6)] + [f"IDC_PROXY_N{i}_PORT" for i in range(1, 6)]
             + [f"IDC_CONTROL_N{i}_PORT" for i in range(1, 6)])
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


def http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
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

    def down(self) -> None:
        self.dc("down", "-v", "--remove-orphans", timeout=300)
        left = run(["docker", "ps", "-a", "-q", "--filter", f"label={PROJECT_LABEL}="
                    f"{self.project}"], timeout=60).stdout.split()
        vols = run(["docker", "volume", "ls", "-q", "--filter", f"label={PROJECT_LABEL}="
                    f"{self.project}"], timeout=60).stdout.split()
        if left or vols:
            raise CheckFailed(f"left after down -v: containers {left}, volumes {vols}")
        say("down -v: no container or volume of the project left")


def _summary(out: str) -> list[str]:
    keep = ("VALID", "INVALID", "adds", "nemeses played", "ack latency",
            "converged", "skipped", "double", "lost")
    return [ln.strip() for ln in out.splitlines() if ln.strip().startswith(keep)
            or any(k in ln for k in ("VALID", "nemeses played"))][:12]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python compose/check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compose", default=os.environ.get("IDC_COMPOSE"),
                    help="compose command (default: docker-compose, else docker compose)")
    ap.add_argument("--chaos-duration", type=float, default=40.0,
                    help="seconds of the host chaos run (the in-network one gets half)")
    ap.add_argument("--keep", action="store_true", help="leave the project up (no down -v)")
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
            for step in (check.build, check.up, check.smoke, check.chaos_in_network,
                         check.chaos_process_faults, check.restart_policy):
                step()
        except CheckFailed as exc:
            failed = True
            say(f"FAILED: {exc}")
            logs = check.dc("logs", "--no-color", "--tail", "20", check=False)
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
