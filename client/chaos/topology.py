"""The system under test: nodes (local processes or given URLs), an HTTP proxy in front of every
node's client port and, when the node supports ``--connect-via``, a peer proxy on every directed
link (n1->n2 is one proxy, n2->n1 another), so partitions cut exactly the links they name.
Given URLs of a docker-compose cluster and its project name, the process faults (kill, pause)
act on the node containers instead (``client.chaos.containers``).

The members change under the membership nemesis (``client.chaos.membership``): a node that
joins gets a client proxy of its own (its peer traffic goes direct: a joining node dials the
addresses of the ring), one that left or was replaced loses its proxy and is neither faulted,
healed nor read again; whoever watches ``on_members`` (the workload's clients) is told the
client URLs of the members each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from client.chaos.containers import ComposeNodes
from client.config import normalize_url
from client.proxy import Proxy, ProxyServer
from cluster.local import LocalCluster, NodeCode, NodeProcess, free_ports


@functools.cache
def node_supports(flag: str) -> bool:
    """Whether ``python -m cluster.node --help`` lists ``flag``."""
    out = subprocess.run([sys.executable, "-m", "cluster.node", "--help"], capture_output=True,
                         text=True, timeout=60)
    return flag in out.stdout


class Topology:
    """Owns the cluster (when local), the proxies, and the process-level faults."""

    def __init__(self, *, nodes: int = 3, rf: int = 3, urls: Sequence[str] = (),
                 node_args: Sequence[str] = (), proxy_peers: bool | None = None,
                 seed: int | None = None, data_dir: str | None = None,
                 compose_project: str | None = None, code: NodeCode | None = None) -> None:
        self.external = [normalize_url(u) for u in urls]
        self.code = code  # what local nodes start on (None: this code)
        if compose_project and not self.external:
            raise ValueError("--compose-project needs --nodes URLS (the compose cluster's)")
        self.containers = ComposeNodes(compose_project) if compose_project else None
        self.n = len(self.external) or nodes
        self.rf = rf
        self.node_args = list(node_args)
        self.data_dir = data_dir
        if data_dir is not None and "--keep-log" not in self.node_args and not self.external:
            # kept for --explain: archive what snapshots cover instead of deleting it
            self.node_args.append("--keep-log")
        want = proxy_peers if proxy_peers is not None else True
        self.peer_links = bool(want and not self.external and node_supports("--connect-via"))
        self.proxies = ProxyServer(seed=seed)
        self.cluster: LocalCluster | None = None
        self.client_proxies: dict[str, Proxy] = {}
        self.link_proxies: dict[tuple[str, str], Proxy] = {}
        self.node_urls: dict[str, str] = {}
        self.paused: set[str] = set()
        self.killed: set[str] = set()
        # membership: ids that left (or were replaced), and who wants the new client URLs
        self.departed: list[str] = []
        self.membership_changed = False
        self.on_members: list[Callable[[list[str]], Awaitable[None]]] = []
        self._retired_counters: dict[str, dict[str, int]] = {}

    @property
    def ids(self) -> list[str]:
        """The current members (a node that left is not one)."""
        return list(self.node_urls)

    @property
    def linked_ids(self) -> list[str]:
        """The members whose peer links go through proxies (those started with the cluster:
        a node that joined later dials its peers directly)."""
        return [i for i in self.node_urls if any(src == i for src, _ in self.link_proxies)]

    @property
    def can_control_processes(self) -> bool:
        return self.cluster is not None or self.containers is not None

    @property
    def client_urls(self) -> list[str]:
        return [p.url for p in self.client_proxies.values()]

    async def __aenter__(self) -> Topology:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        await self.proxies.start()
        try:
            if self.external:
                await self._adopt_external()
                if self.containers is not None:
                    await self.containers.resolve(list(self.node_urls))
            else:
                await self._start_local()
            for node_id, url in self.node_urls.items():
                upstream = url.split("://", 1)[1]
                self.client_proxies[node_id] = await self.proxies.create(
                    f"client-{node_id}", "127.0.0.1:0", upstream, protocol="http")
        except BaseException:
            await self.stop()
            raise

    async def _adopt_external(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            for i, url in enumerate(self.external):
                node_id = f"node{i + 1}"
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with s.get(f"{url}/v1/health") as resp:
                        node_id = str((await resp.json()).get("node", node_id))
                self.node_urls[node_id] = url

    async def _start_local(self) -> None:
        ids = [f"n{i + 1}" for i in range(self.n)]
        per_node: dict[str, list[str]] = {}
        if self.peer_links:
            host = "127.0.0.1"
            listen = dict(zip(ids, free_ports(self.n), strict=True))
            for src, dst in directed_links(ids):
                self.link_proxies[(src, dst)] = await self.proxies.create(
                    f"link-{src}-{dst}", "127.0.0.1:0", f"{host}:{listen[dst]}", protocol="peer")
            for src in ids:
                per_node[src] = connect_via_args(src, {
                    dst: p.listen for (s, dst), p in self.link_proxies.items() if s == src})
            self.cluster = LocalCluster(self.n, rf=self.rf, base_port=None,
                                        data_dir=self.data_dir, extra_args=self.node_args,
                                        node_args=per_node, code=self.code)
            _pin_ports(self.cluster, listen)
        else:
            self.cluster = LocalCluster(self.n, rf=self.rf, data_dir=self.data_dir,
                                        extra_args=self.node_args, code=self.code)
        await self.cluster.start()
        self.node_urls = {n.id: n.url for n in self.cluster.nodes.values()}

    async def stop(self) -> None:
        try:
            for node_id in list(self.paused):
                await self.resume(node_id)
            if self.containers is not None:  # leave the compose cluster as it was found
                for node_id in list(self.killed):
                    await self.containers.start(node_id)
            await self.proxies.stop()
        finally:
            if self.cluster is not None:
                try:
                    await asyncio.wait_for(self.cluster.stop(timeout=5.0), 30.0)
                finally:
                    await self.cluster.abort()

    # -- process faults --------------------------------------------------------------------

    def node(self, node_id: str) -> NodeProcess:
        assert self.cluster is not None, "process faults need a local cluster"
        return self.cluster.nodes[node_id]

    def _signal(self, node_id: str, sig: signal.Signals) -> None:
        proc = self.node(node_id).proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    async def kill(self, node_id: str) -> None:
        """kill -9; its client proxy goes down too, so clients see a refused connection (as
        from a dead host) instead of a proxy that accepts and then hangs up."""
        await self.client_proxies[node_id].disable()
        self.paused.discard(node_id)
        self.killed.add(node_id)
        if self.containers is not None:
            await self.containers.kill(node_id)
        else:
            await self.node(node_id).kill()

    async def restart(self, node_id: str) -> None:
        """Start a killed node on its data and wait until it serves (READY, or for a container
        ``/v1/ready``)."""
        if self.containers is not None:
            await self.containers.start(node_id)
            if not await self.wait_ready(node_id, timeout=90.0):
                raise RuntimeError(f"{node_id}: container started, not ready within 90 s")
        else:
            await self.node(node_id).start(timeout=60.0)
        self.killed.discard(node_id)
        await self.client_proxies[node_id].enable()

    async def restart_with_env(self, node_id: str, env: dict[str, str]) -> None:
        """Stop a local node (SIGTERM) and start it on its data with ``env`` added to its
        environment (test-only switches: ``IDC_CLOCK_OFFSET``); ``{}`` restores it."""
        node = self.node(node_id)
        await self.client_proxies[node_id].disable()
        self.killed.add(node_id)  # a heal meanwhile starts it again
        await node.stop(timeout=10.0)
        node.env = dict(env)
        await self.restart(node_id)

    async def restart_with_code(self, node_id: str, code: NodeCode) -> None:
        """Stop a local node (SIGTERM) and start it on its data and port with ``code`` (a
        rolling upgrade's step, or its rollback); returns once it printed READY."""
        node = self.node(node_id)
        await self.client_proxies[node_id].disable()
        self.killed.add(node_id)  # a heal meanwhile starts it again
        await node.stop(timeout=10.0)
        node.code = code
        await self.restart(node_id)

    async def pause(self, node_id: str) -> None:
        if self.containers is not None:
            await self.containers.pause(node_id)
        else:
            self._signal(node_id, signal.SIGSTOP)
        self.paused.add(node_id)

    async def resume(self, node_id: str) -> None:
        if self.containers is not None:
            await self.containers.unpause(node_id)
        else:
            self._signal(node_id, signal.SIGCONT)
        self.paused.discard(node_id)

    # -- network faults --------------------------------------------------------------------

    async def cut(self, pairs: Sequence[tuple[str, str]], *, mode: str = "down") -> None:
        """Cut the directed links ``src->dst``: "down" refuses and closes connections,
        "blackhole" keeps them open and drops every byte."""
        for pair in pairs:
            p = self.link_proxies[pair]
            if mode == "blackhole":
                if "partition-up" not in p.toxics:
                    p.add_toxic(name="partition-up", type="timeout", stream="upstream")
                    p.add_toxic(name="partition-down", type="timeout", stream="downstream")
            else:
                await p.disable()

    async def heal_network(self) -> None:
        for p in self.link_proxies.values():
            p.clear_toxics()
            if not p.enabled:
                await p.enable()

    async def heal(self) -> None:
        """Every toxic off, every proxy up, every paused node resumed, every killed node back."""
        for node_id in list(self.paused):
            await self.resume(node_id)
        await self.proxies.reset()
        for node_id in list(self.killed):
            await self.restart(node_id)
        for node_id, node in (self.cluster.nodes.items() if self.cluster else ()):
            if node.env and node_id in self.node_urls:  # a clock offset left by an
                # interrupted nemesis, on a node still a member
                await self.restart_with_env(node_id, {})

    async def wait_delivered(self, timeout: float) -> bool:
        """Until no proxy holds a message for later (the network is quiet)."""
        deadline = time.monotonic() + timeout
        while any(p.pending for p in self.proxies.proxies.values()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def wait_ready(self, node_id: str, timeout: float) -> bool:
        """Until the node's ``/v1/ready`` answers 200 (settled and serving)."""
        deadline = time.monotonic() + timeout
        url = self.node_urls[node_id]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with s.get(f"{url}/v1/ready") as resp:
                        if resp.status == 200:
                            return True
                await asyncio.sleep(0.2)
        return False

    async def wait_clock(self, node_id: str, refusing: bool, timeout: float) -> bool | None:
        """Until the node's ``/v1/health`` says ``clock.refusing == refusing`` (its clock judged
        against its peers'); the last value seen (None: never answered)."""
        deadline = time.monotonic() + timeout
        url, seen = self.node_urls[node_id], None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with s.get(f"{url}/v1/health") as resp:
                        seen = bool((await resp.json()).get("clock", {}).get("refusing"))
                        if seen == refusing:
                            return seen
                await asyncio.sleep(0.1)
        return seen

    def proxy_counters(self) -> dict[str, dict[str, int]]:
        return {**self._retired_counters,
                **{name: dict(p.counters) for name, p in self.proxies.proxies.items()}}

    # -- membership ------------------------------------------------------------------------

    async def add_member(self, node_id: str, *, join: Sequence[str],
                         replaces: str | None = None, timeout: float = 60.0) -> NodeProcess:
        """Start a new node with ``--join`` (the members ``join``, in that order) and, if
        given, ``--replace replaces``; once it printed READY it is a member here too: a client
        proxy in front of it, its URL told to ``on_members``. Raises what its start raised
        (``StartError``: it exited with its own error line)."""
        assert self.cluster is not None, "membership changes need a local cluster"
        node = self.cluster.add_node(node_id, join=join, replaces=replaces)
        return await self.start_member(node, timeout=timeout)

    async def start_member(self, node: NodeProcess, *, timeout: float = 60.0) -> NodeProcess:
        """Start ``node`` (made by ``cluster.add_node``, not started yet: the split play asks
        its join first, with its address) and make it a member here, as ``add_member``."""
        node_id = node.id
        self.membership_changed = True
        await node.start(timeout=timeout)
        self.node_urls[node_id] = node.url
        self.client_proxies[node_id] = await self.proxies.create(
            f"client-{node_id}", "127.0.0.1:0", node.address, protocol="http")
        await self._members_changed()
        return node

    async def drop_member(self, node_id: str) -> None:
        """``node_id`` is no member any more (it left, its join was aborted, or it was replaced):
        its client proxy goes (its counters stay in the report) and no fault, heal or final
        read touches it again."""
        self.membership_changed = True
        self.node_urls.pop(node_id, None)
        self.killed.discard(node_id)
        self.paused.discard(node_id)
        if node_id not in self.departed:
            self.departed.append(node_id)
        proxy = self.client_proxies.pop(node_id, None)
        if proxy is not None:
            self._retired_counters[proxy.name] = dict(proxy.counters)
            await self.proxies.delete(proxy.name)
        await self._members_changed()

    async def _members_changed(self) -> None:
        urls = self.client_urls
        for watch in self.on_members:
            await watch(urls)

    async def ring_views(self, ids: Sequence[str] | None = None,
                         timeout: float = 2.0) -> dict[str, dict[str, Any] | None]:
        """Each member's ``GET /v1/ring`` (None: it did not answer), asked at once."""
        ids = list(self.node_urls) if ids is None else list(ids)

        async def one(s: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with s.get(f"{url}/v1/ring") as resp:
                    if resp.status == 200:
                        body = await resp.json()
                        return body if isinstance(body, dict) else None
            return None

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            views = await asyncio.gather(*(one(s, self.node_urls[i]) for i in ids))
        return dict(zip(ids, views, strict=True))

    async def wait_ring_settled(self, timeout: float) -> dict[str, Any] | None:
        """Until every live member's ``/v1/ring`` shows no move, one version, and exactly the
        members this topology holds (none joining or leaving): that ring (None: not within
        ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            live = [i for i in self.node_urls if i not in self.killed]
            views = await self.ring_views(live)
            view = ring_settled(views, set(self.node_urls))
            if view is not None or time.monotonic() > deadline:
                return view
            await asyncio.sleep(0.3)

    # -- observation -----------------------------------------------------------------------

    async def wait_healthy(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while time.monotonic() < deadline:
                ok = 0
                for url in self.node_urls.values():
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with s.get(f"{url}/v1/health") as resp:
                            ok += resp.status == 200
                if ok == len(self.node_urls):
                    break
                await asyncio.sleep(0.2)
            else:
                return False
        if self.membership_changed:  # and every move finished, on every member
            left = max(1.0, deadline - time.monotonic())
            return await self.wait_ring_settled(left) is not None
        return True


def ring_settled(views: dict[str, dict[str, Any] | None],
                 members: set[str]) -> dict[str, Any] | None:
    """One of ``views`` (``GET /v1/ring`` answers) when they all say the same settled ring:
    no move, one version, and ``members`` exactly the members not left, every one normal."""
    if not views or any(v is None for v in views.values()):
        return None
    first = next(iter(views.values()))
    assert first is not None
    for v in views.values():
        assert v is not None
        if v.get("move") or v.get("version") != first.get("version"):
            return None
        states = {m.get("id"): m.get("state") for m in v.get("members", [])}
        if {i for i, st in states.items() if st != "left"} != members:
            return None
        if any(states[i] != "normal" for i in members):
            return None
    return first


def directed_links(ids: Sequence[str]) -> list[tuple[str, str]]:
    """Every ordered pair of distinct nodes: one proxy each, so a cut can be one-way."""
    return [(a, b) for a in ids for b in ids if a != b]


def connect_via_args(src: str, via: dict[str, str]) -> list[str]:
    """``--connect-via ID=HOST:PORT,...``: to reach peer ID, ``src`` dials the link's proxy."""
    return ["--connect-via", ",".join(f"{dst}={addr}" for dst, addr in sorted(via.items()))]


def _pin_ports(cluster: LocalCluster, listen: dict[str, int]) -> None:
    """LocalCluster picked its own free ports; the link proxies were built for ``listen``."""
    host = "127.0.0.1"
    peers = ",".join(f"{i}={host}:{p}" for i, p in listen.items())
    for node_id, proc in cluster.nodes.items():
        proc.port = listen[node_id]
        args = proc.args
        args[args.index("--listen") + 1] = f"{host}:{listen[node_id]}"
        args[args.index("--peers") + 1] = peers
