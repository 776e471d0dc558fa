"""No deduplication: every op id is applied, so every retry over-counts (the paper's approach 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cluster.core.dedup._base import check_version, frame


class NoDedup:
    """Never a duplicate; the over-counting baseline the others are measured against."""

    name: str = "none"

    def __init__(self) -> None:
        self.ops = 0

    def seen_or_add(self, op_id: bytes) -> bool:
        self.ops += 1
        return False

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        self.ops += len(op_ids)
        return [False] * len(op_ids)

    def __contains__(self, op_id: bytes) -> bool:
        return False

    def nbytes(self) -> int:
        return 0

    @property
    def window(self) -> float:
        return 0.0

    def estimated_fpp(self) -> float:
        return 0.0

    def stats(self) -> dict[str, float]:
        return {"items": float(self.ops)}

    def to_bytes(self) -> bytes:
        return frame(self.name, 1, {"ops": self.ops})

    @classmethod
    def from_payload(cls, version: int, payload: Any) -> NoDedup:
        check_version(cls.name, version, 1)
        d = cls()
        d.ops = int(payload["ops"])
        return d
