"""A node's in-memory state: counter shards plus one dedup per table; snapshot and replay.

Pure apart from the dedup clock: the log and the network live in ``cluster.node``. Replay is
idempotent because shard entries merge by max and re-inserting an op id is harmless.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack

from cluster.config import NodeConfig
from cluster.shards import ShardStore

SNAPSHOT_VERSION = 1


def _dedup_module() -> Any:
    import cluster.dedup as dedup  # imported late: the package is built in parallel

    return dedup


class NodeState:
    """Shards and per-table dedup of one node."""

    def __init__(self, config: NodeConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.shards = ShardStore(config.node_id)
        self.dedups: dict[str, Any] = {}

    def dedup(self, table: str) -> Any:
        """The table's dedup, created on first use with the table's configured strategy."""
        d = self.dedups.get(table)
        if d is None:
            cfg = self.config
            d = self.dedups[table] = _dedup_module().make_dedup(
                cfg.dedup_for(table), window=cfg.window, rate=cfg.rate,
                target_fpp=cfg.target_fpp, clock=self.clock, max_bytes=cfg.max_dedup_bytes,
            )
        return d

    def window(self, table: str) -> float:
        """Seconds within which a retry on ``table`` is recognised (the node's op_expired limit)."""
        d = self.dedups.get(table)
        return float(d.window) if d is not None else self.config.window

    def replay(self, op_id: str, table: str, key: str, origin: str, p: int, n: int,
               ts: float) -> None:
        """Re-apply one logged record: merge the pair, remember the id while its window lasts."""
        self.shards.merge_pair(table, key, origin, p, n)
        if op_id:
            d = self.dedup(table)
            if self.clock() - ts <= max(d.window, self.config.window):
                d.seen_or_add(op_id.encode())

    def make_blob(self) -> bytes:
        """Snapshot of everything; called synchronously at the log's rotation instant."""
        return msgpack.packb({
            "version": SNAPSHOT_VERSION,
            "node": self.config.node_id,
            "shards": self.shards.to_bytes(),
            "dedup": {table: d.to_bytes() for table, d in self.dedups.items()},
        })

    def load_blob(self, blob: bytes) -> None:
        data = msgpack.unpackb(blob, strict_map_key=True)
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('version')} is not {SNAPSHOT_VERSION}")
        self.shards = ShardStore.from_bytes(data["shards"], self.config.node_id)
        load = _dedup_module().load_dedup
        self.dedups = {table: load(raw, clock=self.clock) for table, raw in data["dedup"].items()}

    def dedup_bytes(self) -> int:
        return sum(int(d.nbytes()) for d in self.dedups.values())
