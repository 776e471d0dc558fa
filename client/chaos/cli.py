"""``python -m client.chaos``: a bounded workload against a cluster behind fault proxies while a
nemesis schedule plays; then heal, wait for quiet, read every replica, check like Jepsen.

    python -m client.chaos                                # 3 local nodes, every nemesis, 30 s
    python -m client.chaos --duration 20 --nemesis lost-ack,duplicate,kill
    python -m client.chaos --mix delete=0.03,multiget=0.05,scan=0.02   # deletes, multi-gets
                                                          # and scans besides the adds
    python -m client.chaos --duration 32 --nemesis membership   # nodes join, leave, are
                                                          # replaced, crash mid-move (nodes
                                                          # get --window 2: a move lasts
                                                          # ~6-9 s)
    python -m client.chaos --nodes 5 --duration 60 --nemesis split-membership
                                                          # peer links cut between two halves,
                                                          # a different change asked on each:
                                                          # the half without a majority must
                                                          # be refused, and every member end
                                                          # with one membership
    python -m client.chaos --nodes http://h1:7101,http://h2:7101   # given nodes (no process
                                                                   # or peer faults)
    python -m client.chaos --nodes http://127.0.0.1:19101,... --compose-project idemcount
                                                          # a compose cluster: kill and pause
                                                          # its node containers (docker CLI)
    python -m client.chaos --check chaos-out/history.jsonl     # re-check a recorded history
    python -m client.chaos --data-dir d --out o; python -m client.chaos --check o/history.jsonl \
        --explain d                                       # which node applied each double
    python -m client.chaos --dedup                        # Fig. 14/15 + every dedup strategy

Exit status: 0 valid, 1 a violation was found, 2 the run could not be made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from client.chaos.history import load
from client.chaos.nemesis import ALL
from client.chaos.report import render
from client.chaos.runner import ChaosConfig, run_chaos
from client.chaos.workload import WorkloadConfig
from client.checker import check


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    a, b = float(lo), float(hi or lo)
    if not 0 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH seconds, got {text!r}")
    return a, b


MIX_DEFAULT = {"incr": 0.7, "decr": 0.2, "read": 0.1, "delete": 0.0, "multiget": 0.0,
               "scan": 0.0}
MIX_HELP = ("op weights: INCR,DECR,READ (e.g. 0.7,0.2,0.1), or NAME=W,... over incr, decr, "
            "read, delete, multiget, scan, and add (its weight split 7:2 between incr and "
            "decr); a name not given keeps its default (incr 0.7, decr 0.2, read 0.1, the "
            "others 0), e.g. delete=0.03,multiget=0.05,scan=0.02")


def _mix(text: str) -> dict[str, float]:
    try:
        if "=" not in text:
            parts = [float(x) for x in text.split(",")]
            if len(parts) != 3:
                raise ValueError
            mix = {**MIX_DEFAULT, "incr": parts[0], "decr": parts[1], "read": parts[2]}
        else:
            mix = dict(MIX_DEFAULT)
            for item in text.split(","):
                name, _, w = item.partition("=")
                name = name.strip()
                if name == "add":
                    mix["incr"], mix["decr"] = float(w) * 7 / 9, float(w) * 2 / 9
                elif name in mix:
                    mix[name] = float(w)
                else:
                    raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --mix {text!r}; {MIX_HELP}") from None
    if min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise argparse.ArgumentTypeError(f"--mix {text!r}: weights must be >= 0, not all 0")
    return mix


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m client.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("cluster")
    g.add_argument("--nodes", default="3",
                   help="number of local nodes (default 3) or a comma list of node URLs")
    g.add_argument("--rf", type=int, default=3)
    g.add_argument("--node-arg", action="append", default=[],
                   help="extra flag for every local node, e.g. --node-arg=--dedup=exact")
    g.add_argument("--data-dir", default=None,
                   help="keep the local nodes' data and logs (<id>.log) here after the run "
                        "(default: a temporary directory, deleted)")
    g.add_argument("--compose-project", default=None, metavar="NAME",
                   help="with --nodes URLS of a docker-compose cluster: the project whose node "
                        "containers kill and pause act on, through the docker CLI (services "
                        "named as the node ids, as in compose/)")
    g.add_argument("--no-peer-proxies", action="store_true",
                   help="let nodes talk directly (no partitions)")
    w = ap.add_argument_group("workload")
    w.add_argument("--clients", type=int, default=4)
    w.add_argument("--concurrency", type=int, default=4, help="processes per client")
    w.add_argument("--rate", type=float, default=200.0, help="target ops/s in total")
    w.add_argument("--duration", type=float, default=30.0, help="seconds of workload")
    w.add_argument("--keys", type=int, default=8)
    w.add_argument("--table", default=None,
                   help="table the workload counts in; the checker takes every counter to start "
                        "at 0 (default: 'chaos' on a fresh local cluster; with --nodes URLS a "
                        "new 'chaos-<random>' per run, so runs against one cluster never share "
                        "counters)")
    w.add_argument("--mix", type=_mix, default=dict(MIX_DEFAULT), help=MIX_HELP)
    w.add_argument("--max-delta", type=int, default=3)
    w.add_argument("--multiget-keys", type=int, default=4,
                   help="a multi-get reads 1..N distinct keys")
    w.add_argument("--scan-page-size", type=int, default=20)
    w.add_argument("--scan-keys", type=int, default=100,
                   help="a scan covers the keys under a random prefix that at most N of the "
                        "workload's keys start with")
    w.add_argument("--read-consistency", default="quorum", choices=("one", "quorum", "all"),
                   help="of reads, multi-gets and scans (the checker does not judge 'one')")
    w.add_argument("--attempt-timeout", type=float, default=0.5)
    w.add_argument("--total-timeout", type=float, default=10.0,
                   help="per op; clipped to the cluster's advertised window")
    w.add_argument("--batch-interval", type=float, default=0.002)
    w.add_argument("--max-batches-in-flight", type=int, default=1,
                   help="the SDK's setting (its default: 1): batches out at once to each "
                        "leader before its ops gather (0: a batch every --batch-interval)")
    w.add_argument("--coalesce", action="store_true")
    w.add_argument("--no-age", action="store_true",
                   help="do not send age_ms (nodes then never answer op_expired; needed "
                        "against strategies whose window is 0, such as --dedup none)")
    n = ap.add_argument_group("nemesis")
    n.add_argument("--nemesis", default=None,
                   help=f"comma list from {','.join(ALL)} (default: all available); "
                        "'none' for a fault-free run")
    n.add_argument("--quiet", type=_pair, default=(1.0, 2.0), help="LOW,HIGH s between faults")
    n.add_argument("--fault", type=_pair, default=(2.0, 4.0), help="LOW,HIGH s of each fault")
    n.add_argument("--quiet-timeout", type=float, default=15.0,
                   help="after healing, seconds replicas may take to agree")
    n.add_argument("--repair-reads", action="store_true",
                   help="read each key at consistency=all once before the final reads")
    o = ap.add_argument_group("output")
    o.add_argument("--out", default="chaos-out", help="directory for history and report")
    o.add_argument("--seed", type=int, default=None)
    o.add_argument("--no-progress", action="store_true")
    o.add_argument("--check", metavar="HISTORY", help="only run the checker on a history file")
    o.add_argument("--explain", metavar="DATA_DIR",
                   help="with --check: read the nodes' logs kept with --data-dir and list the "
                        "ops counted more than once (which node applied each copy, and when)")
    o.add_argument("--dedup", action="store_true",
                   help="compare dedup strategies (Fig. 14, Fig. 15, table) instead")
    o.add_argument("--dedup-strategies", default=None,
                   help="comma list for --dedup (default: every strategy)")
    return ap


def config_from_args(args: argparse.Namespace) -> ChaosConfig:
    urls: tuple[str, ...] = ()
    nodes = 3
    if args.nodes.isdigit():
        nodes = int(args.nodes)
    else:
        urls = tuple(u for u in args.nodes.split(",") if u.strip())
    wl = WorkloadConfig(clients=args.clients, concurrency=args.concurrency, rate=args.rate,
                        duration=args.duration, keys=args.keys, **args.mix,
                        max_delta=args.max_delta, multiget_keys=args.multiget_keys,
                        scan_page_size=args.scan_page_size, scan_keys=args.scan_keys,
                        read_consistency=args.read_consistency,
                        attempt_timeout=args.attempt_timeout,
                        total_timeout=args.total_timeout, batch_interval=args.batch_interval,
                        max_batches_in_flight=args.max_batches_in_flight,
                        coalesce=args.coalesce, send_age=not args.no_age,
                        table=args.table or ("chaos" if not urls else
                                             f"chaos-{secrets.token_hex(4)}"))
    if args.data_dir and any(Path(args.data_dir).glob("*/incarnation")):
        # the nodes would start from that state: counts of an earlier run, reported as over
        raise ValueError(f"--data-dir {args.data_dir} holds the nodes of an earlier run; "
                         "give a new or empty directory")
    nemeses: tuple[str, ...] | None = None
    if args.nemesis:
        nemeses = tuple(x for x in args.nemesis.split(",") if x and x != "none")
    return ChaosConfig(workload=wl, nodes=nodes, rf=args.rf, urls=urls,
                       node_args=tuple(args.node_arg), nemeses=nemeses, quiet=args.quiet,
                       fault=args.fault, quiet_timeout=args.quiet_timeout,
                       repair_reads=args.repair_reads, out_dir=args.out, seed=args.seed,
                       progress=not args.no_progress,
                       proxy_peers=False if args.no_peer_proxies else None,
                       data_dir=args.data_dir, compose_project=args.compose_project)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check:
        events = load(args.check)
        rep = check(events)
        print(json.dumps(rep.to_dict(), indent=2, default=str))
        print("VALID" if rep.valid else "INVALID: " + "; ".join(rep.problems))
        if args.explain:
            from client.chaos.forensics import explain

            print(explain(args.explain, events))
        return 0 if rep.valid else 1
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dedup:
        from client.chaos.dedup import main_dedup

        return main_dedup(cfg, args.dedup_strategies)
    try:
        result = asyncio.run(run_chaos(cfg))
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    print(f"report: {cfg.out_dir}/report.json")
    return 0 if result.valid else 1
