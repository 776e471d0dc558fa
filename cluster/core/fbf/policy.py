"""Algorithm 3 (Section III-E), window-keeping: when and how to reshape a Forgetful Bloom Filter.

``AdaptivePolicy`` holds the controller's state (the measured insert rate, its target, its memory
cap, the shape it started from) and acts on a filter only through the filter's public reshaping
(``grow``, ``fold``, ``set_period``) and reading (``sync``, ``generation_loads``, ``filters_for``,
``bytes_for``) methods. It is also the one place that decides when a step runs: ``due(now)``, once
per ``interval`` of clock time (the paper's thread "running every one second"); callers that
drive steps themselves call ``step`` (or the filter's ``adapt()``) directly.

The paper's step (scale the filter count up multiplicatively and the period down additively when
the FPP nears the target, the reverse when it is far under) is replaced by one that sizes the
period from the measured rate with equation (3), keeps every generation until the window has
passed over it (the filter's own rule once it is elastic, so no period change shortens the
window), doubles ``m`` by copying when the 64-filter limit is reached, folds it back when load
falls, and raises ``over_target`` when ``max_bytes`` stops it from meeting the target instead of
degrading silently.

The filter carries its policy, and its snapshot carries the policy's state: ``state()`` is a
``PolicyState`` that ``cluster.core.fbf.codec`` writes into fixed header slots, and ``restore``
rebuilds the policy from it. A filter without a policy writes an idle ``PolicyState`` in those
slots. The policy never holds the filter: each call gets it, and it must be the one it was
attached to.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

from cluster.core.fbf.layout import MAX_FILTERS, word_bits
from cluster.core.fbf_model import projected_fpp, shared_fpp


class ForgetfulBloomFilter(Protocol):
    """What the policy reads and reshapes of a filter (``cluster.core.fbf.filter``): its shape, its
    load, and its public reshaping. Declared here so the policy does not import the filter."""

    m: int
    k: int

    @property
    def period(self) -> float: ...

    @property
    def window(self) -> float: ...

    @property
    def inserted(self) -> int: ...

    def sync(self) -> float: ...

    def generation_loads(self) -> list[float]: ...

    def filters_for(self, period: float) -> int: ...

    def bytes_for(self, m: int, period: float) -> int: ...

    def set_period(self, period: float) -> None: ...

    def grow(self) -> None: ...

    def fold(self) -> None: ...

F_ELASTIC = 1  # a policy drives the filter
F_OVER_TARGET = 2


class PolicyState(NamedTuple):
    """The policy's fields of a v1 snapshot header, in header order."""

    flags: int  # F_ELASTIC | F_OVER_TARGET
    target_fpp: float  # 0.0: none
    max_bytes: int  # 0: no cap
    m0: int  # m when the policy started: folding stops there
    period0: float  # period when it started: lengthening stops there
    rate: float  # measured inserts per second
    min_period: float

    @classmethod
    def idle(cls, m: int, period: float, min_period: float, max_bytes: int | None) -> PolicyState:
        """What a filter without a policy writes (the v1 format still has the slots)."""
        return cls(0, 0.0, max_bytes or 0, m, period, 0.0, min_period)

    @property
    def elastic(self) -> bool:
        return bool(self.flags & F_ELASTIC)

    @property
    def over_target(self) -> bool:
        return bool(self.flags & F_OVER_TARGET)

    def idled(self) -> PolicyState:
        """This state as a filter without a policy keeps it (it has no target)."""
        return self if self.elastic else self._replace(target_fpp=0.0)


class AdaptivePolicy:
    """Keeps a filter's FPP under ``target_fpp`` as the insert rate changes, never its window.

    ``max_bytes`` caps the words' memory (None: no cap); ``min_period`` is the shortest refresh
    period it will set; ``interval`` is the clock time between the steps ``due`` allows.
    """

    def __init__(
        self,
        target_fpp: float,
        *,
        max_bytes: int | None = None,
        min_period: float = 0.01,
        interval: float = 1.0,
    ) -> None:
        if not 0 < target_fpp < 1:
            raise ValueError(f"target_fpp must be in (0, 1), got {target_fpp}")
        self.target_fpp = target_fpp
        self.max_bytes = max_bytes
        self.min_period = min_period
        self.interval = interval
        self.over_target = False
        self.rate = 0.0
        self._m0 = 0
        self._period0 = 0.0
        self._rate_t = 0.0
        self._rate_n = 0
        self._next_step = 0.0

    def attach(self, f: ForgetfulBloomFilter, now: float) -> None:
        """Start from ``f``'s shape at ``now``; the first step is due an interval later."""
        self._m0, self._period0 = f.m, f.period
        self._rate_t, self._rate_n = now, f.inserted
        self._next_step = now + self.interval

    @classmethod
    def restore(cls, s: PolicyState, f: ForgetfulBloomFilter, now: float) -> AdaptivePolicy:
        """The policy a snapshot's state describes, attached to ``f`` (loaded from it) at ``now``;
        unchecked, as the snapshot wrote it."""
        p = cls.__new__(cls)
        p.target_fpp, p.max_bytes, p.min_period = s.target_fpp, s.max_bytes or None, s.min_period
        p.interval = 1.0
        p.over_target, p.rate = s.over_target, s.rate
        p.attach(f, now)
        p._m0, p._period0 = s.m0, s.period0
        return p

    def state(self) -> PolicyState:
        flags = F_ELASTIC | (F_OVER_TARGET if self.over_target else 0)
        return PolicyState(
            flags, self.target_fpp, self.max_bytes or 0, self._m0, self._period0, self.rate,
            self.min_period,
        )

    # -- when ------------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        """True (and the next step scheduled an interval later) when a step is due at ``now``."""
        if now < self._next_step:
            return False
        self._next_step = now + self.interval
        return True

    # -- how -------------------------------------------------------------------------------

    def step(self, f: ForgetfulBloomFilter) -> bool:
        """One step of adaptive resizing; returns True when the shape changed.

        The step plans for twice the measured insert rate, so a rising load is met before the
        filters fill (a doubled m only thins new generations; old ones stay as dense as they
        were until they age out). Scale up fast (halve the period; double m once the filter
        count is at its limit) when the current FPP reaches 0.9 of the target or the steady
        state at the measured rate would reach 0.75 of it, planning for half the target at twice
        the rate; relax slowly (lengthen the period by an eighth of the base, fold m in half)
        when the current FPP is under a tenth of the target and the relaxed shape still meets a
        quarter of it at twice the rate. The window never shrinks: the filter count follows
        from the period, and old generations are kept until the window has passed over them.
        """
        now = f.sync()
        dt = now - self._rate_t
        if dt > 0:
            inst = (f.inserted - self._rate_n) / dt
            # rise at once, decay gently, so a burst is met before the filters fill
            self.rate = max(inst, 0.7 * self.rate + 0.3 * inst)
            self._rate_t, self._rate_n = now, f.inserted
        target = self.target_fpp
        cur = shared_fpp(f.generation_loads(), f.k)
        if cur >= 0.9 * target or self._proj(f, f.period, f.m, 1.0) >= 0.75 * target:
            return self._scale_up(f, cur)
        if cur <= 0.1 * target:
            return self._scale_down(f)
        self.over_target = cur > target
        return False

    def _proj(self, f: ForgetfulBloomFilter, period: float, m: int, headroom: float = 2.0) -> float:
        return projected_fpp(headroom * self.rate, period, m, f.k, f.filters_for(period))

    def _scale_up(self, f: ForgetfulBloomFilter, cur: float) -> bool:
        goal = 0.5 * self.target_fpp
        period, m = f.period, f.m
        cap = self.max_bytes or math.inf
        while self._proj(f, period, m) > goal:
            shorter = self._shorter_period(f, period)
            if (
                shorter < period
                and shorter >= self.min_period
                and f.filters_for(shorter) <= MAX_FILTERS - 2
                and f.bytes_for(m, shorter) <= cap
            ):
                period = shorter
            elif f.bytes_for(2 * m, period) <= cap:
                m *= 2
            else:
                break
        changed = period != f.period or m != f.m
        while f.m < m:
            f.grow()
        if period != f.period:
            f.set_period(period)
        self.over_target = max(cur, self._proj(f, f.period, f.m, 1.0)) > self.target_fpp
        return changed

    @staticmethod
    def _shorter_period(f: ForgetfulBloomFilter, period: float) -> float:
        """The period whose filters fill the word that half the period would need: every
        filter costs a bit of that word anyway (33 filters take 64-bit words, as 64 do). The
        widest word keeps two filters of slack for generations the window still covers."""
        bits = word_bits(min(f.filters_for(period / 2), MAX_FILTERS))
        usable = bits - 1 if bits < MAX_FILTERS else MAX_FILTERS - 3
        return f.window / usable

    def _scale_down(self, f: ForgetfulBloomFilter) -> bool:
        low = 0.25 * self.target_fpp
        changed = False
        if f.m > self._m0 and f.m % 2 == 0 and self._proj(f, f.period, f.m // 2) <= low:
            f.fold()
            changed = True
        longer = min(f.period + self._period0 / 8, self._period0)
        if longer > f.period and self._proj(f, longer, f.m) <= low:
            f.set_period(longer)
            changed = True
        self.over_target = False
        return changed
