"""Client settings: one frozen keyword-only dataclass, validated once, naming the bad field.

Every field, its default and its constraint (durations are float seconds):

    nodes                   seed node URLs ("http://host:port" or "host:port"); at least one
    client_id = None        stable client id, [A-Za-z0-9_.-]{1,100}; None: the one stored at
                            ``state_path``, else a fresh random id
    state_path = None       file holding the client id and the op-id high-water mark; without
                            it a restarted client must use a new client id (the default does)
    seq_block = 1000        sequence numbers reserved (written and fsynced) per reservation; >= 1
    attempt_timeout = 1.0   one HTTP attempt; > 0
    total_timeout = 10.0    one op, all retries included; further clipped to the cluster's
                            advertised window minus ``window_margin``, and minus the clock
                            tolerance the nodes advertise (``max_clock_skew``); > 0
    window_margin = 0.25    fraction of the advertised window kept unused (a retry must still be
                            recognised when it arrives); 0 <= margin < 1
    min_window_margin = 0.5 at least this many seconds are kept unused too; >= 0
    assumed_window = 5.0    window used until a node's /v1/health has told the real one; > 0
    backoff_interval = 0.02 first retry's backoff ceiling; later ones double; > 0
    max_backoff_interval = 0.5   the ceiling's ceiling (full jitter below it); >= backoff_interval
    batch_interval = 0.002  0 sends each op on its own; with ``max_batches_in_flight`` 0, ops
                            issued within this many seconds go out as one /v1/batch; >= 0
    max_batches_in_flight = 1   batches out at once to each leader (a request each): while
                            fewer are out, ops go at the end of the loop turn they were issued
                            in (a lone op waits for nobody); once that many are out, the
                            leader's ops gather until one ends, so batches grow with the load,
                            but for no longer than twice what its batches lately took (at least
                            ``batch_interval``, at most ``attempt_timeout``): a stuck request
                            or a slow node holds back only its leader's ops, for a few round
                            trips; 0: a batch every ``batch_interval`` instead; >= 0
    max_batch_ops = 500     ops per batch request; >= 1
    coalesce = False        merge adds to the same key within a batch window into one op (one
                            op id): fewer ids, coarser outcomes
    discover = True         learn more node addresses from /v1/health (when a node advertises
                            them); turn off when the seeds are proxies that must not be bypassed
    health_interval = 5.0   re-read /v1/health (window, members, ring) this often; > 0
    route_to_leader = True  send each op to its key's leader (computed from the ring the nodes
                            publish in /v1/health), batched per leader: no forwarding hop;
                            a leader that failed lately is tried last like any node
    failure_backoff_interval = 0.5  a node that failed is tried last for this long; >= 0
    max_connections = 64    HTTP connections per client; >= 1
    use_msgpack = True      msgpack bodies (JSON otherwise)
    send_age = True         send ``age_ms`` with every attempt, so a node refuses an op older
                            than its window (410) instead of risking a double count; off models
                            a client unaware of the window (the paper's)
    token = None            bearer token for nodes started with ``--token-file``
    ca_file = None          CA bundle (PEM) to check ``https://`` nodes against; None: the
                            system's trust store
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from client.errors import ConfigurationError

CLIENT_ID_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def normalize_url(node: str) -> str:
    node = node.strip().rstrip("/")
    if not node:
        raise ConfigurationError("nodes: empty address")
    if "://" not in node:
        node = "http://" + node
    return node


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientConfig:
    nodes: tuple[str, ...]
    client_id: str | None = None
    state_path: str | None = None
    seq_block: int = 1000
    attempt_timeout: float = 1.0
    total_timeout: float = 10.0
    window_margin: float = 0.25
    min_window_margin: float = 0.5
    assumed_window: float = 5.0
    backoff_interval: float = 0.02
    max_backoff_interval: float = 0.5
    batch_interval: float = 0.002
    max_batches_in_flight: int = 1
    max_batch_ops: int = 500
    coalesce: bool = False
    discover: bool = True
    health_interval: float = 5.0
    route_to_leader: bool = True
    failure_backoff_interval: float = 0.5
    max_connections: int = 64
    use_msgpack: bool = True
    send_age: bool = True
    token: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.nodes, str) or not isinstance(self.nodes, Sequence):
            raise ConfigurationError("nodes: expected a sequence of addresses")
        nodes = tuple(dict.fromkeys(normalize_url(n) for n in self.nodes))
        if not nodes:
            raise ConfigurationError("nodes: at least one node address is required")
        object.__setattr__(self, "nodes", nodes)
        if self.client_id is not None and not CLIENT_ID_RE.fullmatch(self.client_id):
            raise ConfigurationError(
                f"client_id: must match [A-Za-z0-9_.-]{{1,100}}, got {self.client_id!r}")
        for name in ("attempt_timeout", "total_timeout", "assumed_window", "backoff_interval",
                     "health_interval"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("batch_interval", "min_window_margin", "failure_backoff_interval"):
            if not getattr(self, name) >= 0:
                raise ConfigurationError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.window_margin < 1:
            raise ConfigurationError(f"window_margin: must be in [0, 1), got {self.window_margin}")
        if self.max_backoff_interval < self.backoff_interval:
            raise ConfigurationError("max_backoff_interval: must be >= backoff_interval")
        for name in ("seq_block", "max_batch_ops", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if type(self.max_batches_in_flight) is not int or self.max_batches_in_flight < 0:
            raise ConfigurationError("max_batches_in_flight: must be an integer >= 0, got "
                                     f"{self.max_batches_in_flight!r}")

    def budget(self, window: float, skew: float = 0.0) -> float:
        """Seconds one op may spend on retries: its total timeout, kept inside ``window``, and
        inside ``window - skew`` (``skew``: the clock difference the nodes allow, which they
        take off every op's window: an op older than that is refused, never applied)."""
        inside = window * (1.0 - self.window_margin)
        inside = min(inside, window - self.min_window_margin, window - skew)
        return max(0.0, min(self.total_timeout, inside))

    def replace(self, **changes: Any) -> ClientConfig:
        return dataclasses.replace(self, **changes)
