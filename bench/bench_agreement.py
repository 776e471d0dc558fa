"""What agreeing on a membership version costs (docs/membership.md, "Agreement").

    python -m bench.bench_agreement [--nodes 3] [--changes 50]

``--nodes`` nodes run in this process (``NodeServer`` on loopback, signed peer frames, data
directories in a temporary directory, the default config: the ring file and ``votes.json`` are
fsynced at every write). The claimant is asked ``--changes`` table settings one after the
other (each a new version: prepare and accept on the voters, then the push), and the answer's
latency, the agreement's alone (prepare + accept), and the RING items the claimant sent per
change are printed. Then the claimant is cut off from every other node and asked once more:
the time until it answers "no majority" (one phase timeout, 2 ``quorum_timeout``).

The nodes share this process and its event loop, so the voters' fsyncs run one after the
other: on separate machines they overlap, and a change costs about the slowest majority's.
Run from the root of a tree: it imports the ``cluster`` package of the current directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster.core.config import from_mapping
from cluster.core.membership import MembershipError
from cluster.local import free_ports
from cluster.server import NodeServer


async def run(nodes: int, changes: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="idc-agreement-"))
    ports = free_ports(nodes)
    peers = ",".join(f"n{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    servers = [NodeServer(from_mapping({
        "node_id": f"n{i + 1}", "listen": f"127.0.0.1:{p}", "peers": peers,
        "data_dir": str(tmp / f"n{i + 1}")})) for i, p in enumerate(ports)]
    await asyncio.gather(*(s.start() for s in servers))
    try:
        await asyncio.sleep(1.0)  # heartbeats: every member seen live
        node: Any = servers[0].node
        agree_ms: list[float] = []
        agree = getattr(node.changes, "agree", None)
        if agree is not None:
            async def timed(base: Any, new: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await agree(base, new)
                finally:
                    agree_ms.append((time.perf_counter() - t0) * 1000)
            node.changes.agree = timed
        items0 = sum(link.items_sent for link in node.links.values())
        ms: list[float] = []
        for i in range(changes):
            t0 = time.perf_counter()
            await node.changes.change({"change": "table", "name": "t", "ttl_s": 100 + i})
            ms.append((time.perf_counter() - t0) * 1000)
        items = sum(link.items_sent for link in node.links.values()) - items0
        for link in node.links.values():  # the claimant alone
            link.fault = lambda _kind, _items: True
        t0 = time.perf_counter()
        refused = ""
        try:
            await node.changes.apply({"change": "table", "name": "t", "ttl_s": 1})
        except MembershipError as exc:
            refused = str(exc)
        refusal_s = time.perf_counter() - t0
        out: dict[str, Any] = {
            "nodes": nodes, "changes": changes, "version": node.membership.version,
            "change_ms_median": round(statistics.median(ms), 2),
            "change_ms_p90": round(sorted(ms)[int(0.9 * len(ms))], 2),
            "peer_items_per_change": round(items / changes, 1),
            "cut_off_answer_s": round(refusal_s, 2), "cut_off_answer": refused[:80]}
        if agree_ms:
            out["agreement_ms_median"] = round(statistics.median(agree_ms), 2)
        return out
    finally:
        for s in servers:
            with contextlib.suppress(Exception):
                await s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--changes", type=int, default=50)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print(asyncio.run(run(args.nodes, args.changes)))


if __name__ == "__main__":
    main()
