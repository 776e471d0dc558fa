"""Our own figure: memory against counting error for every dedup strategy, under retried ops.

Workload: fresh op ids ``c<client>:<seq>`` at a fixed rate from 100 clients (so the per-client
sequence window works too); each op is retried once, same id, with probability 0.3, after a
lognormal delay (median 1 s, sigma 1.2: about 2.7% of retries come after the 10 s window). Every
strategy sees the same stream on a fake clock. An over-count is a retry accepted as new, an
under-count a fresh op taken for a duplicate; error = (over + under) / fresh ops.

Two passes: every retry reaches the dedup, or (as the cluster does) a retry older than the window
is refused with ``op_expired`` before it reaches the dedup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from bench.figures import FakeClock, Result, Settings, save, write_csv
from cluster.core.dedup import DEDUP_NAMES, make_dedup

WINDOW = 10.0
RATE = 1000.0
CLIENTS = 100
RETRY_P = 0.3
DELAY_MEDIAN = 1.0
DELAY_SIGMA = 1.2
SEED = 20_240_601
SIZE_FREE = {"none", "exact", "seqwindow"}  # strategies that take no target_fpp

FRESH, RETRY, LATE = 0, 1, 2


@dataclass
class Workload:
    times: list[float]
    ids: list[bytes]
    kinds: list[int]
    fresh: int
    retries: int
    late: int

    def refused(self) -> Workload:
        """The stream the dedup sees when retries older than the window get ``op_expired``."""
        keep = [i for i, k in enumerate(self.kinds) if k != LATE]
        return Workload([self.times[i] for i in keep], [self.ids[i] for i in keep],
                        [self.kinds[i] for i in keep], self.fresh, self.retries - self.late, 0)


def workload(duration: float, seed: int = SEED) -> Workload:
    rng = np.random.default_rng(seed)
    n = round(duration * RATE)
    t_fresh = np.arange(n) / RATE
    ids = [b"c%03d:%d" % (i % CLIENTS, i // CLIENTS) for i in range(n)]
    retried = np.nonzero(rng.random(n) < RETRY_P)[0]
    delay = DELAY_MEDIAN * np.exp(DELAY_SIGMA * rng.standard_normal(len(retried)))
    times = np.concatenate([t_fresh, t_fresh[retried] + delay])
    kinds = np.concatenate([np.full(n, FRESH), np.where(delay > WINDOW, LATE, RETRY)])
    order = np.argsort(times, kind="stable")  # a fresh op comes before a retry at the same time
    all_ids = ids + [ids[i] for i in retried]
    return Workload(times[order].tolist(), [all_ids[i] for i in order], kinds[order].tolist(),
                    n, len(retried), int(np.count_nonzero(delay > WINDOW)))


def replay(name: str, target: float, w: Workload) -> tuple[int, int, int, int, float]:
    """Feed the stream to one strategy: (under, over in window, over late, peak bytes, window)."""
    clock = FakeClock(0.0)
    d = make_dedup(name, window=WINDOW, rate=RATE, target_fpp=target, clock=clock)
    seen = d.seen_or_add
    under = over = late = 0
    peak = d.nbytes()
    next_sample = 1.0
    for t, op, kind in zip(w.times, w.ids, w.kinds, strict=True):
        clock.t = t
        if t >= next_sample:
            peak = max(peak, d.nbytes())
            next_sample = math.floor(t) + 1.0
        dup = seen(op)
        if kind == FRESH:
            under += dup
        elif not dup:
            if kind == LATE:
                late += 1
            else:
                over += 1
    peak = max(peak, d.nbytes())
    return under, over, late, peak, float(d.window)


def fig_memory_error(out: Path, s: Settings) -> Result:
    duration = 20.0 if s.quick else 30.0
    targets = (1e-2, 1e-4, 1e-6) if s.quick else (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    w_all = workload(duration)
    w_ref = w_all.refused()
    rows = []
    for name in DEDUP_NAMES:
        for target in (targets[-1:] if name in SIZE_FREE else targets):
            u_a, o_a, l_a, b_a, win = replay(name, target, w_all)
            u_r, o_r, _, b_r, _ = replay(name, target, w_ref)
            rows.append((name, target, max(b_a, b_r), w_all.fresh, u_a, o_a, l_a,
                         (u_a + o_a + l_a) / w_all.fresh, u_r, o_r, (u_r + o_r) / w_all.fresh,
                         win))
    png, csv = out / "fig_memory_error.png", out / "fig_memory_error.csv"
    write_csv(csv, ["strategy", "target_fpp", "peak_bytes", "fresh_ops", "under_all",
                    "over_in_window_all", "over_late_all", "error_all", "under_refused",
                    "over_refused", "error_refused", "window_s"], rows)

    floor = 0.5 / w_all.fresh
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.6), sharey=True)
    panels = (
        (axes[0], 7, "every retry reaches the dedup\n(retries after the window count twice "
                     "for any forgetting strategy)"),
        (axes[1], 10, "retries older than the window refused with op_expired\n"
                      "(as the cluster does): only in-window errors remain"),
    )
    markers = "os^vD<>phX*P"
    for ax, col, title in panels:
        for i, name in enumerate(n for n in DEDUP_NAMES if n != "none"):
            pts = sorted((r[2], r[col], r[1]) for r in rows if r[0] == name)
            x = np.array([p[0] for p in pts], dtype=float)
            y = np.array([p[1] for p in pts])
            color = plt.get_cmap("tab20")(i % 20)  # twelve strategies: tab10 would repeat
            ax.plot(x, np.maximum(y, floor), "-", color=color, lw=1.2, alpha=0.8)
            ax.plot(x[y > 0], y[y > 0], markers[i % len(markers)], color=color, ms=6,
                    label=name)
            ax.plot(x[y == 0], np.full(int(np.sum(y == 0)), floor), markers[i % len(markers)],
                    color=color, ms=7, mfc="none", mew=1.5)
            if name == "fbf":
                for (xb, yb, tg), off in zip((pts[0], pts[-1]), ((-30, -4), (4, 4)), strict=True):
                    ax.annotate(f"{tg:.0e}", (xb, max(yb, floor)), xytext=off,
                                textcoords="offset points", fontsize=7, color=color)
        none = [r for r in rows if r[0] == "none"]
        if none:
            ax.axhline(none[0][col], color="0.2", ls="--", lw=1,
                       label="none (no dedup): every retry counts")
        if col == 7:
            ax.axhline(w_all.late / w_all.fresh, color="C3", ls=":", lw=1.3,
                       label=f"late retries (after {WINDOW:g} s): {w_all.late / w_all.fresh:.4f}")
        ax.axhline(floor, color="0.5", ls="-", lw=0.6)
        ax.annotate(f"open markers: no error in {w_all.fresh} ops", (0.01, floor),
                    xycoords=("axes fraction", "data"), xytext=(0, -10),
                    textcoords="offset points", fontsize=7.5, color="0.35")
        ax.set_ylim(floor / 3, 0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("memory, peak bytes (log)")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("error = (over-counts + under-counts) / true count")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8.5,
                   title=f"strategy (target FPP\n{targets[0]:.0e} ... {targets[-1]:.0e})")
    fig.suptitle(
        f"Memory against counting error: {RATE:g} ops/s for {duration:g} s from {CLIENTS} "
        f"clients, {RETRY_P:.0%} retried after a lognormal delay (median {DELAY_MEDIAN:g} s, "
        f"{w_all.late / max(1, w_all.retries):.1%} beyond the {WINDOW:g} s window)",
        fontsize=11)
    fig.tight_layout()
    save(fig, png)

    def best(name: str, col: int) -> tuple[float, int]:
        cand = [r for r in rows if r[0] == name]
        r = min(cand, key=lambda r: (r[col], r[2]))
        return float(r[col]), int(r[2])

    parts = []
    for name in ("fbf", "adaptive-fbf", "exact", "seqwindow", "counting-bloom", "dleft-window"):
        if name in DEDUP_NAMES:
            err, nbytes = best(name, 10)
            parts.append(f"{name} {err:.1e} @ {nbytes / 1000:.0f} kB")
    late_share = w_all.late / w_all.fresh
    return Result(
        "fig_memory_error", png, csv,
        "best in-window error: " + ", ".join(parts)
        + f"; late retries add {late_share:.4f} to every forgetting strategy",
        {"late_share": late_share},
    )
