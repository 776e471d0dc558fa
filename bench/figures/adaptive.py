"""Fig. 13: the adaptive FBF (Algorithm 3, window-keeping) holding its FPP under a target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from bench.figures import FakeClock, K, M, Result, Settings, measured_fpp, nan_zero, op_ids, save
from bench.figures import write_csv as _write_csv
from cluster.core.fbf import ForgetfulBloomFilter

START_PERIOD = 11.0  # the paper's Fig. 13 starts from 3 filters refreshed every 11 s
STEPS_PER_S = 10


@dataclass(frozen=True)
class Profile:
    key: str
    title: str
    target: float
    duration: float
    rate: Callable[[float], float]


def _rise_fall_rise(t: float) -> float:
    if t < 30:
        return 5 + 145 * t / 30
    if t < 60:
        return 150 - 140 * (t - 30) / 30
    return 10 + 290 * (t - 60) / 60


def _rise_100x(t: float) -> float:
    return 5.0 * 100 ** (min(t, 60.0) / 60.0)


PROFILES = (
    Profile("rise-fall-rise", "load rises, falls, rises again", 1e-2, 120.0, _rise_fall_rise),
    Profile("rise100x", "load rises 100x (5 to 500 ops/s)", 1e-2, 90.0, _rise_100x),
    Profile("rise100x-1e-3", "load rises 100x, tighter target", 1e-3, 90.0, _rise_100x),
)

Row = tuple[str, float, float, int, float, float, float, int, float, int, int, float, int]
HEADER = ["run", "t_s", "ops_per_s", "inserted", "estimated_fpp", "measured_fpp", "target_fpp",
          "filters", "period_s", "m_bits", "bytes", "window_s", "over_target"]


def adaptive_run(p: Profile, probes: int, sample_every: int) -> list[Row]:
    """Insert at ``p.rate`` (batched per 100 ms of fake time); every second of fake time sample
    the FPP (every ``sample_every`` s) and then call ``adapt()`` once, as the paper's thread did."""
    clock = FakeClock(0.0)
    f = ForgetfulBloomFilter(M, K, 1, START_PERIOD, clock, target_fpp=p.target)
    rows: list[Row] = []
    due = 0.0
    done = 0
    for step in range(round(p.duration * STEPS_PER_S)):
        clock.t = step / STEPS_PER_S
        due += p.rate(clock.t) / STEPS_PER_S
        if int(due) > done:
            f.add_many(op_ids(done, int(due)))
            done = int(due)
        if (step + 1) % STEPS_PER_S:
            continue
        clock.t = (step + 1) / STEPS_PER_S
        second = round(clock.t)
        if second % sample_every == 0:
            rows.append((
                p.key, clock.t, p.rate(clock.t), done, f.estimated_fpp(), measured_fpp(f, probes),
                p.target, f.n_past + 2, f.period, f.m, f.nbytes(), f.window, int(f.over_target),
            ))
        f.adapt()
    return rows


def fig13(out: Path, s: Settings) -> Result:
    probes = s.probes if not s.quick else 50_000
    every = 1 if not s.quick else 2
    runs = {p.key: adaptive_run(p, probes, every) for p in PROFILES}
    png, csv = out / "fig13.png", out / "fig13.csv"
    _write_csv(csv, HEADER, [r for p in PROFILES for r in runs[p.key]])

    fig, axes = plt.subplots(2, len(PROFILES), figsize=(5.2 * len(PROFILES), 6.6), sharex="col",
                             gridspec_kw={"height_ratios": [1, 3]})
    facts: dict[str, float] = {}
    parts = []
    for col, p in enumerate(PROFILES):
        rows = runs[p.key]
        t = np.array([r[1] for r in rows])
        est = np.array([r[4] for r in rows])
        meas = np.array([r[5] for r in rows])
        nf = np.array([r[7] for r in rows], dtype=float)
        period = np.array([r[8] for r in rows])
        kbytes = np.array([r[10] for r in rows]) / 1000
        top, ax = axes[0, col], axes[1, col]
        # the load, and the memory it cost
        tt = np.linspace(0, p.duration, 400)
        top.plot(tt, [p.rate(x) for x in tt], color="0.25", lw=1.4, label="load, ops/s")
        top.set_ylabel("ops/s")
        top.set_title(f"{p.title}\ntarget FPP {p.target:g}, start: 3 filters, t = "
                      f"{START_PERIOD:g} s, m = {M}, k = {K}")
        topm = top.twinx()
        topm.step(t, kbytes, where="post", color="C4", lw=1.1, label="memory, kB")
        topm.set_ylabel("kB", color="C4")
        topm.tick_params(axis="y", colors="C4")
        topm.grid(False)
        if col == 0:
            h1, l1 = top.get_legend_handles_labels()
            h2, l2 = topm.get_legend_handles_labels()
            top.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=7.5)
        # the FPP against the target
        ax.plot(t, est, "-", color="C1", lw=1.3,
                label="estimated_fpp() (eq. 3, shared generations)")
        ax.plot(t, nan_zero(meas), "o-", color="C0", ms=2.5, lw=1, label="measured FPP")
        ax.axhline(p.target, color="C3", ls="--", lw=1.5, label="target FPP")
        ax.axhline(1 / probes, color="0.45", ls=":", lw=1, label=f"1 hit in {probes // 1000}k")
        ax.set_yscale("log")
        ax.set_ylim(1e-7, 1.0)
        ax.set_xlabel("time, s (fake clock; adapt() once per second)")
        if col == 0:
            ax.set_ylabel("false positive probability")
        sec = ax.twinx()
        sec.step(t, nf, where="post", color="C2", lw=1.3, label="constituent filters")
        sec.step(t, period, where="post", color="C5", lw=1.3, label="refresh period, s")
        sec.set_yscale("log")
        sec.set_ylim(0.1, 200)
        sec.set_ylabel("filters  /  refresh period (s)")
        sec.grid(False)
        if col == 0:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = sec.get_legend_handles_labels()
            fig.legend(h1 + h2, l1 + l2, loc="lower center", ncol=6, fontsize=9,
                       bbox_to_anchor=(0.5, -0.01))
        worst = float(np.max(meas / p.target))
        facts[f"{p.key}_worst"] = worst
        parts.append(
            f"{p.key} @ {p.target:g}: worst measured {worst:.2f}x target, "
            f"worst estimate {float(np.max(est / p.target)):.2f}x, peak {int(nf.max())} filters, "
            f"period {float(period.min()):.2g} s, {float(kbytes.max()):.0f} kB"
        )
    fig.suptitle("Fig. 13: the adaptive FBF keeps its FPP under the target as the load changes "
                 "(window kept at 22 s)", fontsize=12)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, png)
    return Result("fig13", png, csv, "; ".join(parts), facts)


def worst_ratio(rows: list[dict[str, str]], run: str) -> float:
    """Largest measured FPP / target of one run in fig13.csv (for tests and the README)."""
    vals = [float(r["measured_fpp"]) / float(r["target_fpp"]) for r in rows if r["run"] == run]
    return max(vals) if vals else math.nan
