"""Micro-benchmarks of the write path's pieces, per op, at batch sizes 1, 10 and 100.

    python -m bench.bench_hotpath [--seconds 0.3] [--sizes 1,10,100] [--json FILE]

Rows (each timed in a loop of whole batches; the number is microseconds per op):
  dedup fbf loop       ``FBFDedup.seen_or_add`` once per id
  dedup fbf add_many   ``ForgetfulBloomFilter.add_many`` (inverted), the vectorised call
  dedup fbf many       ``FBFDedup.seen_or_add_many`` (picks loop or vector by batch size)
  record build         ``make_record`` / ``LogRecord(...)`` once per op
  encode per-record    ``wal.encode_records``: one msgpack call and one frame per record (v1)
  encode columnar      ``wal.encode_columns``: one msgpack call and one frame per batch (v2)
  append fsync off/on  ``DurableLog.append`` of one batch, awaited, one appender; wall time and
                       the process CPU time (loop + wal thread), both per op
  append columns       ``DurableLog.append_columns`` with node-shaped columns (kind, origin,
                       ts shared), fsync off/on; ``inline`` rows fsync on the loop thread
  unpublished          ``NodeState.hold`` + ``busy`` + ``release`` per op: the leader's
                       bookkeeping that keeps an op invisible until its quorum acks
  leader apply batch   ``Leader._apply_batch`` (dedup ``none``, so ids may repeat; a log that
                       only takes the columns) + ``Leader.release`` of the batch: the leader's
                       synchronous apply without the encoding
  replica merge batch  ``Replica._replicate_now`` of REPLICATE items as msgpack decodes them
                       (lists), dedup ``fbf``, the same no-op log
  forward unstamp      ``coordinator.unstamped``: FORWARD items (lists) back into ops
  edge ops             ``check_batch`` of a decoded batch body, then the ops the edge submits
  shape ...            (once ``cluster.core.ops`` exists) what building and reading the op's
                       shapes costs: plain tuple/list vs ``Op``/``Item``, index vs attribute

The FBF is sized like the cluster benchmark (``--rate 200000 --window 10``, fpp 1e-6).
Rows for APIs that do not exist in the checked-out tree are skipped, so the same script
measures before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

import cluster.wal as wal
from cluster.core.dedup import make_dedup
from cluster.wal import DurableLog, LogRecord, make_record

try:
    from cluster.core.fbf.hotpath import KERNEL as FBF_KERNEL
except ImportError:  # a tree from before the compiled kernel
    FBF_KERNEL = "numpy"

_ids = itertools.count()


def _op_ids(n: int) -> list[bytes]:
    return [f"client-{next(_ids):012d}:op".encode() for _ in range(n)]


def per_op_us(fn: Callable[[], Any], ops_per_call: int, seconds: float) -> float:
    """Best of three timed runs of ``fn`` repeated for about ``seconds``, in us per op."""
    calls = 1
    while True:  # calibrate: enough calls for ~seconds/3
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
        if dt > seconds / 10:
            break
        calls *= 4
    calls = max(1, int(calls * (seconds / 3) / dt))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls / ops_per_call * 1e6


def _records(b: int) -> list[LogRecord]:
    now = time.time()
    return [
        make_record(
            1, f"client-{i:012d}:op", "fbf_t", f"key-{i % 10000}", 1, "n1@3", 1000 + i, 0, now
        )
        for i in range(b)
    ]


def _columns(recs: list[LogRecord]) -> list[list[Any]]:
    return [
        [getattr(r, f) for r in recs]
        for f in ("kind", "op_id", "table", "key", "delta", "origin", "p", "n", "ts")
    ]


def _each(fn: Callable[[Any], Any], pool: Iterator[Any]) -> Callable[[], Any]:
    """A call of ``fn`` on the next batch of ``pool`` (fresh ids each time, for the dedup)."""
    return lambda: fn(next(pool))


def _loop(fn: Callable[[Any], Any], pool: Iterator[Any]) -> Callable[[], Any]:
    return lambda: [fn(x) for x in next(pool)]


def _star_loop(fn: Callable[..., Any], rows: list[tuple[Any, ...]]) -> Callable[[], Any]:
    return lambda: [fn(*row) for row in rows]


def bench_dedup(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    rows: dict[str, dict[int, float]] = {}
    d: Any = make_dedup("fbf", window=10, rate=200_000, target_fpp=1e-6)
    for b in sizes:
        pool = itertools.cycle([_op_ids(b) for _ in range(2000)])
        rows.setdefault("dedup fbf loop", {})[b] = per_op_us(_loop(d.seen_or_add, pool), b, seconds)
        rows.setdefault("dedup fbf add_many", {})[b] = per_op_us(
            _each(lambda ids: (~d.filter.add_many(ids)).tolist(), pool), b, seconds
        )
        if hasattr(d, "seen_or_add_many"):
            rows.setdefault("dedup fbf many", {})[b] = per_op_us(
                _each(d.seen_or_add_many, pool), b, seconds
            )
    return rows


def bench_unpublished(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    from cluster.core.config import from_mapping
    from cluster.roles.state import NodeState

    state = NodeState(from_mapping({"node_id": "n1", "listen": "127.0.0.1:1",
                                    "peers": "n1=127.0.0.1:1", "data_dir": "/nonexistent"}))
    if not hasattr(state, "hold"):
        return {}
    state.set_origin("n1@1")
    rows: dict[str, dict[int, float]] = {}
    now = time.time()
    for b in sizes:
        items = [[f"client-{i:012d}:op", "fbf_t", f"key-{i}", "n1@1", 1000 + i, 0, 1, now]
                 for i in range(b)]

        def cycle(items: list[list[Any]] = items) -> None:
            hold, busy, release = state.hold, state.busy, state.release
            for item in items:
                busy(item[1], item[2], "n1@1")
                hold(item)
            for item in items:
                release(item[0])

        rows.setdefault("unpublished hold+busy+release", {})[b] = per_op_us(cycle, b, seconds)
    return rows


class _NoLog:
    """A log that takes the columns (or records) and writes nothing: the role code alone."""

    def append_columns_nowait(self, *columns: Any) -> None:
        return None

    def append_nowait(self, records: Any) -> None:
        return None


def _roles_config(dedup: str) -> Any:
    from cluster.core.config import from_mapping

    return from_mapping({"node_id": "n1", "listen": "127.0.0.1:1", "data_dir": "/nonexistent",
                         "peers": "n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3",
                         "dedup": dedup})


def _op_shape() -> Callable[..., Any]:
    """What the tree builds an op with: ``cluster.core.ops.Op`` once it exists, else a tuple."""
    try:
        from cluster.core.ops import Op
    except ImportError:
        return lambda *fields: fields
    return Op


def _leader(config: Any) -> Any:
    from cluster.core.metrics import NodeMetrics
    from cluster.core.ring import Ring
    from cluster.roles.antientropy import Hints
    from cluster.roles.claims import Claims
    from cluster.roles.leader import Leader
    from cluster.roles.state import NodeState

    state = NodeState(config)
    state.set_origin("n1@1")
    ring = Ring([p[0] for p in config.peers], vnodes=config.vnodes, rf=config.rf)
    return Leader(config, ring, state, _NoLog(), {}, NodeMetrics(),  # type: ignore[arg-type]
                  Claims(), Hints(10), clock=time.time, spawn=lambda c: None,
                  settle_key=None, settle_one=None, release_claims=None)  # type: ignore[arg-type]


def bench_roles(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    from cluster.core.metrics import NodeMetrics
    from cluster.edge.validate import check_batch
    from cluster.roles.claims import Claims
    from cluster.roles.coordinator import unstamped
    from cluster.roles.replica import Replica
    from cluster.roles.state import NodeState

    make_op = _op_shape()
    leader = _leader(_roles_config("none"))
    rstate = NodeState(_roles_config("fbf"))
    rstate.set_origin("n1@1")
    replica = Replica(rstate, _NoLog(), Claims(), NodeMetrics(),  # type: ignore[arg-type]
                      clock=time.time)
    try:
        from cluster.edge.routes import _as_ops as edge_ops
    except ImportError:
        def edge_ops(checked: list[Any]) -> list[Any]:
            return [op[:5] for op in checked]
    rows: dict[str, dict[int, float]] = {}
    now, now_ms = time.time(), int(time.time() * 1000)
    for b in sizes:
        ops = [make_op("fbf_t", f"key-{i}", f"client-{i:012d}:op", 1, 1) for i in range(b)]
        ids = [op[2] for op in ops]

        def apply(ops: list[Any] = ops, ids: list[str] = ids) -> None:
            leader._apply_batch(ops)
            leader.release(ids)

        rows.setdefault("leader apply batch + release", {})[b] = per_op_us(apply, b, seconds)
        pool = itertools.cycle([
            msgpack.unpackb(msgpack.packb([[f"client-{next(_ids):012d}:op", "fbf_t",
                                            f"key-{i}", "n2@1", 1000 + i, 0, 1, now]
                                           for i in range(b)]))
            for _ in range(200)])
        rows.setdefault("replica merge batch", {})[b] = per_op_us(
            _each(replica._replicate_now, pool), b, seconds)
        body = msgpack.unpackb(msgpack.packb([[*op, now_ms] for op in ops]))
        rows.setdefault("forward unstamp", {})[b] = per_op_us(
            lambda body=body: unstamped(body, 10_000), b, seconds)
        batch = {"ops": [{"table": "fbf_t", "key": f"key-{i}", "op_id": f"c-{i}:op", "delta": 1}
                         for i in range(b)]}
        rows.setdefault("edge check_batch + ops", {})[b] = per_op_us(
            lambda batch=batch: edge_ops(check_batch(batch, max_ops=1000, max_op_id_bytes=256)),
            b, seconds)
    return rows | _bench_shapes(sizes, seconds)


def _bench_shapes(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    try:
        from cluster.core.ops import Item, Op
    except ImportError:
        return {}
    rows: dict[str, dict[int, float]] = {}
    now = time.time()
    make_item = Item._make
    for b in sizes:
        fields = [("t", f"k{i}", f"c:{i}", 1, 1) for i in range(b)]
        rows.setdefault("shape op: plain tuple", {})[b] = per_op_us(
            lambda f=fields: [(t, k, o, d, a) for t, k, o, d, a in f], b, seconds)
        rows.setdefault("shape op: Op(...)", {})[b] = per_op_us(
            lambda f=fields: [Op(t, k, o, d, a) for t, k, o, d, a in f], b, seconds)
        wire = [[f"c:{i}", "t", f"k{i}", "n1@1", i, 0, 1, now] for i in range(b)]
        rows.setdefault("shape item: list literal", {})[b] = per_op_us(
            lambda w=wire: [[o, t, k, r, p, n, d, s] for o, t, k, r, p, n, d, s in w], b,
            seconds)
        rows.setdefault("shape item: Item(...)", {})[b] = per_op_us(
            lambda w=wire: [Item(o, t, k, r, p, n, d, s) for o, t, k, r, p, n, d, s in w], b,
            seconds)
        rows.setdefault("shape item: wire list -> Item._make", {})[b] = per_op_us(
            lambda w=wire: list(map(make_item, w)), b, seconds)
        items = list(map(make_item, wire))
        rows.setdefault("shape item: read [0],[6] by index", {})[b] = per_op_us(
            lambda w=items: [(x[0], x[6]) for x in w], b, seconds)
        rows.setdefault("shape item: read .op_id,.delta", {})[b] = per_op_us(
            lambda w=items: [(x.op_id, x.delta) for x in w], b, seconds)
    return rows


def bench_records(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    rows: dict[str, dict[int, float]] = {}
    pack = msgpack.Packer().pack
    now = time.time()
    enc_cols = getattr(wal, "encode_columns", None)
    for b in sizes:
        args = [
            (1, f"client-{i:012d}:op", "fbf_t", f"key-{i}", 1, "n1@3", 1000 + i, 0, now)
            for i in range(b)
        ]
        rows.setdefault("record build", {})[b] = per_op_us(
            _star_loop(make_record, args), b, seconds
        )
        recs = _records(b)
        rows.setdefault("encode per-record (v1)", {})[b] = per_op_us(
            _each(lambda r: wal.encode_records(r, pack), itertools.repeat(recs)), b, seconds
        )
        if enc_cols is not None:
            cols = _columns(recs)
            shared = [1, cols[1], cols[2], cols[3], cols[4], "n1@3", cols[6], cols[7], now]
            rows.setdefault("encode columnar (v2)", {})[b] = per_op_us(
                _each(lambda c: enc_cols(c, pack), itertools.repeat(cols)), b, seconds
            )
            rows.setdefault("encode columnar, shared kind/origin/ts", {})[b] = per_op_us(
                _each(lambda c: enc_cols(c, pack), itertools.repeat(shared)), b, seconds
            )
    return rows


async def _append_cell(
    directory: Path, b: int, seconds: float, fsync: bool, mode: str, **kw: Any
) -> tuple[float, float]:
    """(wall us per op, CPU us per op) for one appender awaiting batches of ``b``."""
    async with DurableLog(directory, fsync=fsync, **kw) as log:
        recs = _records(b)
        cols = _columns(recs)
        now = recs[0].ts
        if mode == "records":

            async def one() -> None:
                await log.append(recs)
        else:

            async def one() -> None:
                await log.append_columns(
                    1, cols[1], cols[2], cols[3], cols[4], "n1@3", cols[6], cols[7], now
                )

        for _ in range(20):
            await one()
        n = 0
        c0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await one()
            n += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall / n / b * 1e6, cpu / n / b * 1e6


def bench_append(sizes: list[int], seconds: float) -> dict[str, dict[int, float]]:
    rows: dict[str, dict[int, float]] = {}
    has_cols = hasattr(DurableLog, "append_columns")
    has_inline = "fsync_in_loop" in DurableLog.__init__.__code__.co_varnames
    cells: list[tuple[str, bool, str, dict[str, Any]]] = [
        ("append records", False, "records", {}),
        ("append records", True, "records", {}),
    ]
    if has_inline:
        cells.append(("append records inline", True, "records", {"fsync_in_loop": True}))
    if has_cols:
        cells += [("append columns", False, "columns", {}), ("append columns", True, "columns", {})]
        if has_inline:
            cells.append(("append columns inline", True, "columns", {"fsync_in_loop": True}))
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-", dir=".") as root:
        for b in sizes:
            for i, (name, fsync, mode, kw) in enumerate(cells):
                wall, cpu = asyncio.run(
                    _append_cell(Path(root) / f"{b}-{i}", b, seconds, fsync, mode, **kw)
                )
                tag = "fsync on" if fsync else "fsync off"
                rows.setdefault(f"{name}, {tag}: wall", {})[b] = wall
                rows.setdefault(f"{name}, {tag}: CPU", {})[b] = cpu
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="0.05 s cells (smoke run)")
    ap.add_argument("--seconds", type=float, default=0.3, help="per cell")
    ap.add_argument("--sizes", default="1,10,100")
    ap.add_argument("--only", default="dedup,records,unpublished,roles,append")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 0.05)
    sizes = [int(s) for s in args.sizes.split(",")]
    only = set(args.only.split(","))
    rows: dict[str, dict[int, float]] = {}
    if "dedup" in only:
        rows |= bench_dedup(sizes, args.seconds)
    if "records" in only:
        rows |= bench_records(sizes, args.seconds)
    if "unpublished" in only:
        rows |= bench_unpublished(sizes, args.seconds)
    if "roles" in only:
        rows |= bench_roles(sizes, args.seconds)
    if "append" in only:
        rows |= bench_append(sizes, args.seconds * 3)
    width = max(len(r) for r in rows)
    if "dedup" in only:
        print(f"fbf hot path: {FBF_KERNEL}")
    print(f"{'us per op':<{width}}" + "".join(f"{'batch ' + str(b):>12}" for b in sizes))
    for name, cells in rows.items():
        print(f"{name:<{width}}" + "".join(f"{cells.get(b, float('nan')):>12.2f}" for b in sizes))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
