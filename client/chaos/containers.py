"""Process faults on the node containers of a docker-compose project, through the docker CLI:
the same kill (-9) and pause nemeses that a local cluster gets, for a cluster in containers.

A node's container is found by the labels compose puts on every container it makes
(``com.docker.compose.project`` and ``com.docker.compose.service``, the same in compose v1 and
v2), the service being the node's id (``/v1/health``'s ``node``: n1..n5 in compose/).

    kill    docker kill --signal KILL: no drain, no flush. The engine counts it as a manual
            stop, so no restart policy brings the node back; ``start`` does (at heal).
    pause   docker pause: every process of the container frozen (cgroup freezer), as SIGSTOP
            freezes a local node; ``unpause`` thaws it and it sends its stale messages.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


class DockerError(RuntimeError):
    """A docker command failed or timed out; the message says which and why."""


class ComposeNodes:
    """The node containers of compose project ``project``, driven through ``docker``."""

    def __init__(self, project: str, *, docker: Sequence[str] = ("docker",),
                 timeout: float = 60.0) -> None:
        self.project = project
        self.docker = list(docker)
        self.timeout = timeout
        self.containers: dict[str, str] = {}  # node id -> container id

    async def _run(self, *args: str) -> str:
        if shutil.which(self.docker[0]) is None:
            raise DockerError(f"{self.docker[0]}: not found (the docker CLI drives the "
                              f"containers of --compose-project {self.project})")
        proc = await asyncio.create_subprocess_exec(
            *self.docker, *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise DockerError(f"docker {' '.join(args)}: no answer in {self.timeout}s") from None
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()
            raise DockerError(f"docker {' '.join(args)}: exit {proc.returncode}: "
                              f"{why[-1] if why else '(no message)'}")
        return out.decode(errors="replace")

    async def resolve(self, node_ids: Sequence[str]) -> dict[str, str]:
        """Find each node's container (the compose service named as the node); raises naming
        the nodes without one."""
        missing = []
        for node_id in node_ids:
            out = await self._run("ps", "--all", "--quiet", "--no-trunc",
                                  "--filter", f"label={PROJECT_LABEL}={self.project}",
                                  "--filter", f"label={SERVICE_LABEL}={node_id}")
            ids = out.split()
            if len(ids) != 1:
                missing.append(f"{node_id} ({len(ids)} containers)")
                continue
            self.containers[node_id] = ids[0]
        if missing:
            raise DockerError(
                f"compose project {self.project!r}: no single container for node "
                f"{', '.join(missing)}; the node ids /v1/health reports must be the project's "
                f"service names (docker ps --filter label={PROJECT_LABEL}={self.project})")
        return dict(self.containers)

    async def state(self, node_id: str) -> dict[str, object]:
        """The container's ``State`` (Status, Running, Paused, Restarting, ExitCode, ...) and
        its ``RestartCount``."""
        out = await self._run("inspect", "--format",
                              "{{json .State}}|{{.RestartCount}}", self.containers[node_id])
        state_json, _, restarts = out.strip().rpartition("|")
        state: dict[str, object] = json.loads(state_json)
        state["RestartCount"] = int(restarts)
        return state

    async def kill(self, node_id: str) -> None:
        await self._run("kill", "--signal", "KILL", self.containers[node_id])

    async def start(self, node_id: str) -> None:
        """Start the container unless it runs already (the engine may be restarting it)."""
        state = await self.state(node_id)
        if state.get("Paused"):
            await self.unpause(node_id)
        elif not state.get("Running") and not state.get("Restarting"):
            await self._run("start", self.containers[node_id])

    async def pause(self, node_id: str) -> None:
        await self._run("pause", self.containers[node_id])

    async def unpause(self, node_id: str) -> None:
        state = await self.state(node_id)
        if state.get("Paused"):
            await self._run("unpause", self.containers[node_id])
