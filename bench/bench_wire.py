"""Peer frame cost: encode + decode of REPLICATE frames, unsigned against HMAC-SHA256 signed.

    python -m bench.bench_wire [--seconds 0.5] [--sizes 1,10,100,1000]

Each cell is one frame of ``size`` replication items (the shape ``cluster.node`` sends), encoded
by the sender and decoded and checked by the receiver; us per frame and per item.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from cluster.transport.auth import PeerAuth
from cluster.transport.wire import FrameDecoder, Kind, encode_frame


def _items(n: int) -> list[list[Any]]:
    return [[f"client-{i % 97}:{i}", "likes", f"post:{i % 5000}", "n1@3", 1000 + i, 0, 1, 0]
            for i in range(n)]


def _time(fn: Callable[[], Any], seconds: float) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(10):
            fn()
        calls += 10
    return elapsed / calls * 1e6


def _cell(size: int, seconds: float) -> tuple[float, float]:
    """us per frame of ``size`` items: unsigned, then signed (a connection past its HELLO)."""
    items = _items(size)
    plain = FrameDecoder()

    def unsigned() -> None:
        plain.feed(encode_frame(Kind.REPLICATE, 1, items))

    secret = b"bench-secret-0123456789abcdef"
    dialer, listener = PeerAuth("n1", secret), PeerAuth("n2", secret)
    hello, signer, _ = dialer.dial("n2")

    def accept(body: Any, signed: bytes, trailer: bytes) -> Any:
        return listener.accept(body, signed, trailer)[2]

    checked = FrameDecoder(accept=accept)
    checked.feed(encode_frame(Kind.HELLO, 0, hello, signer))

    def signed() -> None:
        checked.feed(encode_frame(Kind.REPLICATE, 1, items, signer))

    return _time(unsigned, seconds), _time(signed, seconds)


def bench(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {"unsigned_us": {}, "signed_us": {}, "signed_extra_pct": {}}
    for size in sizes:
        u, s = _cell(size, seconds)
        out["unsigned_us"][size], out["signed_us"][size] = round(u, 2), round(s, 2)
        out["signed_extra_pct"][size] = round((s / u - 1) * 100, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_wire", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="0.05 s cells (smoke run)")
    ap.add_argument("--seconds", type=float, default=0.5, help="per cell")
    ap.add_argument("--sizes", default="1,10,100,1000", help="items per frame")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 0.05)
    sizes = [int(s) for s in args.sizes.split(",")]
    res = bench(sizes, args.seconds)
    print(f"{'items/frame':>12} {'unsigned us':>12} {'signed us':>10} {'extra':>7} "
          f"{'signed us/item':>15}")
    for size in sizes:
        print(f"{size:>12} {res['unsigned_us'][size]:>12} {res['signed_us'][size]:>10} "
              f"{res['signed_extra_pct'][size]:>6}% {res['signed_us'][size] / size:>15.3f}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
