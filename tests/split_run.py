"""``make test``: the suite as two pytest processes side by side.

The files named on the command line (the tests that mostly wait on real node processes: chaos
runs, membership moves, compose, the hostile run) run in one process while every other test
runs in the other, which mostly computes (the simulator, hypothesis, the kernels). On two cores
the waiting of the first overlaps the computing of the second instead of queueing behind it.
Neither group shares state with the other: each test binds its own free ports and directories.

    python tests/split_run.py [--] SIDE_FILE... [-- PYTEST_ARGS...]

The main process's output streams; the side process's is printed when both have ended, then a
closing line with the two counts added. The exit status is the worse of the two.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

OUTCOMES = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings",
            "errors", "error")


def counts(output: str) -> Counter[str]:
    """The outcome counts of pytest's closing line (``3 failed, 680 passed, 2 skipped in ...``)."""
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|error)", ln)
             and " in " in ln]
    total: Counter[str] = Counter()
    if lines:
        for n, what in re.findall(r"(\d+) (\w+)", lines[-1].split(" in ")[0]):
            if what in OUTCOMES:
                total["errors" if what == "error" else what] += int(n)
    return total


def closing_line(total: Counter[str]) -> str:
    """The plain closing line: ``N passed, N failed`` then whatever else happened."""
    parts = [f"{total['passed']} passed", f"{total['failed']} failed"]
    parts += [f"{total[k]} {k}" for k in ("skipped", "errors", "xfailed", "xpassed")
              if total[k]]
    return "total: " + ", ".join(parts)


def main(argv: list[str]) -> int:
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    side, extra = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args \
        else (args, [])
    missing = [f for f in side if not Path(f).is_file()]
    if missing:
        print(f"split_run: no such test file: {', '.join(missing)}", file=sys.stderr)
        return 2
    pytest = [sys.executable, "-m", "pytest", "-q", *extra]
    with tempfile.TemporaryFile("w+") as side_out:
        # its own cache-less run: the two processes must not write .pytest_cache at once
        side_proc = subprocess.Popen([*pytest, "-p", "no:cacheprovider", *side],
                                     stdout=side_out, stderr=subprocess.STDOUT, text=True)
        try:
            main_proc = subprocess.Popen([*pytest, *(f"--ignore={f}" for f in side)],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
            assert main_proc.stdout is not None
            main_text = []
            for line in main_proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                main_text.append(line)
            main_code = main_proc.wait()
            side_code = side_proc.wait()
        except BaseException:
            side_proc.kill()
            raise
        side_out.seek(0)
        side_text = side_out.read()
    print(f"\n--- side by side: {' '.join(side)}")
    sys.stdout.write(side_text)
    total = counts("".join(main_text)) + counts(side_text)
    print(closing_line(total), flush=True)
    return max(main_code, side_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
