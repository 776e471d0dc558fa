"""``python -m client.proxy``: run the proxy server with its control API until Ctrl-C.

    python -m client.proxy --control 127.0.0.1:8474 \\
        --proxy n1=127.0.0.1:9101:127.0.0.1:7101:http [--config proxies.json] [--seed 1]

Then drive it like Toxiproxy:
    curl -X POST localhost:8474/proxies/n1/toxics \\
         -d '{"type": "lost_ack", "toxicity": 0.2}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from client.proxy.server import ProxyError, ProxyServer
from client.proxy.toxics import ToxicError


def parse_proxy(text: str) -> dict[str, Any]:
    """``name=listen_host:port:upstream_host:port[:protocol]``"""
    name, sep, rest = text.partition("=")
    parts = rest.split(":")
    if not sep or len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(
            f"expected name=LISTEN_HOST:PORT:UPSTREAM_HOST:PORT[:PROTOCOL], got {text!r}")
    return {"name": name, "listen": f"{parts[0]}:{parts[1]}",
            "upstream": f"{parts[2]}:{parts[3]}",
            "protocol": parts[4] if len(parts) == 5 else "tcp"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m client.proxy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", default="127.0.0.1:8474",
                    help="control API address (default 127.0.0.1:8474)")
    ap.add_argument("--proxy", action="append", type=parse_proxy, default=[],
                    help="a proxy to create at start; repeatable")
    ap.add_argument("--config", help="JSON file: a list of proxies, as for POST /populate")
    ap.add_argument("--seed", type=int, default=None, help="seed for toxicity draws")
    return ap


async def serve(args: argparse.Namespace) -> int:
    srv = ProxyServer(args.control, seed=args.seed)
    items = list(args.proxy)
    if args.config:
        with open(args.config) as f:
            loaded = json.load(f)
        items += loaded.get("proxies", []) if isinstance(loaded, dict) else loaded
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await srv.start()
    try:
        for proxy in await srv.populate(items):
            print(f"proxy {proxy.name}: {proxy.listen} -> {proxy.upstream} ({proxy.protocol})")
        assert srv.control_addr is not None
        print(f"control API on http://{srv.control_addr[0]}:{srv.control_addr[1]}", flush=True)
        await stop.wait()
    finally:
        await srv.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(serve(args))
    except (ProxyError, ToxicError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
