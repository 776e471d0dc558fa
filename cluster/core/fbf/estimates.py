"""Section IV: the false positive probability of a Forgetful Bloom Filter, from its state.

The read-only estimates of ``ForgetfulBloomFilter``, kept apart from the structure's updates: a
base class whose methods read the filter's fills (exact, from the words) and generation loads
(inserts per bit, tracked at insert) and apply equations (1) and (3) (``cluster.core.fbf_model``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from cluster.core.bloom import bloom_fpp
from cluster.core.fbf import layout
from cluster.core.fbf_model import fbf_fpp, shared_fpp


class Estimates(ABC):
    """Estimates over the state ``ForgetfulBloomFilter`` keeps (declared here, set there)."""

    k: int
    _clock: Callable[[], float]
    _next_refresh: float
    _words: np.ndarray
    _nf: int
    _gens: list[float]

    @abstractmethod
    def _catch_up(self) -> None:
        """Run the refreshes that are due (the filter's own)."""

    @abstractmethod
    def _sync_loads(self) -> None:
        """Fold the inserts not yet counted into the generation loads (the filter's own)."""

    def fills(self) -> list[float]:
        """Exact fraction of set bits of each constituent filter, in age order."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return layout.fills(self._words, self._nf)

    def fill(self) -> float:
        """Mean fill of the constituent filters."""
        f = self.fills()
        return sum(f) / len(f)

    def filter_loads(self) -> list[float]:
        """Inserts per bit of each filter: filter j took generation j (as the future) and
        generation j-1 (as the present)."""
        self._sync_loads()
        g = self._gens
        return [g[0]] + [g[j] + g[j - 1] for j in range(1, self._nf)]

    def estimated_fill(self) -> float:
        """Mean fill of the constituent filters expected from their loads (``1 - e^-k*load``
        each): what ``fill`` measures, without a pass over the words (which stalls a loop
        ~70 ms at 16 MB: the node's metrics use this one)."""
        loads = self.filter_loads()
        return sum(1.0 - math.exp(-self.k * load) for load in loads) / len(loads)

    def filter_fpps(self) -> list[float]:
        """Equation (1) for each filter, from the ids inserted into it."""
        return [bloom_fpp(load, self.k) for load in self.filter_loads()]

    def paper_fpp(self) -> float:
        """Equation (3) exactly as the paper gives it (independent filters)."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return fbf_fpp(self.filter_fpps())

    def generation_loads(self) -> list[float]:
        """Inserts per bit of each generation, newest first (as of the last ``sync``)."""
        return list(self._gens)

    def estimated_fpp(self) -> float:
        """Equation (3) with adjacent filters' shared generation accounted for (see
        ``shared_fpp``); equal to ``paper_fpp`` where the pair terms vanish, and the one the
        adaptive step, the sizing and the node's metrics use."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        self._sync_loads()
        return shared_fpp(self._gens, self.k)
