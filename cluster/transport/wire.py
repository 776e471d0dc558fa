"""Peer wire format: length-prefixed msgpack frames, each carrying a whole batch of ops.

A peer connection opens with ``MAGIC`` (an HTTP request never starts with a NUL byte, which is
how one listening port serves both HTTP clients and peers), then frames flow both ways:

    frame   = length:uint32 BE | flags:uint8 | payload (msgpack [kind, req_id, body[, form]])
              [| seq:uint64 BE | mac:32 bytes]        (when flags bit 0 is set)
    flags   = 0: unsigned (a cluster without a secret); 1: signed, see ``cluster.transport.auth``
    form    = the protocol version the body is written in (``cluster.core.versions``); absent
              for form 1, which is all that release 0.4.0 reads. A node sends the cluster's
              finalized version; a frame of a form newer than the receiver speaks is answered
              with an ERROR naming both versions, never read as something else. The HELLO is
              always form 1 and carries the dialer's range, ``speaks``: a listener whose range
              does not overlap it closes the connection (reason ``version``).

On a cluster with a secret every frame is signed and the first one each way opens the
connection (a signed HELLO); until the HELLO checks out, a frame may be at most
``MAX_HELLO_BYTES``, so an unauthenticated connection cannot make a node buffer much.

Requests carry a list of items in ``body``; the answer to ``req_id`` is a ``REPLY`` whose body
is a list aligned with the request's items (or one value for all of them), or an ``ERROR``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgpack

from cluster.core.errors import PeerError
from cluster.core.versions import PROTOCOL_MAX, PROTOCOL_MIN, common, newer, speaks
from cluster.transport.auth import FLAG_SIGNED, TRAILER_BYTES, AuthError, Signer, Verifier

MAGIC = b"\x00IDC1\n"
PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IB")
MAX_FRAME_BYTES = 256 << 20
MAX_HELLO_BYTES = 4096


class Kind(IntEnum):
    # HELLO body: {"node": id, "to": id, "version": 1, "speaks": [lo, hi][, "nonce": bytes,
    # "ts_ms": int]} ("speaks" absent: release 0.4.0, protocol 1 only)
    HELLO = 0
    FORWARD = 1  # body: [[table, key, op_id, delta, attempt, sent_ms], ...] -> [status, ...]
    REPLICATE = 2  # body: [[op_id, table, key, origin, p, n, delta, ts], ...] -> None once durable
    READ = 3  # body: [[table, key], ...] -> [{origin: [p, n]}, ...]
    REPAIR = 4  # body: [[table, key, {origin: [p, n]}], ...] -> None once durable
    PING = 5  # body: {"ready", "t": wall s, "ring": version} -> {"ready", "t", "ring",
    #          "clock_skew": refusing} (heartbeat,
    #          cluster/roles/failure.py; "t" measures clock offsets, cluster/core/clock.py)
    # HOLDS body: [[table, key, op_id, mode?, born?], ...] -> [[held, checked, {origin: [p, n]}],
    # ...] (cluster/roles/checks.py: mode QUERY/CLAIM/RELEASE, born the op's first send)
    HOLDS = 6
    # DIGEST body: {} -> {"digests": {table: [64 ints]}} (or {"busy": true}); or {"level": i,
    # "under": {table: [id, ...]}} -> {"sums": {table: [[child id, sum], ...]}} (the digest
    # tree, core/digests.py; below the leaves, i = len(LEVELS): [[key, hash], ...])
    DIGEST = 7
    # ENTRIES body: {"want": {table: [bucket, ...]}, "leaves": {table: [leaf, ...]},
    # "keys": {table: [key, ...]}} -> [[table, key, entry], ...]
    ENTRIES = 8
    DEDUP = 9  # body: [table, ...] -> {table: dedup.to_bytes()}
    # RING body: [{"op": "get"|"install"|"change"|"sync", ...}, ...] -> one answer each
    # (elastic membership, cluster/roles/membership.py)
    RING = 10
    # DELETE body: FORWARD's items (delta 0) -> [status, ...] (cluster/roles/deletes.py)
    DELETE = 11
    # SCAN body: [{"table", "prefix", "after": [leaf, key] | None, "limit"}] -> [{"keys":
    # [[key, {origin: [p, n]}], ...] in (leaf, key) order, "more": bool}]; or [{"tables": true}]
    # -> [[table, ...]] (cluster/roles/scans.py)
    SCAN = 12
    # STAGE body: REPLICATE's items -> None once durable, False if some were refused: a copy
    # of a leader's new op kept hidden until a visible pair covers it (write quorum above 2:
    # cluster/roles/leader.py, then a REPLICATE of the same items publishes it). A node that
    # does not know the kind answers an ERROR ("unknown peer frame kind"): no copy counted
    STAGE = 13
    REPLY = 100
    ERROR = 101


class Status(IntEnum):
    """Per-op outcome of a FORWARD, as the leader saw it."""

    APPLIED = 0
    DUPLICATE = 1
    UNAVAILABLE = 2
    EXPIRED = 3
    ERROR = 4
    OVERFLOW = 5  # the op would raise its key's entry here past 2^64 - 1: refused, not applied


_pack = msgpack.Packer(use_bin_type=True).pack
SPEAKS = (PROTOCOL_MIN, PROTOCOL_MAX)
# Test only: every frame but the HELLO goes out at this form whatever the cluster finalized (a
# planted incompatible frame change, which the upgrade check must catch: client.chaos.upgrade)
_FORCED_FORM = int(os.environ.get("IDC_TEST_FRAME_FORM", "0") or 0)


def encode_frame(kind: int, req_id: int, body: Any, signer: Signer | None = None,
                 form: int = 1) -> bytes:
    if _FORCED_FORM and kind != Kind.HELLO:
        form = _FORCED_FORM
    payload = _pack([kind, req_id, body] if form == 1 else [kind, req_id, body, form])
    if signer is None:
        return HEADER.pack(len(payload), 0) + payload
    signed = HEADER.pack(len(payload), FLAG_SIGNED) + payload
    return signed + signer.trailer(signed)


# (HELLO body, signed part, trailer) -> verifier
Accept = Callable[[Any, bytes | memoryview, bytes], Verifier]


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, get back the complete frames they finish.

    ``FrameDecoder()`` takes unsigned frames only. ``FrameDecoder(verifier=v)`` takes signed
    frames only and checks each with ``v``. ``FrameDecoder(accept=f)`` is a listener's decoder on
    an authenticated cluster: its first frame must be a signed HELLO, which ``f`` checks and
    answers with the verifier for the rest. Refused frames raise ``AuthError`` (the connection
    must close); a replayed frame is dropped and counted in ``dropped``.
    """

    __slots__ = ("_buf", "_verifier", "_accept", "dropped")

    def __init__(self, *, verifier: Verifier | None = None, accept: Accept | None = None) -> None:
        self._buf = bytearray()
        self._verifier = verifier
        self._accept = accept
        self.dropped = 0

    @property
    def awaiting_hello(self) -> bool:
        return self._accept is not None

    @property
    def signed(self) -> bool:
        return self._verifier is not None or self._accept is not None

    def feed(self, data: bytes) -> list[tuple[int, int, Any]]:
        buf = self._buf
        buf += data
        frames: list[tuple[int, int, Any]] = []
        pos = 0
        hsize = HEADER.size
        end = len(buf)
        signed = self.signed
        while end - pos >= hsize:
            length, flags = HEADER.unpack_from(buf, pos)
            if flags != (FLAG_SIGNED if signed else 0):
                del buf[:pos]
                raise _flags_error(flags, signed)
            limit = MAX_FRAME_BYTES if self._accept is None else MAX_HELLO_BYTES
            if length > limit:
                raise PeerError(f"bad frame header: length={length} (at most {limit})")
            start = pos + hsize
            stop = start + length
            if end - stop < (TRAILER_BYTES if signed else 0):
                break
            payload = buf[start:stop]
            if signed:
                trailer = bytes(buf[stop:stop + TRAILER_BYTES])
                # a view, not a copy, of what the MAC covers; released before buf is resized
                with memoryview(buf)[pos:stop] as head:
                    if self._accept is None:
                        assert self._verifier is not None
                        accepted = self._verifier.check(head, trailer)
                        frame = _decode(payload) if accepted else None
                    else:  # the connection's first frame: a HELLO that names its keys
                        frame = _decode(payload)
                        if frame[0] != Kind.HELLO:
                            raise AuthError("bad_hello",
                                            f"first frame is kind {frame[0]}, not HELLO")
                        self._verifier = self._accept(frame[2], head, trailer)
                        self._accept = None
                pos = stop + TRAILER_BYTES
                if frame is None:
                    self.dropped += 1
                else:
                    frames.append(frame)
            else:
                pos = stop
                frames.append(_decode(payload))
        if pos:
            del buf[:pos]
        return frames


class NewerForm:
    """The body of a frame written in a form this node does not speak: the frame is answered
    with an ERROR (a request) or fails its callers (a reply), never read."""

    __slots__ = ("error",)

    def __init__(self, kind: Any, form: int) -> None:
        self.error = newer(f"peer frame (kind {kind}) form", form)


def _decode(payload: bytearray) -> tuple[int, int, Any]:
    try:
        frame = msgpack.unpackb(payload, raw=False)
        if len(frame) == 3:
            kind, req_id, body = frame
            return kind, req_id, body
        kind, req_id, body, form = frame
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise PeerError(f"undecodable frame: {exc}") from exc
    if type(form) is not int or form < 1:
        raise PeerError(f"undecodable frame: form {form!r}")
    return kind, req_id, (body if form <= PROTOCOL_MAX else NewerForm(kind, form))


def check_hello(body: Any) -> tuple[int, int]:
    """The range a HELLO says its dialer speaks; ``PeerError`` (reason ``version``) when it
    shares no version with this node's."""
    try:
        theirs = speaks(body.get("speaks") if isinstance(body, dict) else None)
    except ValueError as exc:
        raise AuthError("bad_hello", str(exc)) from exc
    if common(theirs, SPEAKS) is None:
        raise AuthError("version", f"peer speaks protocol versions {theirs[0]} to {theirs[1]}, "
                                   f"this node {SPEAKS[0]} to {SPEAKS[1]}: no version in common")
    return theirs


def _flags_error(flags: int, signed: bool) -> PeerError:
    if flags == FLAG_SIGNED:
        return AuthError("unexpected_signature",
                         "peer signs its frames but this node has no cluster secret")
    if flags == 0 and signed:
        return AuthError("unsigned", "unsigned frame on a cluster with a secret")
    return PeerError(f"bad frame header: flags={flags}")
