"""client.chaos.containers against a stand-in docker CLI (a script keeping container states in a
JSON file): which containers it picks by compose labels, and which docker commands each fault
and heal runs. `make compose-check` runs the same code against a real engine."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from client.chaos.containers import ComposeNodes, DockerError

FAKE_DOCKER = r'''
import json, sys
state_path, log_path = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
with open(state_path) as f:
    state = json.load(f)
with open(log_path, "a") as f:
    f.write(json.dumps(args) + "\n")
cmd, rest = args[0], args[1:]
if cmd == "ps":
    labels = dict(v.split("=", 1)[1].split("=", 1) for k, v in zip(rest, rest[1:])
                  if k == "--filter")
    for cid, c in state.items():
        if all(c["labels"].get(k) == v for k, v in labels.items()):
            print(cid)
    sys.exit(0)
cid = rest[-1]
if cid not in state:
    print(f"Error: No such container: {cid}", file=sys.stderr)
    sys.exit(1)
c = state[cid]
if cmd == "inspect":
    print(json.dumps({"Status": c["status"], "Running": c["status"] in ("running", "paused"),
                      "Paused": c["status"] == "paused", "Restarting": False,
                      "ExitCode": c.get("exit", 0)}) + "|" + str(c.get("restarts", 0)))
elif cmd == "kill":
    c["status"], c["exit"] = "exited", 137
elif cmd == "start":
    c["status"] = "running"
elif cmd == "pause":
    c["status"] = "paused"
elif cmd == "unpause":
    c["status"] = "running"
with open(state_path, "w") as f:
    json.dump(state, f)
'''


def fake_docker(tmp_path: Path, containers: dict[str, dict[str, Any]]) -> tuple[list[str], Path]:
    script = tmp_path / "docker.py"
    script.write_text(FAKE_DOCKER)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    state, log = tmp_path / "state.json", tmp_path / "calls.jsonl"
    state.write_text(json.dumps(containers))
    log.write_text("")
    return [sys.executable, str(script), str(state), str(log)], log


def compose_container(project: str, service: str) -> dict[str, Any]:
    return {"status": "running", "labels": {"com.docker.compose.project": project,
                                            "com.docker.compose.service": service}}


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.timeout(60)
async def test_faults_run_the_docker_commands_on_the_projects_containers(tmp_path: Path) -> None:
    docker, log = fake_docker(tmp_path, {
        "c1": compose_container("idc", "n1"), "c2": compose_container("idc", "n2"),
        "other": compose_container("another", "n1"),  # same service, another project
        "p1": compose_container("idc", "proxy-n1")})
    nodes = ComposeNodes("idc", docker=docker)
    assert await nodes.resolve(["n1", "n2"]) == {"n1": "c1", "n2": "c2"}
    assert calls(log)[0] == ["ps", "--all", "--quiet", "--no-trunc",
                             "--filter", "label=com.docker.compose.project=idc",
                             "--filter", "label=com.docker.compose.service=n1"]
    log.write_text("")

    await nodes.kill("n2")
    assert (await nodes.state("n2"))["ExitCode"] == 137
    await nodes.start("n2")  # exited: started again
    await nodes.start("n1")  # running: left alone
    await nodes.pause("n1")
    await nodes.start("n1")  # paused: thawed, not started
    await nodes.unpause("n1")  # running: nothing to do
    acting = [c for c in calls(log) if c[0] != "inspect"]
    assert acting == [["kill", "--signal", "KILL", "c2"], ["start", "c2"], ["pause", "c1"],
                      ["unpause", "c1"]]
    assert (await nodes.state("n1"))["Running"] and (await nodes.state("n2"))["Running"]


@pytest.mark.timeout(60)
async def test_a_node_without_a_container_is_named(tmp_path: Path) -> None:
    docker, _ = fake_docker(tmp_path, {"c1": compose_container("idc", "n1")})
    with pytest.raises(DockerError, match=r"no single container for node node2 \(0 containers\)"):
        await ComposeNodes("idc", docker=docker).resolve(["n1", "node2"])


@pytest.mark.timeout(60)
async def test_a_failing_docker_command_says_why(tmp_path: Path) -> None:
    docker, _ = fake_docker(tmp_path, {"c1": compose_container("idc", "n1")})
    nodes = ComposeNodes("idc", docker=docker)
    nodes.containers["n9"] = "gone"
    with pytest.raises(DockerError, match="docker kill --signal KILL gone: exit 1: Error: No "
                                          "such container: gone"):
        await nodes.kill("n9")
    missing = ComposeNodes("idc", docker=[str(tmp_path / "no-docker")])
    with pytest.raises(DockerError, match="no-docker: not found"):
        await missing.resolve(["n1"])


def test_cli_gives_each_run_against_given_nodes_a_fresh_table() -> None:
    """The checker takes every counter to start at 0: a second run against the same (compose)
    cluster must not count in the first one's counters."""
    from client.chaos.cli import build_parser, config_from_args

    def cfg(*argv: str) -> Any:
        return config_from_args(build_parser().parse_args(list(argv)))

    assert cfg().workload.table == "chaos"  # a fresh local cluster every run
    first, second = (cfg("--nodes", "http://127.0.0.1:1") for _ in range(2))
    assert first.workload.table.startswith("chaos-") and second.workload.table.startswith(
        "chaos-") and first.workload.table != second.workload.table
    given = cfg("--nodes", "http://127.0.0.1:1", "--table", "t1", "--compose-project", "p")
    assert (given.workload.table, given.compose_project, given.urls) == (
        "t1", "p", ("http://127.0.0.1:1",))


def test_compose_project_needs_the_clusters_urls() -> None:
    from client.chaos.topology import Topology

    with pytest.raises(ValueError, match="--compose-project needs --nodes URLS"):
        Topology(compose_project="idc")
    topo = Topology(urls=["http://127.0.0.1:1"], compose_project="idc")
    assert topo.can_control_processes and topo.containers is not None
    assert not Topology(urls=["http://127.0.0.1:1"]).can_control_processes
