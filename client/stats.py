"""What the SDK did, for the caller: op outcomes, attempts, retries, duplicates, requests."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class ClientStats:
    """Counts since the client started; plain ints, read them at any time.

    ops            ops (adds and deletes) the caller issued (coalesced adds counted each)
    sent_ops       ops with their own op id (after coalescing)
    acknowledged   ops answered applied or duplicate
    applied        answered "applied" on some attempt
    duplicates     answered "duplicate": a retry the cluster recognised (a lost ack absorbed)
    attempts       tries of any op, first ones included
    retries        tries after the first
    not_applied    ops certainly not applied (rejected, or never sent before giving up)
    unknown        ops whose outcome is unknown (deadline, op_expired)
    failures       not_applied + unknown
    http_requests  HTTP requests sent (batches count once)
    batches        /v1/batch requests
    coalesced      adds merged into another add's op
    errors         attempt errors by class name
    """

    ops: int = 0
    sent_ops: int = 0
    acknowledged: int = 0
    applied: int = 0
    duplicates: int = 0
    attempts: int = 0
    retries: int = 0
    not_applied: int = 0
    unknown: int = 0
    http_requests: int = 0
    batches: int = 0
    coalesced: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def failures(self) -> int:
        return self.not_applied + self.unknown

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["errors"] = dict(self.errors)
        out["failures"] = self.failures
        return out
