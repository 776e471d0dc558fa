"""A plain Bloom filter over ``bitarray`` (Bloom 1970; the paper's Section II-B, equation (1))."""

from __future__ import annotations

import math
import struct

from bitarray import bitarray

from cluster.core.hashing import MASK64, HashFn, hash_pair, positions

_MAGIC = b"BLM1"
_HEADER = struct.Struct("<4sQIQ")  # magic, m, k, inserted count


def bloom_fpp(load: float, k: int) -> float:
    """Equation (1): ``(1 - e^(-k*l/m))^k`` with ``load = l/m`` items per bit."""
    return (1.0 - math.exp(-k * load)) ** k


def load_from_fill(fill: float, k: int) -> float:
    """Inverse of the expected fill ``1 - e^(-k*l/m)``: the items-per-bit a fill implies."""
    if fill >= 1.0:
        return math.inf
    return -math.log1p(-fill) / k


class BloomFilter:
    """m bits, k positions per item by double hashing; ``add`` reports whether the item was new."""

    __slots__ = ("m", "k", "count", "_bits", "_hash")

    def __init__(self, m: int, k: int, hash_fn: HashFn = hash_pair) -> None:
        if m < 1 or k < 1:
            raise ValueError(f"BloomFilter needs m >= 1 and k >= 1, got m={m}, k={k}")
        self.m = m
        self.k = k
        self.count = 0
        self._bits = bitarray(m)
        self._bits.setall(0)
        self._hash = hash_fn

    def add(self, item: bytes) -> bool:
        """Set the item's bits; True when at least one was unset (the item was not yet a member)."""
        h1, h2 = self._hash(item)
        bits, m = self._bits, self.m
        x, y = h1, h2
        new = False
        for i in range(self.k):  # cluster.core.hashing.positions, walked inline
            p = x % m
            if not bits[p]:
                bits[p] = 1
                new = True
            x = (x + y) & MASK64
            y = (y + i) & MASK64
        if new:
            self.count += 1
        return new

    def __contains__(self, item: bytes) -> bool:
        h1, h2 = self._hash(item)
        return all(self._bits[p] for p in positions(h1, h2, self.k, self.m))

    def fill(self) -> float:
        return self._bits.count(1) / self.m

    def estimated_fpp(self) -> float:
        """Equation (1) from the number of distinct items inserted."""
        return bloom_fpp(self.count / self.m, self.k)

    def clear(self) -> None:
        self._bits.setall(0)
        self.count = 0

    def nbytes(self) -> int:
        return (self.m + 7) // 8

    def _check_compatible(self, other: BloomFilter) -> None:
        if (self.m, self.k) != (other.m, other.k):
            raise ValueError(
                f"cannot merge Bloom filters of different shapes: "
                f"(m={self.m}, k={self.k}) vs (m={other.m}, k={other.k})"
            )

    def merge(self, other: BloomFilter) -> None:
        """Union in place (bitwise OR); the count becomes the estimate the merged fill implies."""
        self._check_compatible(other)
        self._bits |= other._bits
        fill = self.fill()
        self.count = round(load_from_fill(fill, self.k) * self.m) if fill < 1 else self.m

    def copy(self) -> BloomFilter:
        c = BloomFilter(self.m, self.k, self._hash)
        c._bits = self._bits.copy()
        c.count = self.count
        return c

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BloomFilter):
            return NotImplemented
        return (self.m, self.k) == (other.m, other.k) and self._bits == other._bits

    def to_bytes(self) -> bytes:
        return _HEADER.pack(_MAGIC, self.m, self.k, self.count) + self._bits.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, hash_fn: HashFn = hash_pair) -> BloomFilter:
        if len(data) < _HEADER.size:
            raise ValueError("Bloom filter bytes too short")
        magic, m, k, count = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"not a Bloom filter (magic {magic!r})")
        body = data[_HEADER.size :]
        if len(body) != (m + 7) // 8:
            raise ValueError(f"Bloom filter body is {len(body)} bytes, expected {(m + 7) // 8}")
        f = cls(m, k, hash_fn)
        bits = bitarray()
        bits.frombytes(body)
        f._bits = bits[:m]
        f.count = count
        return f
