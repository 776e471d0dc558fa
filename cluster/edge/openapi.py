"""The client API's OpenAPI 3.0.3 description, served at ``/v1/openapi.json``.

One function, ``spec``, builds the document from what ``cluster.edge.http_api`` and
``cluster.edge.validate`` implement; the limits it states (batch size, op id length, body size) are
arguments so that a node can describe its own configuration. ``tests/test_openapi.py`` checks the
document against the app's routes and fuzzes a running node with it (schemathesis).
"""

from __future__ import annotations

from typing import Any

from idc_contract import (
    DEFAULT_MAX_BATCH_OPS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OP_ID_BYTES,
    INT64_MAX,
    INT64_MIN,
    NAME_PATTERN,
)

JSON, MSGPACK = "application/json", "application/msgpack"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _both(schema: dict[str, Any]) -> dict[str, Any]:
    """The same schema as JSON and as msgpack: replies follow ``Accept`` (else the request's
    ``Content-Type``)."""
    return {JSON: {"schema": schema}, MSGPACK: {"schema": schema}}


def _error(description: str, codes: list[str], headers: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": f"{description} Error codes: {', '.join(f'`{c}`' for c in codes)}.",
        "content": _both(_ref("Error")),
    }
    if headers:
        out["headers"] = headers
    return out


def _schemas(max_batch_ops: int, max_op_id_bytes: int) -> dict[str, Any]:
    # One literal, long on purpose: the schemas read top to bottom as the document they become.
    name = {
        "type": "string",
        "pattern": NAME_PATTERN,
        "minLength": 1,
        "maxLength": 128,
    }
    op_fields = {
        "op_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": max_op_id_bytes,
            "description": (
                f"Unique per op, the same on every retry (`<client-id>:<seq>`). At most "
                f"{max_op_id_bytes} bytes once UTF-8 encoded (a character may take up to 4)."
            ),
            "example": "app-1:42",
        },
        "delta": {
            "type": "integer",
            "format": "int64",
            "minimum": INT64_MIN,
            "maximum": INT64_MAX,
            "description": "Signed 64-bit integer added to the counter; `true` and `1.0` are not "
                           "integers.",
            "example": 1,
        },
        "attempt": {
            "type": "integer",
            "format": "int64",
            "minimum": 1,
            "maximum": INT64_MAX,
            "default": 1,
            "description": "1 for the first send, more for a retry: a retry is first checked on "
                           "the key's other replicas.",
        },
        "age_ms": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "maximum": INT64_MAX,
            "default": 0,
            "description": "Milliseconds since the op was first sent; over the table's dedup "
                           "window (`window_s` in /v1/health) the op is refused with 410.",
        },
        "ts_ms": {
            "type": "integer",
            "format": "int64",
            "minimum": 0,
            "maximum": INT64_MAX,
            "description": "Client wall clock (Unix ms) when the op was first sent; an op older "
                           "than the window plus the allowed clock skew is refused with 410.",
        },
    }
    op_description = "Unknown fields are ignored."
    applied = {
        "type": "object",
        "required": ["applied"],
        "properties": {"applied": {"type": "boolean", "enum": [True]}},
        "description": "The op was applied now, for the first time.",
    }
    duplicate = {
        "type": "object",
        "required": ["applied", "duplicate"],
        "properties": {
            "applied": {"type": "boolean", "enum": [False]},
            "duplicate": {"type": "boolean", "enum": [True]},
        },
        "description": "A retry of an op already applied: counted once, a success.",
    }
    return {
        "Name": name,
        "Op": {
            "type": "object",
            "required": ["op_id", "delta"],
            "properties": op_fields,
            "description": op_description,
        },
        "BatchOp": {
            "type": "object",
            "required": ["table", "key", "op_id", "delta"],
            "properties": {"table": _ref("Name"), "key": _ref("Name"), **op_fields},
            "description": op_description,
        },
        "Batch": {
            "type": "object",
            "required": ["ops"],
            "properties": {
                "ops": {"type": "array", "maxItems": max_batch_ops,
                        "items": {"oneOf": [_ref("BatchOp"), _ref("DeleteOp")]}},
            },
            "description": f"At most {max_batch_ops} ops, checked whole before any runs: one "
                           "bad op rejects the batch (400, the message names `ops[i].field`).",
        },
        "Applied": applied,
        "Duplicate": duplicate,
        "WriteResult": {"oneOf": [_ref("Applied"), _ref("Duplicate")]},
        "BatchItemError": {
            "type": "object",
            "required": ["applied", "status", "error"],
            "properties": {
                "applied": {"type": "boolean", "enum": [False]},
                "status": {"type": "integer", "enum": [410, 503]},
                "error": _ref("ErrorBody"),
            },
            "description": "410 `op_expired`: older than the window, outcome unknown. 503 "
                           "`unavailable`: quorum not met in time, a retry with the same op_id "
                           "is safe.",
        },
        "BatchResults": {
            "type": "object",
            "required": ["results"],
            "properties": {
                "results": {
                    "type": "array",
                    "items": {"oneOf": [_ref("Applied"), _ref("Duplicate"),
                                        _ref("BatchItemError")]},
                    "description": "One result per op, in the order of `ops`.",
                },
            },
        },
        "Value": {
            "type": "object",
            "required": ["value"],
            "properties": {"value": {"type": "integer"}},
        },
        "DeleteOp": {
            "type": "object",
            "required": ["table", "key", "op_id", "op"],
            "properties": {"table": _ref("Name"), "key": _ref("Name"),
                           "op": {"type": "string", "enum": ["delete"]},
                           **{k: v for k, v in op_fields.items() if k != "delta"}},
            "description": "A delete in a batch: every increment acknowledged before it was "
                           "sent is removed, none sent after it was acknowledged.",
        },
        "Reads": {
            "type": "object",
            "required": ["reads"],
            "properties": {
                "reads": {"type": "array", "items": {
                    "type": "object", "required": ["table", "key"],
                    "properties": {"table": _ref("Name"), "key": _ref("Name")},
                    "additionalProperties": False}},
                "consistency": {"type": "string", "enum": ["one", "quorum", "all"],
                                "default": "quorum"},
            },
            "additionalProperties": False,
            "description": "At most `max_reads` counters (/v1/health), 400 `too_many_reads` "
                           "above.",
        },
        "Values": {
            "type": "object",
            "required": ["values"],
            "properties": {"values": {"type": "array", "items": {"type": "integer"},
                                      "description": "One value per read, in order: 0 for a "
                                                     "counter never written, deleted or expired."}},
        },
        "ScanPage": {
            "type": "object",
            "required": ["counters", "next"],
            "properties": {
                "counters": {"type": "array", "items": {
                    "type": "object", "required": ["key", "value"],
                    "properties": {"key": _ref("Name"), "value": {"type": "integer"}}}},
                "next": {"type": "string", "nullable": True,
                         "description": "The cursor of the next page (`after`); null on the "
                                        "last. A page may be short, even empty, before the last."},
            },
        },
        "TableSettings": {
            "type": "object",
            "required": ["ttl_s"],
            "properties": {"ttl_s": {"type": "number", "nullable": True, "minimum": 1,
                                     "description": "Seconds after its last write a counter "
                                                    "expires; null: never."}},
            "additionalProperties": False,
        },
        "Table": {
            "type": "object",
            "required": ["table", "ttl_s"],
            "properties": {"table": _ref("Name"),
                           "ttl_s": {"type": "number", "nullable": True}},
        },
        "Tables": {
            "type": "object",
            "required": ["tables"],
            "properties": {"tables": {"type": "array", "items": {
                "type": "object", "required": ["name", "ttl_s"],
                "properties": {"name": _ref("Name"),
                               "ttl_s": {"type": "number", "nullable": True}}}}},
        },
        "Ready": {
            "type": "object",
            "required": ["node", "ready"],
            "properties": {"node": {"type": "string"},
                           "ready": {"type": "boolean", "enum": [True]}},
        },
        "Ring": {
            "type": "object",
            "required": ["version", "members", "rf"],
            "properties": {
                "version": {"type": "integer", "minimum": 1},
                "members": {"type": "array", "items": {
                    "type": "object", "required": ["id", "addr", "state"],
                    "properties": {
                        "id": {"type": "string"}, "addr": {"type": "string"},
                        "state": {"type": "string",
                                  "enum": ["joining", "normal", "leaving", "left", "down"]},
                        "since": {"type": "integer"}}}},
                "rf": {"type": "integer"}, "vnodes": {"type": "integer"},
                "claimant": {"type": "string"},
                "move": {"type": "object", "nullable": True},
                "shed": {"type": "object", "description": (
                    "keys this node no longer replicates after a move: handed off to every "
                    "replica, then dropped (docs/membership.md, \"Shedding\")"),
                    "properties": {
                        "done_version": {"type": "integer", "description": (
                            "the membership whose pass left none behind (0: none yet)")},
                        "foreign_keys": {"type": "integer", "description": (
                            "held but not replicated, as the last pass left them")},
                        "dropped_keys": {"type": "integer"}}},
            },
        },
        "Health": {
            "type": "object",
            "required": ["node", "status", "members", "rf", "write_quorum", "window_s"],
            "properties": {
                "node": {"type": "string"},
                "status": {"type": "string", "enum": ["ok", "recovering"]},
                "members": {"type": "array", "items": {"type": "string"}},
                "rf": {"type": "integer", "minimum": 1},
                "write_quorum": {"type": "integer", "minimum": 1},
                "window_s": {"type": "number",
                             "description": "Shortest dedup window of the node's tables: "
                                            "retries must arrive within it."},
                "dedup": {"type": "object"},
                "tables": {"type": "object"},
                "peers": {"type": "object", "additionalProperties": {"type": "boolean"}},
                "addresses": {"type": "object", "additionalProperties": {"type": "string"},
                              "description": "Each member that has not left: its address."},
                "left": {"type": "object", "additionalProperties": {"type": "string"},
                         "description": "Each member that left the cluster: the address it "
                                        "had. Clients stop using these."},
                "ring_version": {"type": "integer", "minimum": 0},
                "ring": {"type": "object"},
                "counters": {"type": "integer", "minimum": 0},
                "live": {"type": "object", "additionalProperties": {"type": "boolean"}},
                "in_doubt": {"type": "integer", "minimum": 0},
                "hints": {"type": "object", "additionalProperties": {"type": "integer"}},
                "release": {"type": "string",
                            "description": "The release the node runs (absent before 0.5.0)."},
                "protocol": {
                    "type": "object",
                    "description": "Protocol versions (docs/operations.md): the range this node "
                                   "speaks, the version the cluster finalized (what every node "
                                   "sends and writes), and the range each peer last said it "
                                   "speaks. Absent on release 0.4.0 and before (protocol 1).",
                    "required": ["speaks", "cluster"],
                    "properties": {
                        "speaks": {"type": "array", "items": {"type": "integer"},
                                   "minItems": 2, "maxItems": 2},
                        "cluster": {"type": "integer", "minimum": 1},
                        "peers": {"type": "object", "additionalProperties": {
                            "type": "array", "items": {"type": "integer"}}},
                    },
                },
            },
        },
        "ErrorBody": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": _ref("ErrorBody")},
        },
    }


def _responses(max_body_bytes: int) -> dict[str, Any]:
    return {
        "BadRequest": _error(
            "Malformed input (also: a body nested deeper than the node's `max_nesting_depth`, "
            "an op_id over its UTF-8 byte limit); nothing of the request was applied, logged or "
            "remembered.",
            ["bad_body", "bad_op_id", "bad_delta", "bad_table", "bad_key", "bad_attempt",
             "bad_age_ms", "bad_ts_ms", "bad_consistency", "batch_too_large"]),
        "Unauthorized": _error(
            "The node was started with client tokens (`token_file`) and the request has no "
            "valid `Authorization: Bearer <token>`.", ["unauthorized"],
            {"WWW-Authenticate": {"schema": {"type": "string"}}}),
        "NotFound": _error("No route for this method and path (for example a table or key "
                           "that is empty or holds a `/`).", ["not_found"]),
        "RequestTimeout": _error(
            "The request's headers (`header_timeout`) or body (`body_timeout`) did not arrive "
            "in time; the connection is closed.", ["request_timeout"]),
        "Expired": _error(
            "The op is older than the table's dedup window: its outcome is unknown and a retry "
            "could no longer be recognised, so it is refused instead of risking a double count.",
            ["op_expired"]),
        "TooLarge": _error(f"The body is larger than {max_body_bytes} bytes.",
                           ["body_too_large"]),
        "TooManyRequests": _error(
            "The client address already holds as many connections as a client may "
            "(`max_connections_per_client`); the connection is closed, retry on an open one or "
            "later.", ["too_many_connections"]),
        "Unavailable": _error(
            "Too few replicas answered in time. For a write the op may or may not have been "
            "applied, and a retry with the same op_id is safe.",
            ["unavailable", "peer_error"]),
        "NotReady": _error(
            "The node is up but not settled and serving yet: it is recovering its log or "
            "settling in-doubt ops with its replicas. Take it out of rotation (a Kubernetes "
            "readiness probe, a load balancer's check) and ask again.", ["not_ready"]),
    }


_CODES = {"BadRequest": "400", "Unauthorized": "401", "NotFound": "404", "RequestTimeout": "408",
          "Expired": "410", "TooLarge": "413", "TooManyRequests": "429", "Unavailable": "503",
          "NotReady": "503"}


def _resp(ok: dict[str, Any], *errors: str) -> dict[str, Any]:
    """The operation's responses: 200, then the shared error responses in status order."""
    out = {"200": ok} | {_CODES[n]: {"$ref": f"#/components/responses/{n}"} for n in errors}
    return dict(sorted(out.items()))


def _path_params() -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": _ref("Name"),
         "description": f"The counter's {n}: `[A-Za-z0-9_.:-]{{1,128}}`."}
        for n in ("table", "key")
    ]


def _body(schema: str, max_body_bytes: int, example: Any) -> dict[str, Any]:
    return {
        "required": True,
        "description": f"JSON, or msgpack with `Content-Type: {MSGPACK}`; at most "
                       f"{max_body_bytes} bytes.",
        "content": {JSON: {"schema": _ref(schema), "example": example},
                    MSGPACK: {"schema": _ref(schema)}},
    }


def spec(
    *,
    max_batch_ops: int = DEFAULT_MAX_BATCH_OPS,
    max_op_id_bytes: int = DEFAULT_MAX_OP_ID_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    token_required: bool = False,
) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of the client API, stating these limits (NodeConfig's
    defaults unless given) and whether a bearer token is required (the node has a
    ``token_file``); a new dict on every call."""
    # Long on purpose, like _schemas: one literal that reads as the document it becomes.
    # Below aiohttp, any request can get 408 (headers too slow) or 429 (too many connections).
    edge = ("RequestTimeout", "TooManyRequests")
    write_errors = ("BadRequest", "Unauthorized", "TooLarge", *edge)
    open_route: dict[str, Any] = {"security": []}  # no token needed (http_api.OPEN_ROUTES)
    paths: dict[str, Any] = {
        "/v1/counters/{table}/{key}": {
            "parameters": _path_params(),
            "post": {
                "operationId": "post_counter",
                "summary": "Add delta to the counter, exactly once per op_id",
                "description": "Retries must reuse the op_id. A duplicate is a success, never "
                               "an error.",
                "requestBody": _body("Op", max_body_bytes, {"op_id": "app-1:42", "delta": 1}),
                "responses": _resp(
                    {"description": "Applied now, or a duplicate of an op already applied.",
                     "content": _both(_ref("WriteResult"))},
                    *write_errors, "NotFound", "Expired", "Unavailable"),
            },
            "delete": {
                "operationId": "delete",
                "summary": "Delete the counter (observed remove), exactly once per op_id",
                "description": "Removes every increment acknowledged before the delete was sent "
                               "and none sent after it was acknowledged; the counter is usable "
                               "again at once, from 0. A retry must reuse the op_id: it is then "
                               "a duplicate, a success.",
                "parameters": [
                    {"name": "op_id", "in": "query", "required": True,
                     "schema": {"type": "string", "minLength": 1, "maxLength": max_op_id_bytes}},
                    {"name": "attempt", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1}},
                    {"name": "age_ms", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 0}},
                    {"name": "ts_ms", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 0}},
                ],
                "responses": _resp(
                    {"description": "Applied now, or a duplicate of a delete already applied.",
                     "content": _both(_ref("WriteResult"))},
                    "BadRequest", "Unauthorized", "NotFound", "Expired", "Unavailable", *edge),
            },
            "get": {
                "operationId": "get_counter",
                "summary": "Read the counter",
                "parameters": [{
                    "name": "consistency", "in": "query", "required": False,
                    "schema": {"type": "string", "enum": ["one", "quorum", "all"],
                               "default": "quorum"},
                    "description": "How many of the key's replicas are merged: `one`, a "
                                   "majority (`quorum`) or `all`.",
                }],
                "responses": _resp(
                    {"description": "The merged value.", "content": _both(_ref("Value"))},
                    "BadRequest", "Unauthorized", "NotFound", "Unavailable", *edge),
            },
        },
        "/v1/counters/{table}": {
            "parameters": [_path_params()[0]],
            "get": {
                "operationId": "scan",
                "summary": "One page of a scan of the table's counters",
                "description": "Pages chained by `next`: every counter that exists for the "
                               "whole scan comes back exactly once, whatever is written, "
                               "deleted or moved meanwhile. Deleted and expired counters are "
                               "left out.",
                "parameters": [
                    {"name": "prefix", "in": "query", "required": False,
                     "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{0,128}$"},
                     "description": "Only keys starting with it."},
                    {"name": "after", "in": "query", "required": False,
                     "schema": {"type": "string", "maxLength": 400},
                     "description": "The previous page's `next`, as it was handed out."},
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "default": 100},
                     "description": "Most counters in the page (capped to `max_scan_limit`)."},
                    {"name": "consistency", "in": "query", "required": False,
                     "schema": {"type": "string", "enum": ["one", "quorum", "all"],
                                "default": "quorum"}},
                ],
                "responses": _resp(
                    {"description": "A page.", "content": _both(_ref("ScanPage"))},
                    "BadRequest", "Unauthorized", "NotFound", "Unavailable", *edge),
            },
        },
        "/v1/read": {
            "post": {
                "operationId": "read",
                "summary": "Read many counters at once",
                "description": "Values in order, at the consistency asked; keys are grouped by "
                               "replica set, one peer frame per replica.",
                "requestBody": _body("Reads", max_body_bytes, {"reads": [
                    {"table": "likes", "key": "post-42"}], "consistency": "quorum"}),
                "responses": _resp(
                    {"description": "One value per read.", "content": _both(_ref("Values"))},
                    "BadRequest", "Unauthorized", "TooLarge", "Unavailable", *edge),
            },
        },
        "/v1/tables": {
            "get": {
                "operationId": "tables",
                "summary": "The cluster's tables and their settings",
                "responses": _resp(
                    {"description": "Every table a member holds counters of or has settings "
                                    "for.", "content": _both(_ref("Tables"))},
                    "Unauthorized", *edge),
            },
        },
        "/v1/tables/{table}": {
            "parameters": [_path_params()[0]],
            "put": {
                "operationId": "put_table",
                "summary": "Set a table's ttl, agreed by the whole cluster",
                "description": "Held by every member once answered (a member joining later "
                               "gets it). A counter not written for `ttl_s` reads 0, leaves "
                               "scans and is removed; a write after starts it from 0.",
                "requestBody": _body("TableSettings", max_body_bytes, {"ttl_s": 3600}),
                "responses": _resp(
                    {"description": "The table's settings now.", "content": _both(_ref("Table"))},
                    "BadRequest", "Unauthorized", "TooLarge", "Unavailable", *edge),
            },
        },
        "/v1/batch": {
            "post": {
                "operationId": "batch",
                "summary": "Many increments in one request",
                "description": "Each op is routed to its key's leader; one result per op, in "
                               "order. An expired or unavailable op gets its error in its slot "
                               "and the others run.",
                "requestBody": _body("Batch", max_body_bytes, {"ops": [
                    {"table": "likes", "key": "post-42", "op_id": "app-1:43", "delta": 1}]}),
                "responses": _resp(
                    {"description": "One result per op.", "content": _both(_ref("BatchResults"))},
                    *write_errors),
            },
        },
        "/v1/health": {
            "get": {
                "operationId": "health",
                "summary": "The node's status, membership, replication and dedup windows",
                **open_route,
                "responses": _resp(
                    {"description": "`status` is `ok` once the node has recovered.",
                     "content": _both(_ref("Health"))},
                    *edge),
            },
        },
        "/v1/ready": {
            "get": {
                "operationId": "ready",
                "summary": "200 once the node is settled and serving, 503 before",
                "description": "For readiness checks: answers 200 once the node has recovered "
                               "its log and settled in-doubt ops with its replicas (the moment "
                               "/v1/health's `status` turns `ok`), and 503 `not_ready` before.",
                **open_route,
                "responses": _resp(
                    {"description": "Settled and serving.", "content": _both(_ref("Ready"))},
                    "NotReady", *edge),
            },
        },
        "/v1/ring": {
            "get": {
                "operationId": "ring",
                "summary": "The membership this node holds: version, members, states, the move",
                "description": "Elastic membership (docs/membership.md): a member is joining, "
                               "normal, leaving or left (down: the failure detector sees it "
                               "down). `move` is the change under way and when it may finish.",
                **open_route,
                "responses": _resp(
                    {"description": "The membership.", "content": _both(_ref("Ring"))},
                    *edge),
            },
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (text exposition format)",
                "responses": _resp(
                    {"description": "Prometheus text format 0.0.4.",
                     "content": {"text/plain": {"schema": {"type": "string"}}}},
                    "Unauthorized", *edge),
            },
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document, with the node's own limits",
                **open_route,
                "responses": _resp(
                    {"description": "OpenAPI 3.0.3.",
                     "content": {JSON: {"schema": {"type": "object"}}}},
                    *edge),
            },
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "idemcount client API",
            "version": "1",
            "description": (
                "Idempotent distributed counters: every node serves this API and any node "
                "coordinates. Bodies are JSON, or msgpack with `Content-Type: application/"
                "msgpack`; replies follow `Accept` (else the request's content type). Errors "
                "are `{\"error\": {\"code\", \"message\"}}`. An unknown path, or a method a "
                f"path does not serve, answers 404. This node's limits: {max_batch_ops} ops "
                f"per batch, {max_op_id_bytes}-byte op ids, {max_body_bytes}-byte bodies."
            ),
        },
        "security": [{"bearerAuth": []}] if token_required else [{}, {"bearerAuth": []}],
        "paths": paths,
        "components": {
            "schemas": _schemas(max_batch_ops, max_op_id_bytes),
            "responses": _responses(max_body_bytes),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`Authorization: Bearer <token>`, required (except by "
                                   "/v1/health, /v1/ready and /v1/openapi.json) when the node was "
                                   "started with client tokens (`token_file`).",
                },
            },
        },
    }
