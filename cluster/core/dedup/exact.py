"""Exact dedup with a TTL: every op id kept for ``window`` seconds (the paper's approach 2).

Correct inside the window and never a false positive, at the cost of storing every id. Expiry is
lazy: ids sit in a deque in insertion order, and each call pops the ones older than the window,
so memory stays bounded by about rate * window ids.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from cluster.core.dedup._base import Clock, check_version, frame

_BYTES_OVERHEAD = sys.getsizeof(b"")
_FLOAT_SIZE = sys.getsizeof(0.0)


class ExactDedup:
    """A dict op_id -> insertion time, expired in insertion order."""

    name: str = "exact"

    def __init__(self, window: float, clock: Clock = time.time) -> None:
        if not window > 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        self._window = float(window)
        self._clock = clock
        self._seen: dict[bytes, float] = {}
        self._order: deque[bytes] = deque()
        self._key_len = 0  # total length of the stored ids, for an O(1) nbytes

    def _expire(self, now: float) -> None:
        cutoff = now - self._window
        order, seen = self._order, self._seen
        while order and seen[order[0]] < cutoff:
            key = order.popleft()
            del seen[key]
            self._key_len -= len(key)

    def seen_or_add(self, op_id: bytes) -> bool:
        now = self._clock()
        order = self._order
        if order and self._seen[order[0]] < now - self._window:
            self._expire(now)
        if op_id in self._seen:
            return True
        self._seen[op_id] = now
        order.append(op_id)
        self._key_len += len(op_id)
        return False

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        now = self._clock()  # one instant for the batch
        order, seen = self._order, self._seen
        if order and seen[order[0]] < now - self._window:
            self._expire(now)
        out: list[bool] = []
        added = 0
        for op_id in op_ids:
            if op_id in seen:
                out.append(True)
            else:
                seen[op_id] = now
                order.append(op_id)
                added += len(op_id)
                out.append(False)
        self._key_len += added
        return out

    def __contains__(self, op_id: bytes) -> bool:
        t = self._seen.get(op_id)
        return t is not None and t >= self._clock() - self._window

    def __len__(self) -> int:
        return len(self._seen)

    def nbytes(self) -> int:
        """The dict and deque, plus each id's bytes object and its timestamp float."""
        n = len(self._seen)
        return (
            sys.getsizeof(self._seen)
            + sys.getsizeof(self._order)
            + n * (_BYTES_OVERHEAD + _FLOAT_SIZE)
            + self._key_len
        )

    @property
    def window(self) -> float:
        return self._window

    def estimated_fpp(self) -> float:
        return 0.0

    def stats(self) -> dict[str, float]:
        return {"items": float(len(self._seen)), "nbytes": float(self.nbytes())}

    def to_bytes(self) -> bytes:
        seen = self._seen
        return frame(self.name, 1, [self._window, [(k, seen[k]) for k in self._order]])

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> ExactDedup:
        check_version(cls.name, version, 1)
        window, entries = payload
        d = cls(window, clock)
        for key, t in entries:
            d._seen[key] = t
            d._order.append(key)
            d._key_len += len(key)
        return d
