"""Protocol versions: what a node speaks (the HELLO, heartbeats, /v1/health), what the cluster
finalized (the membership), and that a frame or membership of a newer version is refused with
both versions named, never read as something else."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cluster import admin
from cluster.core.membership import Membership, MembershipError
from cluster.core.versions import PROTOCOL_MAX, FormatError, common, speaks
from cluster.roles import protocol
from cluster.roles.membership import _apply, load_ring, save_ring
from cluster.transport.auth import AuthError
from cluster.transport.wire import (
    HEADER,
    MAGIC,
    SPEAKS,
    FrameDecoder,
    Kind,
    NewerForm,
    check_hello,
    encode_frame,
)
from tests.cluster_util import Client, inprocess_configs, inprocess_nodes, node_url, wait_until

# -- the wire ------------------------------------------------------------------------------


def test_a_form_1_frame_is_what_release_0_4_0_sends() -> None:
    frame = encode_frame(Kind.READ, 7, [["t", "k"]])
    assert msgpack.unpackb(frame[HEADER.size:]) == [Kind.READ, 7, [["t", "k"]]]


def test_frames_of_every_spoken_form_decode_and_a_newer_one_is_named_not_read() -> None:
    frames = [encode_frame(Kind.READ, i, [["t", str(i)]], form=f)
              for i, f in enumerate(range(1, PROTOCOL_MAX + 2))]
    got = FrameDecoder().feed(b"".join(frames))
    for kind, req_id, body in got[:-1]:
        assert (kind, body) == (Kind.READ, [["t", str(req_id)]])
    kind, req_id, body = got[-1]
    assert isinstance(body, NewerForm)
    message = str(body.error)
    assert f"version {PROTOCOL_MAX + 1}" in message and f"1 to {PROTOCOL_MAX}" in message


def test_hello_ranges() -> None:
    assert check_hello({"node": "old", "version": 1}) == (1, 1)  # release 0.4.0: 1 only
    assert check_hello({"node": "n", "speaks": [1, 7]}) == (1, 7)
    with pytest.raises(AuthError) as no_overlap:
        check_hello({"node": "future", "speaks": [PROTOCOL_MAX + 1, PROTOCOL_MAX + 3]})
    assert no_overlap.value.reason == "version"
    with pytest.raises(AuthError):
        check_hello({"node": "x", "speaks": [2, 1]})
    assert common((1, 2), (2, 5)) == 2 and common((1, 1), (2, 3)) is None
    assert speaks(None) == (1, 1)


async def _exchange(port: int, frames: bytes) -> bytes:
    """Send ``frames`` as a peer (unsigned) and collect what comes back until the node closes
    the connection or goes quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frames)
    await writer.drain()
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 2.0):
            data += chunk
    except TimeoutError:
        pass
    writer.close()
    return data


async def test_a_node_answers_a_newer_form_with_an_error_and_closes_on_a_foreign_range(
        tmp_path: Path) -> None:
    cfgs = inprocess_configs(tmp_path)
    async with inprocess_nodes(cfgs) as servers:
        port = servers[0].address[1]
        hello = encode_frame(Kind.HELLO, 0, {"node": "probe", "to": "n1", "version": 1,
                                             "speaks": [1, PROTOCOL_MAX + 1]})
        ask = encode_frame(Kind.READ, 5, [["t", "k"]], form=PROTOCOL_MAX + 1)
        replies = FrameDecoder().feed(await _exchange(port, MAGIC + hello + ask))
        assert [(k, r) for k, r, _ in replies] == [(Kind.ERROR, 5)]
        assert f"version {PROTOCOL_MAX + 1}" in replies[0][2]
        # a dialer that speaks no version this node speaks: the connection is closed at once
        future = encode_frame(Kind.HELLO, 0, {"node": "probe", "to": "n1", "version": 9,
                                              "speaks": [PROTOCOL_MAX + 1, PROTOCOL_MAX + 1]})
        read = encode_frame(Kind.READ, 6, [["t", "k"]])
        assert await _exchange(port, MAGIC + future + read) == b""


# -- the membership -------------------------------------------------------------------------


def _ms() -> Membership:
    return Membership.bootstrap([("n1", "127.0.0.1", 1), ("n2", "127.0.0.1", 2)], rf=2, vnodes=8)


def test_membership_at_protocol_1_is_written_as_release_0_4_0_wrote_it(tmp_path: Path) -> None:
    ms = _ms()
    assert "protocol" not in ms.to_wire()
    up = ms.set_protocol(2)
    assert up.version == ms.version + 1 and up.to_wire()["protocol"] == 2
    assert Membership.from_wire(up.to_wire()) == up
    assert up.set_protocol(2) is up
    with pytest.raises(MembershipError):
        up.set_protocol(1)
    save_ring(tmp_path, up)
    assert load_ring(tmp_path) == up
    future = {**up.to_wire(), "protocol": PROTOCOL_MAX + 1}
    (tmp_path / "ring.json").write_text(json.dumps(future))
    with pytest.raises(FormatError) as refused:
        load_ring(tmp_path)
    assert f"version {PROTOCOL_MAX + 1}" in str(refused.value) and "\n" not in str(refused.value)


def test_a_joiner_must_speak_the_finalized_protocol() -> None:
    up = _ms().set_protocol(2)
    join = {"change": "join", "id": "n3", "addr": "127.0.0.1:3"}
    with pytest.raises(MembershipError, match="speaks protocol 1 to 1"):
        _apply(up, join, 0.0)  # a joiner of release 0.4.0 says nothing: 1 only
    assert _apply(up, {**join, "speaks": [1, 2]}, 0.0).get("n3") is not None


class _Node:
    def __init__(self, live: set[str]) -> None:
        self.id = "n1"
        self.membership = Membership.bootstrap(
            [("n1", "h", 1), ("n2", "h", 2), ("n3", "h", 3)], rf=3, vnodes=8)
        self._live = live

    def is_live(self, peer: str) -> bool:
        return peer in self._live


def test_finalize_waits_for_every_member_to_be_live_and_to_speak_the_version() -> None:
    both = {"n2", "n3"}
    assert protocol.finalizable(_Node(both), None, {"n2": (1, 2), "n3": (1, 2)}) == 2
    assert protocol.finalizable(_Node(both), 1, {"n2": (1, 2), "n3": (1, 2)}) == 1
    with pytest.raises(MembershipError, match="n3 speaks up to 1"):
        protocol.finalizable(_Node(both), 2, {"n2": (1, 2), "n3": (1, 1)})
    # asked for the highest with a member still on the old release: refused at once, naming it
    with pytest.raises(MembershipError, match="nothing to finalize: member n3 speaks up to 1"):
        protocol.finalizable(_Node(both), None, {"n2": (1, 2), "n3": (1, 1)})
    with pytest.raises(MembershipError, match="n3 is not live"):
        protocol.finalizable(_Node({"n2"}), None, {"n2": (1, 2), "n3": (1, 2)})
    with pytest.raises(MembershipError, match="n2 is not live"):
        protocol.finalizable(_Node(both), None, {"n3": (1, 2)})
    with pytest.raises(MembershipError):
        protocol.finalizable(_Node(both), PROTOCOL_MAX + 1, {"n2": (1, 2), "n3": (1, 2)})


# -- a cluster finalized ----------------------------------------------------------------------


async def _healths(client: Client, urls: list[str]) -> list[dict[str, Any]]:
    out = []
    for url in urls:
        status, body = await client.get(f"{url}/v1/health")
        assert status == 200
        out.append(body)
    return out


async def test_finalize_raises_the_cluster_protocol_on_every_member_and_survives_restart(
        tmp_path: Path) -> None:
    cfgs = inprocess_configs(tmp_path)
    client = Client()
    try:
        async with inprocess_nodes(cfgs) as servers:
            urls = [node_url(s) for s in servers]
            for h in await _healths(client, urls):
                assert h["protocol"]["speaks"] == list(SPEAKS) and h["protocol"]["cluster"] == 1
            assert not (tmp_path / "n1" / "FORMAT").exists()  # level 1: 0.4.0's files only

            async def everyone_heard() -> bool:
                return all(len(h["protocol"]["peers"]) == 2
                           for h in await _healths(client, urls))

            await wait_until(everyone_heard, what="every node heard what its peers speak")
            for i in range(20):
                status, _ = await client.add(urls[i % 3], "t", f"k{i % 4}", f"before-{i}", 1)
                assert status == 200
            via = [("127.0.0.1", servers[1].address[1])]
            shown = io.StringIO()
            assert await admin.finalize(via, None, 20.0, dry_run=True, out=shown) == 0
            assert "speaks protocol 1 to 2" in shown.getvalue()
            assert "every member speaks up to 2" in shown.getvalue()
            out = io.StringIO()
            assert await admin.finalize(via, None, 20.0, out=out) == 0
            assert "protocol 2 on every member" in out.getvalue()
            for h in await _healths(client, urls):
                assert h["protocol"]["cluster"] == 2
            for s in servers:
                assert all(link.form == 2 for link in s.node.links.values())
            for i in range(20):
                status, _ = await client.add(urls[i % 3], "t", f"k{i % 4}", f"after-{i}", 1)
                assert status == 200
            again = io.StringIO()  # asked again: nothing changes
            assert await admin.finalize(via, None, 20.0, out=again) == 0
            assert await client.value(urls[0], "t", "k0", "all") == 10
        for i in (1, 2, 3):
            assert (tmp_path / f"n{i}" / "FORMAT").read_text().strip() == "2"
        async with inprocess_nodes(cfgs) as servers:
            urls = [node_url(s) for s in servers]
            for h in await _healths(client, urls):
                assert h["protocol"]["cluster"] == 2
            assert await client.value(urls[2], "t", "k1", "all") == 10
    finally:
        await client.close()

