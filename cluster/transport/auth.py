"""Peer authentication: every peer frame is signed with HMAC-SHA256 under a per-connection key.

A client of the HTTP API can open the node's port and speak the peer protocol (``wire.MAGIC``);
one forged REPLICATE or REPAIR frame would set a counter to any value. With a cluster secret
(``--secret-file``) no frame is acted on unless it carries a MAC only a secret holder can make:

* The dialer picks a fresh 16-byte ``nonce`` and derives two keys from the secret, one per
  direction: ``k = HMAC(secret, "idc-peer-v1" | direction | nonce | dialer | listener)``.
* Its first frame is a HELLO ``{node, to, version, nonce, ts_ms}``, signed with the dialer's key.
  The listener reads the nonce from it, derives the same keys and checks the MAC: only a secret
  holder can sign it. It also checks that ``to`` is itself (a HELLO recorded on the way to
  another node is no use here), that ``ts_ms`` is within ``skew`` of its own clock and not
  before this process started, and that it has not seen the nonce within the last
  ``2 * skew`` (a recorded connection replayed whole is refused, before a restart or after).
  No extra round trip: the dialer sends its first requests right behind the HELLO.
* Every frame after that, both ways, carries ``seq:uint64 | mac:32`` after its payload, with
  ``mac = HMAC(k, header | payload | seq)`` and ``seq`` strictly increasing per direction. A frame
  whose seq is not above the last one accepted is a replay inside the connection: it is dropped.
  Gaps are allowed (a lossy network drops frames; callers time out and retry as they would).
* A bad MAC, an unsigned frame, or a HELLO that fails a check closes the connection.

Replies come back signed with the listener's key, which also depends on the dialer's nonce, so
a dialer knows it talks to a secret holder and old replies cannot be replayed at it. Each
rejection is counted by reason (``/metrics``: ``idc_peer_auth_rejected_total``) and logged at
most once per reason every few seconds (an attacker cannot flood the log).

Without a secret, frames are unsigned and the node logs a warning at start: that mode is for
tests and a single trusted host only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from cluster.core.errors import ConfigError, PeerError
from cluster.core.metrics import Refusals

log = logging.getLogger("cluster.auth")

NONCE_BYTES = 16
MIN_SECRET_BYTES = 16
MAC = struct.Struct(">Q32s")  # seq, HMAC-SHA256
TRAILER_BYTES = MAC.size
FLAG_SIGNED = 0x01
DEFAULT_SKEW = 30.0
_LABEL = b"idc-peer-v1\x00"
_DIAL, _LISTEN = b"d", b"l"

# Reasons a peer frame or connection was refused (the label values of the metric).
REASONS = ("unsigned", "bad_mac", "replay", "bad_hello", "stale_hello", "wrong_node",
           "replayed_hello", "unexpected_signature", "bad_frame", "hello_timeout", "version")


class AuthError(PeerError):
    """A peer frame that must not be acted on; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """The cluster secret: the file's bytes, surrounding whitespace stripped (so a base64 line
    written by ``head -c 32 /dev/urandom | base64`` works), at least 16 bytes."""
    p = Path(path)
    try:
        raw = p.read_bytes().strip()
        mode = p.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"secret_file: cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(f"secret_file: {path} holds {len(raw)} bytes; at least "
                          f"{MIN_SECRET_BYTES} are needed (e.g. head -c 32 /dev/urandom | base64)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("secret file %s is readable by group or others (chmod 600 it)", path)
    return raw


def write_secret(path: str | os.PathLike[str]) -> bytes:
    """Create a new random secret file, readable by its owner only (used by local clusters)."""
    value = secrets.token_urlsafe(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(value + b"\n")
    return value


def _key(secret: bytes, direction: bytes, nonce: bytes, dialer: str, listener: str) -> bytes:
    material = b"".join((_LABEL, direction, nonce, dialer.encode(), b"\x00", listener.encode()))
    return hmac.digest(secret, material, hashlib.sha256)


class _HmacSha256:
    """HMAC-SHA256 (RFC 2104) with the key's two padded states hashed once: each MAC copies
    them, where ``hmac.HMAC`` also builds a Python object per copy (measured: 3.7 against 5.7 us
    a small frame). Equal to ``hmac.digest(key, msg, "sha256")``; tests/test_peer_auth.py
    checks that."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def mac(self, *parts: bytes | bytearray | memoryview) -> bytes:
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class Signer:
    """Signs the frames of one direction of one connection."""

    __slots__ = ("_keyed", "_seq")

    def __init__(self, key: bytes) -> None:
        self._keyed = _HmacSha256(key)
        self._seq = 0

    def trailer(self, signed: bytes) -> bytes:
        """``seq | mac`` for ``signed`` (the frame's header and payload)."""
        seq_bytes = self._seq.to_bytes(8, "big")
        self._seq += 1
        return seq_bytes + self._keyed.mac(signed, seq_bytes)


class Verifier:
    """Checks the frames of one direction of one connection."""

    __slots__ = ("_keyed", "_next")

    def __init__(self, key: bytes) -> None:
        self._keyed = _HmacSha256(key)
        self._next = 0

    def check(self, signed: bytes | bytearray | memoryview,
              trailer: bytes | bytearray | memoryview) -> bool:
        """True to accept the frame, False to drop a replayed one; raises on a bad MAC."""
        seq, mac = MAC.unpack(trailer)
        if not hmac.compare_digest(mac, self._keyed.mac(signed, trailer[:8])):
            raise AuthError("bad_mac", "frame MAC does not verify")
        if seq < self._next:
            return False
        self._next = seq + 1
        return True


class PeerAuth:
    """A node's peer authentication: its secret, the HELLO nonces it has seen, its counters.

    ``secret=None`` turns authentication off (frames unsigned, and signed ones refused)."""

    def __init__(self, node_id: str, secret: bytes | None, *, skew: float = DEFAULT_SKEW,
                 clock: Any = time.time, max_nonces: int = 100_000) -> None:
        self.node_id = node_id
        self.secret = secret
        self.skew = skew
        self.clock = clock
        self.max_nonces = max_nonces
        self._nonces: OrderedDict[bytes, float] = OrderedDict()
        # The nonce memory dies with the process: a HELLO from before this process started
        # could be a recorded one that a previous incarnation already accepted.
        self.started = clock()
        # ``reject(reason, peer, detail)``: count a refused frame or connection, and log it
        self.reject = Refusals(log, "peer traffic refused", REASONS, source="peer")
        self.accepted = 0

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    # -- the dialing side ------------------------------------------------------------------

    def dial(self, peer_id: str) -> tuple[dict[str, Any], Signer | None, Verifier | None]:
        """The HELLO body for a new connection to ``peer_id``, with the connection's signer and
        verifier (both None without a secret)."""
        hello: dict[str, Any] = {"node": self.node_id, "to": peer_id}
        if self.secret is None:
            return hello, None, None
        nonce = secrets.token_bytes(NONCE_BYTES)
        hello["nonce"] = nonce
        hello["ts_ms"] = int(self.clock() * 1000)
        return (hello, Signer(_key(self.secret, _DIAL, nonce, self.node_id, peer_id)),
                Verifier(_key(self.secret, _LISTEN, nonce, self.node_id, peer_id)))

    # -- the listening side ----------------------------------------------------------------

    def accept(self, hello: Any, signed: bytes | memoryview,
               trailer: bytes) -> tuple[str, Signer, Verifier]:
        """Check a signed HELLO; the dialer's id, the reply signer and the request verifier."""
        assert self.secret is not None
        if not isinstance(hello, dict):
            raise AuthError("bad_hello", "HELLO body is not a map")
        dialer, to, nonce, ts_ms = (hello.get("node"), hello.get("to"), hello.get("nonce"),
                                    hello.get("ts_ms"))
        if (not isinstance(dialer, str) or not isinstance(to, str)
                or not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES
                or type(ts_ms) is not int):
            raise AuthError("bad_hello", "HELLO lacks node, to, nonce or ts_ms")
        verifier = Verifier(_key(self.secret, _DIAL, nonce, dialer, to))
        verifier.check(signed, trailer)  # raises unless a secret holder signed it
        if MAC.unpack(trailer)[0] != 0:
            raise AuthError("bad_hello", "HELLO must be the connection's first frame")
        if to != self.node_id:
            raise AuthError("wrong_node", f"HELLO addressed to {to!r}, this is {self.node_id!r}")
        now = self.clock()
        if abs(now - ts_ms / 1000.0) > self.skew:
            raise AuthError("stale_hello", f"HELLO clock {ts_ms} ms is more than {self.skew:g} s "
                                           "from ours")
        if ts_ms < int(self.started * 1000):
            raise AuthError("stale_hello", "HELLO made before this process started")
        self._remember(nonce, now)
        self.accepted += 1
        return dialer, Signer(_key(self.secret, _LISTEN, nonce, dialer, to)), verifier

    def _remember(self, nonce: bytes, now: float) -> None:
        nonces = self._nonces
        while nonces:  # oldest first: forget what is past the skew window twice over
            oldest, seen = next(iter(nonces.items()))
            if now - seen <= 2 * self.skew and len(nonces) < self.max_nonces:
                break
            del nonces[oldest]
        if nonce in nonces:
            raise AuthError("replayed_hello", "HELLO nonce already used")
        nonces[nonce] = now
