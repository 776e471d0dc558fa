"""The Forgetful Bloom Filter (Subramanyam et al., Sections III-IV): a moving window of op ids.

Layout: bit-sliced (``cluster.core.fbf.layout``). The N+2 constituent filters share one numpy array
of m words, bit j of word p being bit p of filter j. A check ANDs the item's k words: bit j of the
result says "the item is in filter j", and Algorithm 2 is three integer operations on that mask
whatever the number of filters. A refresh (Section III-C) is one shift of the whole array, atomic
for the event loop that owns the filter (not thread-safe; no I/O; time comes from ``clock``).

Algorithm 2 is corrected: the paper's pseudocode (and the authors' code) skips the oldest past
filter alone when N > 1, so an id held only there is forgotten a period early and its retry counts
twice. Here the oldest filter alone is always checked.

The structure only. Its shape changes through the public ``grow`` (double m), ``fold`` (halve
m) and ``set_period``; with a policy attached (``elastic``) its filter count follows ``window`` at
each refresh, so that no reshaping shortens the window. When and how to reshape is
``AdaptivePolicy``'s job (``cluster.core.fbf.policy``, Algorithm 3), an object beside the filter
that the filter carries so that one snapshot holds both (``cluster.core.fbf.codec``: the header's
policy slots, written back unread). ``adapt()``, ``measured_rate()``, ``over_target`` and
``target_fpp`` are shorthands for the policy's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from cluster.core.bloom import load_from_fill
from cluster.core.fbf import hotpath, layout
from cluster.core.fbf.codec import Snapshot, decode, encode_parts
from cluster.core.fbf.estimates import Estimates
from cluster.core.fbf.layout import MAX_FILTERS, dtype_for
from cluster.core.fbf.policy import AdaptivePolicy, PolicyState
from cluster.core.fbf_model import size_filters
from cluster.core.hashing import HashFn, hash_pair


class ForgetfulBloomFilter(Estimates):
    """N+2 Bloom filters (future, present, N past) that forget ids older than the window.

    An id added at time T is a member until at least T + (N+1)*period and is forgotten by
    T + (N+2)*period. With a ``policy`` (or its shorthand ``target_fpp``, with ``max_bytes`` and
    ``min_period``) the shape adapts and the guarantee becomes: an id added at T is a member until
    at least T + ``window``, whatever the reshaping.
    """

    def __init__(
        self,
        m: int,
        k: int,
        n_past: int = 1,
        period: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        target_fpp: float | None = None,
        max_bytes: int | None = None,
        window: float | None = None,
        min_period: float = 0.01,
        hash_fn: HashFn = hash_pair,
        policy: AdaptivePolicy | None = None,
    ) -> None:
        if m < 1 or k < 1:
            raise ValueError(f"m and k must be >= 1, got m={m}, k={k}")
        if not 1 <= n_past <= MAX_FILTERS - 2:
            raise ValueError(f"n_past must be in 1..{MAX_FILTERS - 2}, got {n_past}")
        if not period > 0:
            raise ValueError(f"period must be > 0 seconds, got {period}")
        if target_fpp is not None:
            if policy is not None:
                raise ValueError("pass a policy or its shorthand target_fpp, not both")
            policy = AdaptivePolicy(target_fpp, max_bytes=max_bytes, min_period=min_period)
        self.m = m
        self.k = k
        self._clock = clock
        self._hash = hash_fn
        self._kernel = hotpath.available()
        self._period = float(period)
        fixed_window = (n_past + 1) * self._period
        self._window = float(window) if window is not None else fixed_window
        if policy is None and abs(self._window - fixed_window) > 1e-9 * fixed_window:
            raise ValueError(
                f"a fixed FBF remembers (n_past+1)*period = {fixed_window}s, not window={window}; "
                "set target_fpp to make the shape follow a window"
            )
        self.window_violations = 0  # refreshes at which 64 filters could not cover the window
        now = clock()
        self._set_shape(n_past + 2, np.zeros(m, dtype=dtype_for(n_past + 2)))
        self._gens = [0.0] * self._nf  # load (inserts per bit) of each generation, newest first
        self._starts: list[float] = []
        self._reset_epochs(now)
        self._pending = 0  # inserts not yet folded into _gens
        self._inserted = 0
        # without a policy the header's policy slots still carry these (the v1 format)
        self._idle = PolicyState.idle(m, self._period, min_period, max_bytes)
        self.policy: AdaptivePolicy | None = None
        if policy is not None:
            policy.attach(self, now)
            self.policy = policy

    # -- shape -----------------------------------------------------------------------------

    def _set_shape(self, nfilters: int, words: np.ndarray) -> None:
        self._nf = nfilters
        self._words = words
        self._hot = hotpath.make(words, self.k, nfilters, self._hash, self._kernel)
        self._hot_add = self._hot.add  # bound once: add() is the hottest call
        # below this many ids a batch loops add(): the scalar walk costs ~0.4 us a hash, numpy
        # ~50 us a call, so the crossover falls near 100/k ids. The kernel keeps the same
        # crossover, although it would not need one: a loop checks each id against the ids
        # before it, a batch does not, and both paths must give the same answers
        self._small_batch = max(2, 100 // self.k)

    @property
    def kernel(self) -> str:
        """What runs this filter's hot operations: ``"c"`` (the compiled kernel) or ``"numpy"``
        (``cluster.core.fbf.hotpath``)."""
        return "numpy" if isinstance(self._hot, hotpath.NumpyPath) else "c"

    def use_kernel(self, on: bool) -> None:
        """Run the hot operations in the compiled kernel (when it is built and the hash is the
        default one) or, off, in the numpy path: the bits and answers are the same either way."""
        self._kernel = on
        self._set_shape(self._nf, self._words)

    @property
    def n_past(self) -> int:
        return self._nf - 2

    @property
    def period(self) -> float:
        return self._period

    @property
    def window(self) -> float:
        """Seconds an added id is guaranteed to stay a member."""
        return self._window

    @property
    def elastic(self) -> bool:
        """True when a policy may reshape the filter: its filter count then follows ``window``."""
        return self.policy is not None

    adaptive = elastic

    @property
    def inserted(self) -> int:
        """Ids inserted since the filter was made (as of the last ``sync``)."""
        return self._inserted

    def nbytes(self) -> int:
        return int(self._words.nbytes)

    def filters_for(self, period: float) -> int:
        """Filters a refresh period needs so that (N+1)*period covers the window."""
        return math.ceil(self._window / period - 1e-9) + 1

    def bytes_for(self, m: int, period: float) -> int:
        """Memory the words would take at ``m`` bits and ``period``."""
        return m * dtype_for(min(self.filters_for(period), MAX_FILTERS))(0).nbytes

    # -- Algorithm 1 and 2 -----------------------------------------------------------------

    def _probe(self, item: bytes) -> int:
        """The AND of the item's k words: bit j set when the item is in filter j."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return self._hot.probe(item)

    def add(self, item: bytes) -> bool:
        """Algorithm 1: insert into future and present unless a member; True when it was new.

        The check is Algorithm 2 on the AND of the item's words: the future alone, any adjacent
        (present, past...) pair, or the oldest past alone."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        if self._hot_add(item):
            self._pending += 1
            return True
        return False

    def __contains__(self, item: bytes) -> bool:
        """Algorithm 2, the optimised check (with the oldest filter alone always checked)."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return self._hot.contains(item)

    def contains_simple(self, item: bytes) -> bool:
        """Section III-A: present in any constituent filter."""
        return self._probe(item) != 0

    # -- batch API -------------------------------------------------------------------------

    def add_many(self, items: Sequence[bytes]) -> np.ndarray:
        """Algorithm 1 for a batch; returns a bool array, True where the id was new.

        Repeats inside the batch are duplicates of their first occurrence, as one-by-one adds
        would say. Unlike one-by-one adds, ids of the same batch cannot make each other false
        positives, so a batch is never less accurate than the sequence it replaces.
        """
        if len(items) < self._small_batch:  # numpy's per-call cost outweighs the loop
            return np.fromiter(map(self.add, items), dtype=bool, count=len(items))
        if self._clock() >= self._next_refresh:
            self._catch_up()
        new = self._hot.add_many(items)
        self._pending += int(np.count_nonzero(new))
        return new

    def contains_many(self, items: Sequence[bytes], *, simple: bool = False) -> np.ndarray:
        """Vectorised ``in`` (or ``contains_simple``) for many items."""
        if len(items) < self._small_batch:
            probe = self.contains_simple if simple else self.__contains__
            return np.fromiter(map(probe, items), dtype=bool, count=len(items))
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return self._hot.contains_many(items, simple)

    # -- refresh (Section III-C) -----------------------------------------------------------

    def _sync_loads(self) -> None:
        if self._pending:
            self._gens[0] += self._pending / self.m
            self._inserted += self._pending
            self._pending = 0

    def _reset_epochs(self, now: float) -> None:
        """Align generations to epochs (epoch = floor(time / period)), as if the filter had been
        running: generation j started j periods before the current one. Replicas that share a
        period therefore agree on every generation's start and can merge by OR."""
        epoch = math.floor(now / self._period)
        self._starts = [(epoch - j) * self._period for j in range(self._nf)]
        self._next_refresh = (epoch + 1) * self._period

    def _resize(self, nf: int) -> None:
        """Change the filter count (``layout.resized``), generations' epochs continued backwards."""
        old = self._nf
        self._set_shape(nf, layout.resized(self._words, old, nf))
        if nf > old:  # the copy holds generations old-1 and old-2, like the filter it copies
            self._gens.append(self._gens[old - 2])
            self._starts.append(self._starts[old - 1] - self._period)
        self._gens = self._gens[:nf]
        self._starts = self._starts[:nf]
        while len(self._starts) < nf:
            self._gens.append(0.0)
            self._starts.append(self._starts[-1] - self._period)

    def _rotate(self, at: float) -> None:
        self._sync_loads()
        elastic = self.policy is not None
        if elastic:
            nf = self._target_filters(at)
            if nf > self._nf:
                self._resize(nf)
        self._hot.shift()  # one C pass with the kernel, two numpy passes without
        self._gens = [0.0, *self._gens[:-1]]
        self._starts = [at, *self._starts[:-1]]
        if elastic and nf < self._nf:
            self._resize(nf)

    def _target_filters(self, at: float) -> int:
        """Filters needed after a refresh at ``at``: the shape the period asks for, and every
        generation whose inserts the window still covers (inserts into a generation end when the
        next one starts)."""
        want = self.filters_for(self._period)
        # after the shift, the generation at bit j ended when the one at bit j-1 started
        ends = [at] + self._starts
        need = 1
        for j in range(1, len(ends)):
            if ends[j - 1] + self._window > at + 1e-9:
                need = j + 1
        nf = max(want, need, 3)
        if nf > MAX_FILTERS:
            self.window_violations += 1
            nf = MAX_FILTERS
        return nf

    def refresh(self) -> None:
        """Rotate once, now: the oldest filter is dropped and a new empty future filter begins."""
        self._rotate(self._clock())

    def sync(self) -> float:
        """Refresh as the clock says and fold pending inserts into the loads; returns the time."""
        now = self._clock()
        if now >= self._next_refresh:
            self._catch_up()
        self._sync_loads()
        return now

    def _catch_up(self) -> None:
        now = self._clock()
        if now - self._next_refresh > self._window + (self._nf + 1) * self._period:
            # idle past every generation's lifetime: all of them have aged out
            self._sync_loads()
            self._words[:] = 0
            self._gens = [0.0] * self._nf
            self._reset_epochs(now)
            return
        while now >= self._next_refresh:
            at = self._next_refresh
            self._rotate(at)
            # the next epoch boundary of the (possibly changed) period; the slack absorbs the
            # rounding of large wall-clock quotients
            self._next_refresh = (math.floor(at / self._period + 1e-4) + 1) * self._period

    # -- reshaping (what Algorithm 3 acts through) ----------------------------------------

    def set_period(self, period: float) -> None:
        """Refresh every ``period`` seconds from the next epoch boundary on; the window is kept
        (enough filters at once for (N+1)*period >= window; fewer only as generations age out,
        and only on an elastic filter: a fixed one keeps the filters it has)."""
        if not period > 0:
            raise ValueError(f"period must be > 0 seconds, got {period}")
        # keep epoch alignment (epoch = floor(time / period)) so replicas with the same shape merge
        self._period = period
        now = self._clock()
        self._next_refresh = min(self._next_refresh, (math.floor(now / period) + 1) * period)
        want = self.filters_for(period)
        if want > self._nf:
            self._sync_loads()
            self._resize(min(want, MAX_FILTERS))

    def grow(self) -> None:
        """Double m by copying: every position x mod m reappears at x mod 2m (no member lost)."""
        self._sync_loads()
        self.m *= 2
        self._set_shape(self._nf, np.concatenate([self._words, self._words]))

    def fold(self) -> None:
        """Halve m by OR-ing the halves: x mod (m/2) is where x mod m lands (no member lost)."""
        if self.m % 2:
            raise ValueError(f"cannot fold an odd m={self.m}")
        self._sync_loads()
        half = self.m // 2
        words = self._words[:half] | self._words[half:]
        self.m = half
        self._set_shape(self._nf, words)
        self._gens = [2.0 * load for load in self._gens]

    # -- Algorithm 3 shorthands: the attached policy's ---------------------------------------

    def adapt(self) -> bool:
        """One step of the attached policy now (see ``AdaptivePolicy.step``); True when the shape
        changed. A fixed filter has none and never changes."""
        return False if self.policy is None else self.policy.step(self)

    def measured_rate(self) -> float:
        return self._idle.rate if self.policy is None else self.policy.rate

    @property
    def target_fpp(self) -> float | None:
        return None if self.policy is None else self.policy.target_fpp

    @property
    def over_target(self) -> bool:
        """True when the policy cannot meet its target (``max_bytes`` stops it)."""
        return self._idle.over_target if self.policy is None else self.policy.over_target

    # -- replicas: merge and bytes ---------------------------------------------------------

    def merge(self, other: ForgetfulBloomFilter) -> None:
        """OR in ``other``'s generations that are aligned to ours (same start epoch).

        Refuses filters of a different m, k or period: their bits do not line up.
        """
        if (self.m, self.k) != (other.m, other.k) or abs(self._period - other._period) > 1e-9:
            raise ValueError(
                f"cannot merge FBFs of different shapes: (m={self.m}, k={self.k}, "
                f"period={self._period}) vs (m={other.m}, k={other.k}, period={other._period})"
            )
        self._catch_up()
        other._catch_up()
        period = self._period
        index = {round(s / period): j for j, s in enumerate(self._starts)}
        pairs = [(i, index.get(round(s / period))) for i, s in enumerate(other._starts)]
        if all(j is None for _, j in pairs):
            raise ValueError("cannot merge FBFs whose generations share no epoch")
        self._sync_loads()
        done: dict[int, int] = {}
        for i, j in pairs:
            if j is not None:
                done.setdefault(j, i)
        layout.or_slices(self._words, other._words, [(i, j) for j, i in done.items()])
        # generation loads from the merged fills: filter 0 is generation 0 alone, filter j is
        # generations j and j-1
        gens: list[float] = []
        for j, fill in enumerate(self.fills()):
            load = load_from_fill(fill, self.k)
            gens.append(max(0.0, load - gens[j - 1]) if j else load)
        self._gens = gens

    def copy(self) -> ForgetfulBloomFilter:
        g = type(self).from_bytes(self.to_bytes(), clock=self._clock, hash_fn=self._hash)
        if g._kernel != self._kernel:
            g.use_kernel(self._kernel)
        if self.policy is not None and g.policy is not None:
            g.policy.interval = self.policy.interval  # not in the bytes
        return g

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ForgetfulBloomFilter):
            return NotImplemented
        self._catch_up()  # the state is a function of the clock: compare both as of now
        other._catch_up()
        return (
            (self.m, self.k, self._nf, self._period) == (other.m, other.k, other._nf, other._period)
            and self._starts == other._starts
            and bool(np.array_equal(self._words, other._words))
        )

    __hash__ = None  # type: ignore[assignment]

    def to_bytes(self) -> bytes:
        """Versioned bytes (``cluster.core.fbf.codec``): the header with the policy's state, start
        time and load per generation, the words."""
        return b"".join(self.to_parts())

    def to_parts(self) -> list[bytes | memoryview]:
        """``to_bytes`` in parts, the words copied once and not joined (a node's snapshot writes
        them as they are: a 16 MB filter costs one copy on the loop, not four)."""
        self._sync_loads()
        return encode_parts(Snapshot(
            self.m, self.k, self._period, self._next_refresh, self._window, self._inserted,
            self._starts, self._gens, self._words,
            self._idle if self.policy is None else self.policy.state(),
        ))

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        clock: Callable[[], float] = time.monotonic,
        hash_fn: HashFn = hash_pair,
    ) -> ForgetfulBloomFilter:
        s = decode(data)
        f = cls.__new__(cls)
        f.m, f.k = s.m, s.k
        f._clock, f._hash, f._kernel = clock, hash_fn, hotpath.available()
        f._period, f._window = s.period, s.window
        f.window_violations = 0
        f._starts, f._gens = s.starts, s.gens
        f._set_shape(len(s.starts), s.words)
        f._next_refresh = s.next_refresh
        f._pending, f._inserted = 0, s.inserted
        f._idle = s.state.idled()
        f.policy = AdaptivePolicy.restore(s.state, f, clock()) if s.state.elastic else None
        return f

    # -- sizing ----------------------------------------------------------------------------

    @classmethod
    def for_window(
        cls,
        window: float,
        rate: float,
        fpp: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        adaptive: bool = False,
        max_bytes: int | None = None,
        n_past: int = 6,
    ) -> ForgetfulBloomFilter:
        """An FBF remembering ``window`` seconds of ids arriving at ``rate``/s, FPP <= ``fpp``.

        Six past filters make eight in all, which fills the uint8 words of the bit-sliced layout
        exactly (the memory sweet spot); m and k are the smallest that meet ``fpp`` by equation
        (3) with shared generations. An adaptive filter is sized for half of ``fpp``, the goal its
        own step plans for, so that it does not resize at the design rate.
        """
        period = window / (n_past + 1)
        m, k = size_filters(rate, period, n_past + 2, fpp / 2 if adaptive else fpp)
        return cls(
            m, k, n_past, period, clock,
            target_fpp=fpp if adaptive else None, max_bytes=max_bytes, window=window,
        )
