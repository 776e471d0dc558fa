"""What the client routes answer, apart from the HTTP server that carries them.

The aiohttp app (``cluster.edge.http_api``) and the raw protocol (``cluster.edge.raw``) call the
same functions, so a request gets the same answer whichever path it took: each takes the route's
inputs as plain values (the body as a reader, so names are checked before a slow body is waited
for, as they always were) and returns the encoded 200 body, or raises a ``ClusterError`` that
``refusal`` turns into the contract's error shape.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgpack

from cluster.core.errors import (
    BadRequest,
    ClusterError,
    ConfigError,
    OpExpired,
    PeerError,
    RequestTimeout,
    Unauthorized,
    Unavailable,
)
from cluster.core.membership import MembershipError
from cluster.core.metrics import NodeMetrics
from cluster.core.ops import Op
from cluster.core.tables import TableError, TableSettings
from cluster.edge.listener import Listener
from cluster.edge.validate import (
    CheckedOp,
    check_batch,
    check_consistency,
    check_limit,
    check_name,
    check_op,
    check_prefix,
    check_reads,
    decode_body,
    is_msgpack,
    query_op,
)
from cluster.roles import scans
from cluster.roles.admission import expired, stale_after_ms
from cluster.roles.member import Node
from cluster.transport.auth import PeerAuth
from cluster.transport.wire import Status

OPEN_ROUTES = ("health", "ready", "ring", "openapi")  # no token needed (probes, discovery)
WWW_AUTHENTICATE = 'Bearer realm="idemcount"'

BodyReader = Callable[[], Awaitable[bytes]]  # the whole body, or a ClusterError (408, 413)


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

    def check_token(self, route: str, header: str | None) -> None:
        """Raise ``Unauthorized`` when ``route`` needs a token and ``header`` carries none
        that this node accepts."""
        if self.tokens and route not in OPEN_ROUTES and not self.authorized(header):
            raise Unauthorized("this node needs 'Authorization: Bearer <token>'")


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
_DELTA, _AGE = itemgetter(3), itemgetter(5)  # a checked op's delta (None: a delete) and age_ms
_OVERFLOW_MESSAGE = "the counter's entry on its leader would pass 2^64 - 1; not applied"
_RESULTS[_OVERFLOW] = {"applied": False, "status": 400,
                       "error": {"code": "counter_overflow", "message": _OVERFLOW_MESSAGE}}
_JSON_RESULTS = {k: json.dumps(v, separators=(",", ":")).encode() for k, v in _RESULTS.items()}
_MSGPACK_RESULTS = {k: msgpack.packb(v) for k, v in _RESULTS.items()}
_PACKER = msgpack.Packer()
_MSGPACK_RESULTS_KEY = _PACKER.pack_map_header(1) + _PACKER.pack("results")


def batch_results(statuses: list[int], mp: bool) -> bytes:
    """A batch's answer body, ``{"results": [...]}``, joined from each status's encoding made
    once (msgpack packing the list of dicts cost 4x as much)."""
    if mp:
        return b"".join([_MSGPACK_RESULTS_KEY, _PACKER.pack_array_header(len(statuses)),
                         *[_MSGPACK_RESULTS[s] for s in statuses]])
    return b'{"results":[' + b",".join([_JSON_RESULTS[s] for s in statuses]) + b"]}"


def wants_msgpack(accept: str, content_type: str) -> bool:
    """Replies follow ``Accept``; without one, the request's own body type."""
    if accept:
        return "msgpack" in accept
    return is_msgpack(content_type)


def encode(payload: Any, mp: bool) -> bytes:
    if mp:
        return msgpack.packb(payload)
    return json.dumps(payload, separators=(",", ":")).encode()


def refusal(metrics: NodeMetrics, exc: ClusterError) -> tuple[dict[str, Any], bool, bool]:
    """A refused request's error body, whether its answer carries ``WWW-Authenticate``
    (401), and whether the connection is closed after it (408: the rest of a slow body is not
    worth waiting for); counts the refusal in ``metrics``."""
    if isinstance(exc, BadRequest):
        metrics.bad_requests += 1
    unauthorized = isinstance(exc, Unauthorized)
    if unauthorized:
        metrics.unauthorized += 1
    return exc.to_dict(), unauthorized, isinstance(exc, RequestTimeout)


def _expired(node: Node, op: CheckedOp) -> bool:
    table, _key, _op_id, _delta, _attempt, age_ms = op
    return expired(node.state.window(table), age_ms)


def _as_ops(checked: list[CheckedOp]) -> list[Op]:
    """The ops to submit: each checked op without its ``age_ms`` (see ``_births``). Built with
    ``tuple.__new__``, which ``Op._make`` calls after a Python frame of its own."""
    new = tuple.__new__
    return [new(Op, op[:5]) for op in checked]


def _births(node: Node, checked: list[CheckedOp]) -> list[float]:
    """When the client first sent each op (this node's wall clock less its ``age_ms``): the
    leader refuses a retry once it is older than the window, however long it took to reach it
    (``cluster.roles.coordinator``)."""
    now = node.clock()
    if not any(map(_AGE, checked)):  # all new: one pass in C
        return [now] * len(checked)
    return [now - op[5] / 1000.0 for op in checked]


def _refuse_on_clock(node: Node, count: int) -> None:
    """503 ``clock_skew`` while the node's clock is off from a majority of its peers' (the
    whole request: every op in it would be stamped and judged by that clock)."""
    if count and node.refuses_clock(count):
        raise Unavailable(f"this node's clock is more than {node.config.max_clock_skew:g} s "
                          "off from a majority of its peers'; it refuses to count rather than "
                          "risk counting twice. Retry with the same op_id at another node",
                          code="clock_skew")


async def post_counter(node: Node, table: str, key: str, read: BodyReader, content_type: str,
                       mp: bool) -> bytes:
    """``POST /v1/counters/{table}/{key}``: one op."""
    cfg = node.config
    table = check_name(table, "table")
    key = check_name(key, "key")
    op = check_op(decode_body(await read(), content_type, max_depth=cfg.max_nesting_depth),
                  table, key, max_op_id_bytes=cfg.max_op_id_bytes,
                  max_depth=cfg.max_nesting_depth,
                  max_clock_skew_ms=int(cfg.max_clock_skew * 1000),
                  stale_after_ms=stale_after_ms(cfg), clock=node.clock)
    return await _one_op(node, op, mp)


async def delete_counter(node: Node, table: str, key: str, query: Mapping[str, str],
                         mp: bool) -> bytes:
    """``DELETE /v1/counters/{table}/{key}?op_id=...``: an observed remove
    (``cluster.roles.deletes``), idempotent by its op id as an add is."""
    cfg = node.config
    table = check_name(table, "table")
    key = check_name(key, "key")
    if "op_id" not in query:
        raise BadRequest("op_id: required (?op_id=<client-id>:<seq>), so that a retried "
                         "delete is recognised", code="bad_op_id")
    op = query_op(query, table, key, max_op_id_bytes=cfg.max_op_id_bytes,
                  max_clock_skew_ms=int(cfg.max_clock_skew * 1000),
                  stale_after_ms=stale_after_ms(cfg), clock=node.clock)
    return await _one_op(node, op, mp)


async def _one_op(node: Node, op: CheckedOp, mp: bool) -> bytes:
    """An add or a delete on its own: its answer body, or the refusal it raises."""
    table = op[0]
    _refuse_on_clock(node, 1)
    if _expired(node, op):
        node.metrics.expired += 1
        age_ms = op[5]
        raise OpExpired(f"op is {age_ms} ms old; this node recognises retries for "
                        f"{node.state.window(table):g} s")
    if op[3] is None:
        status = (await node.delete(_as_ops([op]), _births(node, [op])))[0]
    else:
        status = (await node.submit(_as_ops([op]), _births(node, [op])))[0]
    if status == _EXPIRED:
        raise OpExpired(f"op became older than the dedup window ({node.state.window(table):g} s) "
                        "before its leader could apply it; outcome unknown")
    if status == _UNAVAILABLE or status == int(Status.ERROR):
        raise Unavailable("write quorum not met in time; retry with the same op_id")
    if status == _OVERFLOW:
        raise BadRequest(_OVERFLOW_MESSAGE, code="counter_overflow")
    return _MSGPACK_RESULTS[status] if mp else _JSON_RESULTS[status]


async def post_batch(node: Node, read: BodyReader, content_type: str, mp: bool) -> bytes:
    """``POST /v1/batch``: one result per op, in order."""
    cfg = node.config
    ops = check_batch(decode_body(await read(), content_type, max_depth=cfg.max_nesting_depth),
                      max_ops=cfg.max_batch_ops, max_op_id_bytes=cfg.max_op_id_bytes,
                      max_depth=cfg.max_nesting_depth,
                      max_clock_skew_ms=int(cfg.max_clock_skew * 1000),
                      stale_after_ms=stale_after_ms(cfg), clock=node.clock)
    _refuse_on_clock(node, len(ops))
    statuses = [_EXPIRED] * len(ops)
    # the common batch has no age (age_ms 0: new) and no delete: a pass in C says so
    live = ([i for i, op in enumerate(ops) if not (op[5] and _expired(node, op))]
            if any(map(_AGE, ops)) else list(range(len(ops))))
    node.metrics.expired += len(ops) - len(live)
    removes = [i for i in live if ops[i][3] is None] if None in map(_DELTA, ops) else []
    if removes:  # deletes run first, then the adds: a batch is not ordered between the two
        sub = [ops[i] for i in removes]
        for i, s in zip(removes, await node.delete(_as_ops(sub), _births(node, sub)),
                        strict=True):
            statuses[i] = s
        gone = set(removes)
        live = [i for i in live if i not in gone]
    if len(live) == len(ops):
        statuses = await node.submit(_as_ops(ops), _births(node, ops)) if ops else []
    elif live:
        sub = [ops[i] for i in live]
        for i, s in zip(live, await node.submit(_as_ops(sub), _births(node, sub)), strict=True):
            statuses[i] = s
    return batch_results(statuses, mp)


async def post_read(node: Node, read: BodyReader, content_type: str, mp: bool) -> bytes:
    """``POST /v1/read``: many counters, values in order."""
    cfg = node.config
    reads, consistency = check_reads(
        decode_body(await read(), content_type, max_depth=cfg.max_nesting_depth),
        max_reads=cfg.max_reads)
    return encode({"values": await node.read_many(reads, consistency) if reads else []}, mp)


async def scan_counters(node: Node, table: str, query: Mapping[str, str], mp: bool) -> bytes:
    """``GET /v1/counters/{table}?prefix=&after=&limit=&consistency=``: one page of a scan."""
    cfg = node.config
    table = check_name(table, "table")
    extra = set(query) - {"prefix", "after", "limit", "consistency"}
    if extra:
        raise BadRequest(f"query: unknown parameter {sorted(extra)[0]!r} (prefix, after, limit, "
                         "consistency)", code="bad_query")
    prefix = check_prefix(query.get("prefix"))
    after = scans.decode_cursor(query.get("after"))
    limit = check_limit(query.get("limit"), default=min(100, cfg.max_scan_limit),
                        most=cfg.max_scan_limit)
    consistency = check_consistency(query.get("consistency"))
    page, nxt = await scans.scan_page(node, table, prefix, after, limit, consistency)
    return encode({"counters": [{"key": k, "value": v} for k, v in page],
                   "next": scans.encode_cursor(nxt) if nxt is not None else None}, mp)


async def put_table(node: Node, table: str, read: BodyReader, content_type: str,
                    mp: bool) -> bytes:
    """``PUT /v1/tables/{table}`` ``{"ttl_s": seconds | null}``: agreed by the cluster (the
    membership's claimant issues a version with it) before the answer."""
    cfg = node.config
    table = check_name(table, "table")
    body = decode_body(await read(), content_type, max_depth=cfg.max_nesting_depth)
    if not isinstance(body, dict) or "ttl_s" not in body or set(body) - {"ttl_s"}:
        raise BadRequest('body: must be {"ttl_s": <seconds> | null}', code="bad_body")
    try:
        settings = TableSettings(table, body["ttl_s"], int(node.clock() * 1000))
    except TableError as exc:
        raise BadRequest(str(exc), code="bad_ttl") from exc
    try:
        await node.changes.change({"change": "table", **settings.to_wire()})
    except (MembershipError, PeerError, TimeoutError) as exc:
        raise Unavailable(f"the table setting could not be agreed with the cluster now: {exc}; "
                          "nothing changed, retry", code="unavailable") from exc
    got = node.membership.table(table)
    return encode({"table": table, "ttl_s": got.ttl_s if got is not None else None}, mp)


async def get_tables(node: Node, mp: bool) -> bytes:
    """``GET /v1/tables``."""
    return encode({"tables": await scans.tables(node)}, mp)


async def get_counter(node: Node, table: str, key: str, consistency: str | None,
                      mp: bool) -> bytes:
    """``GET /v1/counters/{table}/{key}?consistency=...``."""
    table = check_name(table, "table")
    key = check_name(key, "key")
    value = await node.read(table, key, check_consistency(consistency))
    return encode({"value": value}, mp)


def health(node: Node, mp: bool) -> bytes:
    """``GET /v1/health``."""
    return encode(node.health(), mp)
