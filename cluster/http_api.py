"""The client HTTP API (CONTRACT.md): JSON or msgpack in and out, errors as {"error": {...}}.

Translates requests into ``Node`` calls and ``ClusterError`` into status codes, once, here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from cluster.errors import BadRequest, BodyTooLarge, ClusterError, OpExpired, Unavailable
from cluster.metrics import render
from cluster.node import Node, Op
from cluster.openapi import spec
from cluster.validate import (
    CheckedOp,
    check_batch,
    check_consistency,
    check_name,
    check_op,
    decode_body,
    is_msgpack,
)
from cluster.wire import Status

NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)

_APPLIED, _DUPLICATE = int(Status.APPLIED), int(Status.DUPLICATE)
_UNAVAILABLE, _EXPIRED = int(Status.UNAVAILABLE), int(Status.EXPIRED)

_RESULTS: dict[int, dict[str, Any]] = {
    _APPLIED: {"applied": True},
    _DUPLICATE: {"applied": False, "duplicate": True},
    _UNAVAILABLE: {"applied": False, "status": 503,
                   "error": {"code": "unavailable",
                             "message": "write quorum not met in time; retry with the same op_id"}},
    _EXPIRED: {"applied": False, "status": 410,
               "error": {"code": "op_expired",
                         "message": "op older than the dedup window; outcome unknown"}},
}
_RESULTS[int(Status.ERROR)] = _RESULTS[_UNAVAILABLE]
_JSON_RESULTS = {k: json.dumps(v, separators=(",", ":")).encode() for k, v in _RESULTS.items()}
_MSGPACK_RESULTS = {k: msgpack.packb(v) for k, v in _RESULTS.items()}


def _wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    if accept:
        return "msgpack" in accept
    return is_msgpack(request.headers.get("Content-Type", ""))


def reply(request: web.Request, payload: Any, status: int = 200) -> web.Response:
    if _wants_msgpack(request):
        return web.Response(body=msgpack.packb(payload), status=status,
                            content_type="application/msgpack")
    return web.Response(body=json.dumps(payload, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


async def _read_body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"body larger than {request.app._client_max_size} bytes") from exc
    return decode_body(raw, request.headers.get("Content-Type", ""))


def _stale_after_ms(node: Node) -> int:
    """Half the time it takes to declare a leader down: an op older than this may have been
    retried at a replica that took over, so it is checked there first (cluster.validate)."""
    return int(node.config.failure_timeout * 500)


def _expired(node: Node, op: CheckedOp) -> bool:
    """Older than the table's window; a strategy with no window (``none``) never refuses."""
    if op[5] <= 0:
        return False
    window = node.state.window(op[0])
    return window > 0 and op[5] > window * 1000.0


async def post_counter(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    table = check_name(request.match_info["table"], "table")
    key = check_name(request.match_info["key"], "key")
    op = check_op(await _read_body(request), table, key,
                  max_op_id_bytes=node.config.max_op_id_bytes,
                  max_clock_skew_ms=int(node.config.max_clock_skew * 1000),
                  stale_after_ms=_stale_after_ms(node))
    if _expired(node, op):
        node.metrics.expired += 1
        raise OpExpired(f"op is {op[5]} ms old; this node recognises retries for "
                        f"{node.state.window(table):g} s")
    status = (await node.submit([op[:5]]))[0]
    if status == _UNAVAILABLE or status == int(Status.ERROR):
        raise Unavailable("write quorum not met in time; retry with the same op_id")
    if _wants_msgpack(request):
        return web.Response(body=_MSGPACK_RESULTS[status], content_type="application/msgpack")
    return web.Response(body=_JSON_RESULTS[status], content_type="application/json")


async def post_batch(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    cfg = node.config
    ops = check_batch(await _read_body(request), max_ops=cfg.max_batch_ops,
                      max_op_id_bytes=cfg.max_op_id_bytes,
                      max_clock_skew_ms=int(cfg.max_clock_skew * 1000),
                      stale_after_ms=_stale_after_ms(node))
    statuses = [_EXPIRED] * len(ops)
    live = [i for i, op in enumerate(ops) if not _expired(node, op)]
    node.metrics.expired += len(ops) - len(live)
    if len(live) == len(ops):
        statuses = await node.submit([op[:5] for op in ops]) if ops else []
    elif live:
        sub: list[Op] = [ops[i][:5] for i in live]
        for i, s in zip(live, await node.submit(sub), strict=True):
            statuses[i] = s
    if _wants_msgpack(request):
        return web.Response(body=msgpack.packb({"results": [_RESULTS[s] for s in statuses]}),
                            content_type="application/msgpack")
    body = b'{"results":[' + b",".join([_JSON_RESULTS[s] for s in statuses]) + b"]}"
    return web.Response(body=body, content_type="application/json")


async def get_counter(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    table = check_name(request.match_info["table"], "table")
    key = check_name(request.match_info["key"], "key")
    consistency = check_consistency(request.query.get("consistency"))
    value = await node.read(table, key, consistency)
    return reply(request, {"value": value})


async def health(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    return reply(request, node.health())


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(spec())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=render(request.app[NODE_KEY]),
                        content_type="text/plain", charset="utf-8")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _timed(route: str, handler: Handler) -> Handler:
    """Errors to their contract shape, latency into the route's histogram."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        node = request.app[NODE_KEY]
        hist = node.metrics.request_histogram(route)
        start = time.perf_counter()
        try:
            return await handler(request)
        except ClusterError as exc:
            if isinstance(exc, BadRequest):
                node.metrics.bad_requests += 1
            return reply(request, exc.to_dict(), status=exc.status)
        finally:
            hist.observe(time.perf_counter() - start)

    return wrapped


async def _not_found(request: web.Request) -> web.Response:
    return reply(request, {"error": {"code": "not_found", "message": f"no route {request.path}"}},
                 status=404)


def make_app(node: Node) -> web.Application:
    app = web.Application(client_max_size=node.config.max_body_bytes)
    app[NODE_KEY] = node
    app.router.add_post("/v1/counters/{table}/{key}", _timed("post_counter", post_counter))
    app.router.add_post("/v1/batch", _timed("batch", post_batch))
    app.router.add_get("/v1/counters/{table}/{key}", _timed("get_counter", get_counter))
    app.router.add_get("/v1/health", _timed("health", health))
    app.router.add_get("/metrics", _timed("metrics", metrics))
    app.router.add_get("/v1/openapi.json", _timed("openapi", openapi))
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app
