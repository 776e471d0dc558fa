"""Hashing shared by every filter: MurmurHash3 at a fixed seed, Kirsch-Mitzenmacher double hashing.

Never Python's ``hash()``: it is salted per process, and filter bits cross processes.
Positions use enhanced double hashing (Dillinger & Manolios 2004): position i is
``X_i mod m`` with ``X_i = (h1 + i*h2 + i(i-1)(i-2)/6) mod 2**64``, walked as ``x += y; y += i``.

- The cubic term: plain double hashing ``h1 + i*h2`` cycles through only m/gcd(h2, m) cells when
  m is composite (m = 4*7189 and h2 a multiple of 7189 give 4 cells for 20 hashes).
- The 64-bit wrap before ``mod m``: without it the positions depend on ``h1 mod m`` and
  ``h2 mod m`` alone, so an absent id matches all k positions of a stored one with probability
  ~2/m**2 whatever k is, a floor of ~2n/m**2 under the FPP (3e-6 for a filter sized for 1e-6
  with m = 82k). With it, every bit of both hashes counts.
- ``X_i`` does not depend on m, and ``X mod 2m`` is congruent to ``X mod m``, so a filter can
  double its size by copying itself (see ``ForgetfulBloomFilter``) without losing a member.
  numpy's uint64 arithmetic wraps the same way, so the scalar and batch paths agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, repeat

import mmh3
import numpy as np

SEED = 0x5EED_1D3A
MASK64 = (1 << 64) - 1

HashFn = Callable[[bytes], tuple[int, int]]

# The digest forms take their arguments positionally; ``mmh3.hash64(item, SEED, True, False)``
# silently ignores the positional ``signed`` flag in mmh3 5.x and returns signed values.
_murmur = mmh3.mmh3_x64_128_utupledigest
_murmur_digest = mmh3.mmh3_x64_128_digest  # the same two words as 16 little-endian bytes


def hash_pair(item: bytes) -> tuple[int, int]:
    """Two 64-bit hashes of ``item``; the second is odd so it never degenerates to a stride of 0."""
    h1, h2 = _murmur(item, SEED)
    return h1, h2 | 1


def positions(h1: int, h2: int, k: int, m: int) -> list[int]:
    x, y = h1, h2
    out = []
    for i in range(k):
        out.append(x % m)
        x = (x + y) & MASK64
        y = (y + i) & MASK64
    return out


def hash_pairs_np(
    items: Sequence[bytes], hash_fn: HashFn = hash_pair
) -> tuple[np.ndarray, np.ndarray]:
    """Hash many items at once into two uint64 arrays (h1, h2), equal to ``hash_fn`` per item."""
    if hash_fn is hash_pair:
        flat = np.frombuffer(b"".join(map(_murmur_digest, items, repeat(SEED))), dtype="<u8")
        return flat[0::2].astype(np.uint64), flat[1::2] | np.uint64(1)
    flat = np.fromiter(chain.from_iterable(map(hash_fn, items)), np.uint64, 2 * len(items))
    return flat[0::2], flat[1::2]


def positions_np(h1: np.ndarray, h2: np.ndarray, k: int, m: int) -> np.ndarray:
    """``positions`` for many items, shape (k, n): row i holds every item's position i.

    The walk's closed form ``h1 + i*h2 + i(i-1)(i-2)/6``, broadcast over (k, n); uint64 wraps
    mod 2**64 like the scalar path's mask.
    """
    i = np.arange(k, dtype=np.uint64)[:, None]
    one = np.uint64(1)
    cubic = i * (i - one) * (i - np.uint64(2)) // np.uint64(6)  # 0 for i < 2 despite the wrap
    x = h1[None, :] + i * h2[None, :] + cubic
    np.remainder(x, np.uint64(m), out=x)
    return x
