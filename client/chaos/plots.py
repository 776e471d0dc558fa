"""Figures and tables of the dedup comparison: PNG (matplotlib, Agg) plus CSV and Markdown."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Protocol


class DedupResult(Protocol):
    """What the figures read of a comparison (``client.chaos.dedup.DedupResult``); declared
    here so the plots do not import the runner that calls them."""

    strategies: list[str]
    lost_ack: float
    samples: list[dict[str, float]]
    batch_ms: dict[str, list[float]]
    rows: list[dict[str, Any]]
    files: list[str]

COLUMNS = ["strategy", "final", "acknowledged", "unknown", "error_pct", "over_count",
           "under_count", "converged", "exact", "batch50_mean_ms", "batch50_p50_ms",
           "batch50_p99_ms", "window_s", "estimated_fpp"]


def write_outputs(res: DedupResult, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    files = [_fig14_csv(res, out / "fig14_counter_accuracy.csv"),
             _fig15_csv(res, out / "fig15_write_latency.csv"),
             _table_csv(res, out / "dedup_table.csv")]
    (out / "dedup_table.md").write_text(markdown_table(res) + "\n")
    files.append(str(out / "dedup_table.md"))
    files += _plots(res, out)
    return files


def _fig14_csv(res: DedupResult, path: Path) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "expected", *res.strategies])
        for row in res.samples:
            w.writerow([row["t"], row["expected"], *(row.get(s, "") for s in res.strategies)])
    return str(path)


def _fig15_csv(res: DedupResult, path: Path) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "batch", "latency_ms"])
        for s, lat in res.batch_ms.items():
            for i, ms in enumerate(lat):
                w.writerow([s, i, round(ms, 4)])
    return str(path)


def _table_csv(res: DedupResult, path: Path) -> str:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(res.rows)
    return str(path)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:g}"
    return str(v)


def markdown_table(res: DedupResult) -> str:
    head = ("| strategy | final | acked | unknown | error % | over | under | exact | "
            "batch-50 p50 ms | mean ms | p99 ms | window s | est. FPP |")
    lines = [head, "|" + "---|" * 13]
    for r in res.rows:
        lines.append("| " + " | ".join(_fmt(r[k]) for k in (
            "strategy", "final", "acknowledged", "unknown", "error_pct", "over_count",
            "under_count", "exact", "batch50_p50_ms", "batch50_mean_ms", "batch50_p99_ms",
            "window_s",
            "estimated_fpp")) + " |")
    return "\n".join(lines)


def render_table(res: DedupResult) -> str:
    fbf = next(r for r in res.rows if r["strategy"] == "fbf")
    none = next(r for r in res.rows if r["strategy"] == "none")
    slower = (100.0 * (fbf["batch50_p50_ms"] / none["batch50_p50_ms"] - 1)
              if fbf["batch50_p50_ms"] and none["batch50_p50_ms"] else float("nan"))
    lines = [
        f"dedup comparison: {len(res.strategies)} strategies, lost acks {res.lost_ack:.0%}, "
        f"client retries with the same op ids (no age_ms)",
        f"Fig. 14: FBF final {fbf['final']} vs acknowledged {fbf['acknowledged']} "
        f"(error {fbf['error_pct']}%); without dedup {none['final']} "
        f"(error {none['error_pct']}%)",
        f"Fig. 15: batch of 50, median {fbf['batch50_p50_ms']} ms with FBF vs "
        f"{none['batch50_p50_ms']} ms without ({slower:+.1f}%; means {fbf['batch50_mean_ms']} "
        f"vs {none['batch50_mean_ms']} ms)",
        "", markdown_table(res), "", "files: " + ", ".join(res.files)]
    return "\n".join(lines)


def _plots(res: DedupResult, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    t = [r["t"] for r in res.samples]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(t, [r["expected"] for r in res.samples], "k--", lw=2, label="expected (acked)")
    styles = {"fbf": ("tab:blue", "counter with FBF"), "none": ("tab:red", "counter without FBF")}
    for s, (color, label) in styles.items():
        ax.plot(t, [r.get(s, math.nan) for r in res.samples], color=color, lw=1.6, label=label)
    rows = {r["strategy"]: r for r in res.rows}
    ax.set_title(f"Fig. 14 reproduced: {res.lost_ack:.0%} lost acks, retried; error with FBF "
                 f"{rows['fbf']['error_pct']}%, without {rows['none']['error_pct']}%",
                 fontsize=9)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("counter value")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "fig14_counter_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(str(path))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2),
                                 gridspec_kw={"width_ratios": [1, 2.2]})
    pair = [s for s in ("none", "fbf") if s in res.batch_ms]
    a1.boxplot([res.batch_ms[s] for s in pair], showfliers=False)
    a1.set_xticks(range(1, len(pair) + 1), ["without FBF", "with FBF"][: len(pair)])
    a1.set_ylabel("write latency of a 50-op batch (ms)")
    a1.set_title("Fig. 15 reproduced", fontsize=9)
    a1.grid(alpha=0.3)
    names = list(res.batch_ms)
    medians = [sorted(v)[len(v) // 2] if v else 0 for v in res.batch_ms.values()]
    a2.bar(range(len(names)), medians, color=["tab:blue" if n == "fbf" else "tab:gray"
                                               for n in names])
    a2.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    a2.set_ylabel("median ms per 50-op batch")
    a2.set_title("every dedup strategy, same batches", fontsize=9)
    a2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = out / "fig15_write_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(str(path))
    return files
