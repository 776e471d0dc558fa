"""What every junk class gets: the run's targets, credentials and limits, the junk keys it
must leave at 0, the request budget, and a connection from the junk's source address."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster.core.ring import Ring
from idc_contract import INT64_MAX as INT64_MAX  # the cases import the ranges from here
from idc_contract import INT64_MIN as INT64_MIN


@dataclass(frozen=True)
class Limits:
    """The limits the nodes were started with (the node's defaults unless told)."""

    max_body_bytes: int = 4 << 20
    max_batch_ops: int = 10_000
    max_op_id_bytes: int = 256
    max_nesting_depth: int = 8
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_connections_per_client: int = 256
    peer_auth_skew: float = 30.0
    max_reads: int = 1000  # counters per POST /v1/read


@dataclass(frozen=True)
class Target:
    url: str
    host: str
    port: int
    node_id: str


class BudgetExhausted(Exception):
    """``--max-requests`` junk requests have been sent."""


class Ctx:
    """What every junk class gets: the targets, credentials, limits and the junk keys used."""

    def __init__(self, targets: Sequence[Target], *, limits: Limits, token: str | None,
                 secret: bytes | None, token_required: bool, run_id: str, table: str,
                 good_table: str, good_keys: Sequence[str], ring: Ring | None,
                 source: str | None, cap_source: str | None, max_requests: int,
                 rng: random.Random) -> None:
        self.targets = list(targets)
        self.limits = limits
        self.token = token
        self.secret = secret
        self.token_required = token_required
        self.run_id = run_id
        self.table = table
        self.good_table = good_table
        self.good_keys = list(good_keys)
        self.ring = ring
        self.source = source
        self.cap_source = cap_source
        self.max_requests = max_requests
        self.rng = rng
        self.requests = 0
        self.junk_keys: set[str] = set()  # keys of ``table`` that must read 0 at the end
        self._seq = itertools.count(1)

    # -- accounting ------------------------------------------------------------------------

    def count(self, n: int = 1) -> None:
        if self.requests + n > self.max_requests:
            raise BudgetExhausted(f"{self.max_requests} junk requests sent")
        self.requests += n

    def junk_key(self, cls: str, i: int = 0) -> str:
        """A key of the junk table that must stay 0 (two per class and variant at most)."""
        key = f"{self.run_id}-{cls}-{i % 2}"[:128]
        self.junk_keys.add(key)
        return key

    def op_id(self, cls: str) -> str:
        return f"{self.run_id}-{cls}:{next(self._seq)}"

    def op(self, cls: str, **extra: Any) -> dict[str, Any]:
        """A well-formed op body (the junk goes in ``extra``)."""
        return {"op_id": self.op_id(cls), "delta": 1, **extra}

    @property
    def class_timeout(self) -> float:
        lim = self.limits
        return max(lim.header_timeout, lim.body_timeout) + 15.0

    @property
    def read_timeout(self) -> float:
        """How long an answer to a complete request may take under load."""
        return 5.0


Part = bytes | float  # bytes to send, or seconds to wait before the next part


async def open_stream(ctx: Ctx, target: Target, source: str | None = None
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    src = source if source is not None else ctx.source
    return await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port,
                                local_addr=(src, 0) if src else None), 5.0)
