"""``python -m cluster.demo`` (``make demo``): a 3-node cluster counts exactly despite duplicates.

Starts three real node processes on free loopback ports with a temporary data directory, runs
a workload that sends every op twice, to two different nodes (half of them one op a request,
half in batches), then reads every counter from every node and prints expected vs actual.
Bounded in time; stops every process; exits 1 on any mismatch.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

import aiohttp

from cluster.local import LocalCluster

TABLE = "demo"
KEYS = [f"page:{i}" for i in range(8)]
OPS = 400


async def post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> Any:
    async with session.post(url, json=payload) as resp:
        body = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {body}")
        return body


async def workload(session: aiohttp.ClientSession, urls: list[str],
                   rng: random.Random) -> tuple[dict[str, int], dict[str, int]]:
    expected = dict.fromkeys(KEYS, 0)
    outcomes = {"applied": 0, "duplicate": 0}
    ops = []
    for i in range(OPS):
        key, delta = rng.choice(KEYS), rng.choice([1, 1, 1, 2, 5, -1])
        expected[key] += delta
        ops.append({"table": TABLE, "key": key, "op_id": f"demo-client:{i}", "delta": delta})

    async def single(op: dict[str, Any], first: str, second: str) -> None:
        for url in (first, second):
            body = await post(session, f"{url}/v1/counters/{TABLE}/{op['key']}",
                              {"op_id": op["op_id"], "delta": op["delta"]})
            outcomes["applied" if body["applied"] else "duplicate"] += 1

    async def batch(chunk: list[dict[str, Any]], first: str, second: str) -> None:
        for url in (first, second):
            body = await post(session, f"{url}/v1/batch", {"ops": chunk})
            for r in body["results"]:
                outcomes["applied" if r["applied"] else "duplicate"] += 1

    half = OPS // 2
    tasks = [single(op, *rng.sample(urls, 2)) for op in ops[:half]]
    tasks += [batch(ops[i : i + 25], *rng.sample(urls, 2)) for i in range(half, OPS, 25)]
    await asyncio.gather(*tasks)
    return expected, outcomes


async def read_all(session: aiohttp.ClientSession, urls: list[str],
                   consistency: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for key in KEYS:
        out[key] = []
        for url in urls:
            async with session.get(f"{url}/v1/counters/{TABLE}/{key}",
                                   params={"consistency": consistency}) as resp:
                out[key].append((await resp.json())["value"])
    return out


async def main_async() -> int:
    rng = random.Random(2024)
    print("starting 3 nodes (RF=3, W=2, FBF dedup, fsync on) ...", flush=True)
    async with LocalCluster(3, rf=3) as cluster:
        urls = cluster.urls
        for node in cluster.nodes.values():
            print(f"  {node.id} {node.url}")
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            started = time.monotonic()
            expected, outcomes = await workload(session, urls, rng)
            print(f"sent {OPS} ops twice each to two different nodes in "
                  f"{time.monotonic() - started:.2f}s: {outcomes['applied']} applied, "
                  f"{outcomes['duplicate']} answered duplicate")
            await read_all(session, urls, "all")  # reads every replica and repairs any lag
            actual = await read_all(session, urls, "one")
    names = list(cluster.nodes)
    print(f"\n{'counter':<10}{'expected':>10}" + "".join(f"{n:>8}" for n in names))
    ok = True
    for key in KEYS:
        row_ok = all(v == expected[key] for v in actual[key])
        ok &= row_ok
        print(f"{key:<10}{expected[key]:>10}" + "".join(f"{v:>8}" for v in actual[key])
              + ("" if row_ok else "   MISMATCH"))
    total_expected = sum(expected.values())
    print(f"{'total':<10}{total_expected:>10}"
          + "".join(f"{sum(actual[k][i] for k in KEYS):>8}" for i in range(len(names))))
    print("\nOK: every node counts every op exactly once" if ok else "\nFAIL: mismatch")
    return 0 if ok else 1


def main() -> int:
    try:
        return asyncio.run(asyncio.wait_for(main_async(), 120))
    except (TimeoutError, RuntimeError, aiohttp.ClientError) as exc:
        print(f"demo failed: {exc!r}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
