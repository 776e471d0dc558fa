"""Dedup strategies a node can run with (``--dedup NAME``): one small interface, twelve strategies.

Each strategy answers "was this op id already applied?" (``seen_or_add``) and sizes itself from
the same three numbers: ``window`` (seconds retries can arrive), ``rate`` (op ids per second) and
``target_fpp`` (acceptable probability of taking a new op for a duplicate). They are pure state:
no I/O, the clock passed in.

    none             every op applied: retries over-count (paper, approach 1)
    exact            dict of ids with a TTL (approach 2)
    bloom            one Bloom filter, never cleared: FPP climbs for ever (approach 3)
    recycling-bloom  one Bloom filter cleared when full (the authors' baseline)
    stable-bloom     Stable Bloom filter (Deng & Rafiei 2006)
    flower           Flower filter (Kifi; seed 001)
    counting-bloom   counting Bloom filter deleting ids after their TTL (Fan et al.; seed 004)
    seqwindow        per-client sequence window (RFC 4303 / RFC 6479 anti-replay)
    fbf              Forgetful Bloom Filter (the paper)
    adaptive-fbf     FBF with adaptive resizing (Algorithm 3, window-keeping)
    dleft-counting   d-left counting Bloom filter deleting sightings after their TTL (seed 004)
    dleft-window     d-left cells of (fingerprint, epoch): forgets at the window, to one epoch
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from cluster.core.dedup._base import Clock, Dedup, unframe
from cluster.core.dedup.bloom import BloomDedup, RecyclingBloomDedup
from cluster.core.dedup.counting import CountingBloomDedup
from cluster.core.dedup.dleft_counting import DLeftCountingDedup
from cluster.core.dedup.dleft_window import DLeftWindowDedup
from cluster.core.dedup.exact import ExactDedup
from cluster.core.dedup.fbf import AdaptiveFBFDedup, FBFDedup
from cluster.core.dedup.flower import FlowerDedup
from cluster.core.dedup.none import NoDedup
from cluster.core.dedup.seqwindow import SeqWindowDedup, parse_op_id
from cluster.core.dedup.stable import StableBloomDedup

__all__ = [
    "DEDUP_NAMES",
    "AdaptiveFBFDedup",
    "BloomDedup",
    "CountingBloomDedup",
    "DLeftCountingDedup",
    "DLeftWindowDedup",
    "Dedup",
    "ExactDedup",
    "FBFDedup",
    "FlowerDedup",
    "NoDedup",
    "RecyclingBloomDedup",
    "SeqWindowDedup",
    "StableBloomDedup",
    "load_dedup",
    "make_dedup",
    "parse_op_id",
]

# name -> (window, rate, target_fpp, clock, max_bytes) -> strategy
_MAKERS: dict[str, Callable[[float, float, float, Clock, int | None], Dedup]] = {
    "none": lambda w, r, p, c, mb: NoDedup(),
    "exact": lambda w, r, p, c, mb: ExactDedup(w, c),
    "bloom": lambda w, r, p, c, mb: BloomDedup.for_window(w, r, p),
    "recycling-bloom": lambda w, r, p, c, mb: RecyclingBloomDedup.for_window(w, r, p),
    "stable-bloom": lambda w, r, p, c, mb: StableBloomDedup.for_window(w, r, p),
    "flower": lambda w, r, p, c, mb: FlowerDedup.for_window(w, r, p),
    "counting-bloom": lambda w, r, p, c, mb: CountingBloomDedup.for_window(w, r, p, c),
    "seqwindow": lambda w, r, p, c, mb: SeqWindowDedup(w, c),
    "fbf": lambda w, r, p, c, mb: FBFDedup.for_window(w, r, p, c),
    "adaptive-fbf": lambda w, r, p, c, mb: AdaptiveFBFDedup.for_window(w, r, p, c, mb),
    "dleft-counting": lambda w, r, p, c, mb: DLeftCountingDedup.for_window(w, r, p, c),
    "dleft-window": lambda w, r, p, c, mb: DLeftWindowDedup.for_window(w, r, p, c),
}

# name -> (version, payload, clock) -> strategy
_LOADERS: dict[str, Callable[[int, Any, Clock], Dedup]] = {
    "none": lambda v, p, c: NoDedup.from_payload(v, p),
    "exact": ExactDedup.from_payload,
    "bloom": lambda v, p, c: BloomDedup.from_payload(v, p),
    "recycling-bloom": lambda v, p, c: RecyclingBloomDedup.from_payload(v, p),
    "stable-bloom": lambda v, p, c: StableBloomDedup.from_payload(v, p),
    "flower": lambda v, p, c: FlowerDedup.from_payload(v, p),
    "counting-bloom": CountingBloomDedup.from_payload,
    "seqwindow": SeqWindowDedup.from_payload,
    "fbf": FBFDedup.from_payload,
    "adaptive-fbf": AdaptiveFBFDedup.from_payload,
    "dleft-counting": DLeftCountingDedup.from_payload,
    "dleft-window": DLeftWindowDedup.from_payload,
}

DEDUP_NAMES: tuple[str, ...] = tuple(_MAKERS)


def make_dedup(
    name: str,
    *,
    window: float = 10.0,
    rate: float = 10_000.0,
    target_fpp: float = 1e-6,
    clock: Clock = time.time,
    max_bytes: int | None = None,
) -> Dedup:
    """The strategy ``name``, sized to remember ``window`` s of ``rate`` ids/s at ``target_fpp``.

    ``max_bytes`` bounds the adaptive FBF only; the others take their sized memory.
    """
    maker = _MAKERS.get(name)
    if maker is None:
        raise ValueError(f"unknown dedup strategy {name!r}; valid: {', '.join(DEDUP_NAMES)}")
    if not (window > 0 and math.isfinite(window)):
        raise ValueError(f"window must be a finite number of seconds > 0, got {window}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a finite number of ids per second > 0, got {rate}")
    if not 0 < target_fpp < 1:
        raise ValueError(f"target_fpp must be in (0, 1), got {target_fpp}")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}")
    return maker(float(window), float(rate), float(target_fpp), clock, max_bytes)


def load_dedup(data: bytes, *, clock: Clock = time.time) -> Dedup:
    """The strategy a ``to_bytes`` snapshot holds; time-based ones read ``clock`` from now on."""
    name, version, payload = unframe(data)
    loader = _LOADERS.get(name)
    if loader is None:
        raise ValueError(f"unknown dedup snapshot {name!r}; valid: {', '.join(DEDUP_NAMES)}")
    return loader(version, payload, clock)
