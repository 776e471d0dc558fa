"""The served OpenAPI document: valid OpenAPI 3.0.3, describing every route the app registers,
and true of a running cluster (a bounded schemathesis run against real node processes)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgpack
import pytest
import pytest_asyncio
import requests
import schemathesis
from cluster_util import Client, running_cluster
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks as oa_checks

from cluster.core.config import NodeConfig
from cluster.edge import http_api
from cluster.edge.openapi import (
    DEFAULT_MAX_BATCH_OPS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OP_ID_BYTES,
    spec,
)
from cluster.local import LocalCluster
from cluster.roles.member import Node

pytestmark = pytest.mark.timeout(120)

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# The fuzzed cluster runs with limits other than the defaults, so the served document can be
# checked for stating them.
LIMITS = {"max_batch_ops": 64, "max_op_id_bytes": 64, "max_body_bytes": 256 << 10}
NODE_ARGS = ["--no-fsync", *[f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()]]

# Bounded: examples per operation and generation mode (positive: valid by the document,
# negative: invalid), derandomized: about 250 requests, under 10 s on 2 cores.
MAX_EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 40}
MAX_EXAMPLES_NO_INPUT = 3  # operations without parameters or body: every case is the same
CHECKS = [
    oa_checks.status_code_conformance,
    oa_checks.content_type_conformance,
    oa_checks.response_headers_conformance,
    oa_checks.response_schema_conformance,
    oa_checks.negative_data_rejection,
]

_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1


def _packable(value: Any) -> Any:
    """msgpack stores integers in [-2**63, 2**64); a larger one (negative cases make them) is
    sent as its decimal string, which the node must refuse like any other wrong type."""
    if isinstance(value, dict):
        return {k: _packable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_packable(v) for v in value]
    if type(value) is int and not _I64_MIN <= value <= _U64_MAX:
        return str(value)
    return value


@schemathesis.serializer("application/msgpack")
def _to_msgpack(ctx: schemathesis.SerializationContext, value: Any) -> dict[str, Any]:
    return {"data": msgpack.packb(_packable(value))}


@schemathesis.deserializer("application/msgpack")
def _from_msgpack(ctx: schemathesis.DeserializationContext, response: Any) -> Any:
    return msgpack.unpackb(response.content, raw=False)


# ---------------------------------------------------------------- the document itself


def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items()
            for method in item if method in METHODS}


@pytest.mark.parametrize("kw", [
    {},
    {"max_batch_ops": 7, "max_op_id_bytes": 16, "max_body_bytes": 1000, "token_required": True},
])
def test_document_is_valid_openapi_3_0_3(kw: dict[str, Any]) -> None:
    doc = spec(**kw)
    assert doc["openapi"] == "3.0.3"
    schema = schemathesis.openapi.from_dict(json.loads(json.dumps(doc)))  # JSON-clean
    schema.validate()  # raises on anything the OpenAPI 3.0 meta-schema refuses
    labels = {r.ok().label for r in schema.get_all_operations()}
    assert labels == {f"{m} {p}" for m, p in _operations(doc)}


def test_document_states_the_limits_it_is_given() -> None:
    default = spec()
    schemas = default["components"]["schemas"]
    assert schemas["Batch"]["properties"]["ops"]["maxItems"] == DEFAULT_MAX_BATCH_OPS == 10_000
    assert schemas["Op"]["properties"]["op_id"]["maxLength"] == DEFAULT_MAX_OP_ID_BYTES == 256
    assert DEFAULT_MAX_BODY_BYTES == 4 << 20
    assert str(DEFAULT_MAX_BODY_BYTES) in default["components"]["responses"]["TooLarge"][
        "description"]
    assert default["security"] == [{}, {"bearerAuth": []}]  # a token is optional by default

    small = spec(max_batch_ops=7, max_op_id_bytes=16, max_body_bytes=1000, token_required=True)
    schemas = small["components"]["schemas"]
    assert schemas["Batch"]["properties"]["ops"]["maxItems"] == 7
    assert schemas["Op"]["properties"]["op_id"]["maxLength"] == 16
    assert schemas["BatchOp"]["properties"]["op_id"]["maxLength"] == 16
    assert "1000 bytes" in small["components"]["responses"]["TooLarge"]["description"]
    assert small["security"] == [{"bearerAuth": []}]
    # health checks and discovery never need the token (http_api.OPEN_ROUTES)
    for path in ("/v1/health", "/v1/ready", "/v1/openapi.json"):
        assert small["paths"][path]["get"]["security"] == []
        assert "401" not in small["paths"][path]["get"]["responses"]
    assert spec() == default and spec() is not default  # a fresh dict each call


def test_document_describes_every_route_the_app_registers() -> None:
    config = NodeConfig(node_id="n1", listen=("127.0.0.1", 0), peers=(("n1", "127.0.0.1", 0),),
                        data_dir="unused")
    app = http_api.make_app(cast(Node, SimpleNamespace(config=config)))
    registered = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp adds HEAD to every GET route
            continue
        canonical = route.resource.canonical if route.resource is not None else ""
        if canonical == "/{tail}":  # the catch-all: 404 in the contract's shape
            continue
        registered.add((route.method, canonical))
    assert registered, "no routes found: did make_app change?"
    assert registered == _operations(spec()), (
        "routes without a description (add them to cluster/openapi.py) or descriptions "
        "without a route")


def test_every_operation_documents_its_error_shape() -> None:
    doc = spec()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in METHODS:
                continue
            assert op["operationId"], (method, path)
            for code, resp in op["responses"].items():
                if code.startswith(("4", "5")):
                    ref = resp["$ref"].rsplit("/", 1)[-1]
                    content = doc["components"]["responses"][ref]["content"]
                    for media in ("application/json", "application/msgpack"):
                        assert content[media]["schema"] == {"$ref": "#/components/schemas/Error"}


# ---------------------------------------------------------------- against a running cluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster():  # type: ignore[no-untyped-def]
    async with running_cluster(3, rf=3, extra_args=NODE_ARGS) as c:
        yield c


def _fuzz_operation(op: schemathesis.APIOperation, mode: GenerationMode, examples: int,
                    base: str, session: requests.Session, headers: dict[str, str] | None = None,
                    expect: Callable[[schemathesis.Response], None] | None = None) -> Counter[int]:
    """One bounded, derandomized schemathesis run of ``op``; the statuses it got."""
    statuses: Counter[int] = Counter()

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        response = case.call(base_url=base, session=session, headers=headers, timeout=15)
        statuses[response.status_code] += 1
        assert response.status_code < 500 or response.status_code == 503, (
            f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}")
        if expect is not None:
            expect(response)
        case.validate_response(response, checks=CHECKS)

    check()
    return statuses


def _fuzz(base: str) -> dict[str, Counter[int]]:
    """Every operation of the served document, positive and negative cases; the statuses seen."""
    seen: dict[str, Counter[int]] = {}
    with requests.Session() as session:
        served = session.get(f"{base}/v1/openapi.json", timeout=10)
        served.raise_for_status()
        # from_dict, not from_url: schemathesis leaves out the operation that serves the
        # document it was loaded from, and that one is to be tested too
        schema = schemathesis.openapi.from_dict(served.json())
        schema.validate()
        for result in schema.get_all_operations():
            op = result.ok()
            has_input = bool(len(op.path_parameters) or len(op.query) or len(op.body))
            for mode, examples in MAX_EXAMPLES.items():
                if not has_input and mode is GenerationMode.NEGATIVE:
                    continue  # nothing to make invalid
                seen[f"{op.label} {mode.value}"] = _fuzz_operation(
                    op, mode, examples if has_input else MAX_EXAMPLES_NO_INPUT, base, session)
    return seen


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_schemathesis_finds_nothing_and_the_cluster_stays_healthy(
        cluster: LocalCluster) -> None:
    base = cluster.urls[0]
    start = time.monotonic()
    seen = await asyncio.to_thread(_fuzz, base)
    elapsed = time.monotonic() - start
    total = sum(sum(c.values()) for c in seen.values())
    print(f"schemathesis: {total} requests in {elapsed:.1f} s: "
          + "; ".join(f"{k} {dict(v)}" for k, v in seen.items()))
    assert total >= 100, seen
    # both kinds of answers were exercised, not only refusals
    assert seen["POST /v1/counters/{table}/{key} positive"][200] > 0, seen
    assert seen["POST /v1/counters/{table}/{key} negative"][400] > 0, seen

    client = Client()
    try:
        for url in cluster.urls:
            status, health = await client.get(f"{url}/v1/health")
            assert status == 200 and health["status"] == "ok", health
            assert all(health["live"].values()), health
        status, body = await client.add(base, "after", "fuzz", "after-fuzz:1", 5)
        assert (status, body) == (200, {"applied": True})
        assert await client.value(cluster.urls[1], "after", "fuzz", "all") == 5
    finally:
        await client.close()
    for node in cluster.nodes.values():
        assert node.running, f"{node.id} died"
        log = node.log_path.read_text()
        assert "Error handling request" not in log, f"{node.id}: unhandled error, see its log"


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_served_document_states_the_node_limits(cluster: LocalCluster) -> None:
    client = Client()
    try:
        status, doc = await client.get(f"{cluster.urls[0]}/v1/openapi.json")
    finally:
        await client.close()
    assert status == 200
    assert doc == spec(**LIMITS)


def _fuzz_with_token(base: str, token: str) -> dict[str, Counter[int]]:
    """Positive cases without a token, with a wrong one and with the right one: 401 exactly
    where the document says a token is needed."""
    seen: dict[str, Counter[int]] = {}
    with requests.Session() as session:
        doc = session.get(f"{base}/v1/openapi.json", timeout=10).json()
        assert doc == spec(token_required=True)
        schema = schemathesis.openapi.from_dict(doc)
        for result in schema.get_all_operations():
            op = result.ok()
            needs_token = doc["paths"][op.path][op.method.lower()].get("security") != []
            for name, sent in (("no token", None), ("wrong token", "x" * 32), ("token", token)):
                refused = needs_token and sent != token

                def expect(response: schemathesis.Response, refused: bool = refused) -> None:
                    assert (response.status_code == 401) == refused, response.request.url
                    if refused:  # schemathesis: lowercase names, a list of values each
                        assert response.headers["www-authenticate"][0].startswith("Bearer")

                seen[f"{op.label} {name}"] = _fuzz_operation(
                    op, GenerationMode.POSITIVE, TOKEN_EXAMPLES, base, session,
                    headers={"Authorization": f"Bearer {sent}"} if sent else None,
                    expect=expect)
    return seen


TOKEN_EXAMPLES = 8


@pytest.mark.slow
async def test_with_a_token_every_closed_operation_answers_401_as_documented(
        tmp_path: Path) -> None:
    token = "t0ken-" + "a" * 26
    token_file = tmp_path / "tokens"
    token_file.write_text(f"{token}\n")
    async with running_cluster(2, rf=2, extra_args=["--no-fsync",
                                                    f"--token-file={token_file}"]) as c:
        seen = await asyncio.to_thread(_fuzz_with_token, c.urls[0], token)
    assert seen["POST /v1/counters/{table}/{key} token"][200] > 0, seen
    assert set(seen["GET /metrics no token"]) == {401}, seen
    assert set(seen["GET /v1/health no token"]) == {200}, seen


@pytest.mark.slow
async def test_single_replica_cluster_answers_retries() -> None:
    async with running_cluster(1, rf=1, extra_args=["--no-fsync"]) as c:
        client = Client()
        try:
            first = await client.add(c.urls[0], "t", "k", "r:1", 1)
            retry = await client.add(c.urls[0], "t", "k", "r:1", 1, attempt=2)
            late = await client.add(c.urls[0], "t", "k", "r:2", 1, age_ms=900)
        finally:
            await client.close()
    assert first == (200, {"applied": True})
    assert retry == (200, {"applied": False, "duplicate": True})
    assert late == (200, {"applied": True})
