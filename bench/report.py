"""``python -m bench --report`` (``make bench``): run the headline benchmarks, write
docs/benchmarks.md and copy its table into README.md.

Every row names the command that measures it; the page's head names the date, the git commit
and the machine (cores, CPU model, memory), so a number is never separated from where it came
from. ``--quick`` runs each for a moment (a smoke run; its numbers are not for quoting).

    python -m bench --report [--quick] [--out docs/benchmarks.md] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
CLUSTER_SETUP = ("3 node processes on this machine, RF 3, W 2, fsync on, signed peer frames; the "
                 "load generator (24 connections) shares the cores")


@dataclass(frozen=True)
class Row:
    measure: str
    result: str
    command: str


# -- where a run happens ---------------------------------------------------------------------


def machine() -> dict[str, str]:
    """Cores, CPU model, memory, OS and Python of this machine, read from /proc where it is."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    except OSError:
        pass
    return {"cores": str(os.cpu_count() or "?"), "cpu": model or platform.processor() or "?",
            "memory": mem or "?", "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}


def machine_line(m: dict[str, str]) -> str:
    return f"{m['cores']} cores, {m['cpu']}, {m['memory']}"


def commit() -> str:
    """The commit measured, marked when the tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        described = git("describe", "--tags", "--always", "--dirty=+changes")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    if not head:
        return "unknown (not a git checkout)"
    dirty = described.endswith("+changes")
    tag = described.removesuffix("+changes")
    text = head if tag in ("", head) else f"{head} ({tag})"
    return f"{text}, with uncommitted changes" if dirty else text


# -- the measures ----------------------------------------------------------------------------


def _run_json(module: str, args: list[str]) -> dict[str, Any]:
    """Run ``python -m module args --json FILE`` from the repository root (its output goes to
    this process's, so the run shows its progress) and return what it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        print(f"\n=== python -m {module} {' '.join(args)} ===", flush=True)
        subprocess.run([sys.executable, "-m", module, *args, "--json", str(out)], cwd=ROOT,
                       check=True, stdout=sys.stdout, stderr=sys.stderr)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def fbf_rows(quick: bool) -> list[Row]:
    from bench import bench_fbf

    print("\n=== python -m bench.bench_fbf (its per-id, batch and memory measures) ===",
          flush=True)
    n, repeat = (20_000, 2) if quick else (200_000, 5)
    per = bench_fbf.per_op(n, repeat)
    per.update(bench_fbf.batch(n * 5, 10_000, repeat))
    mem = bench_fbf.memory(10.0, 100_000.0, 1e-6)
    simplest = per["bloom add, simplest"]
    cmd = "python -m bench.bench_fbf"
    kernel = bench_fbf.hotpath.KERNEL
    return [
        Row("Dedup check+insert of one op id (FBF, 8 filters)",
            f"{per['fbf add, 8 filters']:.2f} us ({per['fbf add, 8 filters'] / simplest:.2f}x "
            f"the simplest Bloom add; kernel: {kernel})", cmd),
        Row("Dedup check+insert in batches of 10,000 ids (FBF, 8 filters)",
            f"{per['fbf add_many, 8 filters']:.3f} us an id", cmd),
        Row("Dedup memory per remembered op id (FBF sized for 10 s at 100k ids/s, FPP 1e-6)",
            f"{mem['fbf bytes per remembered id']:.1f} B (a Python set: "
            f"{mem['python set bytes per id']:.0f} B)", cmd),
    ]


def _k(ops: float) -> str:
    return f"{ops / 1000:.1f}k" if ops >= 10_000 else f"{ops:,.0f}"


def cluster_rows(quick: bool) -> list[Row]:
    """Ours against Redis where redis-server is installed (``bench_redis`` measures both),
    ours alone otherwise (``bench_cluster``)."""
    if shutil.which("redis-server") is not None:
        args = ["--quick"] if quick else []
        out = _run_json("bench.bench_redis", args)
        if "skipped" not in out:
            cmd = "python -m bench.bench_redis" + (" --quick" if quick else "")
            single, paced = out["ours_single"], out["ours_single_paced"]
            routed, anyn = out["ours_pipelined"], out["ours_batch_any_node"]
            rs, rp = out["redis_single"], out["redis_pipelined"]
            return [
                Row("Batched writes, 100 ops a request, each batch to its keys' leader",
                    f"{_k(routed['ops_per_s'])} ops/s, {routed['node_cpu_us_per_op']} us of "
                    f"node CPU an op", cmd),
                Row("Batched writes, 100 ops a request, to any node (forwarded)",
                    f"{_k(anyn['ops_per_s'])} ops/s, {anyn['node_cpu_us_per_op']} us of node "
                    f"CPU an op", cmd),
                Row("One op a request, to its key's leader (what the SDK does)",
                    f"{_k(single['ops_per_s'])} ops/s, {single['node_cpu_us_per_op']} us of "
                    f"node CPU an op", cmd),
                Row(f"Latency of one op a request at {paced['rate']:,} ops/s (80% of that peak)",
                    f"p50 {paced['p50_ms']:.1f} ms, p99 {paced['p99_ms']:.1f} ms", cmd),
                Row("Redis + Lua (SET NX EX + INCRBY, appendfsync always), same clients",
                    f"{_k(rs['ops_per_s'])} ops/s one op a round trip, {_k(rp['ops_per_s'])} "
                    f"pipelined by 100; ours / Redis: {out['ratios']['single']}x and "
                    f"{out['ratios']['pipelined']}x", cmd),
            ]
    args = ["--phases", "routed,single_routed", "--no-memory", "--live-counters", "0"]
    args += ["--quick"] if quick else ["--seconds", "5"]
    out = _run_json("bench.bench_cluster", args)
    cmd = "python -m bench.bench_cluster " + " ".join(args)
    routed, single = out["batch_routed"], out["single_routed"]
    return [
        Row("Batched writes, 100 ops a request, each batch to its keys' leader",
            f"{_k(routed['ops_per_s'])} ops/s, p99 {routed['p99_ms']:.1f} ms, "
            f"{routed['node_cpu_us_per_op']} us of node CPU an op", cmd),
        Row("One op a request, to its key's leader (what the SDK does)",
            f"{_k(single['ops_per_s'])} ops/s, p99 {single['p99_ms']:.1f} ms, "
            f"{single['node_cpu_us_per_op']} us of node CPU an op", cmd),
        Row("Redis comparison", "not measured: redis-server is not installed "
            "(Debian: apt-get install redis-server)", "python -m bench.bench_redis"),
    ]


def app_rows(quick: bool) -> list[Row]:
    """The application shape: one SDK client shared by 256 coroutines (``bench_app``), against
    redis-py doing the same where redis-server is installed."""
    args = ["--quick"] if quick else []
    out = _run_json("bench.bench_app", args)
    ours = out["ours"]
    cmd = "python -m bench.bench_app" + (" --quick" if quick else "")
    against = (f"; Redis the same way {_k(out['redis']['ops_per_s'])} ops/s, ours / Redis "
               f"{out['ratio_ops_per_s']}x" if "redis" in out else "")
    return [Row(f"One SDK client shared by {out['config']['coroutines']} coroutines, each "
                "awaiting one increment at a time (the SDK batches them by leader)",
                f"{_k(ours['ops_per_s'])} ops/s, {ours['ops_per_request']} ops a request, "
                f"p99 {ours['p99_ms']:.1f} ms{against}", cmd)]


def inprocess_rows(quick: bool) -> list[Row]:
    args = ["--quick"] if quick else []
    out = _run_json("bench.bench_inprocess", args)
    cpu = [r["cpu_us_per_op"] for r in out["rounds"]]
    spread = f"{min(cpu)} - {max(cpu)}" if len(cpu) > 1 else f"{cpu[0]}"
    return [Row("The cluster's own logic per batched op (3 nodes in one process: no HTTP, "
                "fsync or wakeups between processes)",
                f"{spread} us of CPU an op ({len(cpu)} round{'s' * (len(cpu) > 1)})",
                "python -m bench.bench_inprocess" + (" --quick" if quick else ""))]


def memory_rows(quick: bool) -> list[Row]:
    from bench.bench_cluster import memory_offline

    n = 100_000 if quick else 1_000_000
    print(f"\n=== memory of {n:,} counters in fresh processes (bench_cluster's memory phase) "
          "===", flush=True)
    rows = {r["what"]: r for r in memory_offline(n)}
    cmd = "python -m bench.bench_cluster --phases memory"
    return [Row(f"Memory per counter, {n:,} counters in a fresh process",
                f"{rows['counters']['bytes_each']:.0f} B built by writes, "
                f"{rows['counters_loaded']['bytes_each']:.0f} B loaded from a snapshot", cmd),
            Row(f"Memory per remembered op id, {n:,} ids (FBF at FPP 1e-6 / exact dict)",
                f"{rows['fbf']['bytes_each']:.1f} B / {rows['exact']['bytes_each']:.0f} B", cmd)]


def live_memory_rows(quick: bool) -> list[Row]:
    """RSS growth of each node of 3 (RF 3) after loading counters through ``/v1/batch``."""
    sizes = (20_000,) if quick else (300_000, 1_000_000)
    spans = []
    for n in sizes:
        per = _run_json("bench.bench_scale", ["--counters", str(n), "--phases", "idle",
                                              "--idle-seconds", "2"])["memory"]
        got = per["bytes_per_counter"].values()
        spans.append(f"{min(got)}-{max(got)} B at {n:,}")
    return [Row("Memory per counter in a live node (3 nodes, RF 3; RSS growth a node after "
                "loading them through /v1/batch)", ", ".join(spans),
                "python -m bench.bench_scale --counters N --phases idle")]


MEASURES: tuple[Callable[[bool], list[Row]], ...] = (fbf_rows, cluster_rows, app_rows,
                                                     inprocess_rows, memory_rows,
                                                     live_memory_rows)


# -- the page --------------------------------------------------------------------------------


def table(rows: list[Row], mach: dict[str, str]) -> str:
    where = machine_line(mach)
    lines = ["| measure | result | command | machine |", "|---|---|---|---|"]
    lines += [f"| {r.measure} | {r.result} | `{r.command}` | {where} |" for r in rows]
    return "\n".join(lines)


def head_line(date: str, rev: str, mach: dict[str, str]) -> str:
    return (f"Measured {date} at commit `{rev}` on {machine_line(mach)} "
            f"({mach['os']}, Python {mach['python']}) by `python -m bench --report`.")


def page(rows: list[Row], *, date: str, rev: str, mach: dict[str, str], quick: bool,
         seconds: float, load: str) -> str:
    smoke = ("\n**A `--quick` run: every phase lasts a moment. These numbers show the report "
             "works, not how fast the cluster is.**\n" if quick else "")
    return f"""# Benchmarks

Written by `python -m bench --report` (`make bench`); the table in the README is a copy of the
one below. Run it again to replace both.
{smoke}
| | |
|---|---|
| date | {date} |
| commit | `{rev}` |
| machine | {machine_line(mach)} |
| system | {mach['os']}, Python {mach['python']} |
| load average when it started | {load} |
| run time | {seconds:.0f} s |

{table(rows, mach)}

Cluster rows: {CLUSTER_SETUP}.

## How to read them

- Every number comes from the one run above, on the machine named. On a shared virtual machine
  throughput moves by 10 - 40% from one run to the next and CPU per op less; to compare two
  versions, run each several times, alternating them, on the same machine.
- "Node CPU an op" is the CPU time of all three node processes (from /proc) divided by the ops
  acknowledged: it is what an op costs the cluster, whatever else runs on the machine.
- What each benchmark does, and the others (`python -m bench` runs them all), is in its
  module's docstring under `bench/`; the cluster's design behind the numbers is in
  [node.md](node.md), and what limits batched throughput in [performance.md](performance.md).
"""


def replace_readme_table(readme: Path, block: str) -> bool:
    """Put ``block`` between the README's markers; False when it has none."""
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        return False
    readme.write_text(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text, count=1))
    return True


def readme_block(rows: list[Row], *, date: str, rev: str, mach: dict[str, str]) -> str:
    return f"{head_line(date, rev, mach)}\n\n{table(rows, mach)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench --report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a moment a phase: shows the report works (numbers not for quoting)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md",
                    help="copy the table between this file's bench-table markers (not with "
                         "--quick)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rev, mach = commit(), machine()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = [row for measure in MEASURES for row in measure(args.quick)]
    text = page(rows, date=date, rev=rev, mach=mach, quick=args.quick,
                seconds=time.monotonic() - started, load=load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"\nwrote {args.out}")
    if args.quick:
        print("a --quick run: the README's table is left as it was")
    elif args.readme.is_file():
        block = readme_block(rows, date=date, rev=rev, mach=mach)
        if replace_readme_table(args.readme, block):
            print(f"copied the table into {args.readme}")
        else:
            print(f"{args.readme} has no {BEGIN} ... {END} markers: left alone")
    print(table(rows, mach))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
