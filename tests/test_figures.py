"""``python -m bench.figures --quick``: every figure is written, and its headline facts hold."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``bench`` is not an installed package: import it from the repo
    sys.path.insert(0, str(ROOT))

from bench.figures import read_csv  # noqa: E402
from bench.figures.__main__ import FIGURES, main  # noqa: E402
from bench.figures.adaptive import worst_ratio  # noqa: E402

NAMES = ("fig8", "fig9", "fig10", "fig11", "fig12", "fig13", "fig_memory_error")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("figures")
    assert main(["--out", str(d), "--quick"]) == 0
    return d


def test_every_figure_has_png_and_csv(out: Path) -> None:
    assert set(FIGURES) <= set(NAMES)
    for name in NAMES:
        png, csv = out / f"{name}.png", out / f"{name}.csv"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert len(read_csv(csv)) >= 3, name


def test_fig8_optimised_check_beats_simple_at_300(out: Path) -> None:
    row = next(r for r in read_csv(out / "fig8.csv") if r["elements"] == "300")
    assert float(row["fpp_optimised"]) < float(row["fpp_simple"])
    # the optimised check answers "member" on a subset of what the simple one does
    for r in read_csv(out / "fig8.csv"):
        assert int(r["hits_optimised"]) <= int(r["hits_simple"])


def test_fig9_equation3_tracks_measured(out: Path) -> None:
    rows = [r for r in read_csv(out / "fig9.csv") if float(r["measured_fpp"]) > 1e-4]
    assert len(rows) >= 3
    for r in rows:
        ratio = float(r["eq3_estimate"]) / float(r["measured_fpp"])
        assert 1 / 3 < ratio < 3, r


def test_fig13_adaptive_stays_under_target_when_load_rises_100x(out: Path) -> None:
    rows = read_csv(out / "fig13.csv")
    assert worst_ratio(rows, "rise100x") < 1.0
    rise = [r for r in rows if r["run"] == "rise100x"]
    # it did adapt: more filters, a shorter period, and never a window under the configured one
    assert max(int(r["filters"]) for r in rise) > 3
    assert min(float(r["period_s"]) for r in rise) < 11.0
    assert min(float(r["window_s"]) for r in rise) >= 22.0 - 1e-9


def test_memory_error_late_retries_are_the_forgetting_floor(out: Path) -> None:
    rows = read_csv(out / "fig_memory_error.csv")
    by = {(r["strategy"], float(r["target_fpp"])): r for r in rows}
    exact = next(r for (name, _), r in by.items() if name == "exact")
    none = next(r for (name, _), r in by.items() if name == "none")
    # exact forgets only by time: its errors are the late retries, none once they are refused
    assert int(exact["under_all"]) == int(exact["over_in_window_all"]) == 0
    assert int(exact["over_late_all"]) > 0
    assert float(exact["error_refused"]) == 0.0
    # no dedup: every retry is an over-count
    assert float(none["error_all"]) > 0.2
    fbf = [r for (name, _), r in by.items() if name == "fbf"]
    assert min(float(r["error_refused"]) for r in fbf) < 1e-3
