"""Hashing shared by every filter: MurmurHash3 at a fixed seed, Kirsch-Mitzenmacher double hashing.

Never Python's ``hash()``: it is salted per process, and filter bits cross processes.
Positions are ``(h1 + i*h2) mod m`` over exact integers, computed as ``a + i*b`` with
``a = h1 mod m`` and ``b = h2 mod m`` (no 64-bit wrap-around, so the scalar and numpy paths agree).
Because ``x mod 2m`` is congruent to ``x mod m``, a filter can double its size by copying itself
(see ``ForgetfulBloomFilter``) without losing a member.
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
    a, b = h1 % m, h2 % m
    return [(a + i * b) % m for i in range(k)]


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
    """Positions for many items, shape (k, n): row i holds ``(h1 + i*h2) mod m``.

    Walked by stride with a conditional subtract (a < m and b < m, so one subtract suffices),
    which is twice as fast as k modulo operations.
    """
    mm = np.uint64(m)
    p = h1 % mm
    b = h2 % mm
    out = np.empty((k, len(p)), dtype=np.uint64)
    for i in range(k):
        out[i] = p
        if i + 1 < k:
            p += b
            p -= mm * (p >= mm)
    return out
