"""HTTP to one node per call (aiohttp, msgpack or JSON): the one place lower-layer errors become
``client.errors``. No retries here; the retry loop in ``client.retry`` decides what to do next.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgpack

from client.errors import (
    AttemptTimeoutError,
    BadRequestError,
    ConnectFailedError,
    ConnectionLostError,
    OpExpiredError,
    ServerError,
    TransientError,
    UnavailableError,
)
from client.stats import ClientStats

MSGPACK = "application/msgpack"


class HttpTransport:
    """One aiohttp session shared by every node; ``requests`` counts HTTP requests sent."""

    def __init__(self, *, use_msgpack: bool = True, max_connections: int = 64,
                 stats: ClientStats | None = None, token: str | None = None,
                 ca_file: str | None = None) -> None:
        self.use_msgpack = use_msgpack
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.ca_file = ca_file
        self.stats = stats
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    async def start(self) -> None:
        if self._session is None:
            tls = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
            connector = aiohttp.TCPConnector(limit=self.max_connections, force_close=False,
                                             enable_cleanup_closed=False, ssl=tls)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _encode(self, body: Any) -> tuple[bytes, dict[str, str]]:
        if self.use_msgpack:
            return msgpack.packb(body), {"Content-Type": MSGPACK, "Accept": MSGPACK, **self._auth}
        return (json.dumps(body, separators=(",", ":")).encode(),
                {"Content-Type": "application/json", "Accept": "application/json", **self._auth})

    async def request(self, method: str, url: str, body: Any = None, *,
                      timeout: float) -> tuple[int, Any]:
        """(status, decoded body); raises a ``TransientError`` subclass when no answer came."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        if body is not None:
            data, headers = self._encode(body)
        else:
            data, headers = None, {"Accept": MSGPACK if self.use_msgpack else "application/json",
                                   **self._auth}
        self.requests += 1
        if self.stats is not None:
            self.stats.http_requests += 1
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                async with self._session.request(method, url, data=data,
                                                 headers=headers) as resp:
                    raw = await resp.read()
                    status, ctype = resp.status, resp.headers.get("Content-Type", "")
        except TimeoutError as exc:
            raise AttemptTimeoutError(f"{method} {url}: no answer within {timeout:.3f}s",
                                      node=url) from exc
        except aiohttp.ClientConnectorError as exc:
            raise ConnectFailedError(f"{method} {url}: cannot connect: {exc}", node=url) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectionLostError(f"{method} {url}: connection lost: {exc!r}",
                                      node=url) from exc
        return status, _decode(raw, ctype, url)

    async def post_op(self, base: str, table: str, key: str, body: Mapping[str, Any], *,
                      timeout: float) -> dict[str, Any]:
        status, payload = await self.request("POST", f"{base}/v1/counters/{table}/{key}",
                                             dict(body), timeout=timeout)
        if status == 200 and isinstance(payload, dict):
            return payload
        raise status_error(status, payload, base)

    async def post_batch(self, base: str, ops: Sequence[Mapping[str, Any]], *,
                         timeout: float) -> list[dict[str, Any]]:
        status, payload = await self.request("POST", f"{base}/v1/batch",
                                             {"ops": list(ops)}, timeout=timeout)
        if status == 200 and isinstance(payload, dict):
            results = payload.get("results")
            if isinstance(results, list) and len(results) == len(ops):
                return results
            raise ServerError(f"{base}: batch answer has the wrong shape", node=base)
        raise status_error(status, payload, base)

    async def delete_op(self, base: str, table: str, key: str, params: Mapping[str, Any], *,
                        timeout: float) -> dict[str, Any]:
        """``DELETE /v1/counters/{table}/{key}?op_id=..`` with the op's fields (``op_id``,
        ``attempt``, ``age_ms``, ``ts_ms``) as query parameters; answered like an add."""
        return await self.call_json("DELETE", base, f"/v1/counters/{table}/{key}",
                                    params=query(params), timeout=timeout)

    async def get_json(self, base: str, path: str, *, timeout: float,
                       params: str = "") -> dict[str, Any]:
        return await self.call_json("GET", base, path, params=params, timeout=timeout)

    async def call_json(self, method: str, base: str, path: str, body: Any = None, *,
                        timeout: float, params: str = "") -> dict[str, Any]:
        """One request whose 200 answer is an object; any other answer raises its error.
        ``params``: the query string, ``?`` included (see ``query``)."""
        status, payload = await self.request(method, f"{base}{path}{params}", body,
                                             timeout=timeout)
        if status == 200 and isinstance(payload, dict):
            return payload
        raise status_error(status, payload, base)


def query(params: Mapping[str, Any]) -> str:
    """``?a=1&b=x`` from the parameters that are not None (``""`` when none is); values are
    percent-encoded except ``:``, which op ids carry and a query may hold as it is."""
    kept = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(kept, safe=":") if kept else ""


def _decode(raw: bytes, ctype: str, url: str) -> Any:
    if not raw:
        return None
    try:
        if "msgpack" in ctype:
            return msgpack.unpackb(raw, raw=False)
        return json.loads(raw)
    except (ValueError, TypeError, msgpack.UnpackException):
        return {"error": {"code": "undecodable", "message": raw[:200].decode("latin-1")}}


def status_error(status: int, payload: Any, node: str) -> Exception:
    """The error for a non-200 answer (or an op result carrying ``status``)."""
    err = payload.get("error", {}) if isinstance(payload, dict) else {}
    code = str(err.get("code", "")) if isinstance(err, dict) else ""
    message = str(err.get("message", "")) if isinstance(err, dict) else ""
    text = f"{node}: HTTP {status} {code}: {message}".rstrip(": ")
    if status == 410 or code == "op_expired":
        return OpExpiredError(text, node=node)
    if status == 503:
        return UnavailableError(text, node=node)
    if 400 <= status < 500 and status not in (408, 429):
        return BadRequestError(text, status=status, code=code, node=node)
    if status == 200:
        return ServerError(f"{node}: unexpected answer {payload!r:.200}", node=node)
    return ServerError(text, node=node)


def op_result_error(result: Mapping[str, Any], node: str) -> Exception | None:
    """None for an applied or duplicate op result in a batch answer, else its error."""
    if result.get("applied") or result.get("duplicate"):
        return None
    status = result.get("status", 503)
    return status_error(int(status) if isinstance(status, int) else 503, result, node)


__all__ = ["HttpTransport", "TransientError", "op_result_error", "query", "status_error"]
