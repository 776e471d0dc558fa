"""Client input rules: decode bodies and check ops before anything is applied or logged.

Names (tables and keys) match ``[A-Za-z0-9_.:-]{1,128}``; an op id is a non-empty string of at
most ``max_op_id_bytes`` UTF-8 bytes; ``delta`` is an int (not a bool) in signed 64-bit range;
``attempt`` (>= 1), ``age_ms`` (>= 0) and ``ts_ms`` (the op's creation, client wall clock) are
optional ints. An op id holds no control characters (U+0000-U+001F, U+007F). A batch is checked
whole before any op runs; the first bad op rejects the batch with a message naming its index,
``ops[i].field``. Bodies may nest at most ``max_depth`` objects or
arrays deep (an op in a batch is at depth 3); the decoders themselves stop at their own
recursion limits, so no body can make decoding slow.

An op that arrives older than ``stale_after_ms`` counts as a retry (``attempt`` >= 2), so its
leader asks the other replicas before applying it: a request that sat in a paused node's socket
buffer while another replica took over and applied a retry is caught, not counted twice.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import msgpack

from cluster.core.batch_kernel import fast_checked
from cluster.core.errors import BadRequest
from idc_contract import CONSISTENCIES, INT64_MAX, INT64_MIN, KNOWN_NAMES, NAME_RE, is_name

__all__ = ["CONSISTENCIES", "INT64_MAX", "INT64_MIN", "NAME_RE", "CheckedOp", "check_batch",
           "check_consistency", "check_limit", "check_name", "check_op", "check_prefix",
           "check_reads", "decode_body", "query_op"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # not in an op id: a log frame header needs a NUL

# (table, key, op_id, delta, attempt, age_ms): the five fields of a ``cluster.core.ops.Op`` and
# the op's age. A plain tuple, built in the batch's fast path; the edge (``http_api``) expires it
# by its age and submits ``Op._make(checked[:5])``. A delete (``"op": "delete"``) has delta None.
CheckedOp = tuple[str, str, str, Any, int, int]


def is_msgpack(content_type: str) -> bool:
    return "msgpack" in content_type


def decode_body(raw: bytes, content_type: str, max_depth: int = 8) -> Any:
    if not raw:
        raise BadRequest("request body is empty", code="bad_body")
    try:
        if is_msgpack(content_type):
            return msgpack.unpackb(raw, raw=False, strict_map_key=True)
        return json.loads(raw)
    except (RecursionError, msgpack.StackError) as exc:
        raise _too_deep("body", max_depth) from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        kind = "msgpack" if is_msgpack(content_type) else "JSON"
        raise BadRequest(f"body is not valid {kind}: {exc}", code="bad_body") from exc


def check_name(value: Any, field: str) -> str:
    if not is_name(value):
        raise BadRequest(f"{field}: must match [A-Za-z0-9_.:-]{{1,128}}", code=f"bad_{field}")
    return value


def _int_field(op: dict[str, Any], name: str, where: str, default: int, lo: int) -> int:
    value = op.get(name, default)
    if type(value) is not int or not lo <= value <= INT64_MAX:
        raise BadRequest(f"{where}{name}: must be an integer >= {lo}", code=f"bad_{name}")
    return value


def nests_deeper(value: Any, limit: int) -> bool:
    """True when ``value`` has containers nested more than ``limit`` deep (a scalar: 0, a flat
    list or map: 1). Iterative, and it stops at the first container past the limit."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list | tuple))
    return False


def _too_deep(where: str, max_depth: int) -> BadRequest:
    return BadRequest(f"{where}: nests deeper than {max_depth} levels", code="too_deep")


def check_op(op: Any, table: str, key: str, *, max_op_id_bytes: int,
             where: str = "", max_clock_skew_ms: int = 1000,
             stale_after_ms: int | None = None, max_depth: int = 8,
             depth: int = 1, clock: Callable[[], float] = time.time,
             deletes: bool = False) -> CheckedOp:
    """One op's fields (``table`` and ``key`` already checked); raises ``BadRequest``.
    ``depth``: how deep the op object sits in its body (1 alone, 3 in a batch); ``clock``: the
    node's wall clock, which ``ts_ms`` is compared with; ``deletes``: ``"op": "delete"`` is
    allowed (a batch item, or the DELETE route's query), not in the body of
    ``POST /v1/counters/{table}/{key}``, whose op is an add (``delta`` required)."""
    if not isinstance(op, dict):
        raise BadRequest(f"{where or 'body'}: must be an object", code="bad_body")
    if nests_deeper(op, max_depth - depth + 1):
        raise _too_deep(where.rstrip(".") or "body", max_depth)
    op_id = op.get("op_id")
    if not isinstance(op_id, str) or not op_id:
        raise BadRequest(f"{where}op_id: required, a non-empty string", code="bad_op_id")
    if _CONTROL.search(op_id):
        raise BadRequest(f"{where}op_id: control characters are not allowed", code="bad_op_id")
    try:
        too_long = len(op_id) > max_op_id_bytes or len(op_id.encode()) > max_op_id_bytes
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in JSON) has no UTF-8
        raise BadRequest(f"{where}op_id: not encodable as UTF-8", code="bad_op_id") from exc
    if too_long:
        raise BadRequest(f"{where}op_id: longer than {max_op_id_bytes} bytes", code="bad_op_id")
    kind = op.get("op", "add")
    if kind == "delete" and not deletes:
        raise BadRequest(f"{where}op: this route adds; a delete is DELETE "
                         "/v1/counters/{table}/{key}?op_id=... or a batch item", code="bad_op")
    if kind == "delete":
        if "delta" in op:
            raise BadRequest(f"{where}delta: a delete takes no delta", code="bad_delta")
        delta: int | None = None
    elif kind == "add":
        delta = op.get("delta")
        if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
            raise BadRequest(f"{where}delta: must be an integer in signed 64-bit range",
                             code="bad_delta")
    else:
        raise BadRequest(f"{where}op: 'add' (the default) or 'delete'", code="bad_op")
    attempt = _int_field(op, "attempt", where, 1, 1) if "attempt" in op else 1
    age_ms = _int_field(op, "age_ms", where, 0, 0) if "age_ms" in op else 0
    stale_ms = age_ms
    if "ts_ms" in op:  # absolute client time: a copy replayed late by the network is refused
        ts_ms = _int_field(op, "ts_ms", where, 0, 0)
        elapsed = int(clock() * 1000) - ts_ms
        age_ms = max(age_ms, elapsed - max_clock_skew_ms)  # refuse only what is surely old
        stale_ms = max(stale_ms, elapsed)  # check on the replicas what may be old
    if stale_after_ms is not None and stale_ms > stale_after_ms:
        attempt = max(attempt, 2)
    return table, key, op_id, delta, attempt, age_ms


def check_batch(body: Any, *, max_ops: int, max_op_id_bytes: int,
                max_clock_skew_ms: int = 1000, stale_after_ms: int | None = None,
                max_depth: int = 8, clock: Callable[[], float] = time.time) -> list[CheckedOp]:
    if not isinstance(body, dict) or not isinstance(body.get("ops"), list):
        raise BadRequest('body: must be {"ops": [...]}', code="bad_body")
    if len(body) > 1 and nests_deeper({k: v for k, v in body.items() if k != "ops"}, max_depth):
        raise _too_deep("body", max_depth)
    ops = body["ops"]
    if len(ops) > max_ops:
        raise BadRequest(f"ops: at most {max_ops} ops per batch, got {len(ops)}",
                         code="batch_too_large")
    # the common shapes (the SDK's included) are checked in one call
    # (``batch_kernel.fast_checked``, compiled where built); an op it leaves out (None) takes
    # the full check, which says what is wrong
    out = fast_checked(ops, KNOWN_NAMES, max_op_id_bytes, int(clock() * 1000),
                       max_clock_skew_ms, stale_after_ms)
    for i, checked in enumerate(out):
        if checked is None:
            out[i] = _check_batch_op(ops[i], i, max_op_id_bytes, max_clock_skew_ms,
                                     stale_after_ms, max_depth, clock)
    return out  # type: ignore[return-value]  # every None replaced


def _check_batch_op(op: Any, i: int, max_op_id_bytes: int, skew_ms: int,
                    stale_after_ms: int | None, max_depth: int,
                    clock: Callable[[], float]) -> CheckedOp:
    where = f"ops[{i}]."
    if not isinstance(op, dict):
        raise BadRequest(f"ops[{i}]: must be an object", code="bad_body")
    table, key = op.get("table"), op.get("key")
    if not is_name(table):
        raise _bad(where, "table")
    if not is_name(key):
        raise _bad(where, "key")
    return check_op(op, table, key, max_op_id_bytes=max_op_id_bytes, where=where,
                    max_clock_skew_ms=skew_ms, stale_after_ms=stale_after_ms,
                    max_depth=max_depth, depth=3, clock=clock, deletes=True)


def _bad(where: str, field: str) -> BadRequest:
    return BadRequest(f"{where}{field}: must match [A-Za-z0-9_.:-]{{1,128}}", code=f"bad_{field}")


def check_reads(body: Any, *, max_reads: int) -> tuple[list[tuple[str, str]], str]:
    """``POST /v1/read``: ``{"reads": [{"table", "key"}, ...], "consistency"?}``, whole."""
    if not isinstance(body, dict) or not isinstance(body.get("reads"), list):
        raise BadRequest('body: must be {"reads": [{"table": ..., "key": ...}, ...]}',
                         code="bad_body")
    extra = set(body) - {"reads", "consistency"}
    if extra:
        raise BadRequest(f"body: unknown field {sorted(extra)[0]!r}", code="bad_body")
    reads = body["reads"]
    if len(reads) > max_reads:
        raise BadRequest(f"reads: at most {max_reads} counters per read, got {len(reads)}",
                         code="too_many_reads")
    # this loop is most of a read's check: no set built an item, and a name already checked
    # (``is_name``'s cache, a read's table nearly always) costs a set lookup, not a call
    out = []
    known, ok = KNOWN_NAMES, is_name
    for i, item in enumerate(reads):
        if not isinstance(item, dict) or len(item) != 2 or "table" not in item \
                or "key" not in item:
            raise BadRequest(f'reads[{i}]: must be {{"table": ..., "key": ...}}',
                             code="bad_body")
        table, key = item["table"], item["key"]
        if not (type(table) is str and table in known) and not ok(table):
            raise _bad(f"reads[{i}].", "table")
        if not (type(key) is str and key in known) and not ok(key):
            raise _bad(f"reads[{i}].", "key")
        out.append((table, key))
    consistency = body.get("consistency")
    if consistency is not None and not isinstance(consistency, str):
        raise BadRequest(f"consistency: one of {', '.join(CONSISTENCIES)}",
                         code="bad_consistency")
    return out, check_consistency(consistency)


def check_prefix(value: str | None) -> str:
    """A scan's key prefix: empty, or the start of a name (same characters, at most 128)."""
    if not value:
        return ""
    if len(value) > 128 or NAME_RE.fullmatch(value) is None:
        raise BadRequest("prefix: must match [A-Za-z0-9_.:-]{0,128}", code="bad_prefix")
    return value


def check_limit(value: str | None, *, default: int, most: int) -> int:
    """A scan page's ``limit``: 1 or more; capped to ``most``."""
    if value is None or value == "":
        return default
    # ASCII digits only ("²".isdigit() and int() refuses it), and the length before int():
    # past 4300 digits int() raises ValueError, a 500
    if not (value.isascii() and value.isdigit()) or len(value) > 12 or int(value) < 1:
        raise BadRequest("limit: must be an integer >= 1", code="bad_limit")
    return min(int(value), most)


def query_op(query: Any, table: str, key: str, *, max_op_id_bytes: int,
             max_clock_skew_ms: int, stale_after_ms: int | None, clock: Callable[[], float],
             ) -> CheckedOp:
    """A delete from its query string (``op_id``, optional ``attempt``, ``age_ms``,
    ``ts_ms``): the fields an op body carries, checked by the same rules."""
    op: dict[str, Any] = {"op": "delete"}
    for name in ("op_id", "attempt", "age_ms", "ts_ms"):
        if name in query:
            value = query[name]
            if name != "op_id":
                if not (value.isascii() and value.isdigit()) or len(value) > 19:
                    raise BadRequest(f"{name}: must be an integer >= 0", code=f"bad_{name}")
                value = int(value)
            op[name] = value
    extra = set(query) - {"op_id", "attempt", "age_ms", "ts_ms"}
    if extra:
        raise BadRequest(f"query: unknown parameter {sorted(extra)[0]!r}", code="bad_query")
    if isinstance(op.get("op_id"), str) and "\ufffd" in op["op_id"]:
        # the query's decoding puts U+FFFD where the percent-escaped bytes are not UTF-8
        # (%FF and %FE alike): two op ids would become one
        raise BadRequest("op_id: not valid UTF-8 once percent-decoded (U+FFFD)",
                         code="bad_op_id")
    return check_op(op, table, key, max_op_id_bytes=max_op_id_bytes,
                    max_clock_skew_ms=max_clock_skew_ms, stale_after_ms=stale_after_ms,
                    clock=clock, deletes=True)


def check_consistency(value: str | None) -> str:
    if value is None:
        return "quorum"
    if value not in CONSISTENCIES:
        raise BadRequest(f"consistency: one of {', '.join(CONSISTENCIES)}",
                         code="bad_consistency")
    return value
