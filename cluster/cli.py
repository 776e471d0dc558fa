"""``python -m cluster.node``: parse the CLI (and ``--config FILE``), set up JSON logs, run."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from cluster.core.config import JOIN_WRITE_QUORUM, NodeConfig, from_mapping, load_file
from cluster.core.errors import ConfigError

# CLI flag -> (config field, type, help); every field is also accepted in --config FILE
_FLAGS: dict[str, tuple[str, type, str]] = {
    "id": ("node_id", str, "this node's id; must appear in --peers"),
    "listen": ("listen", str, "HOST:PORT for client HTTP and peer traffic (one port)"),
    "peers": ("peers", str, "every member, this node included: ID=HOST:PORT,..."),
    "data_dir": ("data_dir", str, "where the log and snapshots live (kept across kill -9)"),
    "rf": ("rf", int, "replicas per key (default min(3, members))"),
    "write_quorum": ("write_quorum", int, "durable acks before an ack (default majority of rf)"),
    "secret_file": ("secret_file", str,
                    "cluster secret; peer frames are HMAC-SHA256 signed with it (recommended)"),
    "peer_auth_skew": ("peer_auth_skew", float,
                       "seconds of peer clock difference a HELLO may show (default 30)"),
    "token_file": ("token_file", str,
                   "client requests need 'Authorization: Bearer T', T a line of this file"),
    "tls_cert": ("tls_cert", str, "PEM certificate: the port speaks TLS (with --tls-key)"),
    "tls_key": ("tls_key", str, "PEM private key for --tls-cert"),
    "tls_ca": ("tls_ca", str, "CA bundle to check peers' certificates against"),
    "dedup": ("dedup", str, "dedup strategy, or per table: 'fbf,t1=exact' (default fbf)"),
    "window": ("window", float, "seconds a retry is recognised in (default 10)"),
    "rate": ("rate", float, "expected op ids per second per table, sizes the filters"),
    "target_fpp": ("target_fpp", float, "false-positive target of the filters (default 1e-6)"),
    "max_dedup_bytes": ("max_dedup_bytes", int, "memory cap for each table's dedup state"),
    "vnodes": ("vnodes", int, "ring tokens per node (default 256)"),
    "max_body_bytes": ("max_body_bytes", int, "largest request body, 413 above (4 MiB)"),
    "max_batch_ops": ("max_batch_ops", int, "most ops in one /v1/batch (10000)"),
    "max_op_id_bytes": ("max_op_id_bytes", int, "longest op id in UTF-8 bytes (256)"),
    "max_nesting_depth": ("max_nesting_depth", int, "deepest body nesting accepted (8)"),
    "max_connections_per_client": ("max_connections_per_client", int,
                                   "open HTTP connections per client address, 429 above (256)"),
    "header_timeout": ("header_timeout", float, "seconds for a request's headers (10)"),
    "body_timeout": ("body_timeout", float, "seconds for a request's body (10)"),
    "idle_timeout": ("idle_timeout", float, "seconds an idle keep-alive connection lives (75)"),
    "quorum_timeout": ("quorum_timeout", float, "wait for a quorum before 503 (2 s)"),
    "snapshot_interval": ("snapshot_interval", float, "seconds between snapshots (30)"),
    "drain_timeout": ("drain_timeout", float, "SIGTERM: time for in-flight requests (5 s)"),
    "max_inflight_frames": ("max_inflight_frames", int,
                            "unanswered frames per peer and kind (0: no limit)"),
    "connect_via": ("connect_via", str,
                    "ID=HOST:PORT,...: dial this address to reach peer ID (a proxy)"),
    "heartbeat_interval": ("heartbeat_interval", float, "seconds between heartbeats (0.2)"),
    "phi_threshold": ("phi_threshold", float, "phi-accrual level that marks a peer down (8)"),
    "failure_timeout": ("failure_timeout", float, "a peer silent this long is down (1 s)"),
    "antientropy_interval": ("antientropy_interval", float,
                             "seconds between anti-entropy exchanges (5)"),
    "max_hints": ("max_hints", int, "writes kept per down replica (100000)"),
    "reconcile_timeout": ("reconcile_timeout", float,
                          "at start, time to settle in-doubt ops before serving (5 s)"),
    "max_clock_skew": ("max_clock_skew", float, "client clock difference allowed for ts_ms (1 s)"),
    "max_reads": ("max_reads", int, "most counters one POST /v1/read reads, 400 above (1000)"),
    "max_scan_limit": ("max_scan_limit", int, "most counters one scan page returns (1000)"),
    "tombstone_grace": ("tombstone_grace", float,
                        "seconds a delete's tombstone is kept before it is collected; a node "
                        "down longer must come back by --replace (3600)"),
    "sweep_interval": ("sweep_interval", float,
                       "seconds between expiry and tombstone-collection passes (5)"),
    "advertise": ("advertise", str, "HOST:PORT the other members reach this node at, when "
                                    "--listen is not it (0.0.0.0, a container): with --join"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m cluster.node",
        description="Run one node of the idempotent counter cluster.",
        epilog="--dedup takes a strategy (fbf, adaptive-fbf, exact, none, ...) or per-table "
               "choices: 'fbf,t1=exact,t2=none'. --config FILE (JSON or TOML) takes the same "
               "fields (underscored); flags given on the command line win. "
               "--connect-via ID=HOST:PORT[,ID=HOST:PORT...]: to reach peer ID, dial this "
               "address instead (a per-link proxy).",
    )
    for flag, (_, typ, help_text) in _FLAGS.items():
        ap.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None,
                        help=help_text, metavar=typ.__name__.upper())
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=None,
                    help="fsync the log before acknowledging (default on)")
    ap.add_argument("--keep-log", action="store_true", default=None,
                    help="archive the log segments a snapshot covers (log/archive/) instead of "
                         "deleting them, for post-mortems (python -m client.chaos --explain)")
    ap.add_argument("--join", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                    help="join the running cluster one of these members belongs to (instead of "
                         "--peers); the node takes its share of the keys after READY, once a "
                         "dedup window has passed (docs/membership.md)")
    ap.add_argument("--replace", default=None, metavar="ID",
                    help="with --join and an empty --data-dir: take the ranges of the dead "
                         "member ID under this node's new --id")
    ap.add_argument("--config", default=None, help="JSON or TOML file with the same fields")
    ap.add_argument("--log-level", default="INFO")
    return ap


def config_from_args(argv: Sequence[str] | None = None) -> tuple[NodeConfig, str]:
    """The config and the log level."""
    config, level, _join, _replaces = parse(argv)
    return config, level


def parse(argv: Sequence[str] | None = None
          ) -> tuple[NodeConfig, str, str | None, str | None]:
    """The config, the log level, ``--join`` and ``--replace``."""
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = load_file(args.config) if args.config else {}
    for flag, (name, _, _) in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            values[name] = value
    if args.fsync is not None:
        values["fsync"] = args.fsync
    if args.keep_log:
        values["keep_log"] = True
    if args.replace and not args.join:
        raise ConfigError("--replace: needs --join HOST:PORT (a live member)")
    if args.join:
        if values.get("peers"):
            raise ConfigError("--join and --peers: give one (--peers starts a new cluster)")
        addr = values.get("advertise") or values.get("listen") or ""
        if str(addr).endswith(":0"):
            raise ConfigError("--join: the node needs a fixed port (--listen HOST:PORT, or "
                              "--advertise HOST:PORT) that the members can dial")
        # until the cluster's members are known (server.run): this node alone, and the write
        # quorum asked for held back (checked against the cluster's rf: admin.configured)
        values["peers"] = f"{values.get('node_id', '')}={addr}"
        wanted = values.pop("write_quorum", None)
        config = from_mapping(values)
        if wanted is not None:
            config = config.replace(extra={**config.extra, JOIN_WRITE_QUORUM: int(wanted)})
        return config, args.log_level, args.join, args.replace
    return from_mapping(values), args.log_level, args.join, args.replace


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": getattr(record, "node", None),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, node_id: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    old_factory = logging.getLogRecordFactory()

    def factory(*a: Any, **kw: Any) -> logging.LogRecord:
        record = old_factory(*a, **kw)
        record.node = node_id
        return record

    logging.setLogRecordFactory(factory)
    logging.Formatter.converter = time.gmtime


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, level, join, replaces = parse(argv)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(level, config.node_id)
    from cluster.server import run

    return run(config, join, replaces)
