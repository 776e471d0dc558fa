"""Peer-protocol junk: unsigned, wrongly signed, stale, misaddressed, replayed, bit-flipped,
oversized, random, truncated and malformed frames. Forged traffic gets the connection closed
with no reply frame, and changes no counter."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from typing import Any

import msgpack

from client.hostile.context import Ctx, Target
from client.hostile.outcome import Outcome
from client.hostile.peer_client import (
    dial,
    expect_closed,
    forged_bodies,
    other_node,
    peer_exchange,
    signed_with,
    unsigned_frame,
)
from client.hostile.registry import junk
from cluster.transport.wire import HEADER, MAGIC, MAX_HELLO_BYTES, PROTOCOL_VERSION, Kind


@junk("peer_unsigned_frames", "peer", reasons=("unsigned",))
async def peer_unsigned_frames(ctx: Ctx, t: Target) -> Outcome:
    """MAGIC, then unsigned REPLICATE/REPAIR/FORWARD/HELLO frames setting counters huge."""
    out = Outcome()
    frames = [(name, unsigned_frame(kind, 1, body)) for name, kind, body in forged_bodies(
        ctx, "peer_unsigned_frames", t)]
    frames.append(("HELLO", unsigned_frame(Kind.HELLO, 0, {"node": other_node(ctx, t),
                                                           "to": t.node_id,
                                                           "version": PROTOCOL_VERSION})))
    for name, frame in frames:
        ans = await peer_exchange(ctx, t, MAGIC + frame)
        out.requests += 1
        expect_closed(out, f"unsigned {name}", ans)
    return out


@junk("peer_wrong_secret", "peer", reasons=("bad_mac",))
async def peer_wrong_secret(ctx: Ctx, t: Target) -> Outcome:
    """A well-formed HELLO signed with a wrong secret, followed by forged REPLICATE/REPAIR."""
    out = Outcome()
    wrong = secrets.token_bytes(32)
    for name, kind, body in forged_bodies(ctx, "peer_wrong_secret", t):
        d = dial(ctx, t.node_id, secret=wrong, dialer=other_node(ctx, t))
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(kind, 1, body))
        out.requests += 1
        expect_closed(out, f"wrong secret + {name}", ans)
    return out


@junk("peer_stale_hello", "peer", needs_secret=True, reasons=("stale_hello",))
async def peer_stale_hello(ctx: Ctx, t: Target) -> Outcome:
    """Real-secret HELLOs whose ts_ms is far in the past or the future (outside the skew)."""
    out = Outcome()
    skew_ms = int(ctx.limits.peer_auth_skew * 1000)
    now = int(time.time() * 1000)
    for case, ts in (("past", now - skew_ms - 60_000), ("future", now + skew_ms + 60_000),
                     ("zero", 0)):
        d = dial(ctx, t.node_id, ts_ms=ts)
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, f"HELLO ts_ms {case}", ans)
    return out


@junk("peer_wrong_node", "peer", needs_secret=True, reasons=("wrong_node",))
async def peer_wrong_node(ctx: Ctx, t: Target) -> Outcome:
    """A real-secret HELLO addressed to another node (recorded on its way there) sent here."""
    out = Outcome()
    for to in (other_node(ctx, t), "not-a-member"):
        d = dial(ctx, to)
        ans = await peer_exchange(ctx, t, MAGIC + d.hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, f"HELLO to {to}", ans)
    return out


@junk("peer_replayed_connection", "peer", needs_secret=True, reasons=("replayed_hello",))
async def peer_replayed_connection(ctx: Ctx, t: Target) -> Outcome:
    """A legitimate connection (signed HELLO + READ + PING) is answered; the same bytes sent
    again on a new connection are refused (replayed_hello) without a reply."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    recorded = MAGIC + d.hello + d.frame(Kind.READ, 1, [[ctx.table, ctx.junk_key(
        "peer_replayed_connection")]]) + d.frame(Kind.PING, 2, [{}])
    ans = await peer_exchange(ctx, t, recorded, until_frames=2, verifier=d.verifier)
    out.requests += 1
    replies = ans.frames
    out.seen[f"legit: {len(replies)} replies"] += 1
    if ans.bad_reply:
        out.fail("reply", "legitimate connection", f"reply does not verify: {ans.bad_reply}")
    if sorted(r[1] for r in replies) != [1, 2] or any(r[0] != Kind.REPLY for r in replies):
        out.fail("status", "legitimate connection", f"expected REPLY to 1 and 2, got {replies!r}"
                 f" ({ans.label})")
    for i in range(2):
        ans = await peer_exchange(ctx, t, recorded)
        out.requests += 1
        expect_closed(out, f"replay {i + 1}", ans)
    return out


@junk("peer_replayed_frame", "peer", needs_secret=True, reasons=("replay",))
async def peer_replayed_frame(ctx: Ctx, t: Target) -> Outcome:
    """Inside a legitimate connection, the same signed PING twice and an older seq after a
    newer one: only the fresh frames are answered, the replays dropped."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    p1 = d.frame(Kind.PING, 1, [{}])
    p2 = d.frame(Kind.PING, 2, [{}])
    p3 = d.frame(Kind.PING, 3, [{}])
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + p1 + p1 + p3 + p2 + p1,
                              read_timeout=5.0, until_frames=2, linger=0.5, verifier=d.verifier)
    out.requests += 1
    ids = sorted(r[1] for r in ans.frames)
    if ans.bad_reply:
        out.fail("reply", "PING 1, 1, 3, 2, 1", f"reply does not verify: {ans.bad_reply}")
    out.seen[f"replies to {ids}"] += 1
    if ids != [1, 3]:
        out.fail("reply", "PING 1, 1, 3, 2, 1", f"expected replies to [1, 3] only, got {ids}")
    return out


def _flip(data: bytes, bit: int) -> bytes:
    b = bytearray(data)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


@junk("peer_bit_flips", "peer", needs_secret=True, reasons=("bad_mac",))
async def peer_bit_flips(ctx: Ctx, t: Target) -> Outcome:
    """Real-secret frames with one bit flipped: in the HELLO's payload or MAC, in a REPLICATE's
    payload, seq or MAC after a good HELLO. Closed, nothing applied, no reply."""
    out = Outcome()
    rng = ctx.rng
    forged = forged_bodies(ctx, "peer_bit_flips", t)[0]
    for case in ("HELLO payload", "HELLO mac", "REPLICATE payload", "REPLICATE seq",
                 "REPLICATE mac"):
        d = dial(ctx, t.node_id)
        frame = d.frame(forged[1], 1, forged[2])
        hsize = HEADER.size
        if case.startswith("HELLO"):
            payload_bits = (len(d.hello) - 40 - hsize) * 8
            bit = ((hsize * 8 + rng.randrange(payload_bits)) if case.endswith("payload")
                   else (len(d.hello) - 32) * 8 + rng.randrange(256))
            data = MAGIC + _flip(d.hello, bit) + frame
        else:
            n = len(frame)
            if case.endswith("payload"):
                bit = hsize * 8 + rng.randrange((n - 40 - hsize) * 8)
            elif case.endswith("seq"):
                bit = (n - 40) * 8 + rng.randrange(64)
            else:
                bit = (n - 32) * 8 + rng.randrange(256)
            data = MAGIC + d.hello + _flip(frame, bit)
        ans = await peer_exchange(ctx, t, data)
        out.requests += 1
        expect_closed(out, f"flip in {case}", ans)
    return out


@junk("peer_oversized_header", "peer", reasons=("bad_frame",))
async def peer_oversized_header(ctx: Ctx, t: Target) -> Outcome:
    """Frame headers announcing more than MAX_HELLO_BYTES (up to 4 GiB) before any HELLO."""
    out = Outcome()
    for length in (MAX_HELLO_BYTES + 1, 1 << 20, (1 << 32) - 1):
        for flags in (1, 0):
            ans = await peer_exchange(ctx, t, MAGIC + HEADER.pack(length, flags) + b"\x93")
            out.requests += 1
            expect_closed(out, f"length {length} flags {flags}", ans)
    return out


@junk("peer_random_bytes", "peer", reasons=("bad_frame",))
async def peer_random_bytes(ctx: Ctx, t: Target) -> Outcome:
    """MAGIC followed by random bytes (first frame header with odd flags, or random payload)."""
    out = Outcome()
    for i in range(4):
        rnd = bytes(ctx.rng.getrandbits(8) for _ in range(256))
        if i == 0:  # a plausible header with unknown flags
            rnd = HEADER.pack(200, 0x80 | ctx.rng.getrandbits(6)) + rnd
        ans = await peer_exchange(ctx, t, MAGIC + rnd)
        out.requests += 1
        if ans.end == "open" and not ans.data:
            # a random length under the cap may wait for more bytes: close is not owed yet
            out.seen["waiting for more bytes"] += 1
        else:
            expect_closed(out, f"random {i}", ans)
    return out


@junk("peer_bad_hello", "peer", reasons=("bad_hello",))
async def peer_bad_hello(ctx: Ctx, t: Target) -> Outcome:
    """First frames that are not a valid HELLO: another kind signed, a body that is not a map,
    no nonce, a short nonce, no ts_ms, and (with the secret) a HELLO whose seq is not 0."""
    out = Outcome()
    key = secrets.token_bytes(32)
    other = other_node(ctx, t)
    now = int(time.time() * 1000)
    bodies: list[tuple[str, int, Any]] = [
        ("REPLICATE first", Kind.REPLICATE, forged_bodies(ctx, "peer_bad_hello", t)[0][2]),
        ("PING first", Kind.PING, [{}]),
        ("body a list", Kind.HELLO, [other, t.node_id]),
        ("no nonce", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now}),
        ("short nonce", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now,
                                      "nonce": b"x"}),
        ("nonce a str", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now,
                                      "nonce": "0" * 16}),
        ("ts_ms a float", Kind.HELLO, {"node": other, "to": t.node_id, "ts_ms": now + 0.5,
                                        "nonce": b"0" * 16}),
        ("node an int", Kind.HELLO, {"node": 1, "to": t.node_id, "ts_ms": now,
                                      "nonce": b"0" * 16}),
    ]
    for case, kind, body in bodies:
        ans = await peer_exchange(ctx, t, MAGIC + signed_with(key, kind, 0, body))
        out.requests += 1
        expect_closed(out, case, ans)
    if ctx.secret is not None:
        d = dial(ctx, t.node_id)  # its HELLO used seq 0: signed again, it goes out as seq 1
        body = msgpack.unpackb(d.hello[HEADER.size:-40], raw=False)[2]
        hello = d.frame(Kind.HELLO, 0, body)
        ans = await peer_exchange(ctx, t, MAGIC + hello + d.frame(Kind.PING, 1, [{}]))
        out.requests += 1
        expect_closed(out, "HELLO with seq 1", ans)
    return out


@junk("peer_truncated", "peer", closes=True)
async def peer_truncated(ctx: Ctx, t: Target) -> Outcome:
    """Frames cut short and the connection closed: half a HELLO, or (with the secret) a good
    HELLO then half of a REPLICATE that would set a junk key. Nothing applied."""
    out = Outcome()
    d = dial(ctx, t.node_id) if ctx.secret is not None else dial(
        ctx, t.node_id, secret=secrets.token_bytes(32))
    forged = forged_bodies(ctx, "peer_truncated", t)[0]
    frame = d.frame(forged[1], 1, forged[2])
    cuts = [("half a HELLO", MAGIC + d.hello[:len(d.hello) // 2]),
            ("HELLO header only", MAGIC + d.hello[:HEADER.size]),
            ("HELLO without its MAC", MAGIC + d.hello[:-32]),
            ("HELLO + half a REPLICATE", MAGIC + d.hello + frame[:len(frame) // 2]),
            ("HELLO + REPLICATE without MAC", MAGIC + d.hello + frame[:-32])]
    for case, data in cuts:
        ans = await peer_exchange(ctx, t, [data, 0.05], read_timeout=0.3)
        out.requests += 1
        out.seen["closed by us" if ans.end == "open" else ans.label] += 1
        if ans.data and not case.startswith("HELLO +"):
            out.fail("reply", case, f"{len(ans.data)} bytes came back")
    return out


@junk("peer_unsigned_after_hello", "peer", needs_secret=True, reasons=("unsigned", "bad_mac"))
async def peer_unsigned_after_hello(ctx: Ctx, t: Target) -> Outcome:
    """A legitimate HELLO, then a REPLICATE unsigned, or signed with another connection's key:
    closed without a reply, nothing applied."""
    out = Outcome()
    name, kind, body = forged_bodies(ctx, "peer_unsigned_after_hello", t)[0]
    d = dial(ctx, t.node_id)
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + unsigned_frame(kind, 1, body))
    out.requests += 1
    expect_closed(out, f"unsigned {name} after HELLO", ans)
    d, other = dial(ctx, t.node_id), dial(ctx, t.node_id)
    ans = await peer_exchange(ctx, t, MAGIC + d.hello + other.frame(kind, 1, body))
    out.requests += 1
    expect_closed(out, f"{name} signed for another connection", ans)
    return out


@junk("peer_signed_malformed", "peer", needs_secret=True, closes=True)
async def peer_signed_malformed(ctx: Ctx, t: Target) -> Outcome:
    """A secret holder's malformed requests (unknown kind, bodies of the wrong shape): each is
    answered with an ERROR frame (or the connection closed), and the node stays up."""
    out = Outcome()
    d = dial(ctx, t.node_id)
    frames = [(77, []), (Kind.PING, None), (Kind.READ, "x"), (Kind.READ, [[1, 2, 3]]),
              (Kind.READ, [[ctx.table, "k" * 200]]), (Kind.HOLDS, [None])]
    data = MAGIC + d.hello + b"".join(d.frame(k, i + 1, b) for i, (k, b) in enumerate(frames))
    ans = await peer_exchange(ctx, t, data, read_timeout=2.0, until_frames=len(frames),
                              verifier=d.verifier)
    out.requests += 1
    kinds = Counter("ERROR" if r[0] == Kind.ERROR else "REPLY" if r[0] == Kind.REPLY else "?"
                    for r in ans.frames)
    for k, n in kinds.items():
        out.seen[k] += n
    if len(ans.frames) < len(frames):
        out.seen[f"then {ans.end}"] += 1
    if kinds.get("?") or ans.bad_reply:
        out.fail("reply", "malformed requests", f"odd replies: {ans.frames!r:.200} "
                 f"{ans.bad_reply}")
    return out
