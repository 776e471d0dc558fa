"""The bit-sliced words of an FBF, and the whole-array operations on them (pure numpy, no state).

Bit j of word p is bit p of constituent filter j, the filters in age order (0 future, 1 present,
2.. past newest to oldest). The filter count picks the word's width (8, 16, 32 or 64 bits), so
there are at most 64 filters. ``ForgetfulBloomFilter`` keeps its scalar hot paths inline; these
are the bulk operations (refresh, resize, merge, fills) it delegates to.
"""

from __future__ import annotations

import numpy as np

MAX_FILTERS = 64
WORDS: tuple[tuple[int, type[np.unsignedinteger]], ...] = (
    (8, np.uint8),
    (16, np.uint16),
    (32, np.uint32),
    (64, np.uint64),
)


def dtype_for(nfilters: int) -> type[np.unsignedinteger]:
    """The narrowest word holding ``nfilters`` bits."""
    for bits, dt in WORDS:
        if nfilters <= bits:
            return dt
    raise ValueError(f"at most {MAX_FILTERS} constituent filters, asked for {nfilters}")


def word_bits(nfilters: int) -> int:
    """Bits of the word ``nfilters`` filters take: every filter up to that width costs nothing."""
    return next(b for b, _ in WORDS if nfilters <= b)


def shift(words: np.ndarray, nfilters: int) -> None:
    """A refresh, in place: every filter ages by one, the oldest drops, an empty future begins."""
    dt = words.dtype.type
    np.left_shift(words, dt(1), out=words)
    if nfilters < 8 * words.dtype.itemsize:  # else the oldest filter's bit fell off already
        np.bitwise_and(words, dt((1 << nfilters) - 1), out=words)


def resized(words: np.ndarray, old: int, new: int) -> np.ndarray:
    """The words for ``new`` filters instead of ``old``: fewer drops the oldest; more appends empty
    filters beyond the oldest, the first a copy of the old oldest (ids held there alone were
    members through the "oldest alone" check and now pair with their copy: never shorter)."""
    dt = dtype_for(new)
    if dt is not words.dtype.type:
        words = words.astype(dt)
    if new > old:
        words |= ((words >> dt(old - 1)) & dt(1)) << dt(old)
    np.bitwise_and(words, dt((1 << new) - 1), out=words)
    return words


def or_slices(dst: np.ndarray, src: np.ndarray, pairs: list[tuple[int, int]]) -> None:
    """OR filter ``i`` of ``src`` into filter ``j`` of ``dst`` for each (i, j), in place."""
    dt, st = dst.dtype.type, src.dtype.type
    for i, j in pairs:
        dst |= ((src >> st(i)) & st(1)).astype(dt) << dt(j)


def fills(words: np.ndarray, nfilters: int) -> list[float]:
    """Exact fraction of set bits of each filter, in age order."""
    dt = words.dtype.type
    buf = np.empty_like(words)
    out: list[float] = []
    for j in range(nfilters):
        np.bitwise_and(words, dt(1 << j), out=buf)
        out.append(int(np.count_nonzero(buf)) / len(words))
    return out
