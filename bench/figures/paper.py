"""Fig. 8-12 of the paper: fixed-shape FBFs, measured with absent probes against equation (3)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from bench.figures import (
    PERIOD,
    FakeClock,
    K,
    M,
    Result,
    Settings,
    fmt_e,
    measured_fpp,
    nan_zero,
    op_ids,
    probe_hits,
    resolution_line,
    save,
    simple_check_fpp,
    write_csv,
)
from cluster.core.fbf import ForgetfulBloomFilter

BASIC = f"basic FBF, m = {M}, k = {K}, t = {PERIOD:g} s"

# -- a basic FBF with its elements spread over its three periods (Fig. 8-10) -----------------


def spread_fbf(n: int, m: int = M, k: int = K, period: float = PERIOD) -> ForgetfulBloomFilter:
    """A basic FBF (1 past filter) that took ``n`` elements at a steady rate over three periods.

    Three periods are everything a basic FBF remembers. The clock is left at the end of the third
    period, the fullest moment: the future filter holds the last period's elements, the present
    the last two periods', the past the two before (the first period's elements live there alone).
    """
    clock = FakeClock(0.0)
    f = ForgetfulBloomFilter(m, k, 1, period, clock)
    ids = op_ids(0, n)
    for j in range(3):
        clock.t = j * period
        f.add_many(ids[j * n // 3 : (j + 1) * n // 3])
    clock.t = 3 * period - 1e-3
    return f


def _elements_grid(s: Settings) -> list[int]:
    if s.quick:
        return [100, 300, 600, 1000, 1500, 2000]
    return [25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 600, 750, 900, 1000, 1250, 1500,
            1750, 2000]


def fig8_9(out: Path, s: Settings) -> tuple[Result, Result]:
    rows = []
    for n in _elements_grid(s):
        f = spread_fbf(n)
        hits_opt = probe_hits(f, s.probes)
        hits_simple = probe_hits(f, s.probes, simple=True)
        rows.append((
            n, hits_opt / s.probes, hits_simple / s.probes, f.paper_fpp(),
            simple_check_fpp(f.filter_fpps()), hits_opt, hits_simple, s.probes, f.estimated_fpp(),
        ))
    n_, opt, simple, est, est_simple = (np.array([r[i] for r in rows]) for i in range(5))
    shared = np.array([r[8] for r in rows])

    # -- Fig. 8
    png8, csv8 = out / "fig8.png", out / "fig8.csv"
    write_csv(csv8, ["elements", "fpp_optimised", "fpp_simple", "eq3_optimised",
                     "model_simple", "hits_optimised", "hits_simple", "probes"],
              [r[:8] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(n_, nan_zero(opt), "o-", color="C0", label="optimised check (Algorithm 2), measured")
    ax.plot(n_, nan_zero(simple), "s-", color="C3", label="simple check (Sec. III-A), measured")
    ax.plot(n_, est, "--", color="C0", lw=1, alpha=0.7, label="optimised, equation (3)")
    ax.plot(n_, est_simple, "--", color="C3", lw=1, alpha=0.7,
            label="simple, 1 - \u220f(1 - p$_i$)")
    resolution_line(ax, s.probes)
    ax.set_yscale("log")
    ax.set_xlabel("elements inserted (spread evenly over the 3 refresh periods)")
    ax.set_ylabel("false positive probability")
    ax.set_title(f"Fig. 8: optimised vs simple membership check\n"
                 f"{BASIC}, {s.probes // 1000}k absent probes")
    i300 = int(np.nonzero(n_ == 300)[0][0])
    lower = 1 - opt[i300] / simple[i300] if simple[i300] > 0 else math.nan
    ax.annotate(f"300 elements: optimised {lower:.0%} lower", (300, opt[i300]),
                xytext=(520, opt[i300] / 6), arrowprops={"arrowstyle": "->", "color": "0.3"},
                fontsize=8.5)
    ax.set_ylim(1e-7, 1)
    ax.legend(loc="lower right")
    save(fig, png8)
    r8 = Result(
        "fig8", png8, csv8,
        f"at 300 elements optimised FPP {fmt_e(opt[i300])} vs simple {fmt_e(simple[i300])} "
        f"({lower:.0%} lower; the paper reports 90%)",
        {"opt_300": float(opt[i300]), "simple_300": float(simple[i300])},
    )

    # -- Fig. 9
    png9, csv9 = out / "fig9.png", out / "fig9.csv"
    write_csv(csv9, ["elements", "eq3_estimate", "shared_estimate", "measured_fpp", "hits",
                     "probes"], [(r[0], r[3], r[8], r[1], r[5], r[7]) for r in rows])
    ok = opt > 1e-4
    ratio = np.where(opt > 0, est / np.where(opt > 0, opt, 1), np.nan)
    worst = float(np.max(np.maximum(ratio[ok], 1 / ratio[ok]))) if ok.any() else math.nan
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(6.4, 5.4), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    ax.plot(n_, est, "-", color="C1", label="equation (3) as in the paper")
    ax.plot(n_, shared, "--", color="C2", lw=1.2,
            label="estimated_fpp() (adjacent filters' shared generation)")
    ax.plot(n_, nan_zero(opt), "o", color="C0", label="measured (optimised check)")
    resolution_line(ax, s.probes)
    ax.set_yscale("log")
    ax.set_ylim(1e-7, 1)
    ax.set_ylabel("false positive probability")
    ax.set_title(f"Fig. 9: equation (3) vs measured FPP over elements inserted\n"
                 f"{BASIC}, {s.probes // 1000}k absent probes")
    ax.legend(loc="lower right")
    axr.axhspan(1 / 3, 3, color="C2", alpha=0.12, label="within 3x")
    axr.axhline(1, color="0.4", lw=0.8)
    axr.plot(n_[opt > 0], ratio[opt > 0], "o-", color="C1", ms=4)
    axr.plot(n_[opt > 0], shared[opt > 0] / opt[opt > 0], "s--", color="C2", ms=3, lw=1)
    axr.set_yscale("log")
    axr.set_ylim(0.1, 10)
    axr.set_ylabel("estimate / measured")
    axr.set_xlabel("elements inserted (spread evenly over the 3 refresh periods)")
    axr.legend(loc="upper right")
    save(fig, png9)
    r9 = Result(
        "fig9", png9, csv9,
        f"equation (3) within {worst:.2f}x of measured wherever measured > 1e-4 "
        f"({int(ok.sum())} points)",
        {"worst_factor": worst},
    )
    return r8, r9


def fig10(out: Path, s: Settings) -> Result:
    n = 300
    ms = list(range(5000, 30001, 5000 if s.quick else 2500))
    rows = []
    for m in ms:
        f = spread_fbf(n, m)
        hits = probe_hits(f, s.probes)
        deep_hits = probe_hits(f, s.deep_probes)
        rows.append((m, f.paper_fpp(), hits / s.probes, hits, s.probes,
                     deep_hits / s.deep_probes, deep_hits, s.deep_probes, f.estimated_fpp()))
    png, csv = out / "fig10.png", out / "fig10.csv"
    write_csv(csv, ["m_bits", "eq3_estimate", "measured_fpp", "hits", "probes",
                    "measured_fpp_deep", "hits_deep", "probes_deep", "shared_estimate"], rows)
    m_, est, meas, deep, shared = (np.array([r[i] for r in rows], dtype=float)
                                   for i in (0, 1, 2, 5, 8))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(m_, est, "-", color="C1", label="equation (3) as in the paper")
    ax.plot(m_, shared, "--", color="C2", lw=1.2,
            label="estimated_fpp() (shared generation)")
    ax.plot(m_, nan_zero(meas), "o", color="C0", ms=7,
            label=f"measured, {s.probes // 1000}k probes (as the paper)")
    ax.plot(m_, nan_zero(deep), "x", color="C3", ms=7,
            label=f"measured, {s.deep_probes / 1e6:g}M probes")
    resolution_line(ax, s.probes)
    ax.set_yscale("log")
    ax.set_xlabel("m, bits per constituent filter")
    ax.set_ylabel("false positive probability")
    ax.set_title(f"Fig. 10: equation (3) vs measured FPP over m\n"
                 f"basic FBF, {n} elements over 3 periods, k = {K}, t = {PERIOD:g} s")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
    save(fig, png)
    i20 = ms.index(20000)
    return Result(
        "fig10", png, csv,
        f"m=5000: estimate {fmt_e(est[0])} vs measured {fmt_e(meas[0])}; m=20000: estimate "
        f"{fmt_e(est[i20])} vs measured {fmt_e(deep[i20])} ({s.deep_probes / 1e6:g}M probes)",
        {"est_5000": float(est[0]), "meas_5000": float(meas[0])},
    )


# -- FBFs under a rising load (Fig. 11, 12) ---------------------------------------------------

STEPS_PER_S = 20  # inserts are batched per 50 ms of fake time


def load_run(
    f: ForgetfulBloomFilter, clock: FakeClock, arrivals: np.ndarray, rate: Callable[[float], float],
    sample_every: float, probes: int,
) -> list[tuple[float, float, int, float, float]]:
    """Insert ids at their arrival times and sample the FPP; rows (t, rate, inserted, measured,
    equation (3)). Batches of 50 ms never straddle a refresh, whose periods are multiples of it."""
    ids = op_ids(0, len(arrivals))
    per_sample = round(sample_every * STEPS_PER_S)
    end = float(arrivals[-1])
    rows = []
    done = 0
    step = 0
    while True:
        t = step / STEPS_PER_S
        if t > end:
            break
        clock.t = t
        upto = int(np.searchsorted(arrivals, (step + 1) / STEPS_PER_S, side="left"))
        if upto > done:
            f.add_many(ids[done:upto])
            done = upto
        step += 1
        if step % per_sample == 0:
            rows.append((t, rate(t), done, measured_fpp(f, probes), f.estimated_fpp()))
    return rows


def _near_rate(rows: list[tuple[float, float, int, float, float]], lo: float, hi: float,
               col: int) -> float:
    vals = [r[col] for r in rows if lo <= r[1] <= hi]
    return float(np.mean(vals)) if vals else math.nan


def fig11(out: Path, s: Settings) -> Result:
    n, m, r0, doubling = 5000, 25_000, 2.0, 10.0
    g = math.log(2) / doubling
    arrivals = np.log1p(np.arange(1, n + 1) * g / r0) / g  # N(t) = r0 (e^gt - 1) / g

    def rate(t: float) -> float:
        return r0 * math.exp(g * t)

    periods = (5.0, 3.0, 2.0, 1.0)
    probes = s.probes if not s.quick else 50_000
    every = 1.0 if not s.quick else 2.0
    runs = {}
    for p in periods:
        clock = FakeClock()
        runs[p] = load_run(ForgetfulBloomFilter(m, K, 1, p, clock), clock, arrivals, rate, every,
                           probes)
    png, csv = out / "fig11.png", out / "fig11.csv"
    write_csv(csv, ["period_s", "t_s", "ops_per_s", "inserted", "measured_fpp", "eq3_estimate"],
              [(p, *r) for p in periods for r in runs[p]])
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    for i, p in enumerate(periods):
        rows = runs[p]
        x = [r[1] for r in rows]
        ax.plot(x, nan_zero([r[3] for r in rows]), "-", color=f"C{i}", lw=1.4,
                label=f"t = {p:g} s, measured")
        ax.plot(x, [r[4] for r in rows], "--", color=f"C{i}", lw=0.9, alpha=0.7)
    ax.plot([], [], "--", color="0.4", lw=0.9, label="estimated_fpp() (eq. 3), same colours")
    resolution_line(ax, probes)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-8)
    ax.set_xlim(left=5)
    ax.set_xlabel(f"workload, ops/s (exponential rise from {r0:g} ops/s, doubling every "
                  f"{doubling:g} s, for {float(arrivals[-1]):.0f} s)")
    ax.set_ylabel("false positive probability")
    ax.set_title(f"Fig. 11: FPP vs refresh period under exponentially rising load\n"
                 f"basic FBF, m = {m}, k = {K}, {n} elements, {probes // 1000}k probes per point",
                 fontsize=10)
    ax.legend(loc="upper left")
    save(fig, png)
    meas5 = _near_rate(runs[5.0], 70, 140, 3)
    meas1 = _near_rate(runs[1.0], 70, 140, 3)
    est5 = _near_rate(runs[5.0], 70, 140, 4)
    est1 = _near_rate(runs[1.0], 70, 140, 4)
    n1 = sum(1 for r in runs[1.0] if 70 <= r[1] <= 140) * probes
    if meas1 > 0:
        meas_txt = f"{meas5 / meas1:.0f}x"
    elif meas5 > 0:
        meas_txt = f"t=1 s: 0 hits in {n1 / 1e6:g}M probes"
    else:
        meas_txt = "both below the probes' resolution"
    return Result(
        "fig11", png, csv,
        f"at ~100 ops/s, t=5 s vs t=1 s: measured {fmt_e(meas5)} vs {fmt_e(meas1)} "
        f"({meas_txt}); equation (3) {est5 / est1:.0f}x (the paper: 1000x)",
        {"meas5": meas5, "meas1": meas1, "est5": est5, "est1": est1},
    )


def fig12(out: Path, s: Settings) -> Result:
    n, peak = 3000, 200.0
    duration = 2 * n / peak
    a = peak / duration
    arrivals = np.sqrt(2 * np.arange(1, n + 1) / a)  # rate a*t, N(t) = a t^2 / 2

    def rate(t: float) -> float:
        return a * t

    counts = (24, 12, 6, 3)
    probes = s.probes if not s.quick else 50_000
    every = 0.5 if not s.quick else 1.0
    runs = {}
    for nf in counts:
        clock = FakeClock()
        runs[nf] = load_run(ForgetfulBloomFilter(M, K, nf - 2, PERIOD, clock), clock, arrivals,
                            rate, every, probes)
    png, csv = out / "fig12.png", out / "fig12.csv"
    write_csv(csv, ["filters", "t_s", "ops_per_s", "inserted", "measured_fpp", "eq3_estimate"],
              [(nf, *r) for nf in counts for r in runs[nf]])
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    widths = (5.0, 3.2, 1.6, 1.6)  # the 24, 12 and 6 filter curves coincide: draw them nested
    for i, nf in enumerate(counts):
        rows = runs[nf]
        x = [r[1] for r in rows]
        ax.plot(x, nan_zero([r[3] for r in rows]), "-", color=f"C{i}", lw=widths[i],
                alpha=0.55 if i < 2 else 1.0,
                label=f"{nf} filters (window {(nf - 1) * PERIOD:g} s), measured")
        ax.plot(x, [r[4] for r in rows], "--", color=f"C{i}", lw=0.9, alpha=0.8)
    ax.plot([], [], "--", color="0.4", lw=0.9, label="estimated_fpp() (eq. 3), same colours")
    resolution_line(ax, probes)
    ax.text(0.02, 0.97, "24, 12 and 6 filters coincide: in a 30 s ramp only the newest\n"
            "generations hold ids, and the oldest filter checked alone is nearly empty",
            transform=ax.transAxes, va="top", fontsize=8, color="0.25")
    ax.set_yscale("log")
    ax.set_ylim(1e-7, 3)
    ax.set_xlabel(f"workload, ops/s (linear ramp, 0 to {peak:g} ops/s over {duration:g} s)")
    ax.set_ylabel("false positive probability")
    ax.set_title(f"Fig. 12: FPP vs number of constituent filters under a rising load\n"
                 f"m = {M}, k = {K}, t = {PERIOD:g} s, {n} elements, "
                 f"{probes // 1000}k probes per point", fontsize=10)
    ax.legend(loc="lower right")
    save(fig, png)
    m3 = _near_rate(runs[3], 80, 125, 3)
    m24 = _near_rate(runs[24], 80, 125, 3)
    e3 = _near_rate(runs[3], 80, 125, 4)
    e24 = _near_rate(runs[24], 80, 125, 4)
    return Result(
        "fig12", png, csv,
        f"at ~100 ops/s, 3 vs 24 filters: measured {fmt_e(m3)} vs {fmt_e(m24)} "
        f"({m3 / m24:.1f}x; the paper: 5.5x); equation (3) says {e3 / e24:.0f}x",
        {"meas3": m3, "meas24": m24, "est3": e3, "est24": e24},
    )
