"""``make test``'s runner (tests/split_run.py): the two processes' counts add up to one closing
line in the plain form CI reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import split_run

ROOT = Path(__file__).resolve().parent.parent


def test_counts_read_pytest_s_closing_line() -> None:
    out = "....F.s\n=== short test summary ===\n1 failed, 680 passed, 2 skipped in 12.50s\n"
    assert split_run.counts(out) == {"failed": 1, "passed": 680, "skipped": 2}
    assert split_run.counts("3 passed, 1 error in 2.00s (0:00:02)\n") == {"passed": 3,
                                                                         "errors": 1}
    assert split_run.counts("no tests ran in 0.01s\n") == {}


def test_the_closing_line_adds_both_processes() -> None:
    total = (split_run.counts("600 passed, 1 skipped in 300.00s\n")
             + split_run.counts("2 failed, 80 passed in 400.00s\n"))
    assert split_run.closing_line(total) == "total: 680 passed, 2 failed, 1 skipped"


def test_an_unknown_side_file_is_refused_before_anything_runs() -> None:
    done = subprocess.run([sys.executable, "tests/split_run.py", "tests/test_nothing_here.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "no such test file" in done.stderr
