"""Membership from outside a running node: join a cluster (``--join``, ``--replace``) and
``python -m cluster decommission``. Both speak RING frames as a peer (signed with the cluster
secret, so a client without it cannot change membership; ``cluster.roles.membership``), over
TLS when the cluster's port speaks it (a joining node dials as its peers do, ``peer_ssl``;
the command takes ``--tls-ca`` or ``--tls``)."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.core.config import JOIN_WRITE_QUORUM, NodeConfig, parse_hostport
from cluster.core.errors import ConfigError
from cluster.core.membership import LEFT, Membership, MembershipError
from cluster.roles.membership import gone, load_ring
from cluster.transport.auth import PeerAuth, load_secret
from cluster.transport.peer import PeerLink, dial_ssl, peer_ssl
from cluster.transport.wire import SPEAKS, Kind


class AdminError(Exception):
    """A membership command failed; the message is the one line the user sees."""


def parse_seeds(text: str) -> list[tuple[str, int]]:
    return [parse_hostport(s.strip(), name="join") for s in text.split(",") if s.strip()]


def admin_ssl(tls: bool, ca_file: str | None) -> ssl.SSLContext | None:
    """How the command dials a cluster whose port speaks TLS: checked against ``ca_file`` when
    given (no host name check: members are addressed by IP, as peers dial each other), else
    encrypted only (the signed frames are what authenticate); None for plain TCP."""
    return dial_ssl(ca_file) if tls or ca_file is not None else None


async def ask_change(seeds: Sequence[tuple[str, int]], own_id: str, secret_file: str | None,
                     item: dict[str, Any], tries: int = 5,
                     ssl_context: ssl.SSLContext | None = None) -> Any:
    """``ask`` a change, again on failure: a change is idempotent (the same join, leave or
    replace asked twice changes nothing the second time), and the first answer can be lost
    with the change made (the claimant died after pushing it)."""
    for attempt in range(tries):
        try:
            return await ask(seeds, own_id, secret_file, item, ssl_context=ssl_context)
        except AdminError as exc:
            if attempt == tries - 1 or "MembershipError" in str(exc) or "ConfigError" in str(exc):
                raise  # refused (not a member, a move under way, ...): asking again won't help
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


async def ask(seeds: Sequence[tuple[str, int]], own_id: str, secret_file: str | None,
              item: dict[str, Any], timeout: float = 30.0,
              ssl_context: ssl.SSLContext | None = None) -> Any:
    """Send one RING item to the first seed that answers; its answer. Each seed is asked as
    the peer it is (``to`` in the signed HELLO names it): its id comes from its /v1/health.
    ``ssl_context``: the cluster's port speaks TLS (``--tls-cert``)."""
    secret = load_secret(secret_file) if secret_file else None
    auth = PeerAuth(own_id, secret)
    errors = []
    for host, port in seeds:
        link = PeerLink(own_id, "?", host, port, auth=auth, connect_timeout=2.0,
                        ssl_context=ssl_context)
        try:
            link.peer_id = await _peer_id(host, port, timeout, ssl_context)
            return (await asyncio.wait_for(link.call(Kind.RING, [item]), timeout))[0]
        except Exception as exc:  # noqa: BLE001 - try the next seed, report them all
            errors.append(f"{host}:{port}: {exc}")
        finally:
            link.abort()
    raise AdminError("; ".join(errors) or "no seed given")


async def _peer_id(host: str, port: int, timeout: float,
                   ssl_context: ssl.SSLContext | None = None) -> str:
    """The id of the node at host:port (its /v1/health over HTTP(S): a HELLO must name it)."""
    return str((await _fetch_health(host, port, timeout, ssl_context))["node"])


async def _fetch_health(host: str, port: int, timeout: float,
                        ssl_context: ssl.SSLContext | None) -> dict[str, Any]:
    """The /v1/health of the node at host:port; ``AdminError`` when none answers."""
    import aiohttp

    scheme = "https" if ssl_context is not None else "http"
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
                    s.get(f"{scheme}://{host}:{port}/v1/health",
                          ssl=ssl_context if ssl_context is not None else True) as resp):
            health = await resp.json()
    except Exception as exc:  # noqa: BLE001 - said in one line
        raise AdminError(f"no node answers at {host}:{port}: {exc!r}") from exc
    if not isinstance(health, dict) or "node" not in health:
        raise AdminError(f"{host}:{port} answers /v1/health with no node id")
    return health


async def join(config: NodeConfig, seeds: Sequence[tuple[str, int]], advertise: str,
               replaces: str | None) -> Membership:
    """The membership a node starting with ``--join`` runs under: the one in its data
    directory if it is a member already (a restart), else the one the claimant returns once
    it admitted this node (joining, or replacing ``replaces``)."""
    saved = load_ring(Path(config.data_dir))
    me = saved.get(config.node_id) if saved is not None else None
    if saved is not None and me is not None:
        if me.state == LEFT:
            raise gone(config.node_id, saved)
        return saved
    if replaces is None and _has_data(Path(config.data_dir)) and saved is None:
        raise ConfigError(f"data_dir: {config.data_dir} holds another node's data; a joining "
                          f"node starts empty")
    wanted = config.extra.get(JOIN_WRITE_QUORUM)
    if wanted:  # before the change is asked: a member admitted must be able to start
        try:
            rf = Membership.from_wire(await ask(seeds, config.node_id, config.secret_file,
                                                {"op": "get"}, ssl_context=peer_ssl(config))).rf
        except (AdminError, MembershipError) as exc:
            raise ConfigError(f"join: {exc}") from exc
        if wanted > rf:
            raise ConfigError(f"write_quorum: must be between 1 and the cluster's rf={rf}, "
                              f"got {wanted}")
    item: dict[str, Any] = {"op": "change", "change": "replace" if replaces else "join",
                            "speaks": list(SPEAKS),
                            "id": config.node_id, "addr": advertise}
    if replaces:
        item["replaces"] = replaces
    try:
        got = await ask_change(seeds, config.node_id, config.secret_file, item,
                               ssl_context=peer_ssl(config))
    except AdminError as exc:
        raise ConfigError(f"join: {exc}") from exc
    return Membership.from_wire(got)


def _has_data(data_dir: Path) -> bool:
    log = data_dir / "log"
    return log.is_dir() and any(log.iterdir())


def configured(config: NodeConfig, ms: Membership) -> NodeConfig:
    """``config`` with the members, rf and vnodes of ``ms``, and the write quorum the joining
    node was started with (``ConfigError`` when the cluster's rf cannot have it)."""
    peers = tuple((m.id, m.host, m.port) for m in ms.members if m.state != LEFT)
    wanted = config.extra.get(JOIN_WRITE_QUORUM, config.write_quorum)
    return config.replace(peers=peers, rf=ms.rf, vnodes=ms.vnodes, connect_via=(),
                          write_quorum=wanted)


# -- python -m cluster decommission ---------------------------------------------------------

async def decommission(node_id: str, via: Sequence[tuple[str, int]], secret_file: str | None,
                       timeout: float, out: Any = sys.stdout,
                       ssl_context: ssl.SSLContext | None = None) -> int:
    """Start moving every range away from ``node_id`` and wait until every remaining member
    lists it as left (the node then exits 0 by itself)."""
    me = f"admin-{os.getpid()}"
    try:
        got = Membership.from_wire(await ask_change(
            via, me, secret_file, {"op": "change", "change": "leave", "id": node_id},
            ssl_context=ssl_context))
    except (AdminError, MembershipError) as exc:
        raise AdminError(f"decommission {node_id}: {exc}") from exc
    m = got.get(node_id)
    state = m.state if m is not None else "?"
    print(f"{node_id}: {state} at membership version {got.version}; ranges move to the other "
          f"members, then it exits", file=out, flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = await _views(got, node_id, me, secret_file, ssl_context)
        pending = [pid for pid, ms in views.items()
                   if ms is None or (x := ms.get(node_id)) is None or x.state != LEFT]
        if views and not pending:
            version = max(ms.version for ms in views.values() if ms is not None)
            print(f"{node_id}: left on every member (version {version})", file=out, flush=True)
            return 0
        newest = max((ms for ms in views.values() if ms is not None),
                     key=lambda ms: ms.version, default=got)
        got = newest
        since = newest.moving_since
        lasted = f", move {time.time() - since:.0f} s old" if since else ""
        print(f"  waiting for {', '.join(pending)}{lasted}", file=out, flush=True)
        await asyncio.sleep(1.0)
    raise AdminError(f"decommission {node_id}: not left everywhere after {timeout:g} s")


async def _views(ms: Membership, node_id: str, me: str, secret_file: str | None,
                 ssl_context: ssl.SSLContext | None) -> dict[str, Membership | None]:
    """Each remaining member's membership (None: it did not answer)."""
    out: dict[str, Membership | None] = {}
    for m in ms.members:
        if m.id == node_id or m.state == LEFT:
            continue
        try:
            out[m.id] = Membership.from_wire(
                await ask([(m.host, m.port)], me, secret_file, {"op": "get"}, timeout=5.0,
                          ssl_context=ssl_context))
        except (AdminError, MembershipError):
            out[m.id] = None
    return out


# -- python -m cluster finalize --------------------------------------------------------------

async def _health(host: str, port: int, timeout: float,
                  ssl_context: ssl.SSLContext | None) -> dict[str, Any] | None:
    """A node's /v1/health, or None when it does not answer."""
    try:
        return await _fetch_health(host, port, timeout, ssl_context)
    except AdminError:  # a member that does not answer is reported as such
        return None


def _speaks_line(health: dict[str, Any] | None) -> tuple[str, int]:
    """What a member runs, in words, and the highest protocol it speaks (0: no answer)."""
    if health is None:
        return "no answer", 0
    proto = health.get("protocol")
    if not isinstance(proto, dict):  # release 0.4.0 names no protocol: it speaks 1 only
        return "release 0.4.0 or before, speaks protocol 1", 1
    lo, hi = proto.get("speaks", [1, 1])
    return (f"idemcount {health.get('release', '?')}, speaks protocol {lo} to {hi}, "
            f"cluster at {proto.get('cluster', 1)}"), int(hi)


def _cluster_protocol(health: dict[str, Any]) -> int:
    """The finalized protocol a member's /v1/health shows (release 0.4.0 shows none: 1)."""
    proto = health.get("protocol")
    return int(proto.get("cluster", 1)) if isinstance(proto, dict) else 1


async def finalize(via: Sequence[tuple[str, int]], secret_file: str | None, timeout: float,
                   protocol: int | None = None, dry_run: bool = False, out: Any = sys.stdout,
                   ssl_context: ssl.SSLContext | None = None) -> int:
    """Show what every member speaks; then (unless ``dry_run``) have the cluster finalize
    ``protocol`` (default: the highest every member speaks) and wait until every member
    installed it. From then on new frames and files are written in it: a member can no
    longer be rolled back to a release that does not speak it."""
    me = f"admin-{os.getpid()}"
    ms = Membership.from_wire(await ask(via, me, secret_file, {"op": "get"},
                                        ssl_context=ssl_context))
    members = [m for m in ms.members if m.state != LEFT]
    healths = await asyncio.gather(*(_health(m.host, m.port, 5.0, ssl_context)
                                     for m in members))
    for m, h in zip(members, healths, strict=True):
        print(f"  {m.id}  {m.addr}  {_speaks_line(h)[0]}", file=out, flush=True)
    tops = [_speaks_line(h)[1] for h in healths]
    highest = min(tops, default=0)
    if dry_run:
        print(f"cluster at protocol {ms.protocol}; every member speaks up to {highest}"
              + ("" if highest > ms.protocol else ": nothing to finalize"), file=out, flush=True)
        return 0
    want = protocol or max(tops, default=0)
    behind = [f"{m.id} ({_speaks_line(h)[0]})" for m, h, top in zip(members, healths, tops,
                                                                   strict=True) if top < want]
    if behind:  # said here, before a member of an older release is asked to judge it
        raise AdminError(f"finalize: cannot finalize protocol {want}: {', '.join(behind)}; "
                         f"upgrade it first (nothing changed)")
    # asked of members that speak it (one of an older release would not know the change)
    seeds = [(m.host, m.port) for m in members] or list(via)
    try:
        got = Membership.from_wire(await ask_change(
            seeds, me, secret_file,
            {"op": "change", "change": "protocol", "protocol": protocol},
            ssl_context=ssl_context))
    except (AdminError, MembershipError) as exc:
        raise AdminError(f"finalize: {exc}") from exc
    print(f"protocol {got.protocol} finalized (membership version {got.version}); waiting for "
          f"every member to install it", file=out, flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = [m for m in got.members if m.state != LEFT]
        healths = await asyncio.gather(*(_health(m.host, m.port, 5.0, ssl_context)
                                         for m in members))
        behind = [m.id for m, h in zip(members, healths, strict=True)
                  if h is None or _cluster_protocol(h) < got.protocol]
        if not behind:
            print(f"protocol {got.protocol} on every member", file=out, flush=True)
            return 0
        print(f"  waiting for {', '.join(behind)}", file=out, flush=True)
        await asyncio.sleep(1.0)
    raise AdminError(f"finalize: protocol {got.protocol} is finalized, but not installed "
                     f"everywhere after {timeout:g} s (members pull it at their next heartbeat)")
