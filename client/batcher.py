"""Automatic batching: ops leave together as one /v1/batch, in the order each key's adds and
deletes were issued.

Ops are queued by their key's leader (``route``), a lane each, and each lane's batch is one
request to that leader. When it leaves adapts to the load (``max_in_flight`` > 0, the SDK's
default): while fewer than ``max_in_flight`` of the lane's batches are out, what was issued goes
at the end of the loop turn it was issued in, so a lone op waits for nobody; once that many are
out, the lane's ops gather until one of them ends, so batches grow with the load and the nodes'
cost per op falls. They wait at most twice as long as the lane's batches have lately taken (at
least ``interval``, at most ``max_wait``): a batch stuck in its retries holds the lane's new ops
back for a few round trips, not for its whole attempt, and a slow node holds back only the ops
it leads. With ``max_in_flight`` 0, a lane's ops issued within ``interval`` seconds leave
together, whatever is out.

With ``coalesce``, adds to the same key inside one batch window merge into one op with one op id
(the "delayed batched requests" of seed 003): fewer ids and smaller batches, at the price that
the merged callers share one outcome. A delete is never merged, and never shares a request with
an op of its own key: ``KeyOrder`` holds it until every op issued before it on its key has
ended (answered, or given up), and holds the ops issued after it until it has ended itself. So
one client's add, then delete, then add of a key reach the cluster in that order even when the
caller did not wait between them, while adds to a key (they commute) still go side by side.
Explicit batches (``CounterClient.batch``) pass through the same order, as one entry over all
their keys.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence

from client.errors import NotAppliedError
from client.retry import ADD, DELETE, AddResult, PendingOp
from client.stats import ClientStats

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

Key = tuple[str, str]
NewOp = Callable[[str, str, int, str], PendingOp]
RunOps = Callable[[list[PendingOp]], Awaitable[None]]
RunTo = Callable[[list[PendingOp], "str | None"], Awaitable[None]]  # ops, their leader
Route = Callable[[str, str], "str | None"]  # a key's leader (a node URL), None: any node


class Parked:
    """An entry waiting in ``KeyOrder``: its keys (with how many ops each), whether it is a
    delete, what to call once it may go, and the callers' futures (failed if it never goes)."""

    __slots__ = ("counts", "delete", "release", "futures", "admitted")

    def __init__(self, counts: dict[Key, int], delete: bool) -> None:
        self.counts = counts
        self.delete = delete
        self.release: Callable[[], None] = _nothing
        self.futures: list[asyncio.Future[AddResult]] = []
        self.admitted = False


class _KeyState:
    __slots__ = ("running", "deleting", "queue", "queued_deletes")

    def __init__(self) -> None:
        self.running = 0  # adds on the key sent and not ended
        self.deleting = False  # a delete of the key sent and not ended
        self.queue: deque[Parked] = deque()  # entries touching the key, in issue order
        self.queued_deletes = 0


class KeyOrder:
    """Per key, the order of one client's adds and deletes, as a reader-writer admission in
    issue order: adds (shared) go at once unless a delete of the key is running or waiting; a
    delete (exclusive) goes once nothing issued before it on its key is running or waiting.
    An entry waits only on entries issued before it, so there is no deadlock, whatever keys a
    multi-key entry spans. State only: the one effect is calling an entry's ``release``.

    ``enter`` admits now (None) or returns the ``Parked`` entry; ``end`` is called once per op
    when it ends (``n``: the callers it carried); ``abandon`` drops an entry still parked.
    """

    def __init__(self) -> None:
        self._keys: dict[Key, _KeyState] = {}
        self.parked = 0

    def busy(self, key: Key) -> bool:
        """Something issued on ``key`` has not ended yet."""
        return key in self._keys

    def enter(self, keys: Sequence[Key], delete: bool = False) -> Parked | None:
        if len(keys) == 1:  # the common case, without the Counter
            key = keys[0]
            st = self._keys.get(key)
            if st is None:
                st = self._keys[key] = _KeyState()
                if delete:
                    st.deleting = True
                else:
                    st.running = 1
                return None
            if not st.queue and not st.deleting and not (delete and st.running):
                if delete:
                    st.deleting = True
                else:
                    st.running += 1
                return None
            counts = {key: 1}
        else:
            if delete:
                raise ValueError("a delete is one key")
            counts = dict(Counter(keys))
        entry = Parked(counts, delete)
        if self._may_go(entry, queued=False):
            self._admit(entry)
            return None
        for key in counts:
            st = self._keys.get(key) or self._keys.setdefault(key, _KeyState())
            st.queue.append(entry)
            st.queued_deletes += delete
        self.parked += 1
        return entry

    def end(self, key: Key, delete: bool = False, n: int = 1) -> None:
        st = self._keys.get(key)
        if st is None:  # never entered: nothing waits on it (and a hook must not raise)
            return
        if delete:
            st.deleting = False
        else:
            st.running -= n
        if st.queue:
            self._wake((key,))
        elif not st.running and not st.deleting:
            del self._keys[key]

    def abandon(self, entry: Parked) -> None:
        """Forget an entry that never went (its callers gave up): nothing was sent."""
        if entry.admitted:
            return
        entry.admitted = True  # never admitted again
        self.parked -= 1
        for key in entry.counts:
            st = self._keys[key]
            st.queue.remove(entry)
            st.queued_deletes -= entry.delete
        self._wake(tuple(entry.counts))

    def clear_parked(self) -> list[Parked]:
        """Take every parked entry out, releasing none of them (the client is closing)."""
        out: dict[int, Parked] = {}
        for key, st in list(self._keys.items()):
            for entry in st.queue:
                out.setdefault(id(entry), entry)
                entry.admitted = True
            st.queue.clear()
            st.queued_deletes = 0
            if not st.running and not st.deleting:
                del self._keys[key]
        self.parked = 0
        return list(out.values())

    def _may_go(self, entry: Parked, *, queued: bool = True) -> bool:
        """May ``entry`` go now? ``queued``: it waits in its keys' queues (else it is new and
        would go behind everything queued)."""
        for key in entry.counts:
            st = self._keys.get(key)
            if st is None:
                continue
            if st.deleting:
                return False
            if entry.delete:
                if st.running or (st.queue and st.queue[0] is not entry):
                    return False
            elif not queued:
                if st.queued_deletes:
                    return False
            else:
                for other in st.queue:
                    if other is entry:
                        break
                    if other.delete:
                        return False
        return True

    def _admit(self, entry: Parked) -> None:
        for key, n in entry.counts.items():
            st = self._keys.get(key) or self._keys.setdefault(key, _KeyState())
            if entry.delete:
                st.deleting = True
            else:
                st.running += n

    def _wake(self, keys: Sequence[Key]) -> None:
        go: list[Parked] = []
        for key in keys:
            st = self._keys.get(key)
            if st is None:
                continue
            for entry in list(st.queue):
                if self._may_go(entry):
                    for k in entry.counts:
                        other = self._keys[k]
                        other.queue.remove(entry)
                        other.queued_deletes -= entry.delete
                    entry.admitted = True
                    self.parked -= 1
                    self._admit(entry)
                    go.append(entry)
                elif entry.delete:
                    break  # everything behind a waiting delete waits too
            if not st.queue and not st.running and not st.deleting:
                del self._keys[key]
        for entry in go:
            entry.release()


def _nothing() -> None:
    pass


class _Lane:
    """The ops queued for one leader (a node URL, or None: any node) and its batches out."""

    __slots__ = ("leader", "ops", "by_key", "timer", "flying", "took")

    def __init__(self, leader: str | None) -> None:
        self.leader = leader
        self.ops: list[PendingOp] = []
        self.by_key: dict[Key, PendingOp] = {}  # coalesce: the queued add of each key
        self.timer: asyncio.Handle | None = None  # the flush to come
        self.flying = 0  # its batches out
        self.took = 0.0  # how long its batches take, seconds (a moving average)


class Batcher:
    """Queues ops for the next batch to their key's leader (``route``); ``order`` keeps each
    key's adds and deletes in order. Each leader's ops leave on their own schedule (a lane
    each), so a slow node holds back only the ops it leads."""

    def __init__(self, new_op: NewOp, run: RunTo, *, interval: float, max_ops: int,
                 coalesce: bool, on_coalesce: Callable[[], None],
                 stats: ClientStats | None = None, max_in_flight: int = 0,
                 max_wait: float = 1.0, route: Route | None = None) -> None:
        self._new_op = new_op
        self._run = run
        self._route = route
        self.interval = interval
        self.max_ops = max_ops
        self.max_in_flight = max_in_flight
        self.max_wait = max_wait
        self.coalesce = coalesce
        self._on_coalesce = on_coalesce
        self.stats = stats if stats is not None else ClientStats()
        self.order = KeyOrder()
        self._lanes: dict[str | None, _Lane] = {}
        self._tasks: dict[asyncio.Future[None], list[PendingOp]] = {}

    def add(self, table: str, key: str, delta: int, *,
            delete: bool = False) -> asyncio.Future[AddResult]:
        """Queue an add (or, with ``delete``, a delete: ``delta`` is ignored); the future ends
        with the op's outcome."""
        fut: asyncio.Future[AddResult] = asyncio.get_running_loop().create_future()
        entry = self.order.enter(((table, key),), delete)
        if entry is None:
            self._queue(table, key, delta, delete, fut)
        else:
            entry.futures.append(fut)
            entry.release = lambda: self._release(table, key, delta, delete, fut)
            fut.add_done_callback(lambda _f: self._caller_gone(entry))
        return fut

    def submit_batch(self, items: Sequence[tuple[str, str, int]],
                     run: RunOps) -> list[asyncio.Future[AddResult]]:
        """Adds to go out together through ``run`` (an explicit batch), once no delete issued
        before them on any of their keys is waiting or running; one future per item."""
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[AddResult]] = [loop.create_future() for _ in items]
        if not items:
            return futs
        entry = self.order.enter([(t, k) for t, k, _ in items])
        if entry is None:
            self._start_batch(items, futs, run)
        else:
            entry.futures.extend(futs)
            entry.release = lambda: self._start_batch(items, futs, run)
            futs[0].add_done_callback(lambda _f: self._caller_gone(entry))
        return futs

    def _caller_gone(self, entry: Parked) -> None:
        """A parked entry whose callers all cancelled is dropped unsent."""
        if all(f.cancelled() for f in entry.futures):
            self.order.abandon(entry)

    def _release(self, table: str, key: str, delta: int, delete: bool,
                 fut: asyncio.Future[AddResult]) -> None:
        if fut.done():  # the caller gave up while the op waited: it is not sent
            self.order.end((table, key), delete)
        else:
            self._queue(table, key, delta, delete, fut)

    def _lane(self, table: str, key: str) -> _Lane:
        leader = self._route(table, key) if self._route is not None else None
        lane = self._lanes.get(leader)
        if lane is None:
            lane = self._lanes[leader] = _Lane(leader)
        return lane

    def _queue(self, table: str, key: str, delta: int, delete: bool,
               fut: asyncio.Future[AddResult]) -> None:
        lane = self._lane(table, key)
        op = lane.by_key.get((table, key)) if self.coalesce and not delete else None
        if op is not None and INT64_MIN <= op.delta + delta <= INT64_MAX:
            op.delta += delta
            op.coalesced += 1
            self._on_coalesce()
        else:
            op = self._new_op(table, key, 0 if delete else delta, DELETE if delete else ADD)
            op.on_finish = self._ended
            lane.ops.append(op)
            if self.coalesce and not delete:
                lane.by_key[(table, key)] = op
        op.waiters.append(fut)
        if len(lane.ops) >= self.max_ops:
            self._flush(lane)
        elif lane.timer is None:
            loop = asyncio.get_running_loop()
            if not self.max_in_flight:
                lane.timer = loop.call_later(self.interval, self._flush, lane)
            elif lane.flying < self.max_in_flight:  # a batch may leave now
                lane.timer = loop.call_soon(self._flush, lane)
            else:  # gather until one of the lane's batches ends (``_landed``), or for twice
                # as long as its batches lately took: one stuck in its retries holds no one
                wait = min(self.max_wait, max(self.interval, 2.0 * lane.took))
                lane.timer = loop.call_later(wait, self._flush, lane)

    def _start_batch(self, items: Sequence[tuple[str, str, int]],
                     futs: list[asyncio.Future[AddResult]], run: RunOps) -> None:
        ops = []
        for (table, key, delta), fut in zip(items, futs, strict=True):
            if fut.done():
                self.order.end((table, key))
                continue
            op = self._new_op(table, key, delta, ADD)
            op.on_finish = self._ended
            op.waiters.append(fut)
            ops.append(op)
        if ops:
            self._spawn(run(ops), ops)

    def _ended(self, op: PendingOp) -> None:
        self.order.end((op.table, op.key), op.kind == DELETE, op.coalesced)

    def _spawn(self, work: Awaitable[None], ops: list[PendingOp]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(work)
        self._tasks[task] = ops
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future[None]) -> None:
        # an op whose task was cancelled before it could start never heard of it
        for op in self._tasks.pop(task, ()):
            op.give_up(self.stats, closing=True)

    def _landed(self, lane: _Lane, started: float, task: asyncio.Future[None]) -> None:
        took = task.get_loop().time() - started
        lane.took = took if not lane.took else 0.8 * lane.took + 0.2 * took
        lane.flying -= 1
        if self.max_in_flight and lane.ops and lane.flying < self.max_in_flight:
            self._flush(lane)  # what gathered while the lane's batches were all out

    def _flush(self, lane: _Lane) -> None:
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        if not lane.ops:
            return
        ops, lane.ops = lane.ops, []
        lane.by_key.clear()
        lane.flying += 1
        task = self._spawn(self._run(ops, lane.leader), ops)
        task.add_done_callback(functools.partial(self._landed, lane, task.get_loop().time()))

    def flush(self) -> None:
        """Send what every lane holds now."""
        for lane in list(self._lanes.values()):
            self._flush(lane)

    @property
    def in_flight(self) -> int:
        return len(self._tasks) + sum(1 for lane in self._lanes.values() if lane.ops)

    async def drain(self) -> None:
        """Send what is queued (and what waits for it) until every op has an outcome."""
        self.flush()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            self.flush()  # ops released by those that just ended
        self._fail_parked()  # nothing runs that they could wait for: never expected

    async def abort(self) -> None:
        """End every op now: waiting and queued ones as not applied (never sent), the ones in
        flight as their retry loop decides on cancellation (unknown if maybe sent)."""
        self._fail_parked()
        for lane in self._lanes.values():
            if lane.timer is not None:
                lane.timer.cancel()
                lane.timer = None
            ops, lane.ops = lane.ops, []
            lane.by_key.clear()
            for op in ops:
                op.give_up(self.stats, closing=True)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _fail_parked(self) -> None:
        for entry in self.order.clear_parked():
            for fut in entry.futures:
                if not fut.done():
                    self.stats.not_applied += 1
                    fut.set_exception(NotAppliedError("client closed before the op was sent "
                                                      "(it waited for an earlier op on its key)"))
