"""Simulated clients: op ids ``c<client>:<seq>``, retries with the same id on a timeout or a 503
at another node (attempt numbers, the op's age bounded by the dedup window as the edge's 410
would), quorum reads, and the history in ``client.checker``'s event format."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from cluster.core.ops import Op
from cluster.sim.world import Host, World
from cluster.transport.wire import Status

TABLE = "t"
_OK = {int(Status.APPLIED): False, int(Status.DUPLICATE): True}  # status -> duplicate


@dataclass
class Workload:
    clients: int = 6
    ops: int = 200
    keys: int = 4
    read_ratio: float = 0.2
    timeout: float = 3.0  # a client call gives up after this long (virtual seconds)
    max_attempts: int = 8
    think: float = 0.5  # a client waits up to this long between its ops


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
        for _ in range(ops):
            await asyncio.sleep(self.rng.uniform(0, self.work.think))
            key = f"k{self.rng.randrange(self.work.keys)}"
            if self.rng.random() < self.work.read_ratio:
                await self.read(key)
            else:
                await self.add(key, self.rng.choice((1, 1, 2, 3, 5, -1, 10)))

    async def _call(self, host: Host, coro_fn: Any) -> Any:
        """Run ``coro_fn(node)`` on ``host`` as a request would: waits while the host is
        paused, fails if it is down or crashes meanwhile, gives up after the timeout."""
        async def attempt() -> Any:
            while host.paused:
                await asyncio.sleep(0.01)
            node, epoch = host.node, host.epoch
            if node is None or not host.up:
                raise ConnectionError("connection refused")
            try:
                result = await coro_fn(node)
            except asyncio.CancelledError:
                # the node crashed under the request (``World.crash`` cancels its work): the
                # client sees its connection reset; a cancel of this request itself goes on
                task = asyncio.current_task()
                if host.epoch == epoch or (task is not None and task.cancelling()):
                    raise
                raise ConnectionError("connection reset: the node crashed") from None
            if host.epoch != epoch:
                raise ConnectionError("connection reset")
            return result

        return await asyncio.wait_for(attempt(), self.work.timeout)

    async def add(self, key: str, delta: int) -> None:
        loop = asyncio.get_running_loop()
        self.seq += 1
        op_id, start = f"c{self.cid}:{self.seq}", loop.time()
        ids = self.world.ids
        nid = self.rng.choice(ids)
        ev = {"f": "add", "process": self.process, "key": f"{TABLE}/{key}", "value": delta,
              "op_id": op_id}
        self.history.add(loop, type="invoke", **ev, node=nid)
        attempt, outcome = 0, None
        window = self.world.hosts[nid].config.window
        while attempt < self.work.max_attempts:
            attempt += 1
            if loop.time() - start > window * 0.9:
                break  # older than the window: the edge would answer 410 op_expired
            op = Op(TABLE, key, op_id, delta, attempt)
            try:
                # born: the first attempt, on the node's clock (what the SDK's ts_ms tells it)
                statuses = await self._call(
                    self.world.hosts[nid],
                    lambda node, op=op: node.submit([op], [node.clock() - (loop.time() - start)]))
            except Exception:  # noqa: BLE001 - timeout, refused, reset, a node error
                statuses = [int(Status.UNAVAILABLE)]
            status = int(statuses[0])
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

    async def read(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        nid = self.rng.choice(self.world.ids)
        ev = {"f": "read", "process": self.process, "key": f"{TABLE}/{key}", "node": nid}
        self.history.add(loop, type="invoke", **ev, value=None)
        try:
            value = await self._call(self.world.hosts[nid],
                                     lambda node: node.read(TABLE, key, "quorum"))
        except Exception:  # noqa: BLE001 - a failed read tells nothing; the checker skips it
            self.history.add(loop, type="fail", **ev, value=None)
            return
        self.history.add(loop, type="ok", **ev, value=int(value))


async def final_reads(world: World, work: Workload, history: History) -> None:
    """After healing and quiet: every key read on every node (``one``: its own replica when it
    holds the key), one after another."""
    loop = asyncio.get_running_loop()
    for k in range(work.keys):
        key = f"k{k}"
        for nid in world.ids:
            host = world.hosts[nid]
            ev = {"f": "final-read", "process": f"final-{nid}", "key": f"{TABLE}/{key}",
                  "node": nid}
            history.add(loop, type="invoke", **ev, value=None)
            try:
                node = host.node
                assert node is not None
                value = await asyncio.wait_for(node.read(TABLE, key, "one"), work.timeout)
            except Exception:  # noqa: BLE001 - reported as a missing final read
                history.add(loop, type="fail", **ev, value=None)
                continue
            history.add(loop, type="ok", **ev, value=int(value))


def client_tasks(world: World, work: Workload, seed: int,
                 history: History) -> list[Coroutine[Any, Any, None]]:
    per, extra = divmod(work.ops, work.clients)
    return [Client(c, world, work, random.Random(f"{seed}:client:{c}"), history).run(
        per + (1 if c < extra else 0)) for c in range(work.clients)]
