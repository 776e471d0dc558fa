"""Node configuration: one frozen keyword-only dataclass, validated once, from CLI and/or a file.

Every field, its default and its constraint (durations are float seconds):

    node_id             this node's id; must appear in ``peers``
    listen              "host:port" this node serves HTTP and peer traffic on
    peers               every member, the node itself included: ((id, host, port), ...)
    data_dir            directory holding the durable log and snapshots
    rf = 0              replicas per key, 1 <= rf <= len(peers); 0 = min(3, len(peers))
    write_quorum = 0    durable acks needed before an ack (0 = majority of rf); 1 <= W <= rf
    dedup = "fbf"       default dedup strategy (cluster.core.dedup.DEDUP_NAMES)
    dedup_tables = ()   per-table overrides: ((table, strategy), ...)
    window = 10.0       seconds within which a retry must be recognised; > 0
    rate = 10000.0      expected op ids per second per table (sizes the filters); > 0
    target_fpp = 1e-6   false-positive target of the filters; 0 < fpp < 1
    max_dedup_bytes     optional memory cap handed to the dedup strategies
    fsync = True        fsync the log before acknowledging (group commit)
    keep_log = False    move the log segments a snapshot covers to <data_dir>/log/archive/
                        instead of deleting them (for ``python -m client.chaos --explain``;
                        the archive grows without bound)
    secret_file         cluster secret: every peer frame is signed with HMAC-SHA256 under keys
                        derived from it (cluster.transport.auth); without it peers are not
                        authenticated
    peer_auth_skew = 30.0   a peer HELLO whose clock is further off than this is refused, and
                        HELLO nonces are remembered for twice as long (replays refused)
    token_file          optional: client requests must send ``Authorization: Bearer <token>``
                        with one of the file's lines (health and the API description excepted)
    tls_cert, tls_key   optional: the node's port speaks TLS (clients and peers alike)
    tls_ca              optional: CA bundle peers' certificates are checked against (without
                        it peer TLS only encrypts; the HMAC authenticates)
    max_nesting_depth = 8   deepest nesting of objects/arrays accepted in a request body
    max_connections_per_client = 256   open HTTP connections allowed per client address
    header_timeout = 10.0   a request's headers must arrive within this (slowloris guard)
    body_timeout = 10.0     and its body within this after the headers
    idle_timeout = 75.0     an idle keep-alive connection is closed after this
    vnodes = 256        ring tokens per node
    max_body_bytes = 4 MiB, max_batch_ops = 10000, max_op_id_bytes = 256
    quorum_timeout = 2.0      wait for a write or read quorum before answering 503
    peer_connect_timeout = 1.0
    snapshot_interval = 30.0  seconds between snapshots (when the log grew at all)
    snapshot_log_bytes = 256 MiB  log growth that triggers a snapshot sooner
    adapt_interval = 1.0      period of the adaptive FBF's Algorithm 3 step
    max_inflight_frames = 0   unanswered frames per peer and kind before calls pile up into
                              the next frame (0 = no limit: one frame per event-loop turn)
    drain_timeout = 5.0       SIGTERM: time allowed for in-flight requests
    connect_via = ()          ((peer id, host, port), ...): dial this address to reach that
                              peer instead of its --peers address (a per-link proxy)
    heartbeat_interval = 0.2  seconds between heartbeats on every peer link; > 0
    phi_threshold = 8.0       phi-accrual suspicion level above which a peer counts as down
    failure_timeout = 1.0     a peer silent this long is down whatever phi says (also the
                              floor of the detector's expected interval); > heartbeat_interval
    antientropy_interval = 5.0   seconds between digest exchanges with each live replica
                              (also run at start and whenever a peer comes back)
    max_hints = 100000        writes kept per down replica for hinted handoff (oldest dropped;
                              anti-entropy repairs whatever a full queue dropped)
    reconcile_timeout = 5.0   at start, time allowed to settle in-doubt ops and pull the
                              replicas' dedup state before serving anyway (the rest is retried)
    max_clock_skew = 1.0      allowed client/node clock difference when an op carries ts_ms
    max_reads = 1000          most counters one ``POST /v1/read`` reads (400 above)
    max_scan_limit = 1000     most counters one scan page returns (``limit`` is capped to it)
    tombstone_grace = 3600.0  seconds a delete's tombstone (or an expired counter) is kept
                              before it is collected; a replica away longer than this must come
                              back by ``--replace`` (docs/deletes.md); > window + 2 * skew
    sweep_interval = 5.0      seconds between passes that expire counters of tables with a
                              ttl and collect tombstones older than ``tombstone_grace``
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.core.errors import ConfigError
from idc_contract import DEFAULT_MAX_BATCH_OPS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_OP_ID_BYTES

Peer = tuple[str, str, int]


def parse_hostport(text: str, *, name: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def parse_peers(text: str | list[str] | Mapping[str, str]) -> tuple[Peer, ...]:
    """``n1=127.0.0.1:7101,n2=...`` (or a list of such items, or a mapping) -> sorted peers."""
    if isinstance(text, Mapping):
        items = [f"{k}={v}" for k, v in text.items()]
    elif isinstance(text, str):
        items = [p for p in text.split(",") if p.strip()]
    else:
        items = list(text)
    peers: dict[str, Peer] = {}
    for item in items:
        node_id, sep, addr = item.strip().partition("=")
        if not sep or not node_id:
            raise ConfigError(f"peers: expected id=host:port, got {item!r}")
        if node_id in peers:
            raise ConfigError(f"peers: node id {node_id!r} listed twice")
        host, port = parse_hostport(addr, name=f"peers[{node_id}]")
        peers[node_id] = (node_id, host, port)
    return tuple(sorted(peers.values()))


def parse_dedup(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``fbf`` or ``t1=exact,t2=fbf`` or ``fbf,t1=exact`` -> (default, per-table overrides)."""
    default = "fbf"
    tables: list[tuple[str, str]] = []
    for item in (p.strip() for p in str(text).split(",") if p.strip()):
        table, sep, name = item.partition("=")
        if sep:
            tables.append((table, name))
        else:
            default = item
    return default, tuple(tables)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    node_id: str
    listen: tuple[str, int]
    peers: tuple[Peer, ...]
    data_dir: str
    rf: int = 0
    write_quorum: int = 0
    dedup: str = "fbf"
    dedup_tables: tuple[tuple[str, str], ...] = ()
    window: float = 10.0
    rate: float = 10_000.0
    target_fpp: float = 1e-6
    max_dedup_bytes: int | None = None
    fsync: bool = True
    keep_log: bool = False
    secret_file: str | None = None
    peer_auth_skew: float = 30.0
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    max_nesting_depth: int = 8
    max_connections_per_client: int = 256
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 75.0
    vnodes: int = 256
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_batch_ops: int = DEFAULT_MAX_BATCH_OPS
    max_op_id_bytes: int = DEFAULT_MAX_OP_ID_BYTES
    quorum_timeout: float = 2.0
    peer_connect_timeout: float = 1.0
    snapshot_interval: float = 30.0
    snapshot_log_bytes: int = 256 << 20
    adapt_interval: float = 1.0
    max_inflight_frames: int = 0
    drain_timeout: float = 5.0
    connect_via: tuple[Peer, ...] = ()
    heartbeat_interval: float = 0.2
    phi_threshold: float = 8.0
    failure_timeout: float = 1.0
    antientropy_interval: float = 5.0
    max_hints: int = 100_000
    reconcile_timeout: float = 5.0
    max_clock_skew: float = 1.0
    max_reads: int = 1000
    max_scan_limit: int = 1000
    tombstone_grace: float = 3600.0
    sweep_interval: float = 5.0
    advertise: str = ""  # HOST:PORT peers and clients reach this node at (default: listen)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [p[0] for p in self.peers]
        if not ids:
            raise ConfigError("peers: at least one member is required")
        if self.node_id not in ids:
            raise ConfigError(f"node_id: {self.node_id!r} is not in peers {ids}")
        if self.rf == 0:
            object.__setattr__(self, "rf", min(3, len(ids)))
        if not 1 <= self.rf <= len(ids):
            raise ConfigError(f"rf: must be between 1 and {len(ids)} (members), got {self.rf}")
        if not 0 <= self.write_quorum <= self.rf:
            raise ConfigError(f"write_quorum: must be between 1 and rf={self.rf}, got "
                              f"{self.write_quorum}")
        if not self.data_dir:
            raise ConfigError("data_dir: required")
        for name in ("window", "rate", "quorum_timeout", "peer_connect_timeout",
                     "snapshot_interval", "adapt_interval", "drain_timeout",
                     "heartbeat_interval", "phi_threshold", "antientropy_interval",
                     "reconcile_timeout", "peer_auth_skew", "header_timeout", "body_timeout",
                     "idle_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be > 0, got {getattr(self, name)}")
        if not self.failure_timeout > self.heartbeat_interval:
            raise ConfigError(f"failure_timeout: must be > heartbeat_interval "
                              f"({self.heartbeat_interval}), got {self.failure_timeout}")
        if self.max_clock_skew < 0:
            raise ConfigError(f"max_clock_skew: must be >= 0, got {self.max_clock_skew}")
        if self.max_hints < 0:
            raise ConfigError(f"max_hints: must be >= 0, got {self.max_hints}")
        unknown = [v[0] for v in self.connect_via if v[0] not in ids]
        if unknown:
            raise ConfigError(f"connect_via: {unknown[0]!r} is not in peers {ids}")
        if not 0.0 < self.target_fpp < 1.0:
            raise ConfigError(f"target_fpp: must be in (0, 1), got {self.target_fpp}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key: give both or neither")
        for name in ("vnodes", "max_body_bytes", "max_batch_ops", "max_op_id_bytes",
                     "snapshot_log_bytes", "max_nesting_depth", "max_connections_per_client",
                     "max_reads", "max_scan_limit"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not self.sweep_interval > 0:
            raise ConfigError(f"sweep_interval: must be > 0, got {self.sweep_interval}")
        if not self.tombstone_grace > self.window + 2 * self.max_clock_skew:
            raise ConfigError(f"tombstone_grace: must be > window + 2 * max_clock_skew "
                              f"({self.window + 2 * self.max_clock_skew:g} s), got "
                              f"{self.tombstone_grace}: a retry could outlive its tombstone")
        if any(pid.startswith("~") for pid in ids):
            raise ConfigError("peers: a node id may not start with '~' (the floors' origins)")
        self._check_dedup_names()

    def _check_dedup_names(self) -> None:
        try:
            from cluster.core.dedup import DEDUP_NAMES
        except ImportError:  # the dedup module is built in parallel; check what we can
            return
        for table, name in ((None, self.dedup), *self.dedup_tables):
            if name not in DEDUP_NAMES:
                where = "dedup" if table is None else f"dedup[{table}]"
                raise ConfigError(f"{where}: unknown strategy {name!r}, choose from {DEDUP_NAMES}")

    @property
    def quorum(self) -> int:
        """W: durable acks (the leader's own log included) needed before an ack."""
        return self.write_quorum or self.rf // 2 + 1

    @property
    def read_quorum(self) -> int:
        return self.rf // 2 + 1

    def peer_addr(self, node_id: str) -> tuple[str, int]:
        for pid, host, port in self.peers:
            if pid == node_id:
                return host, port
        raise KeyError(node_id)

    def dial_addr(self, node_id: str) -> tuple[str, int]:
        """Where to connect to reach ``node_id``: its --connect-via address, else --peers."""
        for pid, host, port in self.connect_via:
            if pid == node_id:
                return host, port
        return self.peer_addr(node_id)

    def dedup_for(self, table: str) -> str:
        for t, name in self.dedup_tables:
            if t == table:
                return name
        return self.dedup

    def replace(self, **changes: Any) -> NodeConfig:
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name for f in dataclasses.fields(NodeConfig)}


def load_file(path: str) -> dict[str, Any]:
    """Read a JSON or TOML config file (by extension; TOML when not ``.json``)."""
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table/object at the top level")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


# ``NodeConfig.extra`` key: the write quorum a joining node was started with, applied once it
# knows the cluster's rf (``cluster.admin.configured``)
JOIN_WRITE_QUORUM = "join_write_quorum"


def from_mapping(values: Mapping[str, Any]) -> NodeConfig:
    """Build a config from plain values (file or CLI): strings are parsed, names are checked."""
    data = dict(values)
    unknown = set(data) - _FIELDS - {"id"}
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown config field")
    if "id" in data:
        data["node_id"] = data.pop("id")
    for required in ("node_id", "listen", "peers", "data_dir"):
        if data.get(required) in (None, ""):
            raise ConfigError(f"{required}: required")
    if not isinstance(data["listen"], tuple):
        data["listen"] = parse_hostport(data["listen"], name="listen")
    if not isinstance(data["peers"], tuple):
        data["peers"] = parse_peers(data["peers"])
    if data.get("connect_via") is not None and not isinstance(data["connect_via"], tuple):
        data["connect_via"] = parse_peers(data["connect_via"]) if data["connect_via"] else ()
    if isinstance(data.get("dedup"), str) and "=" in data["dedup"]:
        default, tables = parse_dedup(data["dedup"])
        data["dedup"] = default
        data["dedup_tables"] = tuple(data.get("dedup_tables", ())) + tables
    elif isinstance(data.get("dedup_tables"), Mapping):
        data["dedup_tables"] = tuple(data["dedup_tables"].items())
    elif "dedup_tables" in data:
        data["dedup_tables"] = tuple(tuple(x) for x in data["dedup_tables"])
    _coerce(data)
    return NodeConfig(**data)


def _coerce(data: dict[str, Any]) -> None:
    for f in dataclasses.fields(NodeConfig):
        if f.name not in data or data[f.name] is None:
            continue
        value = data[f.name]
        try:
            if f.type == "int":
                if isinstance(value, bool) or int(value) != value:
                    raise ValueError(value)
                data[f.name] = int(value)
            elif f.type == "float":
                if isinstance(value, bool):
                    raise ValueError(value)
                data[f.name] = float(value)
            elif f.type == "bool" and not isinstance(value, bool):
                raise ValueError(value)
            elif f.type == "str":
                data[f.name] = str(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{f.name}: expected {f.type}, got {value!r}") from exc
