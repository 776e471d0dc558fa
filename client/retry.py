"""The retry loop: drive ops (one, or a batch) to an outcome with the same op ids throughout.

Per attempt: the next node in failover order, a timeout clipped to the ops' deadline, and on
each op its ``attempt`` number and ``age_ms``. Between attempts: exponential backoff with full
jitter. An op's deadline (``ClientConfig.budget``) keeps every attempt inside the window the
cluster advertises, so any attempt that reaches a node is still recognised as a retry there.
Each op ends as an ``AddResult`` (applied or duplicate), or as an error that says what is known:
``RejectedError``/``NotAppliedError`` (certainly not applied) or ``OutcomeUnknownError``.

An op is an add or a delete (``PendingOp.kind``); both take the same path: a delete has an op id
from the same source, keeps it through every retry, and a retry answered "duplicate" is a
success. On its own a delete is ``DELETE /v1/counters/{table}/{key}?op_id=..&attempt=..&age_ms=..
&ts_ms=..``; in a batch it is the item ``{"table", "key", "op_id", "op": "delete", "attempt",
"age_ms", "ts_ms"}`` (no ``delta``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from client.errors import (
    BadRequestError,
    ClientError,
    ConnectFailedError,
    DeadlineExceededError,
    NotAppliedError,
    OpExpiredError,
    OutcomeUnknownError,
    RejectedError,
    TransientError,
)
from client.stats import ClientStats
from client.transport import HttpTransport, op_result_error

ADD, DELETE = "add", "delete"


@dataclass(frozen=True, slots=True)
class AddResult:
    """A successful add (or delete, ``kind``): ``applied`` the first time, ``duplicate`` when an
    earlier attempt had already been applied (its ack was lost); either way the op took effect
    exactly once. A delete's ``delta`` is 0."""

    op_id: str
    delta: int
    applied: bool
    duplicate: bool
    attempts: int
    node: str
    coalesced: int = 1
    kind: str = ADD


class PendingOp:
    """One op id on its way; ``waiters`` are the callers (several when coalesced).

    ``on_finish`` is called once, when the op ends whichever way (the batcher uses it to let
    the ops that wait behind this one on its key go); ``finish`` and ``give_up`` do nothing
    after the first end."""

    __slots__ = ("table", "key", "delta", "op_id", "created", "deadline", "attempts",
                 "maybe_sent", "waiters", "coalesced", "last_error", "kind", "on_finish",
                 "ended")

    def __init__(self, table: str, key: str, delta: int, op_id: str, created: float,
                 deadline: float, kind: str = ADD) -> None:
        self.table, self.key, self.delta, self.op_id = table, key, delta, op_id
        self.created, self.deadline = created, deadline
        self.kind = kind
        self.attempts = 0
        self.maybe_sent = False  # some attempt may have reached a node
        self.waiters: list[asyncio.Future[AddResult]] = []
        self.coalesced = 1
        self.last_error: ClientError | None = None
        self.on_finish: Callable[[PendingOp], None] | None = None
        self.ended = False

    def wire(self, now: float, send_age: bool = True) -> dict[str, Any]:
        out: dict[str, Any]
        if self.kind == DELETE:
            out = {"table": self.table, "key": self.key, "op_id": self.op_id, "op": DELETE,
                   "attempt": self.attempts}
        else:
            out = {"table": self.table, "key": self.key, "op_id": self.op_id,
                   "delta": self.delta, "attempt": self.attempts}
        if send_age:
            age_ms = int((now - self.created) * 1000)
            out["age_ms"] = age_ms
            # the creation instant on the wall clock: a copy the network delivers late (or that
            # waits in a paused node's socket) is seen as old by the node, whatever age_ms says
            out["ts_ms"] = int(time.time() * 1000) - age_ms
        return out

    def finish(self, result: AddResult | BaseException) -> None:
        if self.ended:
            return
        self.ended = True
        for fut in self.waiters:
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        hook, self.on_finish = self.on_finish, None
        if hook is not None:
            hook(self)

    def give_up(self, stats: ClientStats, *, closing: bool = False) -> None:
        """End without an answer: unknown if any attempt may have been applied."""
        if self.ended:
            return
        why = "client closed" if closing else "deadline passed"
        last = f"; last error: {self.last_error}" if self.last_error else ""
        err: ClientError
        if self.maybe_sent:
            err = DeadlineExceededError(f"op {self.op_id}: {why} after {self.attempts} "
                                        f"attempt(s), outcome unknown{last}", op_id=self.op_id,
                                        attempts=self.attempts)
            stats.unknown += 1
        else:
            err = NotAppliedError(f"op {self.op_id}: {why}; no attempt reached a node{last}",
                                  op_id=self.op_id, attempts=self.attempts)
            stats.not_applied += 1
        self.finish(err)


def backoff(retry: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): uniform in [0, min(cap, base * 2**(retry-1))]."""
    return rng.uniform(0.0, min(cap, base * (2 ** min(retry - 1, 30))))


class RetryLoop:
    """Runs ops against an ordered set of nodes; shared by single ops and batches."""

    def __init__(self, transport: HttpTransport, order: Callable[[str | None], list[str]],
                 on_node_result: Callable[[str, bool], None], *, attempt_timeout: float,
                 backoff_interval: float, max_backoff_interval: float, stats: ClientStats,
                 rng: random.Random | None = None, send_age: bool = True) -> None:
        self.transport = transport
        self.order = order
        self.on_node_result = on_node_result
        self.attempt_timeout = attempt_timeout
        self.backoff_interval = backoff_interval
        self.max_backoff_interval = max_backoff_interval
        self.stats = stats
        self.rng = rng or random.Random()
        self.send_age = send_age

    def backoff_delay(self, retry: int) -> float:
        return backoff(retry, self.backoff_interval, self.max_backoff_interval, self.rng)

    async def run(self, ops: Sequence[PendingOp], *, batch_endpoint: bool | None = None,
                  prefer: str | None = None) -> None:
        """Resolve every op's waiters; never raises (a cancellation ends ops as unknown).
        ``prefer``: the node to try first (the ops' leader), then the usual order."""
        pending = list(ops)
        try:
            await self._loop(pending, batch_endpoint, prefer)
        except asyncio.CancelledError:
            for op in pending:
                op.give_up(self.stats, closing=True)
            raise

    async def _loop(self, pending: list[PendingOp], batch_endpoint: bool | None,
                    prefer: str | None = None) -> None:
        nodes = self.order(prefer)
        turn = 0
        while pending:
            if turn:
                await self._sleep_backoff(turn, pending)
            pending[:] = self._drop_expired(pending)
            if not pending:
                return
            node = nodes[turn % len(nodes)]
            turn += 1
            now = time.monotonic()
            timeout = min(self.attempt_timeout, min(op.deadline for op in pending) - now)
            for op in pending:
                op.attempts += 1
                self.stats.attempts += 1
                self.stats.retries += op.attempts > 1
            use_batch = len(pending) > 1 if batch_endpoint is None else batch_endpoint
            try:
                outcomes = await self._send(node, pending, now, timeout, use_batch)
            except asyncio.CancelledError:
                for op in pending:  # cut off mid-attempt: the request may have been applied
                    op.maybe_sent = True
                raise
            except TransientError as exc:
                self._attempt_failed(node, exc, pending)
                continue
            except BadRequestError as exc:
                if len(pending) > 1:  # one bad op rejects a batch whole: nothing was applied
                    self.stats.errors["BadRequestError"] += 1
                    await asyncio.gather(*(self.run([op], batch_endpoint=False)
                                           for op in pending))
                    pending.clear()
                    return
                outcomes = [exc]
            except (RejectedError, OutcomeUnknownError) as exc:
                outcomes = [exc] * len(pending)
            self.on_node_result(node, True)
            pending[:] = self._settle(node, pending, outcomes)

    async def _send(self, node: str, pending: list[PendingOp], now: float, timeout: float,
                    use_batch: bool) -> list[dict[str, Any] | Exception]:
        if use_batch:
            self.stats.batches += 1
            results = await self.transport.post_batch(
                node, [op.wire(now, self.send_age) for op in pending], timeout=timeout)
            return [op_result_error(r, node) or r for r in results]
        body = pending[0].wire(now, self.send_age)
        table, key = body.pop("table"), body.pop("key")
        if body.pop("op", None) == DELETE:
            return [await self.transport.delete_op(node, table, key, body, timeout=timeout)]
        return [await self.transport.post_op(node, table, key, body, timeout=timeout)]

    async def _sleep_backoff(self, turn: int, pending: list[PendingOp]) -> None:
        left = min(op.deadline for op in pending) - time.monotonic()
        wait = min(self.backoff_delay(turn), left)
        if wait > 0:
            await asyncio.sleep(wait)

    def _drop_expired(self, pending: list[PendingOp]) -> list[PendingOp]:
        now = time.monotonic()
        keep = []
        for op in pending:
            if now >= op.deadline:
                op.give_up(self.stats)
            else:
                keep.append(op)
        return keep

    def _attempt_failed(self, node: str, exc: TransientError, pending: list[PendingOp]) -> None:
        self.stats.errors[type(exc).__name__] += 1
        self.on_node_result(node, False)
        for op in pending:
            op.last_error = exc
            if not isinstance(exc, ConnectFailedError):
                op.maybe_sent = True

    def _settle(self, node: str, pending: list[PendingOp],
                outcomes: list[dict[str, Any] | Exception]) -> list[PendingOp]:
        again = []
        stats = self.stats
        for op, out in zip(pending, outcomes, strict=True):
            if isinstance(out, dict):
                dup = bool(out.get("duplicate"))
                stats.acknowledged += 1
                stats.duplicates += dup
                stats.applied += not dup
                op.finish(AddResult(op.op_id, op.delta, not dup, dup, op.attempts, node,
                                    op.coalesced, op.kind))
                continue
            stats.errors[type(out).__name__] += 1
            if isinstance(out, TransientError):
                op.maybe_sent = True
                op.last_error = out
                again.append(op)
            elif isinstance(out, OpExpiredError) and op.maybe_sent:
                stats.unknown += 1
                op.finish(OpExpiredError(f"op {op.op_id}: {out.message}; outcome unknown",
                                         op_id=op.op_id, node=node, attempts=op.attempts))
            elif isinstance(out, OpExpiredError):
                # refused on its first delivery, no earlier attempt could have landed
                stats.not_applied += 1
                op.finish(NotAppliedError(f"op {op.op_id}: {out.message}", op_id=op.op_id,
                                          node=node, attempts=op.attempts))
            else:
                stats.not_applied += 1
                op.finish(_for_op(out, op, node))
        return again


def _for_op(err: Exception, op: PendingOp, node: str) -> Exception:
    """A fresh error naming the op (one request's error may end several ops)."""
    if isinstance(err, RejectedError):
        return type(err)(f"op {op.op_id}: {err.message}", status=err.status, code=err.code,
                         op_id=op.op_id, node=node, attempts=op.attempts)
    if isinstance(err, ClientError):
        return type(err)(f"op {op.op_id}: {err.message}", op_id=op.op_id, node=node,
                         attempts=op.attempts)
    return err
