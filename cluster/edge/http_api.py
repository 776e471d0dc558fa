"""The client HTTP API (CONTRACT.md): JSON or msgpack in and out, errors as {"error": {...}}.

Translates requests into ``Node`` calls and ``ClusterError`` into status codes, once, here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from cluster.core.errors import (
    BadRequest,
    BodyTooLarge,
    ClusterError,
    ConfigError,
    OpExpired,
    RequestTimeout,
    Unauthorized,
    Unavailable,
)
from cluster.core.metrics import render
from cluster.core.ops import Op
from cluster.edge.listener import Listener
from cluster.edge.openapi import spec
from cluster.edge.validate import (
    CheckedOp,
    check_batch,
    check_consistency,
    check_name,
    check_op,
    decode_body,
    is_msgpack,
)
from cluster.roles.admission import expired, stale_after_ms
from cluster.roles.member import Node
from cluster.transport.auth import PeerAuth
from cluster.transport.wire import Status

log = logging.getLogger("cluster.http")
NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)
EDGE_KEY: web.AppKey[Edge] = web.AppKey("edge")


class Edge:
    """What the API needs from the node's edge: the listener (slow-client guard and its
    counters), the peer authentication counters, and the bearer tokens (none: no token)."""

    def __init__(self, listener: Listener | None = None, auth: PeerAuth | None = None,
                 tokens: frozenset[str] = frozenset()) -> None:
        self.listener = listener
        self.auth = auth
        self.tokens = tokens

    def authorized(self, header: str | None) -> bool:
        if not self.tokens:
            return True
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        # compare against every token, always: how long it takes tells nothing about which
        given = token.strip().encode("utf-8", "surrogateescape")  # any bytes a client sent
        return sum(hmac.compare_digest(given, t.encode()) for t in self.tokens) > 0


def load_tokens(path: str) -> frozenset[str]:
    """The bearer tokens a node accepts: one per non-empty line (two during a rotation)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"token_file: cannot read {path}: {exc}") from exc
    tokens = frozenset(line.strip() for line in text.splitlines() if line.strip())
    if not tokens or any(len(t) < 16 for t in tokens):
        raise ConfigError(f"token_file: {path} needs one or more tokens of 16+ characters")
    return tokens

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
_OVERFLOW = int(Status.OVERFLOW)
_OVERFLOW_MESSAGE = "the counter's entry on its leader would pass 2^64 - 1; not applied"
_RESULTS[_OVERFLOW] = {"applied": False, "status": 400,
                       "error": {"code": "counter_overflow", "message": _OVERFLOW_MESSAGE}}
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
    cfg = request.app[NODE_KEY].config
    try:
        if request.content.is_eof():  # the body came whole with the headers: no timer needed
            raw = await request.read()
        else:
            async with asyncio.timeout(cfg.body_timeout):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"body larger than {request.app._client_max_size} bytes") from exc
    except TimeoutError as exc:
        raise RequestTimeout(f"request body not complete within {cfg.body_timeout:g} s") from exc
    return decode_body(raw, request.headers.get("Content-Type", ""),
                       max_depth=cfg.max_nesting_depth)


def _expired(node: Node, op: CheckedOp) -> bool:
    table, _key, _op_id, _delta, _attempt, age_ms = op
    return expired(node.state.window(table), age_ms)


def _as_ops(checked: list[CheckedOp]) -> list[Op]:
    """The ops to submit: each checked op without its ``age_ms`` (see ``_births``)."""
    return [Op._make(op[:5]) for op in checked]


def _births(node: Node, checked: list[CheckedOp]) -> list[float]:
    """When the client first sent each op (this node's wall clock less its ``age_ms``): the
    leader refuses a retry once it is older than the window, however long it took to reach it
    (``cluster.roles.coordinator``)."""
    now = node.clock()
    return [now - op[5] / 1000.0 for op in checked]


async def post_counter(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    table = check_name(request.match_info["table"], "table")
    key = check_name(request.match_info["key"], "key")
    op = check_op(await _read_body(request), table, key,
                  max_op_id_bytes=node.config.max_op_id_bytes,
                  max_depth=node.config.max_nesting_depth,
                  max_clock_skew_ms=int(node.config.max_clock_skew * 1000),
                  stale_after_ms=stale_after_ms(node.config))
    if _expired(node, op):
        node.metrics.expired += 1
        age_ms = op[5]
        raise OpExpired(f"op is {age_ms} ms old; this node recognises retries for "
                        f"{node.state.window(table):g} s")
    status = (await node.submit(_as_ops([op]), _births(node, [op])))[0]
    if status == _EXPIRED:
        raise OpExpired(f"op became older than the dedup window ({node.state.window(table):g} s) "
                        "before its leader could apply it; outcome unknown")
    if status == _UNAVAILABLE or status == int(Status.ERROR):
        raise Unavailable("write quorum not met in time; retry with the same op_id")
    if status == _OVERFLOW:
        raise BadRequest(_OVERFLOW_MESSAGE, code="counter_overflow")
    if _wants_msgpack(request):
        return web.Response(body=_MSGPACK_RESULTS[status], content_type="application/msgpack")
    return web.Response(body=_JSON_RESULTS[status], content_type="application/json")


async def post_batch(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    cfg = node.config
    ops = check_batch(await _read_body(request), max_ops=cfg.max_batch_ops,
                      max_op_id_bytes=cfg.max_op_id_bytes, max_depth=cfg.max_nesting_depth,
                      max_clock_skew_ms=int(cfg.max_clock_skew * 1000),
                      stale_after_ms=stale_after_ms(node.config))
    statuses = [_EXPIRED] * len(ops)
    live = [i for i, op in enumerate(ops) if not _expired(node, op)]
    node.metrics.expired += len(ops) - len(live)
    if len(live) == len(ops):
        statuses = await node.submit(_as_ops(ops), _births(node, ops)) if ops else []
    elif live:
        sub = [ops[i] for i in live]
        for i, s in zip(live, await node.submit(_as_ops(sub), _births(node, sub)), strict=True):
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


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 once the node is settled and serving (``/v1/health`` says ``ok``)."""
    node = request.app[NODE_KEY]
    if not node.ready:
        return reply(request, {"error": {"code": "not_ready", "message": (
            f"{node.id} is recovering or settling in-doubt ops; not serving yet")}}, status=503)
    return reply(request, {"node": node.id, "ready": True})


async def openapi(request: web.Request) -> web.Response:
    cfg = request.app[NODE_KEY].config
    return web.json_response(spec(max_batch_ops=cfg.max_batch_ops,
                                  max_op_id_bytes=cfg.max_op_id_bytes,
                                  max_body_bytes=cfg.max_body_bytes,
                                  token_required=bool(request.app[EDGE_KEY].tokens)))


async def metrics(request: web.Request) -> web.Response:
    edge = request.app[EDGE_KEY]
    listener = edge.listener
    text = render(request.app[NODE_KEY], auth=edge.auth,
                  edge=listener.stats if listener is not None else None)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


OPEN_ROUTES = ("health", "ready", "openapi")  # answered without a token (probes, discovery)


def _timed(route: str, handler: Handler) -> Handler:
    """The token check, errors to their contract shape, latency into the route's histogram, and
    the slow-client guard told that this connection's request headers are in."""
    needs_token = route not in OPEN_ROUTES

    async def wrapped(request: web.Request) -> web.StreamResponse:
        node, edge = request.app[NODE_KEY], request.app[EDGE_KEY]
        hist = node.metrics.request_histogram(route)
        start = time.perf_counter()
        guard = edge.listener.guard_of(request.protocol) if edge.listener is not None else None
        if guard is not None:
            guard.request_started()
        try:
            if needs_token and edge.tokens and not edge.authorized(
                    request.headers.get("Authorization")):
                raise Unauthorized("this node needs 'Authorization: Bearer <token>'")
            return await handler(request)
        except ClusterError as exc:
            if isinstance(exc, BadRequest):
                node.metrics.bad_requests += 1
            resp = reply(request, exc.to_dict(), status=exc.status)
            if isinstance(exc, Unauthorized):
                resp.headers["WWW-Authenticate"] = 'Bearer realm="idemcount"'
                node.metrics.unauthorized += 1
            elif isinstance(exc, RequestTimeout):
                resp.force_close()  # the rest of a slow body is not worth waiting for
            return resp
        finally:
            hist.observe(time.perf_counter() - start)
            if guard is not None:
                guard.request_finished()

    return wrapped


async def _not_found(request: web.Request) -> web.Response:
    return reply(request, {"error": {"code": "not_found", "message": f"no route {request.path}"}},
                 status=404)


class ShapedErrors(RequestHandler):
    """aiohttp's protocol, with its own answers (a request it cannot parse: bad request line,
    headers too long, bad framing) in the contract's error shape. Those are logged at debug
    level, so junk cannot flood the log; a 500 (a bug) is logged in full."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request", exc_info=exc)
        else:
            log.debug("unparsable request: %s", message or exc)
        if request.writer.output_size > 0:  # a response was on its way: nothing to add
            raise ConnectionError("response already started; closing the connection")
        code = "internal" if status >= 500 else "bad_http"
        text = "internal error" if status >= 500 else (message or "malformed HTTP request")
        resp = web.Response(status=status, content_type="application/json",
                            body=json.dumps({"error": {"code": code, "message": text[:500]}},
                                            separators=(",", ":")).encode())
        resp.force_close()
        return resp


def http_protocol(server: web.Server) -> RequestHandler:
    """A new connection's protocol: aiohttp's, shaped (what ``server()`` would build)."""
    return ShapedErrors(server, loop=asyncio.get_running_loop(), **server._kwargs)


def make_app(node: Node, edge: Edge | None = None) -> web.Application:
    app = web.Application(client_max_size=node.config.max_body_bytes)
    app[NODE_KEY] = node
    app[EDGE_KEY] = edge if edge is not None else Edge()
    app.router.add_post("/v1/counters/{table}/{key}", _timed("post_counter", post_counter))
    app.router.add_post("/v1/batch", _timed("batch", post_batch))
    app.router.add_get("/v1/counters/{table}/{key}", _timed("get_counter", get_counter))
    app.router.add_get("/v1/health", _timed("health", health))
    app.router.add_get("/v1/ready", _timed("ready", ready))
    app.router.add_get("/metrics", _timed("metrics", metrics))
    app.router.add_get("/v1/openapi.json", _timed("openapi", openapi))
    app.router.add_route("*", "/{tail:.*}", _timed("not_found", _not_found))
    return app
