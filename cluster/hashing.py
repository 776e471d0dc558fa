"""Hashing shared by every filter: MurmurHash3 at a fixed seed, Kirsch-Mitzenmacher double hashing.

Never Python's ``hash()``: it is salted per process, and filter bits cross processes.
Positions use enhanced double hashing (Dillinger & Manolios 2004): position i is
``(h1 + i*h2 + (i**3 - i)/6) mod m`` over exact integers, walked as ``x += y; y += i`` mod m.
Plain double hashing ``(h1 + i*h2) mod m`` cycles through only m/gcd(h2, m) cells when m is
composite (m = 4*7189 and h2 a multiple of 7189 give 4 cells for 20 hashes); the cubic term breaks
those cycles. No 64-bit wrap-around, so the scalar and numpy paths agree, and because ``x mod 2m``
is congruent to ``x mod m``, a filter can double its size by copying itself (see
``ForgetfulBloomFilter``) without losing a member.
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
    x, y = h1 % m, h2 % m
    out = []
    for i in range(k):
        out.append(x)
        x += y
        if x >= m:
            x -= m
        y += i
        if y >= m:
            y -= m
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

    Walked with conditional subtracts (x, y < m, so one suffices), twice as fast as k modulos.
    """
    mm = np.uint64(m)
    x = h1 % mm
    y = h2 % mm
    out = np.empty((k, len(x)), dtype=np.uint64)
    for i in range(k):
        out[i] = x
        if i + 1 < k:
            x += y
            x -= mm * (x >= mm)
            y += np.uint64(i)
            y -= mm * (y >= mm)
    return out
