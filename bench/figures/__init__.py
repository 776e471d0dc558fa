"""The paper's Section VI evaluation, reproduced, plus a memory-against-error figure of our own.

``python -m bench.figures --out docs/figures [--quick]`` writes, for each figure, a PNG and a CSV
of the plotted numbers, and prints one line per figure with its headline number:

    fig8              optimised (Algorithm 2) vs simple (Section III-A) check over elements inserted
    fig9              equation (3) estimate vs measured FPP over elements inserted
    fig10             equation (3) estimate vs measured FPP over m (5k..30k bits, 300 elements)
    fig11             FPP vs workload under exponentially rising load, refresh period 5/3/2/1 s
    fig12             FPP vs workload under a linear ramp, 24/12/6/3 constituent filters
    fig13             the adaptive FBF against its target under rising/falling and 100x loads
    fig_memory_error  every dedup strategy: memory against counting error under retried ops

Everything runs on a fake clock, so the figures are deterministic and nothing sleeps. The paper's
parameters are the defaults: m = 6250 bits, k = 5, t = 5 s, 200k absent probes.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
import numpy as np  # noqa: E402

from cluster.core.fbf import ForgetfulBloomFilter  # noqa: E402

M = 6250
K = 5
PERIOD = 5.0
PROBES = 200_000
PROBE_CHUNK = 500_000


class FakeClock:
    """A clock the experiment moves by hand: ``clock.t = 12.5``; calling it returns ``t``."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Settings:
    """How much work each figure does; ``quick`` is for tests and a first look."""

    quick: bool = False
    probes: int = PROBES  # absent ids per FPP measurement, as in the paper
    deep_probes: int = 5_000_000  # fig10's extra series, to see below 200k probes' resolution

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick=True, probes=PROBES, deep_probes=1_000_000)
        return cls()


@dataclass
class Result:
    """What one figure produced: its files and the headline the CLI prints."""

    name: str
    png: Path
    csv: Path
    headline: str
    facts: dict[str, float] = field(default_factory=dict)


def op_ids(start: int, stop: int, prefix: bytes = b"op") -> list[bytes]:
    return [b"%s:%d" % (prefix, i) for i in range(start, stop)]


@functools.cache
def probe_ids(n: int) -> list[bytes]:
    """``n`` ids never inserted anywhere (inserted ids are ``op:<i>``)."""
    return op_ids(0, n, b"probe")


def probe_chunks(n: int) -> Iterator[list[bytes]]:
    """The first ``n`` probe ids in chunks, so millions of probes never sit in memory at once."""
    if n <= PROBES:
        yield probe_ids(n)
        return
    for start in range(0, n, PROBE_CHUNK):
        yield op_ids(start, min(n, start + PROBE_CHUNK), b"probe")


def probe_hits(f: ForgetfulBloomFilter, n: int, *, simple: bool = False) -> int:
    """How many of ``n`` absent ids the filter calls members (its empirical false positives)."""
    return sum(int(np.count_nonzero(f.contains_many(c, simple=simple))) for c in probe_chunks(n))


def measured_fpp(f: ForgetfulBloomFilter, n: int, *, simple: bool = False) -> float:
    return probe_hits(f, n, simple=simple) / n


def simple_check_fpp(p: Sequence[float]) -> float:
    """The model of the simple check: present in any constituent filter (taken independent)."""
    keep = 1.0
    for x in p:
        keep *= 1.0 - x
    return 1.0 - keep


def nan_zero(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Zeros as NaN, so a log axis leaves a gap instead of plotting minus infinity."""
    a = np.asarray(values, dtype=float)
    return np.where(a > 0, a, np.nan)


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    def fmt(v: Any) -> Any:
        if isinstance(v, float):
            return f"{v:.6g}"
        return v

    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows([fmt(v) for v in row] for row in rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def style() -> None:
    plt.rcParams.update({
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.titlesize": 11,
        "axes.labelsize": 10,
        "legend.fontsize": 8.5,
        "font.size": 9.5,
    })


def resolution_line(ax: Any, probes: int, label: bool = True) -> None:
    """A dotted line at one false positive in ``probes``: measured points below it read as 0."""
    ax.axhline(
        1.0 / probes, color="0.45", ls=":", lw=1,
        label=f"1 hit in {probes // 1000}k probes" if label else None,
    )


def save(fig: Any, path: Path) -> None:
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def fmt_e(x: float) -> str:
    return f"{x:.2e}" if x > 0 else "0"
