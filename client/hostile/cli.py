"""``python -m client.hostile``: the flags, the run, the text report and the exit status (0
when every check passes, 1 otherwise)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.hostile.cases import REGISTRY
from client.hostile.context import Limits
from client.hostile.runner import HostileConfig, run_hostile


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{'class':<28} {'group':<5} {'requests':>8}  {'seen':<44} verdict"]
    for name, row in report["classes"].items():
        seen = ", ".join(f"{k}:{v}" for k, v in sorted(row["seen"].items(),
                                                        key=lambda kv: -kv[1]))
        if len(seen) > 44:
            seen = seen[:41] + "..."
        lines.append(f"{name:<28} {row['group']:<5} {row['requests']:>8}  {seen:<44} "
                     f"{row['verdict']}")
    g, j, m = report["good"], report["junk"], report["metrics"]
    lines.append("")
    lines.append(f"classes tried: {report['classes_tried']} (skipped {report['classes_skipped']})"
                 f", junk requests/connections: {report['junk_requests']}, rounds: "
                 f"{report['rounds']} in {report['junk_seconds']}s")
    lines.append(f"good client: {g['acked_ops']} acked ops, {g['unknown_ops']} unknown, "
                 f"{g['not_applied_ops']} certainly not applied; counts "
                 f"{'EXACT' if g['exact'] else 'within bounds' if g['ok'] else 'WRONG'} "
                 f"on {len(g['keys'])} keys x {len(report['nodes'])} nodes")
    lines.append(f"junk counters: {j['keys_checked']} keys x {len(report['nodes'])} nodes read, "
                 f"{len(j['nonzero'])} changed")
    up = sum(1 for n in report["health"].values() if n["up"])
    lines.append(f"nodes healthy: {up}/{len(report['health'])}")
    lines.append("idc_peer_auth_rejected_total (delta): " + _fmt(m["peer_auth_rejected"]))
    lines.append("idc_http_refused_total (delta):       " + _fmt(m["http_refused"]))
    lines.append(f"idc_unauthorized_total +{m['unauthorized']}, idc_bad_requests_total "
                 f"+{m['bad_requests']}, idc_peer_auth_accepted_total +{m['peer_auth_accepted']}")
    for p in report["problems"]:
        lines.append(f"PROBLEM: {p}")
    for name, row in report["classes"].items():
        for f in row["failures"][:3]:
            lines.append(f"  {name}: {f}")
    lines.append("RESULT: " + ("PASS" if report["ok"] else "FAIL"))
    return "\n".join(lines)


def _fmt(d: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items())) or "(none)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client.hostile",
        description="Throw many classes of junk (bad encodings, huge numbers, deep nesting, "
        "oversized bodies, slow and truncated requests, forged and replayed peer frames ...) at "
        "running nodes while a well-behaved client keeps incrementing; then check that its "
        "counts are exact, that no junk changed a counter and that every node is still up.",
        epilog="The --max-* and --*-timeout flags must match what the nodes were started with "
        "(their defaults are the node's). Exit status 0 when every check passes, 1 otherwise.")
    p.add_argument("--nodes", metavar="URL,URL,...",
                   help="the nodes: http://host:port or host:port, comma-separated")
    p.add_argument("--secret-file", metavar="FILE",
                   help="the cluster secret: enables the classes that need a real signed "
                   "HELLO (replays, stale/misaddressed HELLOs, bit flips)")
    p.add_argument("--token", metavar="T", help="bearer token of nodes started with --token-file")
    p.add_argument("--token-file", metavar="FILE",
                   help="read the token from this file (first line)")
    p.add_argument("--duration", type=float, default=30.0, metavar="S",
                   help="seconds of junk; no round starts after this (default 30)")
    p.add_argument("--rounds", type=int, default=0, metavar="N",
                   help="stop after this many rounds of every class (default: fill --duration)")
    p.add_argument("--out", metavar="FILE", help="write the JSON report here")
    p.add_argument("--classes", help="only these classes, comma-separated (see --list)")
    p.add_argument("--skip", default="", help="classes to leave out, comma-separated")
    p.add_argument("--list", action="store_true", help="list the junk classes and exit")
    p.add_argument("--concurrency", type=int, default=4, help="classes running at once (4)")
    p.add_argument("--max-requests", type=int, default=200_000,
                   help="cap on junk requests and connections (200000)")
    p.add_argument("--good-rate", type=float, default=100.0,
                   help="the good client's ops per second (100)")
    p.add_argument("--good-keys", type=int, default=6, help="keys the good client adds to (6)")
    p.add_argument("--seed", type=int, help="random seed (printed in the report)")
    p.add_argument("--source", default="auto", help="source address of junk connections "
                   "(default: 127.0.0.2 when every node is on loopback, so the per-client "
                   "connection cap keeps junk and the good client apart; 'none': the OS picks)")
    p.add_argument("--cap-source", default="auto",
                   help="source address of the connection-cap class (default 127.0.0.3 on "
                   "loopback)")
    _add_limit_flags(p)
    return p


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    lim = Limits()
    g = p.add_argument_group("the nodes' limits", "as the nodes were started with (the "
                             "defaults are the node's): the junk aims just past them")
    g.add_argument("--max-body-bytes", type=int, default=lim.max_body_bytes, metavar="N",
                   help=f"413 above (default {lim.max_body_bytes})")
    g.add_argument("--max-batch-ops", type=int, default=lim.max_batch_ops, metavar="N",
                   help=f"ops per /v1/batch (default {lim.max_batch_ops})")
    g.add_argument("--max-op-id-bytes", type=int, default=lim.max_op_id_bytes, metavar="N",
                   help=f"longest op id (default {lim.max_op_id_bytes})")
    g.add_argument("--max-nesting-depth", type=int, default=lim.max_nesting_depth,
                   metavar="N", help=f"deepest body nesting (default {lim.max_nesting_depth})")
    g.add_argument("--header-timeout", type=float, default=lim.header_timeout, metavar="S",
                   help=f"slowloris gets 408 after this (default {lim.header_timeout:g})")
    g.add_argument("--body-timeout", type=float, default=lim.body_timeout, metavar="S",
                   help=f"a slow body gets 408 after this (default {lim.body_timeout:g})")
    g.add_argument("--max-connections-per-client", type=int,
                   default=lim.max_connections_per_client, metavar="N",
                   help=f"429 above (default {lim.max_connections_per_client})")
    g.add_argument("--peer-auth-skew", type=float, default=lim.peer_auth_skew, metavar="S",
                   help=f"HELLO clock tolerance (default {lim.peer_auth_skew:g})")
    g.add_argument("--max-reads", type=int, default=lim.max_reads, metavar="N",
                   help=f"counters per POST /v1/read (default {lim.max_reads})")


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def config_from_args(args: argparse.Namespace) -> HostileConfig:
    from cluster.transport.auth import load_secret

    token = args.token
    if args.token_file:
        lines = [ln.strip() for ln in Path(args.token_file).read_text().splitlines()
                 if ln.strip()]
        token = lines[0] if lines else None
    limits = Limits(args.max_body_bytes, args.max_batch_ops, args.max_op_id_bytes,
                    args.max_nesting_depth, args.header_timeout, args.body_timeout,
                    args.max_connections_per_client, args.peer_auth_skew, args.max_reads)
    return HostileConfig(
        nodes=_split(args.nodes), secret=load_secret(args.secret_file) if args.secret_file
        else None, token=token, duration=args.duration, rounds=args.rounds,
        classes=_split(args.classes) or None, skip=_split(args.skip), limits=limits,
        concurrency=args.concurrency, max_requests=args.max_requests, good_rate=args.good_rate,
        good_keys=args.good_keys, seed=args.seed,
        source=None if args.source == "none" else args.source,
        cap_source=None if args.cap_source == "none" else args.cap_source)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for cls in REGISTRY.values():
            extra = " [needs secret]" if cls.needs_secret else ""
            extra += " [needs token]" if cls.needs_token else ""
            print(f"{cls.name:<28} {cls.group:<5} {cls.doc}{extra}")
        return 0
    if not args.nodes:
        _parser().error("--nodes is required")
    report = asyncio.run(run_hostile(config_from_args(args)))
    print(format_report(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1
