"""The Forgetful Bloom Filter (Subramanyam et al., Sections III-IV): a moving window of op ids.

Layout: bit-sliced. The N+2 constituent filters share one numpy array of m words; bit j of word p
is bit p of filter j, with the filters in age order (j = 0 future, 1 present, 2.. past newest to
oldest). A check reads the item's k words and ANDs them: bit j of the result says "the item is in
filter j", and Algorithm 2 becomes three integer operations on that mask whatever the number of
filters. A refresh (Section III-C) is one shift of the whole array, so it is atomic for the
event loop that owns the filter (it is not thread-safe and does no I/O; time comes from ``clock``).

Algorithm 2 is corrected: the paper's pseudocode (and the authors' code) skips the oldest past
filter alone when N > 1, so an id held only there is forgotten a period early and its retry counts
twice. Here the oldest filter alone is always checked.

Algorithm 3 is replaced by a window-keeping variant (``adapt``): it sizes the refresh period from
the measured insert rate with equation (3), keeps every generation until the configured window has
passed over it (so no period change ever shortens the window), doubles ``m`` by copying the array
when the 64-filter limit is reached (positions are ``x mod m``, and ``x mod 2m`` is congruent, so
no member is lost), folds it back when load falls, and raises ``over_target`` when ``max_bytes``
stops it from meeting the target instead of degrading silently.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Sequence

import numpy as np

from cluster.bloom import bloom_fpp, load_from_fill
from cluster.fbf_model import fbf_fpp, projected_fpp, shared_fpp, size_filters
from cluster.hashing import MASK64, SEED, HashFn, _murmur, hash_pair, hash_pairs_np, positions_np

MAX_FILTERS = 64
_DTYPES: tuple[tuple[int, type[np.unsignedinteger]], ...] = (
    (8, np.uint8),
    (16, np.uint16),
    (32, np.uint32),
    (64, np.uint64),
)
_MAGIC = b"FBF1"
_HEADER = struct.Struct("<4sQIIdddIdQQdQdd")
_F_ADAPTIVE = 1
_F_OVER_TARGET = 2


def _dtype_for(nfilters: int) -> type[np.unsignedinteger]:
    for bits, dt in _DTYPES:
        if nfilters <= bits:
            return dt
    raise ValueError(f"at most {MAX_FILTERS} constituent filters, asked for {nfilters}")


class ForgetfulBloomFilter:
    """N+2 Bloom filters (future, present, N past) that forget ids older than the window.

    An id added at time T is a member until at least T + (N+1)*period and is forgotten by
    T + (N+2)*period. With ``target_fpp`` set the shape adapts (see ``adapt``) and the guarantee
    becomes: an id added at T is a member until at least T + ``window``, whatever the adaptation.
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
    ) -> None:
        if m < 1 or k < 1:
            raise ValueError(f"m and k must be >= 1, got m={m}, k={k}")
        if not 1 <= n_past <= MAX_FILTERS - 2:
            raise ValueError(f"n_past must be in 1..{MAX_FILTERS - 2}, got {n_past}")
        if not period > 0:
            raise ValueError(f"period must be > 0 seconds, got {period}")
        if target_fpp is not None and not 0 < target_fpp < 1:
            raise ValueError(f"target_fpp must be in (0, 1), got {target_fpp}")
        self.m = m
        self.k = k
        self._clock = clock
        self._hash = hash_fn
        self._fast_hash = hash_fn is hash_pair
        self._period = float(period)
        fixed_window = (n_past + 1) * self._period
        self._window = float(window) if window is not None else fixed_window
        if target_fpp is None and abs(self._window - fixed_window) > 1e-9 * fixed_window:
            raise ValueError(
                f"a fixed FBF remembers (n_past+1)*period = {fixed_window}s, not window={window}; "
                "set target_fpp to make the shape follow a window"
            )
        self.target_fpp = target_fpp
        self.max_bytes = max_bytes
        self.min_period = min_period
        self.over_target = False
        self.window_violations = 0
        self._m0 = m
        self._period0 = self._period
        now = clock()
        self._set_shape(n_past + 2, np.zeros(m, dtype=_dtype_for(n_past + 2)))
        self._gens = [0.0] * self._nf  # load (inserts per bit) of each generation, newest first
        self._starts: list[float] = []
        self._reset_epochs(now)
        self._pending = 0  # inserts not yet folded into _gens
        self._inserted = 0
        self._rate = 0.0
        self._rate_t = now
        self._rate_n = 0

    # -- shape -----------------------------------------------------------------------------

    def _set_shape(self, nfilters: int, words: np.ndarray) -> None:
        self._nf = nfilters
        self._words = words
        self._mv = memoryview(words)  # type: ignore[arg-type]  # ndarray exports a buffer
        self._live = (1 << nfilters) - 1
        self._oldest = nfilters - 1
        self._pairmask = ((1 << (nfilters - 1)) - 1) & ~1  # pair (j, j+1) for j in 1..N
        self._krange = range(self.k)
        self._pos = [0] * self.k  # scratch for add(), so the hot path allocates nothing
        # below this many ids a batch loops add(): the scalar walk costs ~0.4 us a hash, numpy
        # ~50 us a call, so the crossover falls near 100/k ids
        self._small_batch = max(2, 100 // self.k)

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
    def adaptive(self) -> bool:
        return self.target_fpp is not None

    def nbytes(self) -> int:
        return int(self._words.nbytes)

    # -- Algorithm 1 and 2 -----------------------------------------------------------------

    def _probe(self, item: bytes) -> int:
        """The AND of the item's k words: bit j set when the item is in filter j."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        if self._fast_hash:
            h1, h2 = _murmur(item, SEED)
            h2 |= 1
        else:
            h1, h2 = self._hash(item)
        m, mv = self.m, self._mv
        x, y = h1, h2
        w = self._live
        for i in self._krange:  # cluster.hashing.positions, walked inline
            w &= mv[x % m]
            x = (x + y) & MASK64
            y = (y + i) & MASK64
        return w

    def add(self, item: bytes) -> bool:
        """Algorithm 1: insert into future and present unless a member; True when it was new."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        # the hot path, kept inline (it is _probe plus the insert); the check is Algorithm 2
        # on the AND mask: the future alone, any adjacent (present, past...) pair, or the
        # oldest past alone
        if self._fast_hash:
            h1, h2 = _murmur(item, SEED)
            h2 |= 1
        else:
            h1, h2 = self._hash(item)
        m, mv, pos = self.m, self._mv, self._pos
        x, y = h1, h2
        w = self._live
        for i in self._krange:
            p = pos[i] = x % m
            w &= mv[p]
            x = (x + y) & MASK64
            y = (y + i) & MASK64
        if w & 1 or w & (w >> 1) & self._pairmask or w >> self._oldest:
            return False
        for p in pos:
            mv[p] |= 3
        self._pending += 1
        return True

    def __contains__(self, item: bytes) -> bool:
        """Algorithm 2, the optimised check (with the oldest filter alone always checked)."""
        w = self._probe(item)
        return bool(w & 1 or w & (w >> 1) & self._pairmask or w >> self._oldest)

    def contains_simple(self, item: bytes) -> bool:
        """Section III-A: present in any constituent filter."""
        return self._probe(item) != 0

    # -- batch API -------------------------------------------------------------------------

    def _masks_many(self, items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h1, h2 = hash_pairs_np(items, self._hash)
        pos = positions_np(h1, h2, self.k, self.m).view(np.intp)  # < m: the same values
        return pos, np.bitwise_and.reduce(self._words[pos], axis=0), h1

    def _members_np(self, w: np.ndarray) -> np.ndarray:
        dt = self._words.dtype.type
        pairs = w & (w >> dt(1)) & dt(self._pairmask)
        return ((w & dt(1)) | pairs | (w >> dt(self._oldest))) != 0

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
        pos, w, h1 = self._masks_many(items)
        new = ~self._members_np(w)
        # equal ids have equal hashes; only when some hash repeats are the ids compared (a sort
        # is 20x cheaper here than np.unique)
        s = np.sort(h1)
        if bool((s[1:] == s[:-1]).any()):
            first: dict[bytes, int] = {}
            for i, it in enumerate(items):
                j = first.setdefault(it, i)
                if j != i:
                    new[i] = False
        idx = pos.ravel() if new.all() else pos[:, new].ravel()
        self._words[idx] |= self._words.dtype.type(3)
        self._pending += int(np.count_nonzero(new))
        return new

    def contains_many(self, items: Sequence[bytes], *, simple: bool = False) -> np.ndarray:
        """Vectorised ``in`` (or ``contains_simple``) for many items."""
        if len(items) < self._small_batch:
            probe = self.contains_simple if simple else self.__contains__
            return np.fromiter(map(probe, items), dtype=bool, count=len(items))
        if self._clock() >= self._next_refresh:
            self._catch_up()
        _, w, _ = self._masks_many(items)
        return w != 0 if simple else self._members_np(w)

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
        """Change the filter count; a smaller count drops the oldest filters.

        A larger count appends filters beyond the oldest, their epochs continued backwards. The
        first of them gets a copy of the old oldest filter: ids held there alone were members
        through the "oldest alone" check, and now pair with their copy instead (they live a
        little longer, never shorter).
        """
        words = self._words
        old = self._nf
        dt = _dtype_for(nf)
        if dt is not words.dtype.type:
            words = words.astype(dt)
        self._set_shape(nf, words)
        if nf > old:
            words |= ((words >> dt(old - 1)) & dt(1)) << dt(old)
            # the copy holds generations old-1 and old-2, like the filter it copies
            self._gens.append(self._gens[old - 2])
            self._starts.append(self._starts[old - 1] - self._period)
        np.bitwise_and(words, dt(self._live), out=words)
        self._gens = self._gens[:nf]
        self._starts = self._starts[:nf]
        while len(self._starts) < nf:
            self._gens.append(0.0)
            self._starts.append(self._starts[-1] - self._period)

    def _rotate(self, at: float) -> None:
        self._sync_loads()
        if self.adaptive:
            nf = self._target_filters(at)
            if nf > self._nf:
                self._resize(nf)
        words = self._words
        dt = words.dtype.type
        np.left_shift(words, dt(1), out=words)
        np.bitwise_and(words, dt(self._live), out=words)
        self._gens = [0.0, *self._gens[:-1]]
        self._starts = [at, *self._starts[:-1]]
        if self.adaptive and nf < self._nf:
            self._resize(nf)

    def _target_filters(self, at: float) -> int:
        """Filters needed after a refresh at ``at``: the shape the period asks for, and every
        generation whose inserts the window still covers (inserts into a generation end when the
        next one starts)."""
        want = math.ceil(self._window / self._period - 1e-9) + 1
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

    # -- estimates (Section IV) ------------------------------------------------------------

    def fills(self) -> list[float]:
        """Exact fraction of set bits of each constituent filter, in age order."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        words = self._words
        dt = words.dtype.type
        buf = np.empty_like(words)
        out: list[float] = []
        for j in range(self._nf):
            np.bitwise_and(words, dt(1 << j), out=buf)
            out.append(int(np.count_nonzero(buf)) / self.m)
        return out

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

    def filter_fpps(self) -> list[float]:
        """Equation (1) for each filter, from the ids inserted into it."""
        return [bloom_fpp(load, self.k) for load in self.filter_loads()]

    def paper_fpp(self) -> float:
        """Equation (3) exactly as the paper gives it (independent filters)."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        return fbf_fpp(self.filter_fpps())

    def estimated_fpp(self) -> float:
        """Equation (3) with adjacent filters' shared generation accounted for (see
        ``shared_fpp``); equal to ``paper_fpp`` where the pair terms vanish, and the one the
        adaptive step, the sizing and the node's metrics use."""
        if self._clock() >= self._next_refresh:
            self._catch_up()
        self._sync_loads()
        return shared_fpp(self._gens, self.k)

    # -- Algorithm 3, window-keeping -------------------------------------------------------

    def measured_rate(self) -> float:
        return self._rate

    def adapt(self) -> bool:
        """One step of adaptive resizing; returns True when the shape changed.

        The step plans for twice the measured insert rate, so a rising load is met before the
        filters fill (a doubled m only thins new generations; old ones stay as dense as they
        were until they age out). Scale up fast (halve the period; double m once the filter
        count is at its limit) when the current FPP reaches 0.9 of the target or the steady
        state at the measured rate would reach 0.75 of it, planning for half the target at twice
        the rate; relax slowly (lengthen the period by
        an eighth of the base, fold m in half) when the current FPP is under a tenth of the
        target and the relaxed shape still meets a quarter of it at twice the rate. The window
        never shrinks: the filter count follows from the period, and old generations are kept
        until the window has passed over them.
        """
        if self.target_fpp is None:
            return False
        now = self._clock()
        if now >= self._next_refresh:
            self._catch_up()
        self._sync_loads()
        dt = now - self._rate_t
        if dt > 0:
            inst = (self._inserted - self._rate_n) / dt
            # rise at once, decay gently, so a burst is met before the filters fill
            self._rate = max(inst, 0.7 * self._rate + 0.3 * inst)
            self._rate_t, self._rate_n = now, self._inserted
        target = self.target_fpp
        cur = shared_fpp(self._gens, self.k)
        if cur >= 0.9 * target or self._proj(self._period, self.m, 1.0) >= 0.75 * target:
            return self._scale_up(cur)
        if cur <= 0.1 * target:
            return self._scale_down()
        self.over_target = cur > target
        return False

    def _filters_for(self, period: float) -> int:
        return math.ceil(self._window / period - 1e-9) + 1

    def _proj(self, period: float, m: int, headroom: float = 2.0) -> float:
        rate = headroom * self._rate
        return projected_fpp(rate, period, m, self.k, self._filters_for(period))

    def _scale_up(self, cur: float) -> bool:
        assert self.target_fpp is not None
        goal = 0.5 * self.target_fpp
        period, m = self._period, self.m
        cap = self.max_bytes or math.inf
        while self._proj(period, m) > goal:
            shorter = self._shorter_period(period)
            if (
                shorter < period
                and shorter >= self.min_period
                and self._filters_for(shorter) <= MAX_FILTERS - 2
                and self._bytes_for(m, shorter) <= cap
            ):
                period = shorter
            elif self._bytes_for(2 * m, period) <= cap:
                m *= 2
            else:
                break
        changed = period != self._period or m != self.m
        while self.m < m:
            self._grow()
        if period != self._period:
            self._set_period(period)
        self.over_target = max(cur, self._proj(self._period, self.m, 1.0)) > self.target_fpp
        return changed

    def _shorter_period(self, period: float) -> float:
        """The period whose filters fill the word that half the period would need: every
        filter costs a bit of that word anyway (33 filters take 64-bit words, as 64 do). The
        widest word keeps two filters of slack for generations the window still covers."""
        nf = min(self._filters_for(period / 2), MAX_FILTERS)
        bits = next(b for b, _ in _DTYPES if nf <= b)
        usable = bits - 1 if bits < MAX_FILTERS else MAX_FILTERS - 3
        return self._window / usable

    def _scale_down(self) -> bool:
        assert self.target_fpp is not None
        low = 0.25 * self.target_fpp
        changed = False
        if self.m > self._m0 and self.m % 2 == 0 and self._proj(self._period, self.m // 2) <= low:
            self._fold()
            changed = True
        longer = min(self._period + self._period0 / 8, self._period0)
        if longer > self._period and self._proj(longer, self.m) <= low:
            self._set_period(longer)
            changed = True
        self.over_target = False
        return changed

    def _bytes_for(self, m: int, period: float) -> int:
        return m * _dtype_for(min(self._filters_for(period), MAX_FILTERS))(0).nbytes

    def _set_period(self, period: float) -> None:
        # keep epoch alignment (epoch = floor(time / period)) so replicas with the same shape merge
        self._period = period
        now = self._clock()
        self._next_refresh = min(self._next_refresh, (math.floor(now / period) + 1) * period)
        # enough filters at once for (N+1)*period >= window; fewer only as generations age out
        want = self._filters_for(period)
        if want > self._nf:
            self._sync_loads()
            self._resize(min(want, MAX_FILTERS))

    def _grow(self) -> None:
        """Double m by copying: every position x mod m reappears at x mod 2m."""
        self._sync_loads()
        self.m *= 2
        self._set_shape(self._nf, np.concatenate([self._words, self._words]))

    def _fold(self) -> None:
        """Halve m by OR-ing the halves: x mod (m/2) is where x mod m lands."""
        self._sync_loads()
        half = self.m // 2
        words = self._words[:half] | self._words[half:]
        self.m = half
        self._set_shape(self._nf, words)
        self._gens = [2.0 * load for load in self._gens]

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
        dt = self._words.dtype.type
        src = other._words
        done: set[int] = set()
        for i, j in pairs:
            if j is None or j in done:
                continue
            done.add(j)
            bit = ((src >> src.dtype.type(i)) & src.dtype.type(1)).astype(dt)
            self._words |= bit << dt(j)
        # generation loads from the merged fills: filter 0 is generation 0 alone, filter j is
        # generations j and j-1
        gens: list[float] = []
        for j, fill in enumerate(self.fills()):
            load = load_from_fill(fill, self.k)
            gens.append(max(0.0, load - gens[j - 1]) if j else load)
        self._gens = gens

    def copy(self) -> ForgetfulBloomFilter:
        return type(self).from_bytes(self.to_bytes(), clock=self._clock, hash_fn=self._hash)

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
        """Versioned bytes: a fixed header, start times and loads per generation, the words."""
        self._sync_loads()
        flags = (_F_ADAPTIVE if self.adaptive else 0) | (_F_OVER_TARGET if self.over_target else 0)
        header = _HEADER.pack(
            _MAGIC, self.m, self.k, self._nf, self._period, self._next_refresh, self._window,
            flags, self.target_fpp or 0.0, self.max_bytes or 0, self._m0, self._period0,
            self._inserted, self._rate, self.min_period,
        )
        floats = struct.pack(f"<{2 * self._nf}d", *self._starts, *self._gens)
        return header + floats + self._words.astype(self._words.dtype.newbyteorder("<")).tobytes()

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        clock: Callable[[], float] = time.monotonic,
        hash_fn: HashFn = hash_pair,
    ) -> ForgetfulBloomFilter:
        if len(data) < _HEADER.size:
            raise ValueError("FBF bytes too short")
        (magic, m, k, nf, period, next_refresh, window, flags, target, max_bytes, m0, period0,
         inserted, rate, min_period) = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"not FBF bytes (magic {magic!r})")
        if not 3 <= nf <= MAX_FILTERS or m < 1 or k < 1:
            raise ValueError(f"corrupt FBF header (m={m}, k={k}, filters={nf})")
        dt = np.dtype(_dtype_for(nf)).newbyteorder("<")
        off = _HEADER.size + 16 * nf
        if len(data) != off + m * dt.itemsize:
            raise ValueError(f"FBF body is {len(data) - off} bytes, expected {m * dt.itemsize}")
        f = cls.__new__(cls)
        f.m, f.k = m, k
        f._clock, f._hash, f._fast_hash = clock, hash_fn, hash_fn is hash_pair
        f._period, f._window = period, window
        f.target_fpp = target if flags & _F_ADAPTIVE else None
        f.max_bytes = max_bytes or None
        f.min_period = min_period
        f.over_target = bool(flags & _F_OVER_TARGET)
        f.window_violations = 0
        f._m0, f._period0 = m0, period0
        floats = struct.unpack_from(f"<{2 * nf}d", data, _HEADER.size)
        f._starts, f._gens = list(floats[:nf]), list(floats[nf:])
        words = np.frombuffer(data, dtype=dt, count=m, offset=off).astype(_dtype_for(nf))
        f._set_shape(nf, words)
        f._next_refresh = next_refresh
        f._pending, f._inserted, f._rate = 0, inserted, rate
        f._rate_t, f._rate_n = clock(), inserted
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
