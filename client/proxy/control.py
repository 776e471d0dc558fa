"""The control API, a subset of Toxiproxy's (same paths and JSON shapes):

    GET  /version                           GET  /proxies
    POST /proxies                           {"name", "listen", "upstream", "enabled", "protocol"}
    GET|POST|DELETE /proxies/{name}         POST {"enabled": false} is "down"
    GET|POST /proxies/{name}/toxics         POST {"name", "type", "stream", "toxicity",
                                                  "attributes"}
    GET|POST|DELETE /proxies/{name}/toxics/{toxic}
    POST /reset                             remove all toxics, enable all proxies
    POST /populate                          [proxy, ...] -> {"proxies": [...]}

``protocol`` (tcp, http, peer) is our addition: it lets message toxics see whole HTTP messages
or peer frames. Errors answer ``{"error": "...", "status": N}`` as Toxiproxy does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from aiohttp import web

from client.proxy.errors import ProxyError
from client.proxy.toxics import ToxicError
from cluster.core.config import parse_hostport


class ProxyServer(Protocol):
    """What the control API needs of the proxies it serves (``client.proxy.server``); declared
    here so the API does not import the server that starts it."""

    proxies: dict[str, Any]

    async def create(self, name: str, listen: str, upstream: str, *, protocol: str = "tcp",
                     enabled: bool = True) -> Any: ...

    def get(self, name: str) -> Any: ...

    async def delete(self, name: str) -> None: ...

    async def reset(self) -> None: ...

    async def populate(self, items: Iterable[Mapping[str, Any]]) -> list[Any]: ...

VERSION = "idemcount-proxy 0.1 (toxiproxy-compatible subset)"
SERVER: web.AppKey[Any] = web.AppKey("proxy_server", object)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (ProxyError, ToxicError) as exc:
            status = getattr(exc, "status", 400)
            return _json({"error": str(exc), "status": status}, status)

    return wrapped


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ProxyError(f"body is not JSON: {exc}") from exc


def _srv(request: web.Request) -> ProxyServer:
    return request.app[SERVER]


async def version(request: web.Request) -> web.Response:
    return web.Response(text=VERSION)


async def list_proxies(request: web.Request) -> web.Response:
    return _json({n: p.to_json() for n, p in _srv(request).proxies.items()})


async def create_proxy(request: web.Request) -> web.Response:
    body = await _body(request)
    if not isinstance(body, dict):
        raise ProxyError("body: expected an object")
    proxy = await _srv(request).create(
        str(body.get("name", "")), str(body.get("listen", "127.0.0.1:0")),
        str(body.get("upstream", "")), protocol=str(body.get("protocol", "tcp")),
        enabled=bool(body.get("enabled", True)))
    return _json(proxy.to_json(), 201)


async def get_proxy(request: web.Request) -> web.Response:
    return _json(_srv(request).get(request.match_info["name"]).to_json())


async def update_proxy(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    body = await _body(request)
    if not isinstance(body, dict):
        raise ProxyError("body: expected an object")
    await proxy.update(body)
    return _json(proxy.to_json())


async def delete_proxy(request: web.Request) -> web.Response:
    await _srv(request).delete(request.match_info["name"])
    return web.Response(status=204)


async def list_toxics(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    return _json([t.to_json() for t in proxy.toxics.values()])


async def create_toxic(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    body = await _body(request)
    if not isinstance(body, dict):
        raise ProxyError("body: expected an object")
    return _json(proxy.add_toxic(body).to_json())


async def get_toxic(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    return _json(proxy.toxic(request.match_info["toxic"]).to_json())


async def update_toxic(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    body = await _body(request)
    if not isinstance(body, dict):
        raise ProxyError("body: expected an object")
    return _json(proxy.update_toxic(request.match_info["toxic"], body).to_json())


async def delete_toxic(request: web.Request) -> web.Response:
    proxy = _srv(request).get(request.match_info["name"])
    proxy.remove_toxic(request.match_info["toxic"])
    return web.Response(status=204)


async def reset(request: web.Request) -> web.Response:
    await _srv(request).reset()
    return web.Response(status=204)


async def populate(request: web.Request) -> web.Response:
    body = await _body(request)
    if isinstance(body, dict):
        body = body.get("proxies", [])
    if not isinstance(body, list):
        raise ProxyError("body: expected a list of proxies")
    proxies = await _srv(request).populate(body)
    return _json({"proxies": [p.to_json() for p in proxies]}, 201)


def make_app(server: ProxyServer) -> web.Application:
    app = web.Application()
    app[SERVER] = server
    r = app.router
    routes: list[tuple[str, str, Handler]] = [
        ("GET", "/version", version),
        ("GET", "/proxies", list_proxies),
        ("POST", "/proxies", create_proxy),
        ("GET", "/proxies/{name}", get_proxy),
        ("POST", "/proxies/{name}", update_proxy),
        ("PATCH", "/proxies/{name}", update_proxy),
        ("DELETE", "/proxies/{name}", delete_proxy),
        ("GET", "/proxies/{name}/toxics", list_toxics),
        ("POST", "/proxies/{name}/toxics", create_toxic),
        ("GET", "/proxies/{name}/toxics/{toxic}", get_toxic),
        ("POST", "/proxies/{name}/toxics/{toxic}", update_toxic),
        ("PATCH", "/proxies/{name}/toxics/{toxic}", update_toxic),
        ("DELETE", "/proxies/{name}/toxics/{toxic}", delete_toxic),
        ("POST", "/reset", reset),
        ("POST", "/populate", populate),
    ]
    for method, path, handler in routes:
        r.add_route(method, path, _errors(handler))
    return app


async def start_control(server: ProxyServer, address: str) -> tuple[web.AppRunner,
                                                                     tuple[str, int]]:
    host, port = parse_hostport(address, name="control")
    runner = web.AppRunner(make_app(server), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    return runner, (host, sock.getsockname()[1])
