"""``python -m cluster.node``: parse the CLI (and ``--config FILE``), set up JSON logs, run."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from cluster.config import NodeConfig, from_mapping, load_file
from cluster.errors import ConfigError

# CLI flag -> config field, for the flags that map one to one
_FLAGS: dict[str, tuple[str, type]] = {
    "id": ("node_id", str), "listen": ("listen", str), "peers": ("peers", str),
    "data_dir": ("data_dir", str), "rf": ("rf", int), "secret_file": ("secret_file", str),
    "dedup": ("dedup", str), "window": ("window", float), "rate": ("rate", float),
    "target_fpp": ("target_fpp", float), "write_quorum": ("write_quorum", int),
    "vnodes": ("vnodes", int), "max_body_bytes": ("max_body_bytes", int),
    "max_batch_ops": ("max_batch_ops", int), "max_dedup_bytes": ("max_dedup_bytes", int),
    "quorum_timeout": ("quorum_timeout", float),
    "snapshot_interval": ("snapshot_interval", float),
    "drain_timeout": ("drain_timeout", float),
    "max_inflight_frames": ("max_inflight_frames", int),
    "connect_via": ("connect_via", str),
    "heartbeat_interval": ("heartbeat_interval", float),
    "phi_threshold": ("phi_threshold", float),
    "failure_timeout": ("failure_timeout", float),
    "antientropy_interval": ("antientropy_interval", float),
    "max_hints": ("max_hints", int),
    "reconcile_timeout": ("reconcile_timeout", float),
    "max_clock_skew": ("max_clock_skew", float),
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
    for flag, (_, typ) in _FLAGS.items():
        ap.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, default=None)
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=None,
                    help="fsync the log before acknowledging (default on)")
    ap.add_argument("--config", default=None, help="JSON or TOML file with the same fields")
    ap.add_argument("--log-level", default="INFO")
    return ap


def config_from_args(argv: Sequence[str] | None = None) -> tuple[NodeConfig, str]:
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = load_file(args.config) if args.config else {}
    for flag, (name, _) in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            values[name] = value
    if args.fsync is not None:
        values["fsync"] = args.fsync
    return from_mapping(values), args.log_level


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
        config, level = config_from_args(argv)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(level, config.node_id)
    from cluster.server import run

    return run(config)
