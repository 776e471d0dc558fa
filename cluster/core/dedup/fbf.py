"""The Forgetful Bloom Filter as a dedup strategy (the paper's proposal), fixed or adaptive.

``FBFDedup`` wraps ``ForgetfulBloomFilter.for_window`` (Sections III-IV): ids are remembered for
the window and forgotten by time, at an FPP sized from the design rate. ``AdaptiveFBFDedup``
gives the filter an ``AdaptivePolicy`` (the window-keeping Algorithm 3, ``target_fpp`` and
``max_bytes``) and offers it a step from the hot path after every insert; the policy decides
whether one is due (once per its ``interval``, a second of clock time), so a node that does not
run a background task still adapts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cluster.core.dedup._base import Clock, FilterBacked, check_version, frame_parts
from cluster.core.fbf import ForgetfulBloomFilter


class FBFDedup(FilterBacked[ForgetfulBloomFilter]):
    """A ``ForgetfulBloomFilter`` sized for (window, rate, target_fpp)."""

    name: str = "fbf"

    @classmethod
    def for_window(
        cls, window: float, rate: float, target_fpp: float, clock: Clock = time.time
    ) -> FBFDedup:
        return cls(ForgetfulBloomFilter.for_window(window, rate, target_fpp, clock=clock))

    def seen_or_add(self, op_id: bytes) -> bool:
        return not self._f.add(op_id)

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        # add_many answers True where NEW (and loops below its own numpy crossover)
        if len(op_ids) == 1:
            return [not self._f.add(op_ids[0])]
        return (~self._f.add_many(op_ids)).tolist()

    def stats(self) -> dict[str, float]:
        f = self._f
        return {"fpp": f.estimated_fpp(), "fill": f.estimated_fill(), "n_past": float(f.n_past),
                "period": f.period, "window": f.window, "m": float(f.m), "k": float(f.k),
                "over_target": float(f.over_target)}

    def to_bytes(self) -> bytes:
        # ``frame`` of the filter's bytes, built from its parts: one copy of the words and one
        # join, where packing them took four copies (~90 ms at 16 MB, a pull answer's stall)
        return b"".join(self.snapshot_parts())

    def snapshot_parts(self) -> list[bytes | memoryview]:
        """``to_bytes`` as parts, the filter's words copied once (``NodeState``'s snapshot)."""
        return frame_parts(self.name, 1, self._f.to_parts())

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> FBFDedup:
        check_version(cls.name, version, 1)
        return cls(ForgetfulBloomFilter.from_bytes(payload, clock=clock))


class AdaptiveFBFDedup(FBFDedup):
    """The adaptive FBF: keeps its FPP under the target as the rate changes, never the window."""

    name: str = "adaptive-fbf"

    def __init__(self, f: ForgetfulBloomFilter, clock: Clock = time.time) -> None:
        super().__init__(f)
        self._clock = clock
        self.adaptations = 0

    @classmethod
    def for_window(
        cls, window: float, rate: float, target_fpp: float, clock: Clock = time.time,
        max_bytes: int | None = None,
    ) -> AdaptiveFBFDedup:
        f = ForgetfulBloomFilter.for_window(
            window, rate, target_fpp, clock=clock, adaptive=True, max_bytes=max_bytes
        )
        return cls(f, clock)

    def seen_or_add(self, op_id: bytes) -> bool:
        dup = not self._f.add(op_id)
        self._offer_step()
        return dup

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        dups = super().seen_or_add_many(op_ids)
        self._offer_step()
        return dups

    def _offer_step(self) -> None:
        # the policy says when (it was attached with the filter: its first step is an interval
        # after, once there is a rate to measure); the filter runs the step
        policy = self._f.policy
        if policy is not None and policy.due(self._clock()) and self._f.adapt():
            self.adaptations += 1

    def stats(self) -> dict[str, float]:
        s = super().stats()
        s["adaptations"] = float(self.adaptations)
        s["rate"] = self._f.measured_rate()
        return s

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> AdaptiveFBFDedup:
        check_version(cls.name, version, 1)
        return cls(ForgetfulBloomFilter.from_bytes(payload, clock=clock), clock)
