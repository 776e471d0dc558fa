"""The issue's proof: many classes of junk against a live 3-node cluster while a well-behaved
client keeps incrementing; then its counts are exact, no junk changed a counter, every node is
up, every HTTP junk answer is a 4xx in the contract's error shape and none is a 5xx.

The nodes run with a cluster secret, a bearer token and short limits (1 s header and body
timeouts, 16 connections per client address, 64 kB bodies, 100 ops a batch), so the slow and
the oversized classes finish quickly. Junk connects from 127.0.0.2, the connection-cap class
from 127.0.0.3 (both loopback), so the per-address cap keeps them apart from the good client.

Where the node legitimately just closes the connection instead of answering (the class has
``closes=True`` in ``client.hostile.REGISTRY``): requests the sender truncates, a connection
that never says anything, bytes that are not HTTP at all, and all forged peer traffic (the
peer protocol has no error frames for refused authentication: the connection is closed).

The junk found eleven node bugs, all fixed; their classes stay in the registry and run here:
a lone-surrogate op id (500, and a lost op in a batch), lingering after a body timeout, aiohttp's
parser answering in plain text (``headers_too_long``, ``garbage_bytes``, ``malformed_framing``),
a non-UTF-8 bearer token (500), a peer connection holding without a HELLO
(``peer_idle_no_hello``), valid deltas that overflowed an entry (``counter_overflow``: 500,
replicas diverged, the snapshot loop died), a scan ``limit`` of non-ASCII digits or 5000 digits
(``scan_limit_not_ascii``: 500), a delete whose op id is not UTF-8 once percent-decoded
(``delete_op_id_not_utf8``: applied, every such op id taken as the same U+FFFD one), a delete
in the body of the add route (``post_body_delete``: applied, though that route's op needs a
delta), and scan cursors no scan hands out taken as positions (``scan_cursor_not_canonical``).

The read, scan, delete and table-settings routes have their own classes
(``client.hostile.cases_http_routes``); ``test_route_class`` runs each on its own as well, once
against every node.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from cluster_util import running_cluster

from client.hostile import (
    REGISTRY,
    Answer,
    HostileConfig,
    Limits,
    Outcome,
    error_shape,
    expect_reject,
    format_report,
    main,
    parse_metrics,
    parse_response,
    run_hostile,
    try_class,
)
from client.hostile.cases_http_routes import (
    check_victim,
    del_table,
    delete,
    put,
    ttl_on,
    ttl_table,
    victim,
)
from client.hostile.http_client import counter_path, jdump
from client.hostile.runner import Runner
from cluster.local import LocalCluster
from cluster.transport.auth import REASONS, load_secret

LIMITS = Limits(max_body_bytes=65536, max_batch_ops=100, header_timeout=1.0, body_timeout=1.0,
                max_connections_per_client=16, max_reads=64)
TOKEN = "hostile-test-token-0123456789abcdef"

pytestmark = [pytest.mark.timeout(180)]


def node_args(token_file: str) -> list[str]:
    return ["--token-file", token_file,
            "--header-timeout", str(LIMITS.header_timeout),
            "--body-timeout", str(LIMITS.body_timeout),
            "--max-connections-per-client", str(LIMITS.max_connections_per_client),
            "--max-body-bytes", str(LIMITS.max_body_bytes),
            "--max-batch-ops", str(LIMITS.max_batch_ops),
            "--max-reads", str(LIMITS.max_reads)]


def config(cluster: LocalCluster, **kw: Any) -> HostileConfig:
    assert cluster.secret_file is not None
    return HostileConfig(nodes=cluster.urls, secret=load_secret(cluster.secret_file),
                         token=TOKEN, limits=LIMITS, **kw)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def main_cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    token_file = tmp_path_factory.mktemp("hostile") / "tokens"
    token_file.write_text(TOKEN + "\n")
    async with running_cluster(3, rf=3, extra_args=node_args(str(token_file))) as c:
        yield c


# -- the proof ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_junk_changes_nothing(main_cluster: LocalCluster) -> None:
    started = time.monotonic()
    report = await run_hostile(config(main_cluster, duration=16.0, good_rate=80.0,
                                      concurrency=6, seed=20261122))
    elapsed = time.monotonic() - started
    print(format_report(report))
    print(f"hostile run: {elapsed:.1f}s")
    classes = report["classes"]

    # scale: every class ran (secret and token given), several rounds
    assert report["classes_tried"] == len(REGISTRY) >= 25
    assert report["classes_skipped"] == 0
    assert report["rounds"] >= 2
    assert report["junk_requests"] >= 300 * report["rounds"]

    # the well-behaved client's counts are exact on every node
    good = report["good"]
    assert good["acked_ops"] > 100
    assert good["unknown_ops"] == 0 and good["not_applied_ops"] == 0, good["errors"]
    assert good["exact"], good["keys"]
    for key in good["keys"].values():
        assert key["values"] == [key["acked"]] * len(main_cluster.nodes)

    # no junk changed a counter; every node up
    assert report["junk"]["ok"], report["junk"]["nonzero"]
    assert report["junk"]["keys_checked"] >= 40
    assert all(n["up"] for n in report["health"].values()), report["health"]
    assert all(n.running for n in main_cluster.nodes.values())

    # every class met its expectations
    for name, row in classes.items():
        assert row["ok"], (name, row["failures"])
    # no 5xx at all, and every answer to HTTP body/value junk is a 4xx
    for name, row in classes.items():
        assert "5xx" not in row["failure_kinds"], (name, row["failures"])
        assert not [s for s in row["seen"] if s[:1] == "5"], (name, row["seen"])
        if row["group"] == "http" and name != "counter_overflow":  # its first ops are valid
            # answered, always, with a 4xx (other labels are notes)
            assert all(400 <= int(s) < 500 for s in row["seen"] if s.isdigit()), (name, row)
            assert not {"closed", "open", "reset", "connect"} & set(row["seen"]), (name, row)
    assert not report["problems"], report["problems"]

    # the node counted what it refused, by reason
    m = report["metrics"]
    assert m["scraped"] and not m["missing_reasons"], m
    for reason in ("unsigned", "bad_mac", "replay", "bad_hello", "stale_hello", "wrong_node",
                   "replayed_hello", "bad_frame", "hello_timeout"):
        assert reason in REASONS
        assert m["peer_auth_rejected"].get(reason, 0) > 0, (reason, m["peer_auth_rejected"])
    for reason in ("header_timeout", "too_many_connections"):
        assert m["http_refused"].get(reason, 0) > 0, (reason, m["http_refused"])
    assert m["unauthorized"] > 0 and m["bad_requests"] > 0
    assert elapsed < 60.0


ROUTE_CLASSES = ["read_malformed", "read_too_many", "scan_bad_query", "scan_forged_cursors",
                 "delete_bad_query", "batch_delete_malformed", "table_bad_settings",
                 "wrong_methods", "unknown_routes", "scan_limit_not_ascii",
                 "delete_op_id_not_utf8", "post_body_delete", "scan_cursor_not_canonical"]


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", ROUTE_CLASSES)
async def test_route_class(main_cluster: LocalCluster, name: str) -> None:
    """One class against every node, alone: every answer a 4xx in the contract's shape with
    the class's codes, the counters it raised first (``<table>_del``) and its table's ttl
    (``<table>_ttl``) unchanged, every junk counter 0, every node up."""
    out = await try_class(config(main_cluster), name, targets=len(main_cluster.nodes))
    assert out.ok, (out.verdict(), [str(f) for f in out.failures])
    assert out.requests >= 4 * len(main_cluster.nodes)
    assert not [s for s in out.seen if s[:1] == "5"], dict(out.seen)
    assert all(400 <= int(s) < 500 for s in out.seen if s.isdigit()), dict(out.seen)
    assert all(n.running for n in main_cluster.nodes.values())


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_route_classes_see_changes(main_cluster: LocalCluster) -> None:
    """The effect checks are not vacuous: a victim deleted by a valid DELETE, and a ttl set
    again by a valid PUT, are seen by the same checks the classes run."""
    runner = Runner(config(main_cluster))
    async with aiohttp.ClientSession() as session:
        runner._session = session
        targets, ring = await runner._discover()
        ctx = runner._context(targets, ring, True)
    t, out = ctx.targets[0], Outcome()
    found = await victim(ctx, t, out, "see_changes")
    assert found is not None, dict(out.seen)
    ans = await delete(ctx, t, counter_path(ctx, found[0], del_table(ctx))
                       + f"?op_id={ctx.op_id('see_changes')}")
    assert ans.status == 200, ans.describe()
    await check_victim(ctx, out, found, "a valid delete")
    assert dict(out.failure_kinds) == {"effect": 1}
    ans = await put(ctx, t, f"/v1/tables/{ttl_table(ctx)}", jdump({"ttl_s": 12345}))
    assert ans.status == 200, ans.describe()
    assert await ttl_on(ctx, Outcome(), t, ttl_table(ctx)) == 12345


# -- units ---------------------------------------------------------------------------------------


def test_registry() -> None:
    assert len(REGISTRY) >= 25
    groups = {c.group for c in REGISTRY.values()}
    assert groups == {"http", "conn", "peer"}
    assert all(c.doc for c in REGISTRY.values())


def test_parse_response() -> None:
    raw = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
           b"Content-Length: 40\r\n\r\n"
           b'{"error":{"code":"bad_x","message":"m"}}')
    status, headers, body, used = parse_response(raw + b"HTTP/1.1 200 OK")
    assert (status, used) == (400, len(raw))
    assert error_shape(headers["content-type"], body) == {"code": "bad_x", "message": "m"}
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert parse_response(chunked)[2] == b"abc"
    assert parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")[0] is None
    assert error_shape("text/plain", b'{"error":{"code":"x","message":"m"}}') is None
    assert error_shape("application/json", b'{"error":{"code":"","message":"m"}}') is None


def test_expect_reject() -> None:
    out = Outcome()
    ok = Answer(400, {"content-type": "application/json"},
                b'{"error":{"code":"bad_delta","message":"m"}}')
    expect_reject(out, "ok", ok, (400,), ("bad_delta",))
    assert out.ok and out.seen["400"] == 1
    expect_reject(out, "plain", Answer(400, {"content-type": "text/plain"}, b"Bad"), (400,))
    expect_reject(out, "5xx", Answer(500, {"content-type": "text/plain"}, b"oops"), (400,))
    expect_reject(out, "code", ok, (400,), ("bad_op_id",))
    expect_reject(out, "closed", Answer(end="closed"), (400,))
    expect_reject(out, "closed ok", Answer(end="closed"), (400,), may_close=True)
    expect_reject(out, "open", Answer(end="open"), (400,), may_close=True)
    assert dict(out.failure_kinds) == {"shape": 1, "5xx": 1, "code": 1, "status": 2}


def test_parse_metrics() -> None:
    text = ('# HELP idc_peer_auth_rejected_total x\n'
            'idc_peer_auth_rejected_total{reason="bad_mac"} 3\n'
            'idc_http_refused_total{reason="header_timeout"} 2.0\n'
            'idc_unauthorized_total 7\nidc_other_total 1\n')
    assert parse_metrics(text) == {"idc_peer_auth_rejected_total{bad_mac}": 3.0,
                                   "idc_http_refused_total{header_timeout}": 2.0,
                                   "idc_unauthorized_total": 7.0}


def test_cli_help_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "--secret-file" in capsys.readouterr().out
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(REGISTRY)
