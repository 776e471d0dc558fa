"""The FBF snapshot format, version 1 (``FBF1``): a filter's parts to bytes and back, checked.

Little-endian: a 104-byte header; the start time and the load of each generation (2 x filters
doubles); the m words, of the width the filter count picks (``cluster.core.fbf.layout``).

The header holds the filter's own fields (magic, m, k, filters, period, next refresh, window)
and its policy's state, a ``PolicyState`` placed here without being read: its first five fields,
then the filter's insert count, then its last two. That order is the first version's, kept so
that every stored snapshot loads and writes back byte for byte (``tests/test_fbf_snapshots.py``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from cluster.core.fbf.layout import MAX_FILTERS, dtype_for
from cluster.core.fbf.policy import PolicyState

MAGIC = b"FBF1"
HEADER = struct.Struct("<4sQIIddd" "IdQQd" "Q" "dd")
_CUT = 5  # PolicyState fields before the insert count


@dataclass(frozen=True)
class Snapshot:
    """What a snapshot holds; ``starts`` and ``gens`` are per generation, newest first."""

    m: int
    k: int
    period: float
    next_refresh: float
    window: float
    inserted: int
    starts: list[float]
    gens: list[float]
    words: np.ndarray
    state: PolicyState


def encode(s: Snapshot) -> bytes:
    return b"".join(encode_parts(s))


def encode_parts(s: Snapshot) -> list[bytes | memoryview]:
    """``encode`` as its parts: the header and the words, which are copied once (a private,
    little-endian copy: the filter's own words go on changing), never packed or joined."""
    nf = len(s.starts)
    header = HEADER.pack(
        MAGIC, s.m, s.k, nf, s.period, s.next_refresh, s.window,
        *s.state[:_CUT], s.inserted, *s.state[_CUT:],
    )
    floats = struct.pack(f"<{2 * nf}d", *s.starts, *s.gens)
    words = s.words.astype(s.words.dtype.newbyteorder("<"))  # a copy, whatever the byte order
    return [header + floats, memoryview(words.data).cast("B")]


def decode(data: bytes) -> Snapshot:
    """The parts of ``data``; ValueError when it is not a whole, well-formed v1 snapshot."""
    if len(data) < HEADER.size:
        raise ValueError("FBF bytes too short")
    fields = HEADER.unpack_from(data)
    magic, m, k, nf, period, next_refresh, window = fields[:7]
    if magic != MAGIC:
        raise ValueError(f"not FBF bytes (magic {magic!r})")
    if not 3 <= nf <= MAX_FILTERS or m < 1 or k < 1:
        raise ValueError(f"corrupt FBF header (m={m}, k={k}, filters={nf})")
    dt = np.dtype(dtype_for(nf)).newbyteorder("<")
    off = HEADER.size + 16 * nf
    if len(data) != off + m * dt.itemsize:
        raise ValueError(f"FBF body is {len(data) - off} bytes, expected {m * dt.itemsize}")
    floats = struct.unpack_from(f"<{2 * nf}d", data, HEADER.size)
    words = np.frombuffer(data, dtype=dt, count=m, offset=off).astype(dtype_for(nf))
    return Snapshot(
        m, k, period, next_refresh, window, fields[7 + _CUT], list(floats[:nf]),
        list(floats[nf:]), words, PolicyState(*fields[7 : 7 + _CUT], *fields[8 + _CUT :]),
    )
