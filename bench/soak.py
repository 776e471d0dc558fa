"""Soak: the chaos driver for a long bounded run with every nemesis, while this process samples
the nodes' memory. The run must end VALID and the memory stay flat.

    python -m bench.soak [--minutes 10] [--rate 200] [--nemesis LIST (default: every one)]
                         [--sample-seconds 10] [--out soak-out] [--json FILE]

Runs ``python -m client.chaos`` (local nodes, client and peer proxies, the Jepsen-style checker)
as a child process with ``--data-dir`` under ``--out``, finds its node processes by that data
directory (``/proc/<pid>/cmdline``) every ``--sample-seconds`` and records each one's RSS.
Nodes come and go (kill, restart, join, decommission), so memory is reported per node id: the
first sample after its last start, the median, the last, and the growth per minute of a
least-squares line through the samples of its longest life. Prints the chaos verdict line and
the read-check lines, then a JSON summary; exits 1 unless the run is VALID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def every_nemesis() -> str:
    """Every nemesis the chaos driver has, the non-default ones (clock, membership, ...) too."""
    from client.chaos.nemesis import ALL

    return ",".join(ALL)


def node_processes(data_dir: Path) -> dict[str, int]:
    """node id -> pid of every running node process whose --data-dir is under ``data_dir``."""
    out: dict[str, int] = {}
    prefix = str(data_dir.resolve())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "cluster.node" not in args or "--data-dir" not in args or "--id" not in args:
            continue
        ddir = args[args.index("--data-dir") + 1]
        if not os.path.isabs(ddir):  # relative to the node's own working directory
            with contextlib.suppress(OSError):
                ddir = os.path.join(os.readlink(f"/proc/{entry}/cwd"), ddir)
        if ddir.startswith(prefix):
            out[args[args.index("--id") + 1]] = int(entry)
    return out


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares growth (MiB per minute) of (seconds, MiB) points."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def summarize(samples: dict[str, dict[int, list[tuple[float, float]]]]) -> dict[str, Any]:
    """Per node id, over its longest-lived process: first, median and last RSS, growth."""
    out = {}
    for node_id, lives in sorted(samples.items()):
        pid, points = max(lives.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
        rss = [p[1] for p in points]
        growth = slope_per_minute(points)
        out[node_id] = {"pid": pid, "lives": len(lives), "samples": len(points),
                        "seconds": round(points[-1][0] - points[0][0]),
                        "rss_first_mib": round(rss[0], 1),
                        "rss_median_mib": round(statistics.median(rss), 1),
                        "rss_last_mib": round(rss[-1], 1),
                        "growth_mib_per_min": None if growth is None else round(growth, 2)}
    return out


async def soak(args: argparse.Namespace) -> int:
    out_dir = Path(args.out).resolve()  # the nodes' --data-dir, matched as given in their argv
    data_dir = out_dir / "data"
    if data_dir.exists() and any(data_dir.iterdir()):
        print(f"error: {data_dir} is not empty (an earlier soak): pick another --out",
              file=sys.stderr)
        return 2
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "client.chaos", "--duration", str(args.minutes * 60),
           "--rate", str(args.rate), "--nemesis", args.nemesis, "--data-dir", str(data_dir),
           "--out", str(out_dir / "chaos"), "--no-progress", *args.chaos_args]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    print("running:", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    samples: dict[str, dict[int, list[tuple[float, float]]]] = {}
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if args.echo:
                print(line, flush=True)

    reader = asyncio.create_task(read())
    next_report = t0 + 60
    while proc.returncode is None:
        now = time.monotonic() - t0
        for node_id, pid in node_processes(data_dir).items():
            mib = rss_mib(pid)
            if mib is not None:
                samples.setdefault(node_id, {}).setdefault(pid, []).append((now, mib))
        if time.monotonic() >= next_report:  # progress: one line a minute
            nodes = {n: round(lives[max(lives)][-1][1]) for n, lives in samples.items()}
            print(f"  {now / 60:.0f} min: RSS MiB {nodes}", flush=True)
            next_report += 60
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), args.sample_seconds)
    await reader
    start = max((i for i, ln in enumerate(lines) if ln.startswith("=" * 20)), default=0)
    for line in lines[max(0, start - 60):]:  # the chaos report: verdict, keys, reads
        print(line)
    summary = {"minutes": args.minutes, "rate": args.rate, "nemesis": args.nemesis,
               "chaos_exit": proc.returncode, "wall_seconds": round(time.monotonic() - t0),
               "memory": summarize(samples)}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if proc.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=200.0, help="the workload's ops/s")
    ap.add_argument("--nemesis", default=None,
                    help="the chaos driver's --nemesis (default: every nemesis it has)")
    ap.add_argument("--sample-seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default="soak-out", help="chaos output and the nodes' data")
    ap.add_argument("--json", default=None, help="also write the summary here")
    ap.add_argument("--echo", action="store_true", help="print the chaos driver's output")
    ap.add_argument("chaos_args", nargs=argparse.REMAINDER,
                    help="after --, extra flags for python -m client.chaos")
    args = ap.parse_args(argv)
    args.chaos_args = [a for a in args.chaos_args if a != "--"]
    args.nemesis = args.nemesis or every_nemesis()
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
