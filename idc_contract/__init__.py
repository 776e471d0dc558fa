"""The public contract's constants, shared by the server (``cluster``) and the SDK (``client``).

One definition of the rules a client and a node must agree on (``../shared/CONTRACT.md`` and
docs/node.md "Client API"): how a table or key may be named, the integer ranges a delta and a
shard pair may take, the read consistencies, and the default limits a node advertises. It
imports nothing of either side, so the SDK installs and imports without the server.
"""

from __future__ import annotations

import re
from typing import TypeGuard

__all__ = [
    "CONSISTENCIES",
    "DEFAULT_MAX_BATCH_OPS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_OP_ID_BYTES",
    "INT64_MAX",
    "INT64_MIN",
    "KNOWN_NAMES",
    "NAME_PATTERN",
    "NAME_RE",
    "NAME_RULE",
    "U64_MAX",
    "is_name",
]

# Table and key names: what the node accepts in a URL path and a batch op.
NAME_RULE = "[A-Za-z0-9_.:-]{1,128}"
NAME_PATTERN = f"^{NAME_RULE}$"  # the same rule as a JSON Schema pattern (the API description)
NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
# Names already found to follow the rule: both sides check the names of every op, and a set
# lookup beats the regex (a node reads ``KNOWN_NAMES`` in its compiled batch check too).
KNOWN_NAMES: set[str] = set()
_MAX_KNOWN = 100_000


def is_name(value: object) -> TypeGuard[str]:
    """Does ``value`` follow ``NAME_RULE``? A name found to is remembered (``KNOWN_NAMES``, at
    most 100,000, then forgotten all at once)."""
    if type(value) is str and value in KNOWN_NAMES:
        return True
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        return False
    if len(KNOWN_NAMES) >= _MAX_KNOWN:
        KNOWN_NAMES.clear()
    KNOWN_NAMES.add(value)
    return True

# A delta, attempt, age_ms or ts_ms: a signed 64-bit integer.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# A shard pair's P and N: what the log, the peer frames and the snapshots carry.
U64_MAX = (1 << 64) - 1

CONSISTENCIES = ("one", "quorum", "all")

# Limits a node applies unless configured otherwise (its /v1/openapi.json states its own).
DEFAULT_MAX_OP_ID_BYTES = 256
DEFAULT_MAX_BATCH_OPS = 10_000
DEFAULT_MAX_BODY_BYTES = 4 << 20
