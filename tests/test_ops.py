"""The op's named shapes (cluster.core.ops): the index constants match the classes, and the
shapes go on the wire and into the log exactly as the lists and tuples they name did."""

from __future__ import annotations

import msgpack

from cluster.core import ops
from cluster.core.ops import Item, Op
from cluster.wal import LogRecord, RecordKind, record_fields


def test_item_constants_name_the_fields() -> None:
    names = ("OP_ID", "TABLE", "KEY", "ORIGIN", "P", "N", "DELTA", "TS")
    assert Item._fields == tuple(n.lower() for n in names)
    assert [getattr(ops, f"ITEM_{n}") for n in names] == list(range(8))


def test_shapes_pack_like_the_lists_they_replace() -> None:
    item = Item("c:1", "t", "k", "n1@2", 5, 0, 5, 1.5)
    assert msgpack.packb(item) == msgpack.packb(list(item))
    assert msgpack.packb([[*Op("t", "k", "c:1", 5, 1), 7]]) == msgpack.packb(
        [["t", "k", "c:1", 5, 1, 7]])
    assert Item.of(msgpack.unpackb(msgpack.packb(item))) == item


def test_one_conversion_from_an_item_to_a_record() -> None:
    item = Item("c:1", "t", "k", "n1@2", 5, 1, -1, 1.5)
    rec = LogRecord(*record_fields(int(RecordKind.REPLICA), *item))
    assert rec == LogRecord(int(RecordKind.REPLICA), "c:1", "t", "k", -1, "n1@2", 5, 1, 1.5)
    cols = record_fields(1, ["a", "b"], ["t", "t"], ["k", "j"], "n1@2", [1, 2], [0, 0],
                         [1, 1], 2.0)
    assert cols == (1, ["a", "b"], ["t", "t"], ["k", "j"], [1, 1], "n1@2", [1, 2], [0, 0], 2.0)
