"""Peer wire format: length-prefixed msgpack frames, each carrying a whole batch of ops.

A peer connection opens with ``MAGIC`` (an HTTP request never starts with a NUL byte, which is
how one listening port serves both HTTP clients and peers), then frames flow both ways:

    frame   = length:uint32 BE | flags:uint8 | payload (msgpack [kind, req_id, body]) [| mac]
    flags   = 0 today; bit 0 is reserved for an HMAC trailer over the payload (issue 7)

Requests carry a list of items in ``body``; the answer to ``req_id`` is a ``REPLY`` whose body
is a list aligned with the request's items (or one value for all of them), or an ``ERROR``.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

import msgpack

from cluster.errors import PeerError

MAGIC = b"\x00IDC1\n"
PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IB")
MAX_FRAME_BYTES = 256 << 20


class Kind(IntEnum):
    HELLO = 0  # body: {"node": id, "version": 1}
    FORWARD = 1  # body: [[table, key, op_id, delta, attempt, sent_ms], ...] -> [status, ...]
    REPLICATE = 2  # body: [[op_id, table, key, origin, p, n, delta, ts], ...] -> None once durable
    READ = 3  # body: [[table, key], ...] -> [{origin: [p, n]}, ...]
    REPAIR = 4  # body: [[table, key, {origin: [p, n]}], ...] -> None once durable
    PING = 5  # body: {"ready": bool} -> {"ready": bool} (heartbeat, cluster/failure.py)
    HOLDS = 6  # body: [[table, key, op_id], ...] -> [[held, {origin: [p, n]}], ...]
    DIGEST = 7  # body: {"buckets": n, "digests": {table: [int, ...]}} -> the same, ours
    ENTRIES = 8  # body: {"buckets": n, "want": {table: [bucket, ...]}} -> [[table, key, entry]]
    DEDUP = 9  # body: [table, ...] -> {table: dedup.to_bytes()}
    REPLY = 100
    ERROR = 101


class Status(IntEnum):
    """Per-op outcome of a FORWARD, as the leader saw it."""

    APPLIED = 0
    DUPLICATE = 1
    UNAVAILABLE = 2
    EXPIRED = 3
    ERROR = 4


_pack = msgpack.Packer(use_bin_type=True).pack


def encode_frame(kind: int, req_id: int, body: Any, flags: int = 0) -> bytes:
    payload = _pack([kind, req_id, body])
    return HEADER.pack(len(payload), flags) + payload


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, get back the complete frames they finish."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, Any]]:
        buf = self._buf
        buf += data
        frames: list[tuple[int, int, Any]] = []
        pos = 0
        hsize = HEADER.size
        end = len(buf)
        while end - pos >= hsize:
            length, flags = HEADER.unpack_from(buf, pos)
            if length > MAX_FRAME_BYTES or flags != 0:
                raise PeerError(f"bad frame header: length={length} flags={flags}")
            if end - pos - hsize < length:
                break
            start = pos + hsize
            try:
                kind, req_id, body = msgpack.unpackb(buf[start : start + length], raw=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                raise PeerError(f"undecodable frame: {exc}") from exc
            frames.append((kind, req_id, body))
            pos = start + length
        if pos:
            del buf[:pos]
        return frames
