"""The client HTTP API (CONTRACT.md) on aiohttp: JSON or msgpack in and out, errors as
{"error": {...}}.

Every route is here, in the app ``make_app`` builds; what the client routes answer is in
``cluster.edge.routes``, shared with the raw protocol (``cluster.edge.raw``), which serves the hot
routes itself and hands any other request to this app. ``ClusterError`` becomes a status code
in ``_timed`` (and in ``raw``, through the same ``routes.refusal``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from cluster.core.errors import BodyTooLarge, ClusterError, RequestTimeout
from cluster.core.metrics import render
from cluster.edge import routes
from cluster.edge.openapi import spec
from cluster.edge.routes import (
    OPEN_ROUTES,
    WWW_AUTHENTICATE,
    Edge,
    encode,
    load_tokens,
    refusal,
    wants_msgpack,
)
from cluster.roles import membership
from cluster.roles.member import Node

log = logging.getLogger("cluster.http")
NODE_KEY: web.AppKey[Node] = web.AppKey("node", Node)
EDGE_KEY: web.AppKey[Edge] = web.AppKey("edge", Edge)

__all__ = ["EDGE_KEY", "NODE_KEY", "OPEN_ROUTES", "Edge", "ShapedErrors", "http_protocol",
           "load_tokens", "make_app", "reply"]


def _wants_msgpack(request: web.Request) -> bool:
    return wants_msgpack(request.headers.get("Accept", ""),
                         request.headers.get("Content-Type", ""))


def reply(request: web.Request, payload: Any, status: int = 200) -> web.Response:
    return _encoded(request, encode(payload, _wants_msgpack(request)), status)


def _encoded(request: web.Request, body: bytes, status: int = 200) -> web.Response:
    ctype = "application/msgpack" if _wants_msgpack(request) else "application/json"
    return web.Response(body=body, status=status, content_type=ctype)


def _body_reader(request: web.Request) -> routes.BodyReader:
    async def read() -> bytes:
        cfg = request.app[NODE_KEY].config
        try:
            if request.content.is_eof():  # the body came whole with the headers: no timer
                return await request.read()
            async with asyncio.timeout(cfg.body_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BodyTooLarge(f"body larger than {request.app._client_max_size} bytes") from exc
        except TimeoutError as exc:
            raise RequestTimeout(
                f"request body not complete within {cfg.body_timeout:g} s") from exc

    return read


async def post_counter(request: web.Request) -> web.Response:
    return _encoded(request, await routes.post_counter(
        request.app[NODE_KEY], request.match_info["table"], request.match_info["key"],
        _body_reader(request), request.headers.get("Content-Type", ""),
        _wants_msgpack(request)))


async def post_batch(request: web.Request) -> web.Response:
    return _encoded(request, await routes.post_batch(
        request.app[NODE_KEY], _body_reader(request), request.headers.get("Content-Type", ""),
        _wants_msgpack(request)))


async def get_counter(request: web.Request) -> web.Response:
    return _encoded(request, await routes.get_counter(
        request.app[NODE_KEY], request.match_info["table"], request.match_info["key"],
        request.query.get("consistency"), _wants_msgpack(request)))


async def delete_counter(request: web.Request) -> web.Response:
    return _encoded(request, await routes.delete_counter(
        request.app[NODE_KEY], request.match_info["table"], request.match_info["key"],
        request.query, _wants_msgpack(request)))


async def post_read(request: web.Request) -> web.Response:
    return _encoded(request, await routes.post_read(
        request.app[NODE_KEY], _body_reader(request), request.headers.get("Content-Type", ""),
        _wants_msgpack(request)))


async def scan_counters(request: web.Request) -> web.Response:
    return _encoded(request, await routes.scan_counters(
        request.app[NODE_KEY], request.match_info["table"], request.query,
        _wants_msgpack(request)))


async def put_table(request: web.Request) -> web.Response:
    return _encoded(request, await routes.put_table(
        request.app[NODE_KEY], request.match_info["table"], _body_reader(request),
        request.headers.get("Content-Type", ""), _wants_msgpack(request)))


async def get_tables(request: web.Request) -> web.Response:
    return _encoded(request, await routes.get_tables(request.app[NODE_KEY],
                                                     _wants_msgpack(request)))


async def health(request: web.Request) -> web.Response:
    return _encoded(request, routes.health(request.app[NODE_KEY], _wants_msgpack(request)))


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 once the node is settled and serving (``/v1/health`` says ``ok``)."""
    node = request.app[NODE_KEY]
    if not node.ready:
        return reply(request, {"error": {"code": "not_ready", "message": (
            f"{node.id} is recovering or settling in-doubt ops; not serving yet")}}, status=503)
    return reply(request, {"node": node.id, "ready": True})


async def ring(request: web.Request) -> web.Response:
    """The membership this node holds: version, members and their states (``down`` for a
    member the failure detector sees down), rf, and the move under way."""
    return reply(request, membership.view(request.app[NODE_KEY]))


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


def _timed(route: str, handler: Handler) -> Handler:
    """The token check, errors to their contract shape, latency into the route's histogram, and
    the slow-client guard told that this connection's request headers are in."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        node, edge = request.app[NODE_KEY], request.app[EDGE_KEY]
        hist = node.metrics.request_histogram(route)
        start = time.perf_counter()
        guard = edge.listener.guard_of(request.protocol) if edge.listener is not None else None
        if guard is not None:
            guard.request_started()
        try:
            edge.check_token(route, request.headers.get("Authorization"))
            return await handler(request)
        except ClusterError as exc:
            payload, unauthorized, close = refusal(node.metrics, exc)
            resp = reply(request, payload, status=exc.status)
            if unauthorized:
                resp.headers["WWW-Authenticate"] = WWW_AUTHENTICATE
            elif close:
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
    app.router.add_delete("/v1/counters/{table}/{key}", _timed("delete", delete_counter))
    app.router.add_get("/v1/counters/{table}", _timed("scan", scan_counters))
    app.router.add_post("/v1/read", _timed("read", post_read))
    app.router.add_get("/v1/tables", _timed("tables", get_tables))
    app.router.add_put("/v1/tables/{table}", _timed("put_table", put_table))
    app.router.add_get("/v1/health", _timed("health", health))
    app.router.add_get("/v1/ready", _timed("ready", ready))
    app.router.add_get("/v1/ring", _timed("ring", ring))
    app.router.add_get("/metrics", _timed("metrics", metrics))
    app.router.add_get("/v1/openapi.json", _timed("openapi", openapi))
    app.router.add_route("*", "/{tail:.*}", _timed("not_found", _not_found))
    return app
