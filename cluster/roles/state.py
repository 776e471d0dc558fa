"""A node's in-memory state: counter shards plus one dedup per table; snapshot and replay.

Pure apart from the dedup clock: the log and the network live in ``cluster.node``. Replay is
idempotent because shard entries merge by max and re-inserting an op id is harmless.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from cluster.core.batch_kernel import encoded_ids, hold_items, needs_touch, release_ids
from cluster.core.config import NodeConfig
from cluster.core.entry import LAST, CounterEntry, is_real
from cluster.core.ops import (
    ITEM_KEY,
    ITEM_N,
    ITEM_OP_ID,
    ITEM_ORIGIN,
    ITEM_P,
    ITEM_TABLE,
    ITEM_TS,
    Item,
    ItemFields,
    Op,
)
from cluster.core.shards import ShardStore
from cluster.core.tables import TableSettings, settings_map

SNAPSHOT_VERSION = 1
MAX_STAGED = 1_000_000  # staged copies remembered by op id (their pairs stay hidden anyway)
_OP_TABLE, _OP_KEY, _OP_ID = (Op._fields.index(f) for f in ("table", "key", "op_id"))


def _many(dedup: Any, ids: list[bytes]) -> list[bool]:
    """Batch ``seen_or_add``: every strategy has ``seen_or_add_many`` (``cluster.core.dedup``'s
    ``Dedup`` protocol; ``OneByOne`` loops for those with no batch path)."""
    return list(dedup.seen_or_add_many(ids))


def _dedup_module() -> Any:
    import cluster.core.dedup as dedup  # imported late: the package is built in parallel

    return dedup


class NodeState:
    """Shards and per-table dedup of one node."""

    def __init__(self, config: NodeConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.shards = ShardStore(config.node_id)
        self.dedups: dict[str, Any] = {}
        # Unpublished ops: applied here as leader, not yet known to be on a quorum (in flight,
        # or in doubt once their quorum failed). op id -> its item (``cluster.core.ops``: the
        # leader's list, or an ``Item`` once recovered); change it only through hold/release,
        # which keep their deltas hidden in the shards and the per-key order.
        self.pending: dict[str, ItemFields] = {}
        # (table, key, origin) -> its unpublished op ids in the order they were applied
        self._by_key: dict[tuple[str, str, str], dict[str, None]] = {}
        # Staged copies (write quorum above 2): op id -> the item of another leader's op this
        # node merged hidden (``ShardStore.stage``), until a visible pair of its origin covers
        # it. While one is open, HOLDS answers for the op say so (``cluster.roles.checks``).
        self.staged: dict[str, ItemFields] = {}
        # Ops this node applied and then withdrew (op id -> time): it does not count them, and
        # says so when asked, so the leader whose application stands is never mistaken for it.
        self.withdrawn: dict[str, float] = {}
        # Dedup state pulled from the replicas at start (table -> their dedups), until
        # ``pulled_until`` (wall clock): an id in it only makes an op go through the check
        # (``suspected``). It is never answered as held: it may be another node's op still in
        # doubt, which only that node's settling may decide (``cluster.roles.settle``).
        self.pulled: dict[str, list[Any]] = {}
        self.pulled_until = 0.0
        # the agreed table settings (``cluster.core.tables``), from the installed membership;
        # ``ttl_tables``: the names of those with a ttl, whose writes keep the key's LAST
        self.tables: dict[str, TableSettings] = {}
        self.ttl_tables: frozenset[str] = frozenset()
        # table -> the highest count this origin's pairs reached on keys it collected there
        # (``cluster.roles.expiry``): a pair it raises again on a key it no longer holds
        # starts above it (``cluster.roles.leader``)
        self.collected: dict[str, int] = {}
        # wall time since which keys this node no longer replicates wait for their hand-off
        # (``cluster.roles.shed``); logged (a DROP record of no key) and snapshotted
        self.foreign_since: float | None = None

    def use_tables(self, tables: Iterable[TableSettings]) -> None:
        self.tables = settings_map(tables)
        self.ttl_tables = frozenset(t.name for t in self.tables.values() if t.ttl_s is not None)

    def touch(self, items: Iterable[ItemFields]) -> None:
        """Items applied or merged here: in a table with a ttl, the key's last change
        (``LAST``) rises to the item's time. Every replica derives it from the same items, and
        it is a pair, so repairs carry it too.

        A delete's own ``LAST`` item (merged by the compiled ``merge_items``, out of
        ``merge_pair``'s sight) is told to the store's due index (``ShardStore.noted_last``):
        the tombstone comes due ``tombstone_grace`` after it."""
        ttl = self.ttl_tables
        if not isinstance(items, list):
            items = list(items)
        if not needs_touch(items, ttl, LAST):
            return
        shards = self.shards
        merge, noted = shards.merge_pair, shards.noted_last
        for item in items:
            table, origin = item[ITEM_TABLE], item[ITEM_ORIGIN]
            if origin == LAST:
                noted(table, item[ITEM_KEY], item[ITEM_P])
            elif table in ttl and is_real(origin):  # as ``replay`` does: a delete's floors
                # come with its own LAST item, of the same time
                merge(table, item[ITEM_KEY], LAST, int(item[ITEM_TS] * 1000), 0)

    def expired(self, table: str, entry: CounterEntry, now: float) -> bool:
        """Has the key whose entry this is expired by its table's ttl at ``now`` (seconds)?"""
        settings = self.tables.get(table)
        return settings is not None and settings.ttl_s is not None and settings.expired(
            entry.last_change_ms(), int(now * 1000))

    def read_value(self, table: str, entry: CounterEntry, now: float) -> int:
        """What a read answers of ``entry``: its value, 0 once expired."""
        return 0 if self.expired(table, entry, now) else entry.value()

    def set_origin(self, origin: str) -> None:
        """The origin id this node raises from now on (a fresh incarnation)."""
        self.shards = ShardStore(origin)
        self.set_pending(list(self.pending.values()))

    # -- unpublished ops ---------------------------------------------------------------------

    def hold(self, item: ItemFields, *, hidden: bool = False) -> None:
        """An op this node just applied as leader: unpublished (and hidden) until released.
        ``hidden``: its delta is hidden already (``ShardStore.apply_hidden``)."""
        self.hold_many([item], hidden=hidden)

    def hold_many(self, items: Iterable[ItemFields], *, hidden: bool = False) -> None:
        """``hold`` of each item, in order (a leader's batch)."""
        items = items if isinstance(items, list) else list(items)
        hold_items(self.pending, self._by_key, items)
        if not hidden:
            hide = self.shards.hide
            for _op_id, table, key, origin, _p, _n, delta, _ts in items:
                hide(table, key, origin, delta)

    def release(self, op_id: str) -> ItemFields | None:
        """The op is published or withdrawn: visible (or compensated) from now on. Its item."""
        items = self.release_many([op_id])
        return items[0] if items else None

    def release_many(self, op_ids: Iterable[str]) -> list[ItemFields]:
        """``release`` of each op (published or withdrawn together); the items of those that
        were unpublished, in order. Their deltas are made visible in one store call."""
        out: list[ItemFields] = release_ids(self.pending, self._by_key, op_ids)
        self.shards.unhide_items(out)
        return out

    # -- staged copies (write quorum above 2) --------------------------------------------------

    def stage_items(self, items: Sequence[ItemFields]) -> None:
        """Another leader's new ops, merged hidden until published (``ShardStore.stage``)."""
        self.shards.stage_items(items)
        staged = self.staged
        for item in items:
            staged[item[ITEM_OP_ID]] = item
        if len(staged) > MAX_STAGED:
            self.sweep_staged()
            while len(staged) > MAX_STAGED:  # the oldest: its pair stays hidden regardless
                del staged[next(iter(staged))]

    def published_staged(self, items: Sequence[ItemFields]) -> Sequence[ItemFields]:
        """REPLICATE items to be merged visible: the staged copies of those ops from the same
        origin are published. The other items (their ids not learned from a staged copy)."""
        staged = self.staged
        fresh: list[ItemFields] = []
        for item in items:
            got = staged.pop(item[ITEM_OP_ID], None)
            if got is None:
                fresh.append(item)
            elif got[ITEM_ORIGIN] != item[ITEM_ORIGIN]:  # another leader's copy: still staged
                staged[item[ITEM_OP_ID]] = got
                fresh.append(item)
        return fresh

    def staged_open(self, op_id: str) -> ItemFields | None:
        """The item of this node's staged copy of ``op_id`` while no visible pair covers it
        (its leader has not published or withdrawn it, as far as this node knows); else None."""
        item = self.staged.get(op_id)
        if item is None:
            return None
        if self.shards.covers(item[ITEM_TABLE], item[ITEM_KEY], item[ITEM_ORIGIN],
                              item[ITEM_P], item[ITEM_N]):
            del self.staged[op_id]
            return None
        return item

    def sweep_staged(self) -> None:
        """Forget the staged copies a visible pair covers, and those older than twice their
        table's window (every retry of them is refused as expired; their pairs stay hidden)."""
        now, window = self.clock(), self.config.window
        for op_id, item in list(self.staged.items()):
            if (item[ITEM_TS] < now - 2 * max(window, self.window(item[ITEM_TABLE]))
                    or self.staged_open(op_id) is None):
                self.staged.pop(op_id, None)

    def set_pending(self, items: Sequence[ItemFields]) -> None:
        """Replace the unpublished ops (a snapshot or a log replay found them)."""
        self.pending, self._by_key = {}, {}
        self.shards.clear_hidden()
        for item in items:
            self.hold(Item.of(item))

    def keys_in_doubt(self) -> set[tuple[str, str]]:
        """The keys with an op this node applied and has not published or withdrawn yet."""
        return {(table, key) for table, key, _origin in self._by_key}

    def busy(self, table: str, key: str, origin: str) -> bool:
        """``origin`` has an unpublished op on the key: the next op's pair would carry it."""
        return (table, key, origin) in self._by_key

    def busy_among(self, ops: Sequence[Op], origin: str) -> list[int]:
        """The indices of the ops (``cluster.core.ops.Op``) whose key is ``busy`` for
        ``origin``, in order: ``busy`` for a batch."""
        by_key = self._by_key
        if not by_key:
            return []
        return [i for i, op in enumerate(ops) if (op[_OP_TABLE], op[_OP_KEY], origin) in by_key]

    def unpublished(self, table: str, key: str, origin: str) -> list[ItemFields]:
        """The key's unpublished ops of ``origin``, in the order they were applied."""
        pending = self.pending
        return [pending[op_id] for op_id in self._by_key.get((table, key, origin), ())]

    def unpublished_keys(self) -> list[tuple[str, str, str]]:
        return list(self._by_key)

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

    def seen_or_add_ops(self, ops: Sequence[Op]) -> list[bool]:
        """Dedup check-and-insert of a batch of ops (each ``op_id`` in its ``table``'s dedup);
        True marks a duplicate. One vectorised filter call per table where the strategy has one.
        """
        return self._seen_or_add(ops, _OP_TABLE, _OP_ID)

    def seen_or_add_items(self, items: Sequence[ItemFields]) -> list[bool]:
        """``seen_or_add_ops`` for a batch of REPLICATE items (a replica learning the ids)."""
        return self._seen_or_add(items, ITEM_TABLE, ITEM_OP_ID)

    def _seen_or_add(self, items: Sequence[Sequence[Any]], table_at: int,
                     id_at: int) -> list[bool]:
        """Both shapes: ``item[id_at]`` in table ``item[table_at]``."""
        if len(items) == 1:
            item = items[0]
            return [self.dedup(item[table_at]).seen_or_add(item[id_at].encode())]
        if not items:
            return []
        ids, table = encoded_ids(items, table_at, id_at)
        if table is not None:  # one table, one call
            return _many(self.dedup(table), ids)
        out = [False] * len(items)
        by_table: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_table.setdefault(item[table_at], []).append(i)
        for table, idx in by_table.items():
            flags = _many(self.dedup(table), [ids[i] for i in idx])
            for i, flag in zip(idx, flags, strict=True):
                out[i] = flag
        return out

    def add_pulled(self, table: str, dedup: Any) -> None:
        """A replica's dedup of ``table``: its ids make ops suspect for the window."""
        self.pulled.setdefault(table, []).append(dedup)
        self.pulled_until = max(self.pulled_until,
                                self.clock() + max(float(dedup.window), self.config.window))

    def suspected(self, table: str, op_id: str) -> bool:
        """A replica held ``op_id`` when this node started: check it before applying."""
        pulled = self.pulled.get(table)
        if not pulled:
            return False
        if self.clock() > self.pulled_until:
            self.pulled.clear()  # every retry of what they held is expired by now
            return False
        raw = op_id.encode()
        return any(raw in d for d in pulled)

    def window(self, table: str) -> float:
        """Seconds within which a retry on ``table`` is recognised (the node's op_expired limit)."""
        d = self.dedups.get(table)
        return float(d.window) if d is not None else self.config.window

    def replay(self, op_id: str, table: str, key: str, origin: str, p: int, n: int,
               ts: float, delta: int = 0, *, staged: bool = False) -> None:
        """Re-apply one logged record: merge the pair (``staged``: hidden, a STAGED record),
        remember the id while its window lasts."""
        if staged:
            self.stage_items([Item(op_id, table, key, origin, p, n, delta, ts)])
        else:
            self.shards.merge_pair(table, key, origin, p, n)
        if table in self.ttl_tables and op_id and is_real(origin):
            self.shards.merge_pair(table, key, LAST, int(ts * 1000), 0)
        if op_id:
            d = self.dedup(table)
            if self.clock() - ts <= max(d.window, self.config.window):
                d.seen_or_add(op_id.encode())

    def make_blob(self) -> bytes:
        """Snapshot of everything, made at once (the simulator's log; tests)."""
        return self.snapshot_cut().finish_now()

    def snapshot_cut(self) -> SnapshotCut:
        """A snapshot begun now, at the log's rotation instant (``DurableLog.write_snapshot``):
        the unpublished ops, the withdrawn ids and the dedup state are copied now; the shards
        are encoded later, in steps, by ``SnapshotCut.finish``."""
        return SnapshotCut(self)

    def load_blob(self, blob: bytes) -> None:
        data = msgpack.unpackb(blob, strict_map_key=True)
        version = data.get("version")
        if type(version) is int and version > SNAPSHOT_VERSION:  # a later release wrote it
            from cluster.core.versions import newer

            raise newer("snapshot contents", version, SNAPSHOT_VERSION)
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('version')} is not {SNAPSHOT_VERSION}")
        self.shards = ShardStore.from_bytes(data["shards"], self.shards.own)
        load = _dedup_module().load_dedup
        self.dedups = {table: load(raw, clock=self.clock) for table, raw in data["dedup"].items()}
        self.set_pending(list(data.get("in_doubt", [])))
        self.withdrawn = dict(data.get("withdrawn", {}))
        self.staged = {item[ITEM_OP_ID]: list(item) for item in data.get("staged", [])}
        self.foreign_since = data.get("foreign_since")

    def dedup_bytes(self) -> int:
        return sum(int(d.nbytes()) for d in self.dedups.values())


class SnapshotCut:
    """One snapshot of a node's state, cut at the log's rotation instant and finished in steps.

    What may shrink or change shape is copied at the cut: the unpublished ops (the snapshot's
    ``in_doubt``: their APPLY records go with the covered segments), the withdrawn ids, and each
    table's dedup (one consistent copy: a filter's generations shift as it refreshes). The
    shards are encoded afterwards, ``CHUNK_PAGES`` pages a loop turn, so a million counters
    never stall the loop: they may then hold pairs raised after the cut. That is safe because
    pairs only grow and max-merge, replay raises them to the same values, and the log writes
    the snapshot only once every record appended before ``finish`` returned is durable
    (``DurableLog.barrier``): a snapshot never holds a pair the log could lose.
    """

    CHUNK_PAGES = 128  # pages of 16 leaves: the keys of 2,048 leaves a turn

    def __init__(self, state: NodeState) -> None:
        now = state.clock()
        self._head: dict[str, Any] = {
            "version": SNAPSHOT_VERSION,
            "node": state.config.node_id,
            "in_doubt": [tuple(item) for item in state.pending.values()],
            "withdrawn": {k: t for k, t in state.withdrawn.items()
                          if t > now - 2 * state.config.window},
            "foreign_since": state.foreign_since,
        }
        if state.staged:  # staged copies' ids (their hidden pairs are in the shards' tail)
            self._head["staged"] = [tuple(item) for item in state.staged.values()]
        # one consistent copy of each dedup, as the parts of its ``to_bytes`` (a 16 MB filter's
        # words copied once, not packed and re-packed on the loop)
        self._dedup = {table: _dedup_parts(d) for table, d in state.dedups.items()}
        self._chunks = state.shards.dump_chunks(self.CHUNK_PAGES)

    def _parts(self, chunks: list[bytes]) -> list[bytes | memoryview]:
        """The blob, ``msgpack`` of the snapshot's map with the shards (``ShardStore.to_bytes``:
        a map holding the list of chunks) as bytes, in parts that join into exactly that,
        without copying the chunks: a whole-blob copy would hold the GIL for ~100 ms at 1M
        counters. bin 32 headers throughout (any msgpack reader takes them)."""
        pack = msgpack.Packer().pack
        inner: list[bytes | memoryview] = [b"\x81", pack("chunks"), _array_header(len(chunks))]
        for chunk in chunks:
            inner += (_bin_header(len(chunk)), chunk)
        head = self._head
        out: list[bytes | memoryview] = [_map_header(len(head) + 2)]
        for k, v in head.items():
            out += (pack(k), pack(v))
        out += (pack("shards"), _bin_header(sum(map(len, inner))), *inner)
        out += (pack("dedup"), _map_header(len(self._dedup)))
        for table, parts in self._dedup.items():
            out += (pack(table), _bin_header(sum(map(len, parts))), *parts)
        return out

    def finish_now(self) -> bytes:
        return b"".join(self._parts(list(self._chunks)))

    async def finish(self) -> list[bytes | memoryview]:
        chunks: list[bytes] = []
        for chunk in self._chunks:
            chunks.append(chunk)
            await asyncio.sleep(0)  # let the loop run between chunks
        return self._parts(chunks)


def _dedup_parts(d: Any) -> list[bytes | memoryview]:
    """``d.to_bytes()`` in parts: a strategy holding a large buffer (the FBF) gives a copy of
    it as is (``snapshot_parts``); the others are small enough to encode whole."""
    parts = getattr(d, "snapshot_parts", None)
    return list(parts()) if parts is not None else [d.to_bytes()]


def _bin_header(n: int) -> bytes:
    return b"\xc6" + n.to_bytes(4, "big")


def _array_header(n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big")


def _map_header(n: int) -> bytes:
    return b"\xdf" + n.to_bytes(4, "big")
