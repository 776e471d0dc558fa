"""Peer authentication (cluster.transport.auth): signed frames, HELLO checks, replays, the real
cluster."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.errors import ConfigError, PeerError
from cluster.local import LocalCluster
from cluster.transport.auth import AuthError, PeerAuth, load_secret, write_secret
from cluster.transport.wire import HEADER, MAGIC, MAX_HELLO_BYTES, FrameDecoder, Kind, encode_frame
from tests.cluster_util import Client, running_cluster, wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = b"s" * 32


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _pair(secret_a: bytes = SECRET, secret_b: bytes = SECRET, clock: Clock | None = None
          ) -> tuple[PeerAuth, PeerAuth]:
    clock = clock or Clock()
    return (PeerAuth("n1", secret_a, clock=clock), PeerAuth("n2", secret_b, clock=clock))


def _connection(dialer: PeerAuth, frames: list[tuple[int, int, Any]], to: str = "n2"
                ) -> tuple[bytes, Any, Any]:
    """The bytes a dialer sends after MAGIC: its HELLO then ``frames``; and its signer and
    verifier."""
    hello, signer, verifier = dialer.dial(to)
    data = encode_frame(Kind.HELLO, 0, {**hello, "version": 1}, signer)
    data += b"".join(encode_frame(k, r, b, signer) for k, r, b in frames)
    return data, signer, verifier


def _listener(auth: PeerAuth) -> tuple[FrameDecoder, dict[str, Any]]:
    state: dict[str, Any] = {}

    def accept(hello: Any, signed: bytes, trailer: bytes) -> Any:
        state["peer"], state["signer"], verifier = auth.accept(hello, signed, trailer)
        return verifier

    return FrameDecoder(accept=accept), state


FRAMES = [(Kind.REPLICATE, 1, [["op:1", "t", "k", "n1@1", 5, 0, 5, 0]]),
          (Kind.READ, 2, [["t", "k"]]), (Kind.PING, 3, [{"ready": True}])]


def test_signed_frames_round_trip_both_ways_byte_by_byte() -> None:
    a, b = _pair()
    data, _, dialer_verifier = _connection(a, FRAMES)
    dec, state = _listener(b)
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert got[0][0] == Kind.HELLO and got[1:] == FRAMES
    assert state["peer"] == "n1" and b.accepted == 1
    # the listener's replies are signed with its own key and check out at the dialer
    replies = b"".join(encode_frame(Kind.REPLY, r, None, state["signer"]) for _, r, _ in FRAMES)
    assert FrameDecoder(verifier=dialer_verifier).feed(replies) == [
        (Kind.REPLY, r, None) for _, r, _ in FRAMES]


def test_wrong_secret_cannot_open_a_connection() -> None:
    a, b = _pair(secret_b=b"t" * 32)
    data, _, _ = _connection(a, FRAMES)
    dec, _ = _listener(b)
    with pytest.raises(AuthError) as err:
        dec.feed(data)
    assert err.value.reason == "bad_mac"


def test_a_recorded_connection_replayed_whole_is_refused() -> None:
    a, b = _pair()
    data, _, _ = _connection(a, FRAMES)
    assert len(_listener(b)[0].feed(data)) == 1 + len(FRAMES)
    with pytest.raises(AuthError) as err:
        _listener(b)[0].feed(data)
    assert err.value.reason == "replayed_hello"


def test_hello_for_another_node_or_too_old_is_refused() -> None:
    clock = Clock()
    a, b = _pair(clock=clock)
    data, _, _ = _connection(a, [], to="n3")  # recorded on its way to n3, replayed at n2
    with pytest.raises(AuthError) as err:
        _listener(b)[0].feed(data)
    assert err.value.reason == "wrong_node"
    data, _, _ = _connection(a, [])
    clock.now += b.skew + 1
    with pytest.raises(AuthError) as err:
        _listener(b)[0].feed(data)
    assert err.value.reason == "stale_hello"


def test_a_hello_from_before_a_restart_is_refused() -> None:
    """The nonce memory dies with the process: a connection recorded before a restart must not
    be accepted by the new process, even inside the skew."""
    clock = Clock()
    a, b = _pair(clock=clock)
    data, _, _ = _connection(a, FRAMES)
    assert len(_listener(b)[0].feed(data)) == 1 + len(FRAMES)
    clock.now += 2.0
    restarted = PeerAuth("n2", SECRET, clock=clock)
    with pytest.raises(AuthError) as err:
        _listener(restarted)[0].feed(data)
    assert err.value.reason == "stale_hello"
    fresh, _, _ = _connection(a, FRAMES)
    assert len(_listener(restarted)[0].feed(fresh)) == 1 + len(FRAMES)


def test_a_frame_repeated_inside_a_connection_is_dropped() -> None:
    a, b = _pair()
    hello_and_one, signer, _ = _connection(a, FRAMES[:1])
    repeated = hello_and_one[-(len(hello_and_one) - len(_connection(a, [])[0])):]
    dec, _ = _listener(b)
    got = dec.feed(hello_and_one + repeated + encode_frame(*FRAMES[1], signer))
    assert [f[1] for f in got] == [0, 1, 2] and dec.dropped == 1


def test_unsigned_and_unexpectedly_signed_frames_are_refused() -> None:
    _, b = _pair()
    with pytest.raises(AuthError) as err:
        _listener(b)[0].feed(encode_frame(Kind.REPAIR, 1, [["t", "k", {"x": [9, 0]}]]))
    assert err.value.reason == "unsigned"
    a, _ = _pair()
    data, _, _ = _connection(a, FRAMES)
    with pytest.raises(AuthError) as err:
        FrameDecoder().feed(data)
    assert err.value.reason == "unexpected_signature"


def test_before_the_hello_frames_are_small_and_must_be_a_hello() -> None:
    _, b = _pair()
    with pytest.raises(PeerError):
        _listener(b)[0].feed(HEADER.pack(MAX_HELLO_BYTES + 1, 1))
    a, _ = _pair()
    hello, signer, _ = a.dial("n2")
    with pytest.raises(AuthError) as err:
        _listener(b)[0].feed(encode_frame(Kind.PING, 0, hello, signer))
    assert err.value.reason == "bad_hello"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_flipped_bit_is_caught_never_delivered(data: st.DataObject) -> None:
    a, b = _pair()
    clean, _, _ = _connection(a, FRAMES)
    pos = data.draw(st.integers(0, len(clean) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(clean)
    flipped[pos] ^= 1 << bit
    dec, _ = _listener(b)
    try:
        got = dec.feed(bytes(flipped))
    except PeerError:
        return  # refused: the connection closes
    # a flip in a length field can only leave the decoder waiting for more bytes; whatever
    # was delivered is the untouched prefix of the stream
    if got:
        assert got[0][0] == Kind.HELLO and got[1:] == FRAMES[: len(got) - 1]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_peer_errors(junk: bytes) -> None:
    _, b = _pair()
    dec, _ = _listener(b)
    with contextlib.suppress(PeerError):
        assert dec.feed(junk) == []


def test_secret_file_rules(tmp_path: Any) -> None:
    path = tmp_path / "secret"
    value = write_secret(path)
    assert load_secret(path) == value and (path.stat().st_mode & 0o777) == 0o600
    path.write_bytes(b"  short \n")
    with pytest.raises(ConfigError, match="at least 16"):
        load_secret(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(tmp_path / "missing")


# -- real node processes ---------------------------------------------------------------------


async def _metric(client: Client, url: str, name: str, reason: str) -> float:
    async with client.session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(f'{name}{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _send_raw(host: str, port: int, data: bytes) -> bytes:
    """Write ``data`` on a fresh connection; what comes back before the node closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()


async def test_forged_and_replayed_peer_traffic_changes_nothing() -> None:
    async with running_cluster(3) as cluster:
        client = Client()
        try:
            n1 = cluster.nodes["n1"]
            assert cluster.secret_file is not None
            for i in range(5):
                status, _ = await client.add(cluster.urls[i % 3], "t", "k", f"good:{i}", 1)
                assert status == 200
            forged = [["t", "k", {"evil@1": [10**12, 0]}], ["t", "forged", {"evil@1": [7, 0]}]]
            # 1. unsigned REPAIR and REPLICATE frames from a client
            await _send_raw(n1.host, n1.port, MAGIC + encode_frame(Kind.REPAIR, 1, forged)
                            + encode_frame(Kind.REPLICATE, 2, [["x:1", "t", "k", "evil@1",
                                                                10**12, 0, 10**12, 0]]))
            # 2. signed with a guessed secret
            wrong = PeerAuth("n2", b"not-the-secret-0123456789")
            data, _, _ = _connection(wrong, [(Kind.REPAIR, 1, forged)], to="n1")
            await _send_raw(n1.host, n1.port, MAGIC + data)
            # 3. a legitimate connection (harmless READ), recorded and replayed whole
            real = PeerAuth("n2", load_secret(cluster.secret_file))
            data, _, _ = _connection(real, [(Kind.READ, 1, [["t", "k"]])], to="n1")
            answer = await asyncio.wait_for(_send_raw_keep(n1.host, n1.port, MAGIC + data), 5)
            assert answer, "the legitimate connection got no reply"
            await _send_raw(n1.host, n1.port, MAGIC + data)
            for reason in ("unsigned", "bad_mac", "replayed_hello"):
                assert await _metric(client, n1.url, "idc_peer_auth_rejected_total",
                                     reason) >= 1, reason
            for url in cluster.urls:
                assert await client.value(url, "t", "k", "all") == 5
                assert await client.value(url, "t", "forged", "all") == 0
        finally:
            await client.close()


async def _send_raw_keep(host: str, port: int, data: bytes) -> bytes:
    """Write ``data`` and return the first bytes answered (the connection stays up until then)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        return await reader.read(65536)
    finally:
        writer.close()


async def test_a_node_without_the_secret_cannot_join(tmp_path: Any) -> None:
    other = tmp_path / "other.secret"
    write_secret(other)
    cluster = LocalCluster(3, node_args={"n3": ["--secret-file", str(other)]})
    await cluster.start()
    client = Client()
    try:
        n1, n2, n3 = cluster.urls
        for i in range(10):
            status, body = await client.add(n1, "t", f"k{i}", f"op:{i}", 1)
            assert status == 200, body  # n1 and n2 are a quorum without n3
        async def refused() -> bool:
            return await _metric(client, n1, "idc_peer_auth_rejected_total", "bad_mac") >= 1

        await wait_until(refused, timeout=10, what="n1 refusing n3's HELLO")
        assert all([await client.value(n3, "t", f"k{i}", "one") == 0 for i in range(10)])
        assert all([await client.value(n2, "t", f"k{i}", "one") == 1 for i in range(10)])
    finally:
        await client.close()
        await cluster.stop()
        await cluster.abort()


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=100), st.binary(max_size=3000))
def test_the_frame_mac_is_hmac_sha256(key: bytes, message: bytes) -> None:
    import hashlib
    import hmac

    from cluster.transport.auth import _HmacSha256

    assert _HmacSha256(key).mac(message[:7], message[7:]) == hmac.digest(key, message,
                                                                          hashlib.sha256)
