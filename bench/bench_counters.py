"""Counters beyond adding: multi-get, scans, deletes, and node memory while keys expire.

    python -m bench.bench_counters [--quick] [--parts multiget,delete,scan,churn] [--json F]

Every part runs against 3 real node processes, RF 3, W 2, fsync on (``cluster.local``), bounded
in time, and prints a table:

  multiget  ``--mget-keys`` counters (100) read at quorum by one ``POST /v1/read`` against the
            same number of single ``GET /v1/counters/{t}/{k}?consistency=quorum``: node
            CPU-seconds per counter read for each (all three nodes, from /proc), the ratio, and
            counters read a second by multi-get under ``--concurrency`` clients (msgpack bodies;
            a JSON multi-get row shows what msgpack saves). Targets: >= 20x less node CPU a
            counter, >= 50k counters/s.
  delete    node CPU per delete against per add, one op a request and ``--batch`` ops a
            ``/v1/batch``, with request p50/p99. Each request goes to its keys' leader (as the
            SDK sends them); the deletes remove the keys the adds just wrote.
  scan      ``--scan-counters`` counters (1M) loaded by ``/v1/batch`` requests of
            ``--load-batch`` ops (10k, one leader's keys a request), then scanned with
            ``limit=--scan-limit`` (1000) pages at quorum: counters/s, and a check that every
            key came back exactly once, with its value (the run fails otherwise).
  churn     a table with ``ttl_s = --churn-ttl`` (30) that gets ``--churn-keys`` (200k) new keys
            every ``--churn-period`` (the ttl) for ``--churn-seconds`` (300), spread evenly;
            every node's RSS and keys held sampled every ``--rss-every`` s, and whether each
            node's RSS stayed within 15% of its value at the end of the second period (and
            from the earliest steady state, ttl + grace + a period); the load stops at the end
            even when behind, and the peers the nodes took for down are counted. Its own
            cluster runs with a short ``--tombstone-grace`` and ``--sweep-interval``: a key's
            memory is reclaimed only once its ttl and then its tombstone's grace have passed
            (and a sweep pass reached it), so with the default grace (3600 s) a run of minutes
            would only ever grow.

multiget and delete share one cluster (``--rate 200000`` sizes the nodes' filters for the loads,
as ``bench.bench_cluster`` does); scan and churn each start one of their own. The load
generator runs in this process on the same machine and competes for the same cores; the nodes'
idle CPU (heartbeats, anti-entropy, sweeps) is measured before each part and printed beside it.
``--client aiohttp`` sends through one keep-alive aiohttp session per worker instead of
``bench.httpload``'s raw keep-alive connections (which cost the load generator less).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol
from urllib.parse import quote

import msgpack

from bench.bench_cluster import cpu_seconds, pct, rss_kib, run_and_report
from bench.httpload import HttpConn
from cluster.core.ring import Ring
from cluster.local import LocalCluster
from cluster.roles.expiry import MAX_KEYS

MP = "application/msgpack"
PARTS = ("multiget", "delete", "scan", "churn")


class Conn(Protocol):
    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = MP) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class AioConn:
    """One keep-alive aiohttp session to one node (``--client aiohttp``)."""

    def __init__(self, base: str) -> None:
        import aiohttp

        self.base = base
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))

    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = MP) -> tuple[int, bytes]:
        async with self.session.request(method, self.base + path, data=body, headers={
                "Content-Type": content_type, "Accept": content_type}) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        await self.session.close()


class Nodes:
    """The cluster's nodes as the load sees them: addresses, pids, connections, /metrics."""

    def __init__(self, cluster: LocalCluster, client: str) -> None:
        self.ids = list(cluster.nodes)
        self.addr = {i: (n.host, n.port) for i, n in cluster.nodes.items()}
        self.pid = {i: n.proc.pid for i, n in cluster.nodes.items() if n.proc}
        self.log = {i: n.log_path for i, n in cluster.nodes.items()}
        self.client = client

    async def open(self, node_id: str) -> Conn:
        host, port = self.addr[node_id]
        if self.client == "aiohttp":
            return AioConn(f"http://{host}:{port}")
        return await HttpConn.open(host, port)

    def cpu(self) -> float:
        return cpu_seconds(list(self.pid.values()))

    async def idle_cpu(self, seconds: float = 1.0) -> float:
        """The three nodes' CPU a second with no load (heartbeats, anti-entropy, sweeps)."""
        cpu0 = self.cpu()
        await asyncio.sleep(seconds)
        return round((self.cpu() - cpu0) / seconds, 3)

    async def quiet(self, most: float, below: float = 0.1) -> tuple[float, float]:
        """Wait (up to ``most`` s) until the nodes' CPU falls under ``below`` CPU-s/s: their
        CPU a second then, and the seconds waited."""
        start = time.perf_counter()
        rate = await self.idle_cpu()
        while rate >= below and time.perf_counter() - start < most:
            rate = await self.idle_cpu()
        return rate, round(time.perf_counter() - start, 1)

    async def metrics(self, node_id: str) -> dict[str, float]:
        """The node's unlabelled /metrics samples."""
        conn = await HttpConn.open(*self.addr[node_id])
        try:
            _, body = await conn.request("GET", "/metrics", content_type="text/plain")
        finally:
            await conn.close()
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(" ")
            if line and not line.startswith("#") and "{" not in name:
                out[name] = float(value)
        return out

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One msgpack request to the first node; the decoded answer (raises unless 200)."""
        conn = await HttpConn.open(*self.addr[self.ids[0]])
        try:
            status, got = await conn.request(method, path, msgpack.packb(body) if body else b"")
        finally:
            await conn.close()
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {got[:300]!r}")
        return msgpack.unpackb(got)


# make(conn, worker) sends one request: (items done, items failed), or None when out of work
Make = Callable[[Conn, int], Awaitable[tuple[int, int] | None]]


async def drive(nodes: Nodes, concurrency: int, seconds: float, make: Make) -> dict[str, Any]:
    """``concurrency`` workers (worker i on node ``ids[i % 3]``), each sending its next request
    as soon as it has an answer, for ``seconds`` or until ``make`` runs out of work."""
    conns = [await nodes.open(nodes.ids[i % len(nodes.ids)]) for i in range(concurrency)]
    lat: list[float] = []
    done = [0, 0]
    deadline = [0.0]

    async def worker(i: int) -> None:
        conn = conns[i]
        while time.perf_counter() < deadline[0]:
            t0 = time.perf_counter()
            got = await make(conn, i)
            if got is None:
                break
            lat.append(time.perf_counter() - t0)
            done[0] += got[0]
            done[1] += got[1]

    cpu0, own0 = nodes.cpu(), time.process_time()
    start = time.perf_counter()
    deadline[0] = start + seconds
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        elapsed = time.perf_counter() - start
        node_cpu, own = nodes.cpu() - cpu0, time.process_time() - own0
        for conn in conns:
            await conn.close()
    items = max(done[0], 1)
    return {"requests": len(lat), "items": done[0], "failed": done[1],
            "seconds": round(elapsed, 2), "items_per_s": round(done[0] / elapsed),
            "node_cpu_us_per_item": round(node_cpu / items * 1e6, 1),
            "client_cpu_us_per_item": round(own / items * 1e6, 1),
            "p50_ms": round(pct(lat, 0.50) * 1e3, 2), "p99_ms": round(pct(lat, 0.99) * 1e3, 2)}


def applied(body: bytes) -> tuple[int, int]:
    """A batch answer's (applied, not applied) counts (a duplicate counts as applied: only
    retries are sent twice here)."""
    results = msgpack.unpackb(body)["results"]
    ok = sum(1 for r in results if r.get("applied") or r.get("duplicate"))
    return ok, len(results) - ok


def table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Print ``rows`` as an aligned table of ``cols`` (the first column: the row's name)."""
    cells = [cols] + [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))
    print(flush=True)


async def load_table(nodes: Nodes, tbl: str, count: int, key_of: Callable[[int], str],
                     delta_of: Callable[[int], int], per: int, prefix: str = "load",
                     workers: int = 1) -> dict[str, Any]:
    """Write ``count`` counters through ``/v1/batch`` requests of ``per`` ops, each request
    of one leader's keys sent to that leader (as the SDK splits a batch; sent to any node, a
    big batch's forwarded parts outlive the quorum timeout under load and answer 503 although
    they are applied), ``workers`` requests in flight. One at a time is the default: with a
    10k-op request per leader in flight at once, each took over the 2 s quorum timeout on a
    machine busy with other work, and the resends' checks on the replicas (``attempt`` > 1)
    cost more than the load itself (~1k counters/s).

    Ops answered 503 are sent again with their op ids, as the API asks: each op carries
    ``ts_ms`` (when it was first sent) and, sent again, its ``attempt``, so that a node refuses
    a copy older than the dedup window with 410 instead of counting it again (plain resends,
    without them, went on past the window on a loaded machine and counted ops two and three
    times). An op answered 410 has an unknown outcome: once the load is done and the nodes
    have settled their in-doubt ops, its key is read, and written again under a new op id if
    it reads 0. Seconds, ops/s, ops resent, answered 410 and written again."""
    ring = Ring(nodes.ids, rf=3)
    led: dict[str, list[int]] = {i: [] for i in nodes.ids}
    for j in range(count):
        led[str(ring.leader(tbl, key_of(j)))].append(j)
    stats = {"ops_resent": 0, "ops_expired_410": 0, "ops_written_again": 0}
    unknown: list[int] = []

    async def send(conn: Conn, idx: list[int], again: int) -> None:
        ts, pending = int(time.time() * 1000), idx
        for attempt in range(1, 31):
            ops = [{"table": tbl, "key": key_of(j), "delta": delta_of(j), "ts_ms": ts,
                    "op_id": f"{prefix}:{j}" + (f":{again}" if again else ""),
                    **({"attempt": attempt} if attempt > 1 else {})} for j in pending]
            status, body = await conn.request("POST", "/v1/batch", msgpack.packb({"ops": ops}))
            if status == 200:
                left = []
                for j, r in zip(pending, msgpack.unpackb(body)["results"], strict=True):
                    if r.get("applied") or r.get("duplicate"):
                        continue
                    if r.get("status") == 410:
                        unknown.append(j)
                        stats["ops_expired_410"] += 1
                    else:
                        left.append(j)
                pending = left
            if not pending:
                return
            stats["ops_resent"] += len(pending)
            await asyncio.sleep(min(0.25 * 2 ** (attempt - 1), 2.0))
        raise RuntimeError(f"loading {tbl}: {len(pending)} ops still refused after 30 tries "
                           f"({status} {body[:200]!r})")

    async def run(led: dict[str, list[int]], again: int) -> None:
        """Every leader's keys in requests of ``per``, the leaders in turn, ``workers``
        requests in flight."""
        todo = iter([(leader, keys[at:at + per])
                     for at in range(0, max(map(len, led.values())), per)
                     for leader, keys in led.items() if keys[at:at + per]])

        async def worker() -> None:
            conns: dict[str, Conn] = {}
            try:
                for leader, idx in todo:
                    if leader not in conns:
                        conns[leader] = await nodes.open(leader)
                    await send(conns[leader], idx, again)
            finally:
                for conn in conns.values():
                    await conn.close()

        await asyncio.gather(*(worker() for _ in range(workers)))

    start = time.perf_counter()
    await run(led, 0)
    for again in range(1, 6):
        if not unknown:
            break
        await asyncio.sleep(3.0)  # in-doubt ops past their window are settled meanwhile
        first = await read_values(nodes, tbl, [key_of(j) for j in unknown])
        await asyncio.sleep(2.0)
        values = await read_values(nodes, tbl, [key_of(j) for j in unknown])
        if values != first:
            continue  # still settling: look again
        wrong = [(key_of(j), v) for j, v in zip(unknown, values, strict=True)
                 if v not in (0, delta_of(j))]
        if wrong:
            raise RuntimeError(f"loading {tbl}: counters other than 0 or their delta after "
                               f"410 answers: {wrong[:10]}")
        redo = [j for j, v in zip(unknown, values, strict=True) if v == 0]
        unknown.clear()
        stats["ops_written_again"] += len(redo)
        led = {i: [] for i in nodes.ids}
        for j in redo:
            led[str(ring.leader(tbl, key_of(j)))].append(j)
        await run(led, again)
    if unknown:
        raise RuntimeError(f"loading {tbl}: {len(unknown)} ops of unknown outcome left")
    secs = time.perf_counter() - start
    return {"counters": count, "seconds": round(secs, 1), "ops_per_s": round(count / secs),
            **stats}


async def read_values(nodes: Nodes, tbl: str, keys: list[str], consistency: str = "quorum"
                      ) -> list[int]:
    """The keys' values by ``POST /v1/read`` of up to 1000 keys each (503s asked again)."""
    out: list[int] = []
    for at in range(0, len(keys), 1000):
        body = {"reads": [{"table": tbl, "key": k} for k in keys[at:at + 1000]],
                "consistency": consistency}
        for attempt in range(20):
            try:
                out += (await nodes.call("POST", "/v1/read", body))["values"]
                break
            except RuntimeError:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
    return out


# ---------------------------------------------------------------------------------- multiget

async def part_multiget(nodes: Nodes, args: argparse.Namespace) -> dict[str, Any]:
    n, tbl = args.mget_keys, "mg"
    key_of, delta_of = (lambda i: f"m{i:07d}"), (lambda i: 1 + i % 97)
    out: dict[str, Any] = {"load": await load_table(nodes, tbl, args.mget_table_keys, key_of,
                                                    delta_of, 10_000, prefix="mg")}
    print(f"loaded {args.mget_table_keys} counters: {out['load']}", flush=True)
    # the values come back right, in order: every key, in multi-gets of 1000
    want = [delta_of(i) for i in range(args.mget_table_keys)]
    got = await read_values(nodes, tbl, [key_of(i) for i in range(args.mget_table_keys)])
    wrong = [(key_of(i), g, w) for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    print(f"check: multi-gets at quorum of all {len(want)} counters: {len(wrong)} wrong"
          + (f" (key, read, written): {wrong[:5]}" if wrong else ", every value right"),
          flush=True)
    assert not wrong, f"{len(wrong)} counters read wrong, e.g. {wrong[:5]}"
    out["idle_node_cpu_per_s"] = await nodes.idle_cpu()

    # requests built before the clock starts (building them is the client's work, not the
    # nodes'); each worker walks a pool of its own
    rng = random.Random(1)
    bodies = {fmt: [enc({"reads": [{"table": tbl, "key": key_of(rng.randrange(
                args.mget_table_keys))} for _ in range(n)], "consistency": "quorum"})
                     for _ in range(64)]
              for fmt, enc in (("msgpack", msgpack.packb), ("json", _json_bytes))}
    paths = [f"/v1/counters/{tbl}/{key_of(rng.randrange(args.mget_table_keys))}"
             "?consistency=quorum" for _ in range(4096)]
    turn = itertools.count()

    async def single(conn: Conn, _: int) -> tuple[int, int]:
        status, _body = await conn.request("GET", paths[next(turn) % len(paths)])
        return (1, 0) if status == 200 else (0, 1)

    def multi(fmt: str) -> Make:
        ctype = MP if fmt == "msgpack" else "application/json"

        async def make(conn: Conn, _: int) -> tuple[int, int]:
            body = bodies[fmt][next(turn) % 64]
            status, _body = await conn.request("POST", "/v1/read", body, ctype)
            return (n, 0) if status == 200 else (0, n)
        return make

    rows = []
    for name, make in ((f"{n} single GETs", single), ("multi-get, msgpack", multi("msgpack")),
                       ("multi-get, JSON", multi("json"))):
        res = await drive(nodes, args.concurrency, args.seconds, make)
        res["phase"] = name
        rows.append(res)
    out["single"], out["multi"], out["multi_json"] = rows
    ratio = rows[0]["node_cpu_us_per_item"] / max(rows[1]["node_cpu_us_per_item"], 1e-9)
    out["cpu_ratio_single_over_multi"] = round(ratio, 1)
    table(f"multi-get: counters read at quorum, {args.concurrency} clients, "
          f"{args.seconds:g} s each, {len(nodes.ids)} nodes' CPU (idle: "
          f"{out['idle_node_cpu_per_s']} CPU-s/s)", rows,
          ["phase", "items_per_s", "node_cpu_us_per_item", "client_cpu_us_per_item",
           "requests", "p50_ms", "p99_ms", "failed"])
    print(f"node CPU a counter, single GET / multi-get: {ratio:.1f}x", flush=True)
    out["targets"] = [
        {"target": "multi-get node CPU a counter >= 20x less than single GETs",
         "measured": round(ratio, 1), "met": ratio >= 20},
        {"target": "multi-get counters/s >= 50k", "measured": rows[1]["items_per_s"],
         "met": rows[1]["items_per_s"] >= 50_000}]
    return out


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------- delete

async def part_delete(nodes: Nodes, args: argparse.Namespace) -> dict[str, Any]:
    tbl, ids = "dl", nodes.ids
    ring = Ring(ids, rf=3)

    def pool(prefix: str, count: int) -> dict[str, list[str]]:
        """``count`` keys by their leader (found before the clock starts)."""
        led: dict[str, list[str]] = {i: [] for i in ids}
        for j in range(count):
            key = f"{prefix}{j}"
            led[str(ring.leader(tbl, key))].append(key)
        return led

    fresh = {"single": pool("a", args.delete_keys // 10), "batch": pool("b", args.delete_keys)}
    written: dict[str, dict[str, list[str]]] = {"single": {i: [] for i in ids},
                                                 "batch": {i: [] for i in ids}}
    removed: list[str] = []
    out: dict[str, Any] = {"idle_node_cpu_per_s": await nodes.idle_cpu()}

    async def add_one(conn: Conn, w: int) -> tuple[int, int] | None:
        leader = ids[w % len(ids)]
        if not fresh["single"][leader]:
            return None
        key = fresh["single"][leader].pop()
        status, body = await conn.request("POST", f"/v1/counters/{tbl}/{key}",
                                          msgpack.packb({"op_id": f"a:{key}", "delta": 1}))
        if status == 200 and msgpack.unpackb(body).get("applied"):
            written["single"][leader].append(key)
            return 1, 0
        return 0, 1

    async def delete_one(conn: Conn, w: int) -> tuple[int, int] | None:
        leader = ids[w % len(ids)]
        if not written["single"][leader]:
            return None
        key = written["single"][leader].pop()
        status, body = await conn.request("DELETE", f"/v1/counters/{tbl}/{key}?op_id=d:{key}")
        if status == 200 and msgpack.unpackb(body).get("applied"):
            removed.append(key)
            return 1, 0
        return 0, 1

    async def add_batch(conn: Conn, w: int) -> tuple[int, int] | None:
        leader = ids[w % len(ids)]
        keys = _take(fresh["batch"][leader], args.batch)
        if not keys:
            return None
        ops = [{"table": tbl, "key": k, "op_id": f"a:{k}", "delta": 1} for k in keys]
        status, body = await conn.request("POST", "/v1/batch", msgpack.packb({"ops": ops}))
        if status != 200:
            return 0, len(keys)
        results = msgpack.unpackb(body)["results"]
        written["batch"][leader] += [k for k, r in zip(keys, results, strict=True)
                                     if r.get("applied")]
        return applied(body)

    async def delete_batch(conn: Conn, w: int) -> tuple[int, int] | None:
        leader = ids[w % len(ids)]
        keys = _take(written["batch"][leader], args.batch)
        if not keys:
            return None
        ops = [{"table": tbl, "key": k, "op_id": f"d:{k}", "op": "delete"} for k in keys]
        status, body = await conn.request("POST", "/v1/batch", msgpack.packb({"ops": ops}))
        if status != 200:
            return 0, len(keys)
        results = msgpack.unpackb(body)["results"]
        removed.extend(k for k, r in zip(keys, results, strict=True) if r.get("applied"))
        return applied(body)

    rows = []
    for name, make in (("add, 1 a request", add_one), ("delete, 1 a request", delete_one),
                       (f"add, {args.batch} a batch", add_batch),
                       (f"delete, {args.batch} a batch", delete_batch)):
        res = await drive(nodes, args.concurrency, args.seconds, make)
        res["phase"] = name
        rows.append(res)
    out["add_single"], out["delete_single"], out["add_batch"], out["delete_batch"] = rows
    table(f"delete vs add: ops sent to their leader, {args.concurrency} clients, up to "
          f"{args.seconds:g} s each (a delete phase ends when the keys just added run out); "
          f"idle: {out['idle_node_cpu_per_s']} CPU-s/s", rows,
          ["phase", "items_per_s", "node_cpu_us_per_item", "client_cpu_us_per_item",
           "requests", "p50_ms", "p99_ms", "seconds", "failed"])
    for kind, add, rem in (("single", rows[0], rows[1]), ("batch", rows[2], rows[3])):
        r = rem["node_cpu_us_per_item"] / max(add["node_cpu_us_per_item"], 1e-9)
        out[f"cpu_ratio_delete_over_add_{kind}"] = round(r, 2)
        print(f"node CPU a delete / an add ({kind}): {r:.2f}", flush=True)

    # what was deleted reads 0; what was added and not deleted still reads 1
    gone = random.sample(removed, min(100, len(removed)))
    left = [k for keys in written["single"].values() for k in keys][:50] + \
        [k for keys in written["batch"].values() for k in keys][:50]
    values = (await nodes.call("POST", "/v1/read", {
        "reads": [{"table": tbl, "key": k} for k in gone + left]}))["values"]
    assert values == [0] * len(gone) + [1] * len(left), "a delete did not read back right"
    print(f"check: {len(gone)} deleted counters read 0 and {len(left)} kept ones read 1",
          flush=True)
    return out


def _take(keys: list[str], n: int) -> list[str]:
    taken = keys[-n:]
    del keys[-n:]
    return taken


# ---------------------------------------------------------------------------------- scan

async def part_scan(nodes: Nodes, args: argparse.Namespace) -> dict[str, Any]:
    count, tbl = args.scan_counters, "scan"
    key_of = (lambda i: f"s{i:07d}")  # noqa: E731 - one line, used twice
    out: dict[str, Any] = {"load": await load_table(
        nodes, tbl, count, key_of, lambda i: 1, args.load_batch, prefix="scan",
        workers=args.load_workers)}
    print(f"loaded {count} counters in {out['load']['seconds']} s "
          f"({out['load']['ops_per_s']} ops/s, {args.load_batch} ops a /v1/batch sent to their "
          f"leader): {out['load']}", flush=True)
    out["idle_node_cpu_per_s"], out["waited_for_idle_s"] = await nodes.quiet(args.idle_wait)
    print(f"nodes' CPU before the scan: {out['idle_node_cpu_per_s']} CPU-s/s, after waiting "
          f"{out['waited_for_idle_s']} s for the load's after-work (snapshots, digests)",
          flush=True)

    seen: set[str] = set()
    dups = wrong = pages = short = 0
    page_lat: list[float] = []
    conn = await nodes.open(nodes.ids[0])
    cpu0 = nodes.cpu()
    start = time.perf_counter()
    after: str | None = None
    try:
        while True:
            path = f"/v1/counters/{tbl}?limit={args.scan_limit}&consistency=quorum"
            if after is not None:
                path += f"&after={quote(after, safe='')}"
            t0 = time.perf_counter()
            status, body = await conn.request("GET", path)
            for _ in range(5):
                if status == 200:
                    break
                await asyncio.sleep(0.2)
                status, body = await conn.request("GET", path)
            if status != 200:
                raise RuntimeError(f"scan page {pages}: {status} {body[:300]!r}")
            page_lat.append(time.perf_counter() - t0)
            page = msgpack.unpackb(body)
            pages += 1
            short += len(page["counters"]) < args.scan_limit and page["next"] is not None
            for c in page["counters"]:
                if c["key"] in seen:
                    dups += 1
                seen.add(c["key"])
                wrong += c["value"] != 1
            after = page["next"]
            if after is None:
                break
    finally:
        await conn.close()
    elapsed = time.perf_counter() - start
    node_cpu = nodes.cpu() - cpu0
    returned = len(seen) + dups
    expected = {key_of(i) for i in range(count)}
    missing, extra = len(expected - seen), len(seen - expected)
    out["scan"] = {"counters_returned": returned, "pages": pages, "short_pages": short,
                   "seconds": round(elapsed, 2), "counters_per_s": round(returned / elapsed),
                   "node_cpu_us_per_counter": round(node_cpu / max(returned, 1) * 1e6, 2),
                   "page_p50_ms": round(pct(page_lat, 0.5) * 1e3, 2),
                   "page_p99_ms": round(pct(page_lat, 0.99) * 1e3, 2)}
    out["check"] = {"expected": count, "distinct": len(seen), "duplicates": dups,
                    "missing": missing, "unexpected": extra, "wrong_values": wrong}
    table(f"scan: one client, limit={args.scan_limit}, consistency=quorum "
          f"(idle: {out['idle_node_cpu_per_s']} CPU-s/s)", [out["scan"]],
          ["counters_returned", "counters_per_s", "seconds", "pages", "short_pages",
           "node_cpu_us_per_counter", "page_p50_ms", "page_p99_ms"])
    ok = dups == missing == extra == wrong == 0 and returned == count
    print(f"check: {count} keys written, {returned} returned, {len(seen)} distinct, "
          f"{dups} duplicates, {missing} missing, {extra} unexpected, {wrong} wrong values: "
          f"{'every key exactly once' if ok else 'FAILED'}", flush=True)
    assert ok, f"scan check failed: {out['check']}"
    return out


# ---------------------------------------------------------------------------------- churn

async def part_churn(nodes: Nodes, args: argparse.Namespace) -> dict[str, Any]:
    tbl, period, seconds = "churn", args.churn_period, args.churn_seconds
    got = await nodes.call("PUT", f"/v1/tables/{tbl}", {"ttl_s": args.churn_ttl})
    assert got.get("ttl_s") == args.churn_ttl, got
    per_batch = min(args.churn_batch, args.churn_keys)
    batches = math.ceil(args.churn_keys / per_batch)
    periods = math.ceil(seconds / period)
    schedule: Iterator[tuple[float, int, int]] = iter(
        (p * period + b * period / batches, p, b)
        for p in range(periods) for b in range(batches) if p * period + b * period / batches
        < seconds)
    sent = [0, 0, 0]  # applied, refused (503 and the like: not resent), not sent by the end
    lag = [0.0]
    start = time.perf_counter()

    async def loader(w: int) -> None:
        conn = await nodes.open(nodes.ids[w % len(nodes.ids)])
        try:
            for due, p, b in schedule:
                lo, hi = b * per_batch, min((b + 1) * per_batch, args.churn_keys)
                wait = start + due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif time.perf_counter() - start >= seconds:  # behind and out of time: bounded
                    sent[2] += hi - lo
                    continue
                else:
                    lag[0] = max(lag[0], -wait)
                ops = [{"table": tbl, "key": f"p{p}-{j}", "op_id": f"c:{p}:{j}", "delta": 1}
                       for j in range(lo, hi)]
                status, body = await conn.request("POST", "/v1/batch",
                                                  msgpack.packb({"ops": ops}))
                ok, bad = applied(body) if status == 200 else (0, len(ops))
                sent[0] += ok
                sent[1] += bad
        finally:
            await conn.close()

    samples: list[dict[str, Any]] = []

    async def sample() -> None:
        row: dict[str, Any] = {"t": round(time.perf_counter() - start, 1)}
        expired = collected = 0.0
        for i in nodes.ids:
            m = await nodes.metrics(i)
            row[f"{i}_rss_mib"] = round(rss_kib(nodes.pid[i]) / 1024, 1)
            row[f"{i}_keys"] = int(m.get("idc_counters", -1))
            expired += m.get("idc_expired_keys_total", 0)
            collected += m.get("idc_collected_keys_total", 0)
        row["expired"], row["collected"] = int(expired), int(collected)
        row["written"] = sent[0]
        samples.append(row)
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    life = args.churn_ttl + args.churn_grace
    steady_t = life + period
    print(f"churn: table {tbl!r} ttl_s={args.churn_ttl}, {args.churn_keys} new keys every "
          f"{period:g} s for {seconds:g} s; nodes: --tombstone-grace {args.churn_grace:g} "
          f"--sweep-interval {args.churn_sweep:g}. A key is held from its write until at least "
          f"ttl + grace = {life:g} s later (plus until a sweep pass reaches it, twice: to expire "
          f"it, then to drop its tombstone; a pass looks at up to {MAX_KEYS} due keys a node), so "
          f"the keys held can level off from t = {steady_t:g} s at the earliest", flush=True)
    await sample()
    loading = asyncio.gather(*(loader(w) for w in range(4)))
    tick = 1
    while time.perf_counter() - start < seconds:
        await asyncio.sleep(max(0.0, start + tick * args.rss_every - time.perf_counter()))
        tick += 1
        await sample()
    await loading

    cols = ["t"] + [f"{i}_rss_mib" for i in nodes.ids] + [f"{i}_keys" for i in nodes.ids] + \
        ["written", "expired", "collected"]
    table("churn: RSS (MiB) and keys held by each node; so far: keys written (applied), "
          "expired (deleted by time, by their leaders) and collected (dropped after the grace, "
          "summed over the nodes)", samples, cols)
    asked = sent[0] + sent[1] + sent[2]
    print(f"churn load: {asked} new keys due in {seconds:g} s ({asked / seconds:.0f}/s): "
          f"{sent[0]} applied, {sent[1]} refused (not resent), {sent[2]} not sent (the load fell "
          f"behind its schedule, by {lag[0]:.1f} s at most, and stops at the end)", flush=True)
    health = await churn_health(nodes, time.time() - (time.perf_counter() - start))
    verdicts = {"rss_after_two_periods": flatness(samples, nodes.ids, 2 * period,
                                                  "after the second period"),
                "rss_after_steady": flatness(samples, nodes.ids, steady_t,
                                             "from the earliest steady state")}
    return {"config": {"ttl_s": args.churn_ttl, "keys_per_period": args.churn_keys,
                       "period_s": period, "seconds": seconds,
                       "tombstone_grace": args.churn_grace, "sweep_interval": args.churn_sweep},
            "applied": sent[0], "refused": sent[1], "not_sent": sent[2], "health": health,
            "max_schedule_lag_s": round(lag[0], 2),
            "samples": samples, **verdicts}


async def churn_health(nodes: Nodes, t0: float) -> dict[str, Any]:
    """What the nodes went through: peers their failure detectors took for down (from their
    logs; every node here stayed up, so each is a false suspicion: a node too busy to answer
    heartbeats within --failure-timeout), and the ops refused, fenced and checked on replicas
    (checks follow a peer seen down: cluster.roles.checks)."""
    downs: dict[str, list[float]] = {}
    for i, path in nodes.log.items():
        for line in path.read_text(errors="replace").splitlines():
            if '"cluster.failure"' in line and "is down" in line:
                with contextlib.suppress(ValueError, KeyError):
                    downs.setdefault(i, []).append(round(json.loads(line)["ts"] - t0, 1))
    totals: dict[str, int] = {}
    for i in nodes.ids:
        m = await nodes.metrics(i)
        for name in ("unavailable", "fenced", "retry_checks", "deletes", "collected_keys"):
            totals[name] = totals.get(name, 0) + int(m.get(f"idc_{name}_total", 0))
    first = min((t for ts in downs.values() for t in ts), default=None)
    print(f"peers taken for down (every node stayed up): "
          f"{sum(map(len, downs.values()))} times"
          + (f", first at t={first} s; by node: {downs}" if downs else "")
          + f"; node totals: {totals}", flush=True)
    return {"peer_down_events": downs, "totals": totals}


def flatness(samples: list[dict[str, Any]], ids: list[str], from_t: float, what: str
             ) -> dict[str, Any]:
    """Each node's RSS (and keys held) from the first sample at or after ``from_t``: whether
    every later sample stayed within 15% of that one."""
    after = [s for s in samples if s["t"] >= from_t]
    if len(after) < 2:
        print(f"RSS {what} (t >= {from_t:g} s): too few samples to judge", flush=True)
        return {}
    verdict: dict[str, Any] = {}
    for i in ids:
        base = after[0][f"{i}_rss_mib"]
        rss = [s[f"{i}_rss_mib"] for s in after]
        keys = [s[f"{i}_keys"] for s in after]
        dev = max(abs(r - base) for r in rss) / base
        v = verdict[i] = {
            "from_t": after[0]["t"], "rss_base_mib": base, "rss_min_mib": min(rss),
            "rss_max_mib": max(rss), "rss_last_mib": rss[-1],
            "max_deviation_pct": round(dev * 100, 1), "within_15pct": dev <= 0.15,
            "keys_base": keys[0], "keys_max": max(keys), "keys_last": keys[-1]}
        print(f"{i}: RSS {what}: {base} MiB at t={after[0]['t']} s, then "
              f"{v['rss_min_mib']}..{v['rss_max_mib']}, last {v['rss_last_mib']}: "
              f"{v['max_deviation_pct']}% at most -> "
              f"{'within 15%' if v['within_15pct'] else 'NOT within 15%'}; keys held "
              f"{keys[0]} -> max {v['keys_max']}, last {v['keys_last']}", flush=True)
    return verdict


# ---------------------------------------------------------------------------------- main

async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    parts = [p for p in PARTS if p in args.parts.split(",")]
    results: dict[str, Any] = {"config": {
        "nodes": 3, "rf": 3, "write_quorum": 2, "fsync": args.fsync, "client": args.client,
        "cores": os.cpu_count(), "concurrency": args.concurrency, "seconds": args.seconds}}
    fsync = [] if args.fsync else ["--no-fsync"]
    shared = [p for p in parts if p in ("multiget", "delete")]
    if shared:
        async with LocalCluster(3, rf=3, extra_args=["--rate", "200000", *fsync]) as cluster:
            nodes = Nodes(cluster, args.client)
            for part in shared:
                print(f"\n--- {part} ---", flush=True)
                results[part] = await {"multiget": part_multiget,
                                       "delete": part_delete}[part](nodes, args)
    if "scan" in parts:  # alone: the deletes' tombstones would have the sweeps walk its keys
        print("\n--- scan ---", flush=True)
        async with LocalCluster(3, rf=3, extra_args=["--rate", "200000", *fsync]) as cluster:
            results["scan"] = await part_scan(Nodes(cluster, args.client), args)
    if "churn" in parts:
        print("\n--- churn ---", flush=True)
        print(f"(nodes run with --tombstone-grace {args.churn_grace:g} instead of 3600: a key's "
              f"memory comes back only after its ttl ({args.churn_ttl:g} s) plus the grace plus "
              "a sweep pass reaching it; with the default an hour of keys would be held and a "
              "run of minutes could only show growth)", flush=True)
        extra = ["--tombstone-grace", str(args.churn_grace),
                 "--sweep-interval", str(args.churn_sweep), *fsync]
        async with LocalCluster(3, rf=3, extra_args=extra) as cluster:
            results["churn"] = await part_churn(Nodes(cluster, args.client), args)
    targets = [t for p in parts for t in results[p].get("targets", [])]
    if targets:
        table("targets", [{**t, "met": "yes" if t["met"] else "NO"} for t in targets],
              ["target", "measured", "met"])
        results["targets"] = targets
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_counters",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1.5 s phases, 20k counters scanned, a 20 s churn with ttl 3 s "
                         "(nodes: --tombstone-grace 13 --sweep-interval 1); under a minute")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                    help="raw: bench.httpload keep-alive connections (cheapest for the load "
                         "generator); aiohttp: one keep-alive ClientSession per worker")
    ap.add_argument("--seconds", type=float, default=8.0, help="per load phase")
    ap.add_argument("--concurrency", type=int, default=16, help="clients per load phase")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--mget-keys", type=int, default=100, help="counters a multi-get reads")
    ap.add_argument("--mget-table-keys", type=int, default=100_000,
                    help="counters the multi-get reads among")
    ap.add_argument("--batch", type=int, default=100, help="ops a batch in the delete part")
    ap.add_argument("--delete-keys", type=int, default=1_000_000,
                    help="keys the batched adds may write (a tenth for the single adds)")
    ap.add_argument("--scan-counters", type=int, default=1_000_000)
    ap.add_argument("--load-batch", type=int, default=10_000, help="ops a /v1/batch to load")
    ap.add_argument("--load-workers", type=int, default=1,
                    help="load requests in flight at once (scan part)")
    ap.add_argument("--scan-limit", type=int, default=1000)
    ap.add_argument("--idle-wait", type=float, default=60.0,
                    help="most seconds to wait after the scan's load for the nodes to go idle")
    ap.add_argument("--churn-seconds", type=float, default=300.0)
    ap.add_argument("--churn-keys", type=int, default=200_000, help="new keys each period")
    ap.add_argument("--churn-ttl", type=int, default=30, help="the table's ttl_s")
    ap.add_argument("--churn-period", type=float, default=None,
                    help="seconds between two sets of new keys (default: the ttl)")
    ap.add_argument("--churn-batch", type=int, default=1000, help="ops a /v1/batch in churn")
    ap.add_argument("--churn-grace", type=float, default=30.0,
                    help="the churn cluster's --tombstone-grace (> 12 with the default window)")
    ap.add_argument("--churn-sweep", type=float, default=5.0,
                    help="the churn cluster's --sweep-interval")
    ap.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 1.5)
        args.idle_wait = min(args.idle_wait, 3.0)
        args.concurrency = min(args.concurrency, 8)
        args.mget_table_keys = min(args.mget_table_keys, 10_000)
        args.delete_keys = min(args.delete_keys, 100_000)
        args.scan_counters = min(args.scan_counters, 20_000)
        args.churn_seconds = min(args.churn_seconds, 20.0)
        args.churn_keys = min(args.churn_keys, 5_000)
        args.churn_ttl = min(args.churn_ttl, 3)
        args.churn_grace = min(args.churn_grace, 13.0)
        args.churn_sweep = min(args.churn_sweep, 1.0)
        args.rss_every = min(args.rss_every, 2.0)
    if args.churn_period is None:
        args.churn_period = float(args.churn_ttl)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; choose among {','.join(PARTS)}")
    return run_and_report(main_async(args), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
