"""Table settings: what the cluster agrees on per table (``ttl_s`` today), and expiry.

The settings are part of the agreed membership (``cluster.core.membership.Membership.tables``):
versioned with it, issued by its claimant, installed by every member and pulled by a member that
missed a version or joins later, so two nodes never judge a table by different rules for longer
than it takes a version to spread (docs/deletes.md).

Expiry is decided from a key's state alone: its last change (``cluster.core.entry.LAST``, ms)
against ``ttl_s``. Every replica holding the same state decides the same way. Pure: no I/O, no
clock (times are arguments).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from idc_contract import NAME_RE

MAX_TTL_S = 10 * 365 * 86400.0  # ten years: longer is a mistake, not a ttl
MIN_TTL_S = 1.0  # below the dedup window a retry could outlive its counter (docs/deletes.md)


class TableError(ValueError):
    """A table setting that cannot be taken (the message names the field)."""


@dataclasses.dataclass(frozen=True)
class TableSettings:
    """One table's agreed settings; ``ttl_s`` None: counters never expire. ``since_ms``: when
    the claimant issued them (wall clock, ms); a key with no recorded last change (written
    before the table had a ttl) counts as changed then."""

    name: str
    ttl_s: float | None = None
    since_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.fullmatch(self.name):
            raise TableError(f"table: {self.name!r} is not a table name "
                             "(1-128 of A-Z a-z 0-9 _ . : -)")
        ttl = self.ttl_s
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
                raise TableError(f"ttl_s: {ttl!r} is not a number of seconds or null")
            if not MIN_TTL_S <= ttl <= MAX_TTL_S:
                raise TableError(f"ttl_s: {ttl!r} is outside [{MIN_TTL_S:g}, {MAX_TTL_S:g}] "
                                 "seconds (null: never expire)")
            object.__setattr__(self, "ttl_s", float(ttl))

    def expired(self, last_ms: int, now_ms: int) -> bool:
        """Has a key whose last change was at ``last_ms`` (0: none recorded) expired?"""
        return expired(last_ms or self.since_ms, self.ttl_s, now_ms)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "ttl_s": self.ttl_s, "since_ms": self.since_ms}

    @classmethod
    def from_wire(cls, data: Any) -> TableSettings:
        if not isinstance(data, Mapping):
            raise TableError("a table's settings are a map")
        since = data.get("since_ms", 0)
        if type(since) is not int or since < 0:
            raise TableError("since_ms: not a time in ms")
        return cls(data.get("name"), data.get("ttl_s"), since)  # type: ignore[arg-type]


def settings_map(tables: Iterable[TableSettings]) -> dict[str, TableSettings]:
    return {t.name: t for t in tables}


def expired(last_ms: int, ttl_s: float | None, now_ms: int) -> bool:
    """A counter whose last change was at ``last_ms`` has expired at ``now_ms``."""
    return ttl_s is not None and last_ms + int(ttl_s * 1000) <= now_ms


__all__ = ["MAX_TTL_S", "MIN_TTL_S", "TableError", "TableSettings", "expired", "settings_map"]
