"""What the log stores: the record schema and its encoding into frames, and back.

Pure: no I/O. Two payload formats share one frame (see ``cluster.wal.frames``):

    v1  one record per frame, the payload a msgpack array of the nine ``LogRecord`` fields
        (measured: smaller and faster to encode than a struct layout)
    v2  columnar, many records per frame: the msgpack array
            [2, kind, op_id, table, key, delta, origin, p, n, ts]
        where each field is either an array (one value per record, all arrays of one length)
        or a scalar shared by every record of the frame. A v1 payload is an array of 9, so the
        length tells the versions apart. A frame is all-or-nothing on replay, like the append
        it came from.

Decoding checks every field's type, so bytes that merely pass the checksum (a foreign file,
or garbage that looks like a frame) never replay as records.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from enum import IntEnum
from itertools import repeat
from typing import Any, NamedTuple

import msgpack

from cluster.wal import frames as _frames
from cluster.wal.frames import MAX_RECORD_BYTES

__all__ = [
    "LogRecord",
    "NewerFormError",
    "RecordKind",
    "encode_columns",
    "encode_records",
    "make_record",
    "record_fields",
]

# Bound by assignment, not imported by name: CPython 3.11 compiles ``_FRAME.pack(...)`` on a
# name bound by an import as an attribute load (a bound method object per frame), on any other
# name as a method call, which is what the encoders were measured with.
_FRAME = _frames._FRAME
_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


class NewerFormError(ValueError):
    """A payload of a record form above the ones this code reads (``form``): written by a later
    release, not damage."""

    def __init__(self, form: int) -> None:
        super().__init__(f"log record form {form}, newer than forms 1 to {_COLUMNAR}")
        self.form = form


class RecordKind(IntEnum):
    APPLY = 1  # op applied here, this node is the origin
    REPLICA = 2  # entry merged from a peer
    PUBLISHED = 3  # op known to be replicated to a quorum
    WITHDRAW = 4
    DROP = 5  # the key left this node's store (handed off, or a tombstone collected)
    STAGED = 6  # a peer's copy merged hidden (write quorum above 2: ``ShardStore.stage``)


class LogRecord(NamedTuple):
    """One logged fact. A NamedTuple (building one costs about 0.4 us; the frozen dataclass it
    replaced cost about 3 us), but compared like the dataclass was: equal only to another
    ``LogRecord`` with equal fields, never to a plain tuple. Hash = hash of the field tuple."""

    kind: int
    op_id: str
    table: str
    key: str
    delta: int  # signed 64-bit
    origin: str  # node id whose entry this is
    p: int  # the origin's new P entry after this op (unsigned 64-bit)
    n: int  # the origin's new N entry (unsigned 64-bit)
    ts: float  # wall-clock seconds when applied

    def __eq__(self, other: object) -> bool:
        return type(other) is LogRecord and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not (type(other) is LogRecord and tuple.__eq__(self, other))

    def __hash__(self) -> int:
        return tuple.__hash__(self)


# The write path's record constructor. Once a faster stand-in for a slow frozen dataclass, now
# simply the class (a NamedTuple builds in about 0.4 us); it stays a name so callers need not
# change. Faster still is to build no records: ``DurableLog.append_columns_nowait``.
make_record: Callable[..., LogRecord] = LogRecord
_make_record = LogRecord._make


def record_fields(kind: int, op_id: Any, table: Any, key: Any, origin: Any, p: Any, n: Any,
                  delta: Any, ts: Any) -> tuple[Any, ...]:
    """The one conversion from a replication item to a log record: the record's nine fields in
    ``LogRecord`` order, from ``kind`` and the item's eight in its own order (``op_id, table,
    key, origin, p, n, delta, ts``: ``cluster.core.ops.Item``, or the list a peer sent).

    Each field is one value or a column, so one call serves both ways of logging:
    ``make_record(*record_fields(kind, *item))`` is one record, and
    ``log.append_columns_nowait(*record_fields(kind, *columns))`` a columnar frame, where a
    field may also be one value shared by every record of the frame."""
    return kind, op_id, table, key, delta, origin, p, n, ts


# ---------------------------------------------------------------- v1: a frame per record


def encode_records(records: Sequence[LogRecord], pack: Callable[[Any], bytes]) -> bytes:
    """Format v1: one frame per record, the payload a msgpack array of the nine fields.

    ValueError, with nothing encoded, for a delta/p/n outside the 64-bit range or a payload
    over ``MAX_RECORD_BYTES``. ``pack`` is a ``msgpack.Packer().pack``.
    """
    parts: list[bytes] = []
    # The frame header is packed inline (not via a helper) to keep a call off the per-record
    # path; ``_FRAME`` is still the one definition of its layout.
    frame, crc = _FRAME.pack, zlib.crc32
    for rec in records:
        # msgpack would silently store an out-of-range delta as unsigned, or a negative entry;
        # the on-disk format promises i64/u64, so refuse here rather than replay nonsense.
        if not (_I64_MIN <= rec.delta <= _I64_MAX and 0 <= rec.p <= _U64_MAX
                and 0 <= rec.n <= _U64_MAX):  # fmt: skip
            raise ValueError(f"record {rec.op_id!r}: delta/p/n out of the 64-bit range")
        payload = pack(tuple(rec))
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"record {rec.op_id!r}: {len(payload)} bytes > {MAX_RECORD_BYTES}")
        parts.append(frame(len(payload), crc(payload)))
        parts.append(payload)
    return b"".join(parts)


# ---------------------------------------------------------------- v2: columnar frames

_COLUMNAR = 2
_COLUMN_TYPES = (list, tuple)
_DELTA, _P, _N = 4, 6, 7
_SPLIT_AT = MAX_RECORD_BYTES * 3 // 4  # columns estimated past this are cut before encoding
_COLUMNAR_MIN = 3  # fewer records are written as v1 frames, cheaper to encode at that size


def _check_range(col: Any, lo: int, hi: int, name: str, op_ids: Sequence[str]) -> None:
    if isinstance(col, _COLUMN_TYPES):
        if lo <= min(col) and max(col) <= hi:
            return
        bad = next(i for i, v in enumerate(col) if not lo <= v <= hi)
        raise ValueError(f"record {op_ids[bad]!r}: delta/p/n out of the 64-bit range ({name})")
    if not lo <= col <= hi:
        raise ValueError(f"records {op_ids[0]!r}..: delta/p/n out of the 64-bit range ({name})")


def encode_columns(columns: Sequence[Any], pack: Callable[[Any], bytes]) -> bytes:
    """Format v2 frames for the nine columns (``op_id`` must be a list, others may be shared
    scalars). One msgpack call per frame; split in halves while a frame exceeds the limit.

    ValueError, with nothing encoded, for columns of the wrong count or lengths, or a value
    ``encode_records`` would refuse. Fewer than three records are written as v1 frames.
    """
    if len(columns) != 9:
        raise ValueError(f"9 columns expected, got {len(columns)}")
    op_ids = columns[1]
    if not isinstance(op_ids, _COLUMN_TYPES):
        raise ValueError("op_id must be a sequence, one per record")
    count = len(op_ids)
    is_col = []
    for col in columns:
        if isinstance(col, _COLUMN_TYPES):
            if len(col) != count:
                raise ValueError(f"a column has {len(col)} values for {count} records")
            is_col.append(True)
        else:
            is_col.append(False)
    if count < _COLUMNAR_MIN:  # v1 is cheaper for very few records (measured)
        return encode_records([_make_record([c[i] if col else c
                                             for c, col in zip(columns, is_col)])  # noqa: B905 - 9 and 9
                               for i in range(count)], pack)
    _check_range(columns[_DELTA], _I64_MIN, _I64_MAX, "delta", op_ids)
    _check_range(columns[_P], 0, _U64_MAX, "p", op_ids)
    _check_range(columns[_N], 0, _U64_MAX, "n", op_ids)
    return _pack_columns(columns, count, pack)


def _estimate(columns: Sequence[Any], count: int) -> int:
    """About the bytes of the columns' payload, from the first record's strings (names and op
    ids are ASCII at the edge, and a batch's are much alike) and 5 bytes a number, without
    encoding anything: O(columns). An estimate short of the truth costs an encoding in halves
    (``_pack_columns``), never a frame over the limit."""
    size = 0
    for col in columns:
        if isinstance(col, _COLUMN_TYPES):
            first = col[0] if col else 0
            size += (len(first) + 1 if type(first) is str else 5) * count
    return size


def _pack_columns(columns: Sequence[Any], count: int, pack: Callable[[Any], bytes],
                  parts: int = 0) -> bytes:
    """One frame for the columns, or ``parts`` frames of equal record counts: as many as the
    estimate needs (``_estimate``: cut before encoding, not encoded whole and again), then two
    more for a part that still came out over the limit."""
    if not parts:
        parts = -(-_estimate(columns, count) // _SPLIT_AT) if count > 1 else 1
    if parts > 1:
        step = -(-count // parts)
        return b"".join(
            _pack_columns([c[i:i + step] if isinstance(c, _COLUMN_TYPES) else c
                           for c in columns], min(step, count - i), pack, 1)
            for i in range(0, count, step))
    payload = pack([_COLUMNAR, *columns])
    if len(payload) <= MAX_RECORD_BYTES:
        return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
    if count == 1:
        raise ValueError(f"record {columns[1][0]!r}: {len(payload)} bytes > {MAX_RECORD_BYTES}")
    return _pack_columns(columns, count, pack, 2)


# ---------------------------------------------------------------- decoding (either format)

# The type each field must have after decoding (ts: an int is fine too, msgpack keeps 0.0).
_FIELD_TYPES = (int, str, str, str, int, str, int, int, float)
_TYPE_OK: tuple[frozenset[type], ...] = tuple(
    frozenset({t, int}) if t is float else frozenset({t}) for t in _FIELD_TYPES)


def _decode_payload(obj: Any) -> list[LogRecord]:
    """The records of one unpacked frame payload (either format); ValueError if it is none:
    wrong shape, or a field of the wrong type (a foreign file, or bytes that merely look like a
    frame), so nothing replays that was never written. ``obj`` comes from
    ``msgpack.unpackb(payload, use_list=False)``."""
    if type(obj) is not tuple:
        raise ValueError(f"not a log record payload ({type(obj).__name__})")
    if len(obj) == 9:
        for value, ok in zip(obj, _TYPE_OK, strict=True):
            if type(value) not in ok:
                raise ValueError(f"log record field of type {type(value).__name__}")
        return [LogRecord(*obj)]
    if len(obj) != 10 or obj[0] != _COLUMNAR:
        if obj and type(obj[0]) is int and obj[0] > _COLUMNAR:
            raise NewerFormError(obj[0])
        raise ValueError(f"not a log record payload (array of {len(obj)})")
    op_ids = obj[2]
    if type(op_ids) is not tuple:
        raise ValueError("columnar frame without an op_id array")
    count = len(op_ids)
    cols: list[Any] = []
    for col, ok in zip(obj[1:], _TYPE_OK, strict=True):
        if type(col) is tuple:
            if len(col) != count:
                raise ValueError("columnar frame with columns of different lengths")
            if not set(map(type, col)) <= ok:  # C speed: a set of the types present
                raise ValueError("columnar frame with a field of the wrong type")
            cols.append(col)
        else:
            if type(col) not in ok:
                raise ValueError(f"columnar frame field of type {type(col).__name__}")
            cols.append(repeat(col, count))
    return list(map(_make_record, zip(*cols, strict=True)))


def _decode(payload: bytes | memoryview) -> list[LogRecord]:
    """The records of one frame's payload; ValueError (or a msgpack error) if it holds none."""
    return _decode_payload(msgpack.unpackb(payload, use_list=False))
