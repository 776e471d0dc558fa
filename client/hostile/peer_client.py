"""A raw peer-protocol client: connections that send forged, replayed or broken frames (signed
with the real secret, another one, or none) and watch what the node sends back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from client.hostile.context import Ctx, Part, Target, open_stream
from client.hostile.outcome import Outcome
from cluster.transport.auth import PeerAuth, Signer, Verifier
from cluster.transport.wire import PROTOCOL_VERSION, FrameDecoder, Kind
from cluster.transport.wire import encode_frame as _encode_frame


@dataclass
class PeerAnswer:
    data: bytes = b""
    end: str = "closed"  # closed, open, reset, connect
    elapsed: float = 0.0
    frames: list[tuple[int, int, Any]] = field(default_factory=list)  # decoded with verifier
    bad_reply: str = ""  # a reply that did not decode or verify

    @property
    def label(self) -> str:
        if self.end == "connect":
            return "connect failed"
        return f"{self.end}, {len(self.data)} bytes back" if self.data else self.end


@dataclass
class _Replies:
    """What a peer connection sent back so far, decoded with ``decoder`` when there is one."""

    decoder: FrameDecoder | None
    buf: bytearray = field(default_factory=bytearray)
    frames: list[tuple[int, int, Any]] = field(default_factory=list)
    bad: str = ""  # a reply that did not decode or verify (decoding stops there)

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        if self.decoder is not None and not self.bad:
            try:
                self.frames += self.decoder.feed(chunk)
            except Exception as exc:  # a reply that does not verify
                self.bad = f"{type(exc).__name__}: {exc}"


async def _write_parts(writer: asyncio.StreamWriter, parts: Sequence[Part]) -> None:
    for part in parts:
        if isinstance(part, bytes):
            writer.write(part)
            await writer.drain()
        else:
            await asyncio.sleep(float(part))


async def _read_replies(reader: asyncio.StreamReader, replies: _Replies, read_timeout: float,
                        until_frames: int, linger: float) -> str:
    """Read until the node closes ("closed"), or until ``until_frames`` frames are in and
    ``linger`` more seconds have passed ("open"); TimeoutError after ``read_timeout``."""
    lingering = False
    async with asyncio.timeout(read_timeout) as deadline:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return "closed"
            replies.feed(chunk)
            if until_frames and len(replies.frames) >= until_frames and not lingering:
                if linger <= 0:
                    return "open"
                lingering = True
                deadline.reschedule(asyncio.get_running_loop().time() + linger)


async def peer_exchange(ctx: Ctx, t: Target, parts: Sequence[Part] | bytes, *,
                        read_timeout: float = 3.0, until_frames: int = 0,
                        verifier: Verifier | None = None, linger: float = 0.0) -> PeerAnswer:
    """Send ``parts`` on a new connection; read until the node closes, ``read_timeout``, or
    (with ``until_frames``) that many frames decode with ``verifier`` and ``linger`` more
    seconds have passed (to see frames that should not come)."""
    ctx.count()
    if isinstance(parts, bytes):
        parts = [parts]
    started = time.monotonic()
    try:
        reader, writer = await open_stream(ctx, t)
    except (OSError, TimeoutError):
        return PeerAnswer(end="connect")
    replies = _Replies(FrameDecoder(verifier=verifier) if verifier is not None else None)
    try:
        await _write_parts(writer, parts)
        end = await _read_replies(reader, replies, read_timeout, until_frames, linger)
    except TimeoutError:
        end = "open"
    except (ConnectionError, OSError):
        end = "reset"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
    return PeerAnswer(bytes(replies.buf), end, time.monotonic() - started, replies.frames,
                      replies.bad)


def expect_closed(out: Outcome, case: str, ans: PeerAnswer) -> None:
    """Forged peer traffic: the node closes the connection and sends nothing back."""
    out.seen[ans.label] += 1
    if ans.end == "connect":
        out.fail("connect", case, "the node did not accept a connection")
    elif ans.data:
        out.fail("reply", case, f"{len(ans.data)} bytes came back: {ans.data[:40]!r}")
    elif ans.end == "open":
        out.fail("open", case, f"connection still open after {ans.elapsed:.1f}s")


@dataclass
class Dial:
    """A signed HELLO to ``to`` (with the real secret, or another one) and its keys."""

    hello: bytes
    signer: Signer
    verifier: Verifier

    def frame(self, kind: int, req_id: int, body: Any) -> bytes:
        return _encode_frame(kind, req_id, body, self.signer)


def dial(ctx: Ctx, to: str, *, secret: bytes | None = None, ts_ms: int | None = None,
         dialer: str = "hostile") -> Dial:
    key = secret if secret is not None else ctx.secret
    assert key is not None
    hello, signer, verifier = PeerAuth(dialer, key).dial(to)
    assert signer is not None and verifier is not None
    if ts_ms is not None:
        hello["ts_ms"] = ts_ms
    hello["version"] = PROTOCOL_VERSION
    return Dial(_encode_frame(Kind.HELLO, 0, hello, signer), signer, verifier)


def other_node(ctx: Ctx, t: Target) -> str:
    ids = sorted({x.node_id for x in ctx.targets} - {t.node_id})
    return ids[0] if ids else t.node_id + "-elsewhere"


def forged_bodies(ctx: Ctx, cls: str, t: Target) -> list[tuple[str, int, Any]]:
    """REPLICATE, REPAIR and FORWARD bodies that would set a junk key and a good key huge."""
    jk = ctx.junk_key(cls)
    gk = ctx.good_keys[0] if ctx.good_keys else jk
    huge = 10**15
    now = int(time.time() * 1000)
    return [
        ("REPLICATE", Kind.REPLICATE,
         [[ctx.op_id(cls), ctx.table, jk, t.node_id, huge, 0, huge, now],
          [ctx.op_id(cls), ctx.good_table, gk, t.node_id, huge, 0, huge, now]]),
        ("REPAIR", Kind.REPAIR,
         [[ctx.table, jk, {t.node_id: [huge, 0]}], [ctx.good_table, gk, {"forged": [huge, 0]}]]),
        ("FORWARD", Kind.FORWARD, [[ctx.table, jk, ctx.op_id(cls), huge, 1, now]]),
    ]


def unsigned_frame(kind: int, req_id: int, body: Any) -> bytes:
    return _encode_frame(kind, req_id, body)


def signed_with(key: bytes, kind: int, req_id: int, body: Any) -> bytes:
    return _encode_frame(kind, req_id, body, Signer(key))
