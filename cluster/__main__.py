"""``python -m cluster up``: start N local node processes, print their addresses, stop on Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from cluster.core.errors import ConfigError
from cluster.local import LocalCluster, ports_in_use


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cluster")
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run a local cluster of real node processes until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--rf", type=int, default=3)
    up.add_argument("--base-port", type=int, default=7101,
                    help="node i listens on BASE_PORT+i-1 (default 7101); 0: any free ports")
    up.add_argument("--data-dir", default=None, help="default: a fresh temporary directory")
    up.add_argument("--no-secret", dest="secret", action="store_false",
                    help="run peers unauthenticated (by default a random cluster secret is "
                         "written to DATA_DIR/cluster.secret and every frame is signed)")
    up.add_argument("node_args", nargs=argparse.REMAINDER,
                    help="after --, extra flags for every node (e.g. -- --dedup exact)")
    dec = sub.add_parser(
        "decommission", help="move every key range away from a member; it then exits 0",
        description="Move every key range away from member ID while clients keep writing. "
                    "Returns 0 once every remaining member lists ID as left; the node process "
                    "exits 0 by itself. A move lasts at least one dedup window. Of a member "
                    "still joining, the join is aborted instead.")
    dec.add_argument("id", metavar="ID", help="the member to remove")
    dec.add_argument("--via", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                     help="any live member (a comma list is tried in order)")
    dec.add_argument("--secret-file", default=None,
                     help="the cluster secret (needed when the cluster has one)")
    dec.add_argument("--timeout", type=float, default=600.0,
                     help="give up (exit 1) after this many seconds (default 600)")
    dec.add_argument("--tls-ca", default=None, metavar="FILE",
                     help="the cluster's port speaks TLS (nodes run with --tls-cert): check its "
                          "certificates against this CA bundle")
    dec.add_argument("--tls", action="store_true",
                     help="the cluster's port speaks TLS, certificates not checked (the "
                          "cluster secret still authenticates every frame)")
    fin = sub.add_parser(
        "finalize", help="after a rolling upgrade: let every member send and write the new "
                         "protocol (no rollback below it afterwards)",
        description="Show the release and protocol versions every member runs, then finalize "
                    "the highest protocol every member speaks: from then on nodes send frames "
                    "and write new files in it. Refused (exit 1, nothing changed) while a "
                    "member is down or still runs a release that does not speak it. Until "
                    "then, any node can be rolled back to the release it came from; after, "
                    "only to a release that speaks the finalized protocol (docs/operations.md).")
    fin.add_argument("--via", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                     help="any live member (a comma list is tried in order)")
    fin.add_argument("--protocol", type=int, default=None,
                     help="the version to finalize (default: the highest every member speaks)")
    fin.add_argument("--dry-run", action="store_true",
                     help="only show what every member runs and speaks")
    fin.add_argument("--secret-file", default=None,
                     help="the cluster secret (needed when the cluster has one)")
    fin.add_argument("--timeout", type=float, default=60.0,
                     help="give up (exit 1) when not every member installed it after this many "
                          "seconds (default 60)")
    fin.add_argument("--tls-ca", default=None, metavar="FILE",
                     help="the cluster's port speaks TLS: check its certificates against this")
    fin.add_argument("--tls", action="store_true",
                     help="the cluster's port speaks TLS, certificates not checked")
    return ap


class UpError(Exception):
    """``cluster up`` cannot start; the message is the one line the user sees."""


async def up(args: argparse.Namespace) -> int:
    extra = [a for a in args.node_args if a != "--"]
    if args.base_port:
        ports = [args.base_port + i for i in range(args.nodes)]
        taken = ports_in_use(ports)
        if taken:  # before any node starts: nothing to stop
            raise UpError(
                f"port{'s' if len(taken) > 1 else ''} {', '.join(map(str, taken))} on 127.0.0.1 "
                f"already in use (another `cluster up`, or the compose cluster?); pick free ones "
                f"with --base-port, or --base-port 0 for any free ports")
    try:
        cluster = LocalCluster(args.nodes, rf=args.rf, base_port=args.base_port or None,
                               data_dir=args.data_dir, extra_args=extra, secret=args.secret)
    except OSError as exc:
        why = ("exists and is not a directory" if isinstance(exc, FileExistsError)
               else exc.strerror or str(exc))
        raise UpError(f"--data-dir {args.data_dir}: {why}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await cluster.start()  # a node that fails stops the others before this raises
    except RuntimeError as exc:  # StartError (the node's own cause) or no READY in time
        raise UpError(f"{exc}; the other nodes were stopped") from exc
    try:
        print(f"cluster up: {len(cluster.nodes)} nodes, rf={args.rf}, data in {cluster.data_dir}")
        if cluster.secret_file is not None:
            print(f"  peers sign every frame with the secret in {cluster.secret_file}")
        for node in cluster.nodes.values():
            print(f"  {node.id}  {node.url}   (log: {node.log_path})")
        print("Ctrl-C to stop", flush=True)
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        waits += [asyncio.ensure_future(n.proc.wait()) for n in cluster.nodes.values() if n.proc]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        dead = [n.id for n in cluster.nodes.values() if not n.running]
        if dead and not stop.is_set():
            print(f"node(s) exited on their own: {', '.join(dead)}; stopping", file=sys.stderr)
    finally:
        codes = await cluster.stop()
        await cluster.abort()
    print("stopped: " + ", ".join(f"{k}={v}" for k, v in codes.items()), flush=True)
    return 0 if all(c == 0 for c in codes.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "decommission":
        from cluster import admin

        try:
            via = admin.parse_seeds(args.via)
            ctx = admin.admin_ssl(args.tls, args.tls_ca)
            return asyncio.run(admin.decommission(args.id, via, args.secret_file,
                                                  args.timeout, ssl_context=ctx))
        except (admin.AdminError, ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.command == "finalize":
        from cluster import admin

        try:
            via = admin.parse_seeds(args.via)
            ctx = admin.admin_ssl(args.tls, args.tls_ca)
            return asyncio.run(admin.finalize(via, args.secret_file, args.timeout,
                                              args.protocol, args.dry_run, ssl_context=ctx))
        except (admin.AdminError, ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    try:
        return asyncio.run(up(args))
    except UpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
