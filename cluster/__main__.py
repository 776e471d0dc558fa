"""``python -m cluster up``: start N local node processes, print their addresses, stop on Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from cluster.local import LocalCluster


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m cluster")
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run a local cluster of real node processes until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--rf", type=int, default=3)
    up.add_argument("--base-port", type=int, default=7101)
    up.add_argument("--data-dir", default=None, help="default: a fresh temporary directory")
    up.add_argument("--no-secret", dest="secret", action="store_false",
                    help="run peers unauthenticated (by default a random cluster secret is "
                         "written to DATA_DIR/cluster.secret and every frame is signed)")
    up.add_argument("node_args", nargs=argparse.REMAINDER,
                    help="after --, extra flags for every node (e.g. -- --dedup exact)")
    return ap


async def up(args: argparse.Namespace) -> int:
    extra = [a for a in args.node_args if a != "--"]
    cluster = LocalCluster(args.nodes, rf=args.rf, base_port=args.base_port,
                           data_dir=args.data_dir, extra_args=extra, secret=args.secret)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await cluster.start()
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
    return asyncio.run(up(args))


if __name__ == "__main__":
    sys.exit(main())
