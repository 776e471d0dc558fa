"""``python -m bench --report``: the page names its machine, commit and commands, and the
README's table is a copy of the one in docs/benchmarks.md."""

from __future__ import annotations

import os
from pathlib import Path

from bench import report
from bench.report import BEGIN, END, Row

ROOT = Path(__file__).resolve().parent.parent
MACHINE = {"cores": "2", "cpu": "Test CPU", "memory": "3.8 GiB", "os": "Linux 6.1",
           "python": "3.11.2"}
ROWS = [Row("Batched writes", "70.0k ops/s, 25.0 us of node CPU an op",
            "python -m bench.bench_redis"),
        Row("Dedup memory per remembered op id", "8.2 B", "python -m bench.bench_fbf")]


def _table_lines(text: str) -> list[str]:
    """The rows of the measures table: four cells, the header and the rule left out."""
    return [line for line in text.splitlines() if line.startswith("| ")
            and line.count(" | ") == 3 and not line.startswith(("| measure |", "|---"))]


def test_machine_reads_cores_and_cpu_model() -> None:
    m = report.machine()
    assert m["cores"] == str(os.cpu_count())
    assert m["cpu"] and m["cpu"] != "?"
    assert m["python"].startswith("3.")


def test_every_row_names_its_command_and_machine() -> None:
    text = report.page(ROWS, date="2026-01-02 03:04 UTC", rev="abc1234", mach=MACHINE,
                       quick=False, seconds=123, load="0.10 0.20 0.30")
    for row in ROWS:
        assert f"| {row.measure} | {row.result} | `{row.command}` | 2 cores, Test CPU, 3.8 GiB |" \
            in text
    assert "| date | 2026-01-02 03:04 UTC |" in text and "| commit | `abc1234` |" in text
    assert "--quick" not in text.split("## How to read them")[0]
    quick = report.page(ROWS, date="d", rev="r", mach=MACHINE, quick=True, seconds=1, load="0")
    assert "A `--quick` run" in quick


def test_the_readme_block_is_replaced_between_its_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    block = report.readme_block(ROWS, date="d", rev="r", mach=MACHINE)
    assert report.replace_readme_table(readme, block)
    text = readme.read_text()
    assert "old" not in text and text.endswith("\n\nafter\n") and block in text
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not report.replace_readme_table(plain, block)
    assert plain.read_text() == "no markers\n"


def test_the_readme_table_is_the_latest_report_s() -> None:
    readme = (ROOT / "README.md").read_text()
    inside = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert _table_lines(inside), "the README's table is empty: run make bench"
    assert _table_lines(inside) == _table_lines(page)
    head = page.split("| date | ", 1)[1].split(" |", 1)[0]
    assert f"Measured {head} at commit" in inside  # the same run
