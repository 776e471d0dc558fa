"""A node's snapshot, cut at one instant and finished in steps (``cluster.roles.state``): what
it must hold, and that the shards may move on between its chunks without harm."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from cluster.core.config import NodeConfig
from cluster.core.ops import Op
from cluster.core.shards import ShardStore
from cluster.roles.state import NodeState, SnapshotCut
from cluster.wal import DurableLog


def _state(tmp_path: Path) -> NodeState:
    cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path), listen=("127.0.0.1", 1),
                     peers=(("n1", "127.0.0.1", 1),))
    return NodeState(cfg, clock=lambda: 1000.0)


def _fill(state: NodeState, keys: int) -> None:
    for i in range(keys):
        state.shards.apply_local("t", f"k{i}", i + 1)
        state.shards.merge_pair("u", f"k{i}", "n2@1", i, 1)


async def test_a_cut_holds_what_was_there_at_the_cut_and_may_hold_later_pairs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(tmp_path)
    _fill(state, 3000)
    state.seen_or_add_ops([Op("t", "k1", "op-before", 1, 1)])
    state.hold(["op-pending", "t", "k1", "n1", 3, 0, 1, 999.0])  # unpublished at the cut
    state.withdrawn["op-gone"] = 999.0
    monkeypatch.setattr(SnapshotCut, "CHUNK_PAGES", 64)  # many chunks, with changes between
    cut = state.snapshot_cut()
    chunks = cut._chunks
    first = next(chunks)
    # after the cut: a pair raised, a new key, an op published, a new id in the dedup
    state.shards.apply_local("t", "k2999", 100)
    state.shards.apply_local("t", "after", 7)
    state.release("op-pending")
    state.seen_or_add_ops([Op("t", "k1", "op-after", 1, 1)])
    blob = b"".join(cut._parts([first, *chunks]))
    loaded = _state(tmp_path)
    loaded.load_blob(blob)
    for i in range(0, 3000, 97):  # every pair as it was at the cut, or as raised since
        assert loaded.shards.pair("u", f"k{i}", "n2@1") == (i, 1)
        assert loaded.shards.own_pair("t", f"k{i}")[0] >= i + 1
    assert loaded.shards.own_pair("t", "k2999")[0] in (3000, 3100)  # a page taken before or after
    assert set(loaded.pending) == {"op-pending"}  # the unpublished ops of the cut instant
    assert loaded.withdrawn == {"op-gone": 999.0}
    assert loaded.dedup("t").seen_or_add(b"op-before")  # the dedup as copied at the cut
    assert not loaded.dedup("t").seen_or_add(b"op-after")


def test_the_parts_join_into_the_snapshot_a_plain_pack_would_make(tmp_path: Path) -> None:
    """The hand-built msgpack (bin 32 headers around the chunks) reads back as the map."""
    state = _state(tmp_path)
    _fill(state, 500)
    data = msgpack.unpackb(state.make_blob(), strict_map_key=True)
    assert set(data) == {"version", "node", "dedup", "in_doubt", "withdrawn", "foreign_since",
                         "shards"}
    shards = ShardStore.from_bytes(data["shards"], "n1")
    assert shards == state.shards and shards.keys == 1000
    assert msgpack.unpackb(data["shards"]).keys() == {"chunks"}


async def test_a_node_snapshot_reloads_from_its_file(tmp_path: Path) -> None:
    state = _state(tmp_path)
    _fill(state, 2000)
    async with DurableLog(tmp_path / "log", fsync=False) as log:
        await log.write_snapshot(state.snapshot_cut)
    async with DurableLog(tmp_path / "log", fsync=False) as log:
        blob = log.load_snapshot()
    assert blob is not None
    loaded = _state(tmp_path)
    loaded.load_blob(blob)
    assert loaded.shards == state.shards
