"""The SDK's many-counter reads, scans, deletes and table settings, against a fake cluster.

The fake is a few aiohttp apps on port 0 that share one in-memory store and speak the contract's
routes (``/v1/read``, the scan, ``DELETE``, ``/v1/batch`` deletes, ``/v1/tables``) in JSON or
msgpack. It logs every request, can fail a chosen request (after applying it, for a lost answer)
and hold one until the test lets it go. No real node is involved; ``KeyOrder`` is also tested
alone, as the pure state it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import pytest_asyncio
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from client import (
    BadRequestError,
    CounterClient,
    DeadlineExceededError,
    NotAppliedError,
    SyncCounterClient,
)
from client.batcher import KeyOrder, Parked

pytestmark = pytest.mark.timeout(60)

Pred = Callable[["Req"], bool]


@dataclass
class Req:
    node: str
    method: str
    path: str
    query: dict[str, str]
    body: Any
    arrived: int
    answered: int = -1
    status: int = 0


@dataclass
class Fault:
    pred: Pred
    status: int
    apply_first: bool  # apply the op, then answer with the error: the ack is lost
    times: int = 1


@dataclass
class Hold:
    """Holds the first request ``pred`` matches until ``event`` is set (or 10 s passed)."""

    pred: Pred
    event: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: int = 0


class FakeCluster:
    """Nodes sharing one store. Ticks (a counter bumped on every arrival and answer) order
    requests exactly; ``ops`` lists every add or delete that reached the store, with the ticks
    of the request that carried it."""

    def __init__(self, n: int = 2, *, max_reads: list[int | None] | None = None,
                 enforce_max_reads: int = 1000) -> None:
        self.ids = [f"n{i + 1}" for i in range(n)]
        self.max_reads = max_reads or [None] * n
        self.enforce_max_reads = enforce_max_reads
        self.values: dict[tuple[str, str], int] = {}
        self.applied: set[str] = set()
        self.tables: dict[str, float | None] = {}
        self.log: list[Req] = []
        self.ops: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.holds: list[Hold] = []
        self.scan_script: dict[str | None, tuple[list[tuple[str, int]], str | None]] | None = None
        self.read_delay = 0.0
        self.inflight_reads = self.max_inflight_reads = 0
        self.tick = 0
        self.urls: list[str] = []
        self._runners: list[web.AppRunner] = []

    def fail(self, pred: Pred, status: int = 503, *, apply_first: bool = False,
             times: int = 1) -> None:
        self.faults.append(Fault(pred, status, apply_first, times))

    @contextlib.contextmanager
    def holding(self, pred: Pred) -> Iterator[Hold]:
        """A hold released on leaving the block, so a failing test cannot leave it stuck."""
        h = Hold(pred)
        self.holds.append(h)
        try:
            yield h
        finally:
            h.event.set()

    def requests(self, method: str, path: str | None = None) -> list[Req]:
        return [r for r in self.log if r.method == method and (path is None or r.path == path)]

    async def start(self) -> None:
        for node_id, max_reads in zip(self.ids, self.max_reads, strict=True):
            app = web.Application()

            async def handle(request: web.Request, node_id: str = node_id,
                             max_reads: int | None = max_reads) -> web.Response:
                return await self._handle(request, node_id, max_reads)

            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            self.urls.append(f"http://{host}:{port}")
            self._runners.append(runner)

    async def stop(self) -> None:
        for h in self.holds:
            h.event.set()
        for runner in self._runners:
            await runner.cleanup()

    # -- the routes ------------------------------------------------------------------------

    async def _handle(self, request: web.Request, node_id: str,
                      max_reads: int | None) -> web.Response:
        raw = await request.read()
        body: Any = None
        if raw:
            mp = "msgpack" in request.headers.get("Content-Type", "")
            body = msgpack.unpackb(raw, raw=False) if mp else json.loads(raw)
        self.tick += 1
        req = Req(node_id, request.method, request.path, dict(request.query), body,
                  self.tick)
        self.log.append(req)
        for h in self.holds:
            if not h.arrived and h.pred(req):
                h.arrived += 1
                with contextlib.suppress(TimeoutError):  # a failing test must not hang
                    await asyncio.wait_for(h.event.wait(), 10.0)
        fault = next((f for f in self.faults if f.times > 0 and f.pred(req)), None)
        if fault is not None:
            fault.times -= 1
            if fault.apply_first:
                self._route(req, max_reads)
            status, payload = fault.status, {"error": {"code": "fake", "message": "injected"}}
        else:
            if req.path == "/v1/read" and self.read_delay:
                self.inflight_reads += 1
                self.max_inflight_reads = max(self.max_inflight_reads, self.inflight_reads)
                await asyncio.sleep(self.read_delay)
                self.inflight_reads -= 1
            status, payload = self._route(req, max_reads)
        self.tick += 1
        req.answered, req.status = self.tick, status
        if "msgpack" in request.headers.get("Accept", ""):
            return web.Response(status=status, body=msgpack.packb(payload),
                                content_type="application/msgpack")
        return web.json_response(payload, status=status)

    def _route(self, req: Req, max_reads: int | None) -> tuple[int, Any]:
        parts = req.path.strip("/").split("/")
        if req.path == "/v1/health":
            out: dict[str, Any] = {"node": req.node, "status": "ok", "window_s": 10.0}
            if max_reads is not None:
                out["max_reads"] = max_reads
            return 200, out
        if req.path == "/v1/read":
            reads = req.body["reads"]
            if len(reads) > self.enforce_max_reads:
                return 400, {"error": {"code": "too_many_reads", "message": "too many"}}
            return 200, {"values": [self.values.get((r["table"], r["key"]), 0)
                                    for r in reads]}
        if req.path == "/v1/batch":
            return 200, {"results": [self._apply(op, req) for op in req.body["ops"]]}
        if req.path == "/v1/tables" and req.method == "GET":
            return 200, {"tables": [{"name": n, "ttl_s": t} for n, t in self.tables.items()]}
        if parts[:2] == ["v1", "tables"] and req.method == "PUT":
            self.tables[parts[2]] = req.body["ttl_s"]
            return 200, {"table": parts[2], "ttl_s": req.body["ttl_s"]}
        if parts[:2] == ["v1", "counters"] and len(parts) == 3 and req.method == "GET":
            return 200, self._scan(parts[2], req.query)
        if parts[:2] == ["v1", "counters"] and len(parts) == 4:
            if req.method == "DELETE":
                return 200, self._apply({"table": parts[2], "key": parts[3], "op": "delete",
                                         **req.query}, req)
            if req.method == "POST":
                return 200, self._apply({"table": parts[2], "key": parts[3], **req.body}, req)
            return 200, {"value": self.values.get((parts[2], parts[3]), 0)}
        return 404, {"error": {"code": "not_found", "message": req.path}}

    def _apply(self, op: dict[str, Any], req: Req) -> dict[str, Any]:
        self.ops.append({**op, "request": req})
        if op["op_id"] in self.applied:
            return {"applied": False, "duplicate": True}
        self.applied.add(op["op_id"])
        key = (op["table"], op["key"])
        if op.get("op") == "delete":
            self.values.pop(key, None)
        else:
            self.values[key] = self.values.get(key, 0) + op["delta"]
        return {"applied": True}

    def _scan(self, table: str, q: dict[str, str]) -> dict[str, Any]:
        after = q.get("after")
        if self.scan_script is not None:
            items, nxt = self.scan_script[after]
        else:
            keys = sorted(k for t, k in self.values if t == table and
                          k.startswith(q.get("prefix", "")) and (after is None or k > after))
            items = [(k, self.values[(table, k)]) for k in keys[:int(q["limit"])]]
            nxt = items[-1][0] if len(keys) > len(items) else None
        return {"counters": [{"key": k, "value": v} for k, v in items], "next": nxt}


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    f = FakeCluster()
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


def seq(op_id: str) -> int:
    return int(op_id.rsplit(":", 1)[1])


# -- get_many ------------------------------------------------------------------------------

async def test_get_many_splits_by_the_advertised_max_reads_and_sends_chunks_together() -> None:
    fake = FakeCluster(2, max_reads=[3, 5])
    await fake.start()
    try:
        fake.values.update({("t", f"k{i}"): i * 10 for i in range(8)})
        fake.read_delay = 0.05
        async with CounterClient(fake.urls) as c:
            assert c.max_reads == 3  # the smallest any node advertises
            keys = [f"k{i}" for i in (7, 0, 3, 3, 99, 1, 2, 6)]
            assert await c.get_many("t", keys) == [70, 0, 30, 30, 0, 10, 20, 60]
        reads = fake.requests("POST", "/v1/read")
        assert sorted(len(r.body["reads"]) for r in reads) == [2, 3, 3]
        assert fake.max_inflight_reads == 3  # side by side, not one after another
        assert all(r.body["consistency"] == "quorum" for r in reads)
    finally:
        await fake.stop()


async def test_get_many_counts_a_silent_node_as_1000_reads() -> None:
    fake = FakeCluster(2, max_reads=[2000, None], enforce_max_reads=1000)
    await fake.start()
    try:
        async with CounterClient(fake.urls, use_msgpack=False) as c:
            assert c.max_reads == 1000
            values = await c.get_many("t", [f"k{i}" for i in range(2500)], "all")
        assert values == [0] * 2500
        sizes = sorted(len(r.body["reads"]) for r in fake.requests("POST", "/v1/read"))
        assert sizes == [500, 1000, 1000]
    finally:
        await fake.stop()


async def test_get_many_retries_a_failed_chunk_on_another_node(fake: FakeCluster) -> None:
    fake.values[("t", "a")] = 4
    fake.fail(lambda r: r.path == "/v1/read", 503)
    async with CounterClient(fake.urls) as c:
        assert await c.get_many("t", ["a", "b"], "one") == [4, 0]
        assert await c.get_many_pairs([("t", "a"), ("u", "a")]) == [4, 0]
    first, again = fake.requests("POST", "/v1/read")[:2]
    assert first.status == 503 and again.status == 200
    assert first.body == again.body and first.node != again.node


async def test_get_many_checks_its_input_before_sending(fake: FakeCluster) -> None:
    async with CounterClient(fake.urls) as c:
        with pytest.raises(BadRequestError, match="key"):
            await c.get_many("t", ["ok", "not ok"])
        with pytest.raises(BadRequestError, match="keys"):
            await c.get_many("t", "abc")
        with pytest.raises(BadRequestError, match="consistency"):
            await c.get_many("t", ["a"], "most")
        with pytest.raises(BadRequestError, match="table"):
            await c.get_many("t/x", ["a"])
        with pytest.raises(BadRequestError, match="pair"):
            await c.get_many_pairs([("t", "a", "b")])  # type: ignore[list-item]
        assert await c.get_many("t", []) == []
    assert fake.requests("POST", "/v1/read") == []


async def test_get_many_ends_with_the_error_of_a_refused_chunk() -> None:
    fake = FakeCluster(1, max_reads=[2], enforce_max_reads=1)  # the node lied about its limit
    await fake.start()
    try:
        async with CounterClient(fake.urls) as c:
            with pytest.raises(BadRequestError, match="too_many_reads"):
                await c.get_many("t", [f"k{i}" for i in range(6)])
    finally:
        await fake.stop()


# -- scan ----------------------------------------------------------------------------------

async def test_scan_follows_next_through_short_and_empty_pages(fake: FakeCluster) -> None:
    fake.scan_script = {None: ([("a", 1), ("b", 2)], "c1"), "c1": ([], "c2"),
                        "c2": ([], "c3"), "c3": ([("c", 3)], "c4"), "c4": ([], None)}
    async with CounterClient(fake.urls) as c:
        got = [kv async for kv in c.scan("t", prefix="x", page_size=2, consistency="all")]
        pages = [p async for p in c.scan_pages("t")]
    assert got == [("a", 1), ("b", 2), ("c", 3)]
    assert len(pages) == 5 and pages[1] == [] and pages[4] == []
    scans = fake.requests("GET", "/v1/counters/t")[:5]
    assert [r.query.get("after") for r in scans] == [None, "c1", "c2", "c3", "c4"]
    assert all(r.query["limit"] == "2" and r.query["prefix"] == "x" and
               r.query["consistency"] == "all" for r in scans)


async def test_a_failed_page_is_asked_again_with_the_same_cursor(fake: FakeCluster) -> None:
    fake.values.update({("t", f"k{i:02d}"): i for i in range(9)})
    fake.values[("t", "other")] = 100
    fake.values[("u", "k50")] = 100
    fake.fail(lambda r: r.query.get("after") == "k03", 503)
    fake.fail(lambda r: r.query.get("after") == "k05", 500)
    async with CounterClient(fake.urls) as c:
        got = [kv async for kv in c.scan("t", prefix="k", page_size=2)]
    assert got == [(f"k{i:02d}", i) for i in range(9)]  # each once, in order
    scans = fake.requests("GET", "/v1/counters/t")
    for cursor in ("k03", "k05"):
        failed, again = [r for r in scans if r.query.get("after") == cursor]
        assert failed.status in (500, 503) and again.status == 200
        assert failed.node != again.node
    assert [r.query.get("after") for r in scans if r.status == 200] == \
        [None, "k01", "k03", "k05", "k07"]


async def test_scan_sends_an_odd_cursor_back_as_it_came(fake: FakeCluster) -> None:
    odd = "a b&c=d/é?%"
    fake.scan_script = {None: ([("a", 1)], odd), odd: ([("b", 2)], None)}
    async with CounterClient(fake.urls, use_msgpack=False) as c:
        assert [kv async for kv in c.scan("t")] == [("a", 1), ("b", 2)]
    assert fake.requests("GET", "/v1/counters/t")[1].query["after"] == odd


async def test_scan_checks_its_arguments_when_called(fake: FakeCluster) -> None:
    cases: list[tuple[dict[str, Any], str]] = [({"page_size": 0}, "page_size"),
                                               ({"page_size": 2.5}, "page_size"),
                                               ({"page_size": True}, "page_size"),
                                               ({"prefix": "a/b"}, "prefix"),
                                               ({"consistency": "two"}, "consistency")]
    async with CounterClient(fake.urls) as c:
        for kw, field_name in cases:
            with pytest.raises(BadRequestError, match=field_name):
                c.scan("t", **kw)  # raised by the call, before any iteration
        with pytest.raises(BadRequestError, match="table"):
            c.scan("")
    assert fake.requests("GET", "/v1/counters/t") == []


async def test_sync_scan_yields_the_same_and_closes_early(fake: FakeCluster) -> None:
    fake.values.update({("t", f"k{i}"): i for i in range(7)})
    fake.fail(lambda r: r.query.get("after") == "k3", 503)
    async with CounterClient(fake.urls) as c:
        expected = [kv async for kv in c.scan("t", page_size=2)]

    def work() -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[int]]:
        with SyncCounterClient(fake.urls) as s:
            every = list(s.scan("t", page_size=2))
            it = s.scan("t", page_size=2)
            first = [next(it), next(it), next(it)]
            it.close()  # stops asking for pages; the client still works
            return every, first, s.get_many("t", ["k1", "k6"])

    every, first, values = await asyncio.to_thread(work)
    assert every == expected == [(f"k{i}", i) for i in range(7)]
    assert first == expected[:3] and values == [1, 6]


# -- deletes -------------------------------------------------------------------------------

async def test_a_delete_keeps_its_op_id_and_a_duplicate_is_success(fake: FakeCluster) -> None:
    fake.values[("t", "k")] = 5
    fake.fail(lambda r: r.method == "DELETE", 503, apply_first=True)  # applied, answer lost
    async with CounterClient(fake.urls, batch_interval=0) as c:
        before = await c.incr("t", "other")
        r = await c.delete("t", "k")
        after = await c.incr("t", "other")
        assert c.stats.duplicates == 1
    assert r.kind == "delete" and r.delta == 0
    assert r.duplicate and not r.applied and r.attempts == 2
    assert seq(before.op_id) + 1 == seq(r.op_id) == seq(after.op_id) - 1  # one id source
    first, again = fake.requests("DELETE")
    assert first.path == again.path == "/v1/counters/t/k"
    assert first.query["op_id"] == again.query["op_id"] == r.op_id
    assert (first.query["attempt"], again.query["attempt"]) == ("1", "2")
    assert 0 <= int(first.query["age_ms"]) <= int(again.query["age_ms"])
    assert "ts_ms" in first.query and first.node != again.node
    assert ("t", "k") not in fake.values


async def test_a_delete_that_never_gets_an_answer_ends_unknown(fake: FakeCluster) -> None:
    fake.fail(lambda r: r.method == "DELETE", 503, times=1000)
    async with CounterClient(fake.urls, batch_interval=0, total_timeout=0.4,
                             attempt_timeout=0.1) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError) as exc:
            await c.delete("t", "k")
        assert time.monotonic() - start < 0.4 + 0.2
    deletes = fake.requests("DELETE")
    assert exc.value.attempts == len(deletes) >= 2
    assert len({r.query["op_id"] for r in deletes}) == 1
    assert [int(r.query["attempt"]) for r in deletes] == list(range(1, len(deletes) + 1))


async def test_a_refused_delete_is_not_retried(fake: FakeCluster) -> None:
    fake.fail(lambda r: r.method == "DELETE", 400)
    async with CounterClient(fake.urls, batch_interval=0) as c:
        with pytest.raises(BadRequestError):
            await c.delete("t", "k")
        with pytest.raises(BadRequestError, match="key"):
            await c.delete("t", "bad key")
    assert len(fake.requests("DELETE")) == 1


async def test_batched_deletes_go_as_op_delete_items(fake: FakeCluster) -> None:
    fake.values.update({("t", "a"): 1, ("t", "b"): 2})
    async with CounterClient(fake.urls, batch_interval=0.05) as c:
        ra, rb, rc = await asyncio.gather(c.delete("t", "a"), c.delete("t", "b"),
                                          c.add("t", "c", 7))
    (batch,) = fake.requests("POST", "/v1/batch")
    items = batch.body["ops"]
    assert [i.get("op") for i in items] == ["delete", "delete", None]
    for item, r in zip(items[:2], (ra, rb), strict=True):
        assert set(item) == {"table", "key", "op_id", "op", "attempt", "age_ms", "ts_ms"}
        assert item["op_id"] == r.op_id and r.kind == "delete" and r.applied
    assert items[2]["delta"] == 7 and rc.kind == "add"
    assert fake.values == {("t", "c"): 7}


async def test_a_batched_delete_is_retried_with_its_op_id(fake: FakeCluster) -> None:
    fake.fail(lambda r: r.path == "/v1/batch", 503, apply_first=True)
    async with CounterClient(fake.urls, batch_interval=0.05) as c:
        rd, ra = await asyncio.gather(c.delete("t", "a"), c.add("t", "b", 1))
    first, again = fake.requests("POST", "/v1/batch")
    assert [i["op_id"] for i in first.body["ops"]] == [i["op_id"] for i in again.body["ops"]]
    assert [i["attempt"] for i in again.body["ops"]] == [2, 2]
    assert rd.duplicate and ra.duplicate and fake.values == {("t", "b"): 1}


def wire_ops(fake: FakeCluster, key: str) -> list[dict[str, Any]]:
    return [op for op in fake.ops if op["key"] == key]


async def test_add_delete_add_of_a_key_reach_the_cluster_in_issue_order(
        fake: FakeCluster) -> None:
    """The caller does not wait between them: the delete leaves only once the first add has
    its answer, and the last add only once the delete has its own."""
    def holds_k(r: Req) -> bool:
        return r.path == "/v1/counters/t/k" or \
            any(op["key"] == "k" for op in (r.body or {}).get("ops", []))

    async with CounterClient(fake.urls, batch_interval=0.01, attempt_timeout=8.0) as c:
        with fake.holding(holds_k) as held:
            first = asyncio.create_task(c.add("t", "k", 1))
            await wait_until(lambda: held.arrived == 1)
            gone = asyncio.create_task(c.delete("t", "k"))
            last = asyncio.create_task(c.add("t", "k", 5))
            other = asyncio.create_task(c.add("t", "z", 1))  # other keys are not held back
            await other
            await wait_until(lambda: c.batcher.order.parked == 2)
            assert fake.requests("DELETE") == []
        r1, rd, r2 = await asyncio.gather(first, gone, last)
    kinds = [(op.get("op", "add"), op["request"]) for op in wire_ops(fake, "k")]
    assert [k for k, _ in kinds] == ["add", "delete", "add"]
    (_, a1), (_, d), (_, a2) = kinds
    assert a1.answered < d.arrived and d.answered < a2.arrived
    assert fake.values[("t", "k")] == 5 and rd.kind == "delete"
    assert seq(r1.op_id) < seq(rd.op_id) < seq(r2.op_id)


async def test_coalescing_never_merges_across_a_delete(fake: FakeCluster) -> None:
    async with CounterClient(fake.urls, batch_interval=0.02, coalesce=True) as c:
        results = await asyncio.gather(c.add("t", "k", 1), c.add("t", "k", 2),
                                       c.delete("t", "k"), c.delete("t", "k"),
                                       c.add("t", "k", 4), c.add("t", "k", 8))
    on_wire = [(op.get("op", "add"), op.get("delta")) for op in wire_ops(fake, "k")]
    assert on_wire == [("add", 3), ("delete", None), ("delete", None), ("add", 12)]
    for op in wire_ops(fake, "k"):  # a delete never shares a request with its key's ops
        if op.get("op") == "delete":
            assert [o for o in fake.ops if o["request"] is op["request"]] == [op]
    assert results[0].op_id == results[1].op_id and results[0].coalesced == 2
    assert results[2].op_id != results[3].op_id
    assert fake.values[("t", "k")] == 12


async def test_an_explicit_batch_waits_for_an_earlier_delete_of_its_keys(
        fake: FakeCluster) -> None:
    async with CounterClient(fake.urls, batch_interval=0, attempt_timeout=8.0) as c:
        with fake.holding(lambda r: r.method == "DELETE") as held:
            gone = asyncio.create_task(c.delete("t", "k"))
            await wait_until(lambda: held.arrived == 1)
            batch = asyncio.create_task(c.batch([("t", "j", 1), ("t", "k", 2)]))
            await wait_until(lambda: c.batcher.order.parked == 1)
        await gone
        await batch
    (d,) = fake.requests("DELETE")
    (b,) = fake.requests("POST", "/v1/batch")
    assert d.answered < b.arrived and fake.values[("t", "k")] == 2


async def test_abort_ends_a_waiting_delete_as_never_sent(fake: FakeCluster) -> None:
    c = CounterClient(fake.urls, batch_interval=0, attempt_timeout=8.0)
    await c.start()
    with fake.holding(lambda r: r.method == "POST") as held:
        add = asyncio.create_task(c.add("t", "k", 1))
        gone = asyncio.create_task(c.delete("t", "k"))
        await wait_until(lambda: held.arrived == 1 and c.batcher.order.parked == 1)
        await c.abort()
    with pytest.raises(NotAppliedError):
        await gone
    with pytest.raises(DeadlineExceededError):  # it reached the node: outcome unknown
        await add
    assert fake.requests("DELETE") == [] and c.stats.not_applied == 1


async def test_stop_sends_what_waits_behind_an_op_in_flight(fake: FakeCluster) -> None:
    async with CounterClient(fake.urls, batch_interval=0) as c:
        tasks = [asyncio.create_task(c.add("t", "k", 1)), asyncio.create_task(c.delete("t", "k")),
                 asyncio.create_task(c.add("t", "k", 3))]
        await asyncio.sleep(0)
    assert [t.result().kind for t in tasks] == ["add", "delete", "add"]
    assert fake.values[("t", "k")] == 3


# -- tables --------------------------------------------------------------------------------

async def test_set_table_and_tables(fake: FakeCluster) -> None:
    fake.fail(lambda r: r.method == "PUT", 503)
    async with CounterClient(fake.urls) as c:
        assert await c.set_table("t", ttl_s=60) == {"table": "t", "ttl_s": 60}
        assert await c.set_table("u") == {"table": "u", "ttl_s": None}
        assert await c.tables() == [{"name": "t", "ttl_s": 60}, {"name": "u", "ttl_s": None}]
        for bad in (0, -1.0, math.nan, math.inf, True, "5"):
            with pytest.raises(BadRequestError, match="ttl_s"):
                await c.set_table("t", ttl_s=bad)  # type: ignore[arg-type]
        with pytest.raises(BadRequestError, match="table"):
            await c.set_table("a b", ttl_s=1.0)
    puts = fake.requests("PUT")
    assert [r.status for r in puts] == [503, 200, 200] and puts[0].node != puts[1].node
    assert puts[1].path == "/v1/tables/t" and puts[1].body == {"ttl_s": 60}

    def work() -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        with SyncCounterClient(fake.urls) as s:
            return s.set_table("v", 1.5), s.tables(), s.delete("t", "k").kind

    made, tables, kind = await asyncio.to_thread(work)
    assert made == {"table": "v", "ttl_s": 1.5} and tables[-1] == {"name": "v", "ttl_s": 1.5}
    assert kind == "delete"


# -- KeyOrder, the pure state behind the ordering ------------------------------------------

def test_key_order_lets_adds_share_and_a_delete_wait_its_turn() -> None:
    o = KeyOrder()
    k, j = ("t", "k"), ("t", "j")
    released: list[str] = []

    def parked(entry: Parked | None, name: str) -> Parked:
        assert entry is not None, name
        entry.release = lambda: released.append(name)
        return entry

    assert o.enter([k]) is None and o.enter([k]) is None  # adds side by side
    parked(o.enter([k], delete=True), "d1")
    parked(o.enter([k]), "a3")  # behind the delete
    parked(o.enter([k, j]), "batch")  # spans k: behind the delete too
    parked(o.enter([j], delete=True), "dj")  # issued after the batch that spans j
    assert o.enter([("t", "x")], delete=True) is None  # another key is not held
    assert o.parked == 4
    o.end(k)
    assert released == []
    o.end(k)
    assert released == ["d1"]
    o.end(k, delete=True)
    assert released == ["d1", "a3", "batch"]
    o.end(k)
    o.end(k)
    assert released[-1] == "batch"
    o.end(j)
    assert released[-1] == "dj" and o.parked == 0
    o.end(j, delete=True)
    o.end(("t", "x"), delete=True)
    assert not o.busy(k) and not o.busy(j)


def test_key_order_abandoning_a_waiting_delete_lets_the_adds_behind_it_go() -> None:
    o = KeyOrder()
    k = ("t", "k")
    assert o.enter([k]) is None
    d = o.enter([k], delete=True)
    a = o.enter([k])
    assert d is not None and a is not None
    went: list[str] = []
    a.release = lambda: went.append("a")
    o.abandon(d)
    assert went == ["a"] and o.parked == 0
    assert [e for e in o.clear_parked()] == []


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["issue", "issue", "end", "cancel", "abandon", "close"]),
                          st.lists(st.sampled_from("abc"), min_size=1, max_size=3)
                          | st.sampled_from("abc").map(lambda k: [k]),
                          st.booleans(), st.integers(0, 10)), max_size=50))
def test_key_order_never_runs_a_delete_beside_its_key_and_keeps_issue_order(
        steps: list[tuple[str, list[str], bool, int]]) -> None:
    """Random issues, ends, callers giving up and closes, driven as the batcher does: per key
    a running delete is alone; an op waits for every earlier op of its keys that it conflicts
    with (one of the two is a delete) to end or be dropped, and for nothing else (no entry is
    left parked that may go); once everything running ends, nothing is parked or held.
    A parked entry whose callers cancelled is abandoned when their callback runs (a no-op if
    it went first: it then ended at once, unsent, inside its release); a close takes every
    parked entry out; an explicit batch may name a key twice."""
    o = KeyOrder()
    running: list[tuple[int, list[str], bool]] = []
    done: set[int] = set()  # ended, abandoned, or taken out by a close
    issued: list[tuple[int, list[str], bool]] = []
    parked: dict[int, Parked] = {}
    entries: list[tuple[int, Parked]] = []  # every entry that ever parked
    cancelled: list[tuple[int, Parked]] = []

    def end(n: int, keys: list[str], delete: bool) -> None:
        done.add(n)
        for key in keys:
            o.end(("t", key), delete)

    def start(n: int, keys: list[str], delete: bool) -> None:
        parked.pop(n, None)
        assert n not in done
        for m, other_keys, other_delete in issued[:n]:
            if (delete or other_delete) and set(keys) & set(other_keys):
                assert m in done, f"op {n} went before conflicting op {m} ended"
        for _m, other_keys, other_delete in running:
            if delete or other_delete:
                assert not set(keys) & set(other_keys)
        if any(m == n for m, _e in cancelled):  # the batcher ends it unsent
            end(n, keys, delete)
        else:
            running.append((n, keys, delete))

    for action, keys, delete, pick in steps:
        if action == "end" and running:
            end(*running.pop(pick % len(running)))
        elif action == "cancel" and entries:  # its done callback has not run yet
            cancelled.append(entries[pick % len(entries)])
        elif action == "abandon" and entries:  # cancelled, and the callback runs
            n, entry = entries[pick % len(entries)]
            cancelled.append((n, entry))
            if parked.pop(n, None) is not None:
                done.add(n)
            o.abandon(entry)
        elif action == "close":
            taken = {id(e) for e in o.clear_parked()}
            assert taken == {id(e) for e in parked.values()}
            done.update(parked)
            parked.clear()
        else:  # an issue (also an end, cancel or abandon with nothing to act on)
            delete = delete and len(keys) == 1
            n = len(issued)
            issued.append((n, keys, delete))
            entry = o.enter([("t", k) for k in keys], delete)
            if entry is None:
                start(n, keys, delete)
            else:
                parked[n] = entry
                entries.append((n, entry))
                entry.release = functools.partial(start, n, keys, delete)
        assert o.parked == len(parked)
        for n in parked:  # an entry waits only for an earlier one it conflicts with
            _n, waiting_keys, waiting_delete = issued[n]
            assert any(m not in done and (waiting_delete or other_delete)
                       and set(waiting_keys) & set(other_keys)
                       for m, other_keys, other_delete in issued[:n]), f"op {n} waits for nothing"
    while running:
        end(*running.pop(0))
    assert o.parked == 0 and not parked and len(done) == len(issued)
    assert not any(o.busy(("t", k)) for k in "abc")
