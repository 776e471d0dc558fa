"""``python -m bench.figures --out docs/figures [--quick] [--only fig8,fig13]``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.figures import Result, Settings, style
from bench.figures.adaptive import fig13
from bench.figures.memory import fig_memory_error
from bench.figures.paper import fig8_9, fig10, fig11, fig12

Maker = Callable[[Path, Settings], "Result | tuple[Result, ...]"]
FIGURES: dict[str, Maker] = {
    "fig8": fig8_9,  # fig8 and fig9 come from the same runs
    "fig10": fig10,
    "fig11": fig11,
    "fig12": fig12,
    "fig13": fig13,
    "fig_memory_error": fig_memory_error,
}
ALIASES = {"fig9": "fig8"}


def run(out: Path, quick: bool = False, only: list[str] | None = None) -> list[Result]:
    out.mkdir(parents=True, exist_ok=True)
    style()
    settings = Settings.make(quick)
    wanted = list(FIGURES) if not only else list(dict.fromkeys(ALIASES.get(n, n) for n in only))
    unknown = [n for n in wanted if n not in FIGURES]
    if unknown:
        raise SystemExit(f"unknown figure(s) {', '.join(unknown)}; known: "
                         f"{', '.join([*FIGURES, *ALIASES])}")
    results: list[Result] = []
    for name in wanted:
        t0 = time.perf_counter()
        made = FIGURES[name](out, settings)
        for r in made if isinstance(made, tuple) else (made,):
            results.append(r)
            print(f"{r.name:<17} {r.png}  {r.headline}  [{time.perf_counter() - t0:.1f}s]",
                  flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("docs/figures"),
                    help="directory for the PNG and CSV files (default: docs/figures)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer points and probes: a first look in well under a minute")
    ap.add_argument("--only", default="",
                    help="comma-separated figure names (fig8..fig13, fig_memory_error)")
    args = ap.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    t0 = time.perf_counter()
    run(args.out, args.quick, only or None)
    print(f"done in {time.perf_counter() - t0:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
