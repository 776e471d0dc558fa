"""The FBF's false-positive model: equation (3) of Section IV, its shared-generation
correction, the steady state at a given insert rate, and the sizing that follows from them.

Pure functions of loads (inserts per bit); ``cluster.core.fbf`` uses them for ``estimated_fpp``,
``adapt`` and ``for_window``, and the benchmarks plot them against measured rates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence


def fbf_fpp(p: Sequence[float]) -> float:
    """Equation (3) for per-filter false-positive rates ``p`` in age order (future first).

    A false positive comes from the future filter alone, from any adjacent pair of the present
    and past filters, or from the oldest past filter alone; the stages are taken as independent.
    """
    nf = len(p)
    keep = 1.0 - p[0]
    for j in range(1, nf - 1):
        keep *= 1.0 - p[j] * p[j + 1]
    keep *= 1.0 - p[nf - 1]
    return 1.0 - keep


def shared_fpp(gens: Sequence[float], k: int) -> float:
    """Equation (3) without the independence assumption for adjacent filters.

    ``gens[j]`` is the load (inserts per bit) of generation j: the ids inserted while filter j
    was the future. Filter j holds generations j and j-1, so adjacent filters share a whole
    generation, and a bit set by a shared id is set in both. The paper multiplies the two
    filters' FPPs as if independent and underestimates the pair terms (by 30% at FPP 1e-2).
    Here a probe position is set in both filters with probability
    ``1 - q_j - q_(j+1) + q_(j,j+1)`` (q = probability the bit is still 0), per position
    independent, as in equation (1).
    """
    nf = len(gens)
    loads = [gens[0]] + [gens[j] + gens[j - 1] for j in range(1, nf)]
    q = [math.exp(-k * load) for load in loads]
    keep = 1.0 - (1.0 - q[0]) ** k  # future alone
    for j in range(1, nf - 1):
        union = loads[j] + loads[j + 1] - gens[j]
        both = 1.0 - q[j] - q[j + 1] + math.exp(-k * union)
        keep *= 1.0 - max(both, 0.0) ** k
    keep *= 1.0 - (1.0 - q[nf - 1]) ** k  # oldest alone
    return 1.0 - keep


def projected_fpp(rate: float, period: float, m: int, k: int, nfilters: int) -> float:
    """``shared_fpp`` in steady state at ``rate`` inserts/s, at the end of a period (the worst
    point): every generation holds one period of inserts."""
    return shared_fpp([rate * period / m] * nfilters, k)


@functools.lru_cache(maxsize=64)
def size_filters(rate: float, period: float, nfilters: int, fpp: float) -> tuple[int, int]:
    """Smallest (m, k) whose steady-state equation (3) estimate is at most ``fpp``. Cached:
    a search of ~40 ms, made again for every table's filter at every start otherwise."""
    best: tuple[int, int] | None = None
    for k in range(1, 31):
        lo, hi = 8, 8
        while projected_fpp(rate, period, hi, k, nfilters) > fpp:
            lo, hi = hi, hi * 2
            if hi > 1 << 40:
                break
        while lo < hi:
            mid = (lo + hi) // 2
            if projected_fpp(rate, period, mid, k, nfilters) > fpp:
                lo = mid + 1
            else:
                hi = mid
        if best is None or hi < best[0]:
            best = (hi, k)
    assert best is not None
    return best
