"""Real nodes refuse malformed input with 400/413/410 and the error shape; nothing is applied."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
import pytest_asyncio
from cluster_util import Client, running_cluster

from cluster.local import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90),
              pytest.mark.asyncio(loop_scope="module")]

MAX_BODY = 65536
LIMITS = ["--max-body-bytes", str(MAX_BODY), "--max-batch-ops", "500", "--window", "5"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster():  # type: ignore[no-untyped-def]
    async with running_cluster(3, rf=3, extra_args=LIMITS) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def client():  # type: ignore[no-untyped-def]
    c = Client()
    yield c
    await c.close()


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# (name, path under /v1, body bytes, content type, expected status, expected code)
SINGLE = "/v1/counters/t/k"
CASES = [
    ("not json", SINGLE, b"{nope", "application/json", 400, "bad_body"),
    ("empty body", SINGLE, b"", "application/json", 400, "bad_body"),
    ("bad msgpack", SINGLE, b"\xc1\xc1", "application/msgpack", 400, "bad_body"),
    ("truncated msgpack", SINGLE, msgpack.packb({"op_id": "x:1", "delta": 1})[:-3],
     "application/msgpack", 400, "bad_body"),
    ("list body", SINGLE, j([1, 2]), "application/json", 400, "bad_body"),
    ("missing op_id", SINGLE, j({"delta": 1}), "application/json", 400, "bad_op_id"),
    ("empty op_id", SINGLE, j({"op_id": "", "delta": 1}), "application/json", 400, "bad_op_id"),
    ("int op_id", SINGLE, j({"op_id": 5, "delta": 1}), "application/json", 400, "bad_op_id"),
    ("long op_id", SINGLE, j({"op_id": "x" * 257, "delta": 1}), "application/json", 400,
     "bad_op_id"),
    ("missing delta", SINGLE, j({"op_id": "x:1"}), "application/json", 400, "bad_delta"),
    ("string delta", SINGLE, j({"op_id": "x:1", "delta": "5"}), "application/json", 400,
     "bad_delta"),
    ("float delta", SINGLE, j({"op_id": "x:1", "delta": 1.5}), "application/json", 400,
     "bad_delta"),
    ("bool delta", SINGLE, j({"op_id": "x:1", "delta": True}), "application/json", 400,
     "bad_delta"),
    ("delta 2**63", SINGLE, j({"op_id": "x:1", "delta": 2**63}), "application/json", 400,
     "bad_delta"),
    ("delta -2**63-1", SINGLE, j({"op_id": "x:1", "delta": -(2**63) - 1}), "application/json",
     400, "bad_delta"),
    ("huge int delta", SINGLE, b'{"op_id": "x:1", "delta": 1' + b"0" * 5000 + b"}",
     "application/json", 400, "bad_body"),
    ("attempt 0", SINGLE, j({"op_id": "x:1", "delta": 1, "attempt": 0}), "application/json",
     400, "bad_attempt"),
    ("negative age", SINGLE, j({"op_id": "x:1", "delta": 1, "age_ms": -1}), "application/json",
     400, "bad_age_ms"),
    ("bad table", "/v1/counters/bad%20table/k", j({"op_id": "x:1", "delta": 1}),
     "application/json", 400, "bad_table"),
    ("long key", "/v1/counters/t/" + "k" * 129, j({"op_id": "x:1", "delta": 1}),
     "application/json", 400, "bad_key"),
    ("unicode key", "/v1/counters/t/%C3%A9", j({"op_id": "x:1", "delta": 1}),
     "application/json", 400, "bad_key"),
    ("deep json nesting", SINGLE, b"[" * 30_000 + b"]" * 30_000, "application/json", 400,
     "too_deep"),
    ("control char in op id", SINGLE, j({"op_id": "x\u0000:1", "delta": 1}),
     "application/json", 400, "bad_op_id"),
    ("control char in a batch op id", "/v1/batch",
     j({"ops": [{"table": "t", "key": "k", "op_id": "x\n1", "delta": 1}]}),
     "application/json", 400, "bad_op_id"),
    ("nested extra field", SINGLE, j({"op_id": "x:1", "delta": 1, "x": [[[[[[[[1]]]]]]]]}),
     "application/json", 400, "too_deep"),
    ("nested batch op field", "/v1/batch",
     j({"ops": [{"table": "t", "key": "k", "op_id": "x:1", "delta": 1, "x": [[[[[[1]]]]]]}]}),
     "application/json", 400, "too_deep"),
    ("deep msgpack nesting", SINGLE, b"\x91" * 30_000 + b"\xc0", "application/msgpack", 400,
     "too_deep"),
    ("deep nesting, oversized", SINGLE, b"[" * 100_000 + b"]" * 100_000, "application/json", 413,
     "body_too_large"),
    ("oversized body", SINGLE, j({"op_id": "x:1", "delta": 1, "pad": "p" * MAX_BODY}),
     "application/json", 413, "body_too_large"),
    ("batch not object", "/v1/batch", j([]), "application/json", 400, "bad_body"),
    ("batch ops not list", "/v1/batch", j({"ops": 5}), "application/json", 400, "bad_body"),
    ("batch too large", "/v1/batch",
     j({"ops": [{"table": "t", "key": "k", "op_id": f"z:{i}", "delta": 1} for i in range(501)]}),
     "application/json", 400, "batch_too_large"),
    ("batch op not object", "/v1/batch", j({"ops": [5]}), "application/json", 400, "bad_body"),
    ("batch bad key", "/v1/batch",
     j({"ops": [{"table": "t", "key": "a b", "op_id": "z:1", "delta": 1}]}),
     "application/json", 400, "bad_key"),
]


@pytest.mark.parametrize(("name", "path", "body", "ctype", "status", "code"), CASES,
                         ids=[c[0] for c in CASES])
async def test_bad_input_is_refused(cluster: LocalCluster, client: Client, name: str, path: str,
                                    body: bytes, ctype: str, status: int, code: str) -> None:
    got, reply = await client.raw_post(cluster.urls[0] + path, body, ctype)
    assert got == status, (name, reply)
    assert set(reply) == {"error"} and reply["error"]["code"] == code, reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]


async def test_bad_batch_applies_nothing_and_names_the_index(
        cluster: LocalCluster, client: Client) -> None:
    good = [{"table": "t", "key": "batchk", "op_id": f"g:{i}", "delta": 1} for i in range(3)]
    bad = {"table": "t", "key": "batchk", "op_id": "g:bad", "delta": "1"}
    status, reply = await client.batch(cluster.urls[1], [*good[:2], bad, good[2]])
    assert status == 400 and "ops[2]" in reply["error"]["message"]
    assert await client.value(cluster.urls[2], "t", "batchk", "all") == 0
    # the good ops were not recorded as seen either: sent alone they apply
    status, reply = await client.batch(cluster.urls[2], good)
    assert reply["results"] == [{"applied": True}] * 3


async def test_op_older_than_window_is_expired(cluster: LocalCluster, client: Client) -> None:
    status, reply = await client.add(cluster.urls[0], "t", "old", "o:1", 1, age_ms=6000)
    assert status == 410 and reply["error"]["code"] == "op_expired"
    status, reply = await client.batch(cluster.urls[0], [
        {"table": "t", "key": "old", "op_id": "o:2", "delta": 1, "age_ms": 6000},
        {"table": "t", "key": "old", "op_id": "o:3", "delta": 1, "age_ms": 100}])
    assert reply["results"][0]["error"]["code"] == "op_expired"
    assert reply["results"][1] == {"applied": True}
    assert await client.value(cluster.urls[0], "t", "old", "all") == 1


async def test_bad_consistency_and_msgpack_round_trip(cluster: LocalCluster,
                                                      client: Client) -> None:
    status, reply = await client.get(cluster.urls[0] + "/v1/counters/t/k?consistency=some")
    assert status == 400 and reply["error"]["code"] == "bad_consistency"
    body = msgpack.packb({"op_id": "mp:1", "delta": 7})
    async with client.session.post(cluster.urls[0] + "/v1/counters/t/mp", data=body, headers={
            "Content-Type": "application/msgpack", "Accept": "application/msgpack"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/msgpack")
        assert msgpack.unpackb(await resp.read()) == {"applied": True}


async def test_node_still_serves_and_counts_exactly(cluster: LocalCluster,
                                                    client: Client) -> None:
    # every refused request above wrote nothing under t/k
    assert await client.value(cluster.urls[0], "t", "k", "all") == 0
    for url in cluster.urls:
        status, body = await client.get(url + "/v1/health")
        assert status == 200 and body["status"] == "ok"
