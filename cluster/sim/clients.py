"""Simulated clients: op ids ``c<client>:<seq>``, retries with the same id on a timeout or a 503
at another node (attempt numbers, the op's age bounded by the dedup window as the edge's 410
would), quorum reads, and the history in ``client.checker``'s event format.

Besides adds and reads, when the workload asks for them: deletes (retried as adds are, recorded
``invoke``/``ok``/``info`` as adds are), multi-gets (``Node.read_many`` at ``quorum`` over a few
distinct keys of any table) and scans (``scan_page`` at ``quorum``, pages of 1-3 keys, following
the cursor to the end: one history op); and a second table, ``TTL_TABLE``, whose ttl the run
sets through the membership before the clients start, written and read like the first.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from cluster.core.ops import Op
from cluster.roles.member import Node
from cluster.roles.scans import scan_page
from cluster.sim.world import Host, World
from cluster.transport.wire import Status

TABLE = "t"
TTL_TABLE = "e"  # the table with a ttl (``Workload.ttl``)
_OK = {int(Status.APPLIED): False, int(Status.DUPLICATE): True}  # status -> duplicate
_BEST = (int(Status.APPLIED), int(Status.DUPLICATE), int(Status.EXPIRED))


def _preference(status: int) -> int:
    """Of two answers to one op, the one that says most: applied, duplicate, expired, other."""
    return _BEST.index(status) if status in _BEST else len(_BEST)


async def _answer(call: Coroutine[Any, Any, Any]) -> Any:
    """A call's answer, or its error (timeout, refused, reset, a node error) as a value."""
    try:
        return await call
    except Exception as exc:  # noqa: BLE001 - the caller reads it as 503
        return exc


MAX_PAGES = 100  # a scan that has not ended after this many pages fails


@dataclass
class Workload:
    """Each op is a read, a delete, a multi-get or a scan with its ratio, else an add (the
    ratios are drawn from one number, so with the last three 0 a seed's ops are what they
    were before those existed). With ``ttl``, an op goes to ``TTL_TABLE`` with ``ttl_ratio``."""

    clients: int = 6
    ops: int = 200
    keys: int = 4
    read_ratio: float = 0.2
    delete_ratio: float = 0.0
    multiget_ratio: float = 0.0
    scan_ratio: float = 0.0
    hedge_ratio: float = 0.0  # adds whose first attempt goes to two nodes at once
    ttl: float | None = None  # seconds: TTL_TABLE's ttl, set before the clients start
    ttl_ratio: float = 0.3
    ttl_keys: int = 8  # more keys than the first table: each is written less often
    multiget_keys: int = 3  # a multi-get reads 2..this many distinct keys
    timeout: float = 3.0  # a client call gives up after this long (virtual seconds)
    max_attempts: int = 8
    think: float = 0.5  # a client waits up to this long between its ops

    def tables(self) -> list[tuple[str, int]]:
        """Every table the clients use, with its number of keys."""
        return [(TABLE, self.keys)] + ([(TTL_TABLE, self.ttl_keys)] if self.ttl else [])


@dataclass
class History:
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, loop: asyncio.AbstractEventLoop, **event: Any) -> None:
        self.events.append({**event, "time": round(loop.time(), 6)})


class Client:
    def __init__(self, cid: int, world: World, work: Workload, rng: random.Random,
                 history: History) -> None:
        self.cid, self.world, self.work, self.rng, self.history = cid, world, work, rng, history
        self.process = cid
        self.seq = 0

    async def run(self, ops: int) -> None:
        w, rng = self.work, self.rng
        for _ in range(ops):
            await asyncio.sleep(rng.uniform(0, w.think))
            key = f"k{rng.randrange(w.keys)}"
            table = TABLE
            if w.ttl and rng.random() < w.ttl_ratio:
                table, key = TTL_TABLE, f"k{rng.randrange(w.ttl_keys)}"
            r = rng.random()
            if r < w.read_ratio:
                await self.read(key, table)
            elif (r := r - w.read_ratio) < w.delete_ratio:
                await self.write("delete", table, key, None)
            elif (r := r - w.delete_ratio) < w.multiget_ratio:
                await self.multiget()
            elif (r := r - w.multiget_ratio) < w.scan_ratio:
                await self.scan(table)
            elif r - w.scan_ratio < w.hedge_ratio:
                await self.write("add", table, key, rng.choice((1, 2, 3, 5, -1, 10)), hedge=True)
            else:
                await self.write("add", table, key, rng.choice((1, 1, 2, 3, 5, -1, 10)))

    async def _call(self, host: Host, coro_fn: Any) -> Any:
        """Run ``coro_fn(node)`` on ``host`` as a request would (``Host.call``): fails if it is
        down or crashes meanwhile, gives up after the timeout (the node goes on)."""
        async def attempt() -> Any:
            node, epoch = host.node, host.epoch
            if node is None or not host.up:
                raise ConnectionError("connection refused")
            result = await host.call(lambda: coro_fn(node))  # the node's work, not ours
            if host.epoch != epoch:
                raise ConnectionError("connection reset")
            return result

        return await asyncio.wait_for(attempt(), self.work.timeout)

    async def write(self, f: str, table: str, key: str, delta: int | None,
                    hedge: bool = False) -> None:
        """An add (``delta``) or a delete (``delta`` None): the same op id at every attempt,
        at another node after a timeout or a 503. ``hedge``: the first attempt is sent to two
        nodes at once, both as first attempts (what a client that hedges its requests, not the
        SDK, does); the better answer counts."""
        loop = asyncio.get_running_loop()
        self.seq += 1
        op_id, start = f"c{self.cid}:{self.seq}", loop.time()
        ids = self.world.ids
        nid = self.rng.choice(ids)
        ev = {"f": f, "process": self.process, "key": f"{table}/{key}", "value": delta,
              "op_id": op_id}
        self.history.add(loop, type="invoke", **ev, node=nid)
        attempt, outcome = 0, None
        window = self.world.hosts[nid].config.window
        while attempt < self.work.max_attempts:
            attempt += 1
            if loop.time() - start > window * 0.9:
                break  # older than the window: the edge would answer 410 op_expired
            op = Op(table, key, op_id, delta or 0, attempt)

            async def attempt_at(node: Node, op: Op = op) -> list[int]:
                # born: the first attempt, on the node's clock (what the SDK's ts_ms tells it)
                born = [node.clock() - (loop.time() - start)]
                if delta is None:
                    return await node.delete([op], born)
                return await node.submit([op], born)

            calls = [self._call(self.world.hosts[nid], attempt_at)]
            if hedge and attempt == 1:
                other = self.rng.choice([n for n in ids if n != nid])
                calls.append(self._call(self.world.hosts[other], attempt_at))
            answers = (await asyncio.gather(*calls, return_exceptions=True) if len(calls) > 1
                       else [await _answer(calls[0])])  # (one call: no task around it)
            status = min((int(a[0]) for a in answers if not isinstance(a, BaseException)),
                         key=_preference, default=int(Status.UNAVAILABLE))
            if status in _OK:
                outcome = _OK[status]
                break
            if status == int(Status.EXPIRED):
                break
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            nid = self.rng.choice([n for n in ids if n != nid])
        if outcome is None:
            self.history.add(loop, type="info", **ev, node=nid, attempts=attempt)
            self.process += self.work.clients  # the op stays open: a new process goes on
        else:
            self.history.add(loop, type="ok", **ev, node=nid, attempts=attempt,
                             duplicate=outcome)

    async def read(self, key: str, table: str = TABLE) -> None:
        loop = asyncio.get_running_loop()
        nid = self.rng.choice(self.world.ids)
        ev = {"f": "read", "process": self.process, "key": f"{table}/{key}", "node": nid}
        self.history.add(loop, type="invoke", **ev, value=None)
        try:
            value = await self._call(self.world.hosts[nid],
                                     lambda node: node.read(table, key, "quorum"))
        except Exception:  # noqa: BLE001 - a failed read tells nothing; the checker skips it
            self.history.add(loop, type="fail", **ev, value=None)
            return
        self.history.add(loop, type="ok", **ev, value=int(value))

    async def multiget(self) -> None:
        """``Node.read_many`` at ``quorum`` over 2..multiget_keys distinct keys of any table."""
        loop, rng = asyncio.get_running_loop(), self.rng
        names = [(t, f"k{k}") for t, n in self.work.tables() for k in range(n)]
        reads = rng.sample(names, rng.randint(2, self.work.multiget_keys))
        nid = rng.choice(self.world.ids)
        ev = {"f": "multiget", "process": self.process, "keys": [f"{t}/{k}" for t, k in reads],
              "node": nid, "consistency": "quorum"}
        self.history.add(loop, type="invoke", **ev, value=None)
        try:
            values = await self._call(self.world.hosts[nid],
                                      lambda node: node.read_many(reads, "quorum"))
        except Exception:  # noqa: BLE001 - a failed multi-get tells nothing
            self.history.add(loop, type="fail", **ev, value=None)
            return
        self.history.add(loop, type="ok", **ev, value=[int(v) for v in values])

    async def scan(self, table: str) -> None:
        """Every page of one scan of ``table`` (keys starting with ``prefix``: all of them,
        or now and then one key's name) at one node, as one op; a page that fails fails it."""
        loop, rng = asyncio.get_running_loop(), self.rng
        keys = dict(self.work.tables())[table]
        prefix = "" if rng.random() < 0.7 else f"k{rng.randrange(keys)}"
        limit = rng.randint(1, 3)
        nid = rng.choice(self.world.ids)
        ev = {"f": "scan", "process": self.process, "table": table, "prefix": prefix,
              "page_size": limit, "node": nid, "consistency": "quorum"}
        self.history.add(loop, type="invoke", **ev, value=None)
        got: list[list[Any]] = []
        after: tuple[int, str] | None = None
        try:
            for _ in range(MAX_PAGES):
                page, after = await self._call(
                    self.world.hosts[nid], lambda node, at=after: scan_page(
                        node, table, prefix, at, limit, "quorum"))
                got += [[f"{table}/{k}", int(v)] for k, v in page]
                if after is None:
                    break
            else:
                raise TimeoutError(f"no end after {MAX_PAGES} pages")
        except Exception:  # noqa: BLE001 - a failed scan tells nothing
            self.history.add(loop, type="fail", **ev, value=None, returned=len(got))
            return
        self.history.add(loop, type="ok", **ev, value=got)


async def final_reads(world: World, work: Workload, history: History) -> None:
    """After healing and quiet: every key read on every node (``one``: its own replica when it
    holds the key), one after another."""
    loop = asyncio.get_running_loop()
    for table, key in [(t, f"k{k}") for t, n in work.tables() for k in range(n)]:
        for nid in world.ids:
            host = world.hosts[nid]
            ev = {"f": "final-read", "process": f"final-{nid}", "key": f"{table}/{key}",
                  "node": nid}
            history.add(loop, type="invoke", **ev, value=None)
            try:
                node = host.node
                assert node is not None
                value = await asyncio.wait_for(node.read(table, key, "one"), work.timeout)
            except Exception:  # noqa: BLE001 - reported as a missing final read
                history.add(loop, type="fail", **ev, value=None)
                continue
            history.add(loop, type="ok", **ev, value=int(value))


def client_tasks(world: World, work: Workload, seed: int,
                 history: History) -> list[Coroutine[Any, Any, None]]:
    per, extra = divmod(work.ops, work.clients)
    return [Client(c, world, work, random.Random(f"{seed}:client:{c}"), history).run(
        per + (1 if c < extra else 0)) for c in range(work.clients)]
