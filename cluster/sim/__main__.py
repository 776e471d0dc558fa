"""``python -m cluster.sim``: run one seed, or sweep ``--seeds A..B``; exit 1 on a violation."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from cluster.sim.forensics import failing_keys, key_story
from cluster.sim.run import BREAKS, DEFAULT_FAULTS, FAULTS, MIX, Options, run_seed

# The compiled kernels the simulated nodes run, each switched off by its variable: read once
# at import, so ``--kernels reference`` sets them and starts the process again.
KERNEL_SWITCHES = ("IDC_FBF_KERNEL", "IDC_STORE_KERNEL", "IDC_BATCH_KERNEL")


def _kernels_line() -> str:
    """Which form of each kernel this process runs (``c``, or its reference)."""
    from cluster.core import batch_kernel, store_kernel
    from cluster.core.fbf import hotpath

    return (f"kernels: fbf {hotpath.KERNEL}, store {store_kernel.KERNEL}, "
            f"batch {batch_kernel.KERNEL}")


def _wants_reference(argv: list[str]) -> bool:
    """``--kernels reference`` among the arguments, read as ``main``'s parser reads it (an
    abbreviation too) before anything imports the kernels."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--kernels")
    return ap.parse_known_args(argv)[0].kernels == "reference"


def _seeds(text: str) -> range:
    lo, _, hi = text.partition("..")
    return range(int(lo), int(hi or lo) + 1)


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n and n != "none")
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"--{what}: unknown {bad}; choose from {','.join(allowed)}")
    return names


def _mix(text: str) -> tuple[tuple[str, float], ...]:
    """``NAME=SHARE,...`` (names of ``MIX``): the shares that differ from the defaults."""
    out: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, _, share = part.partition("=")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if name not in MIX or not 0.0 <= value <= 1.0:
            raise SystemExit(f"--mix: {part!r} is not NAME=SHARE with NAME one of "
                             f"{','.join(MIX)} and SHARE in [0, 1]")
        out[name] = value
    if sum({**MIX, **out}.values()) > 1.0:
        raise SystemExit("--mix: the shares add up to more than 1 (adds take the rest)")
    return tuple((k, v) for k, v in out.items() if v != MIX[k])


def _one(opts: Options, trace: bool, history: str | None) -> tuple[bool, float, float, str]:
    """Run one seed; (ok, virtual s, real s, what to print). Picklable both ways, so a sweep
    can run it in worker processes (``--jobs``)."""
    res = run_seed(opts)
    out = [res.line()]
    if trace:
        out += ["    " + t for t in res.trace]
        for key in failing_keys(res):
            out.append(f"  {key}:")
            out += ["    " + t for t in key_story(res, key)]
    if history:
        with open(history, "w") as f:
            f.writelines(json.dumps(ev, sort_keys=True) + "\n" for ev in res.history)
    return res.ok, res.virtual_s, res.real_s, "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster.sim", description=__doc__)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", help="a sweep, A..B inclusive (one line per seed)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="seeds run in this many worker processes at once (lines stay in seed "
                         "order; each seed is still deterministic)")
    ap.add_argument("--kernels", choices=("compiled", "reference"), default="compiled",
                    help="compiled: the nodes run the compiled kernels where built, as a node "
                         "process does; reference: their Python (numpy for the FBF) twins, the "
                         "same answers by the twin tests, to sweep both")
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                    help=f"any of {','.join(FAULTS)} (default: all but skew, clock and "
                         "membership), or none")
    ap.add_argument("--mix", default="",
                    help="the op mix, NAME=SHARE,... of "
                         + ",".join(f"{k} (default {v:g})" for k, v in MIX.items())
                         + "; adds take the rest. Deletes are retried as adds are, multi-gets "
                         "read 2-3 keys, scans follow the cursor to the end")
    ap.add_argument("--ttl", type=float, default=None,
                    help="a second table with this ttl (seconds, at least 1), set through the "
                         "membership before the clients start; 30%% of the ops go to it, and "
                         "the checker judges expiry")
    ap.add_argument("--break", dest="breaks", default="",
                    help=f"test-only: {','.join(BREAKS)} (the checker must then fail)")
    ap.add_argument("--history", help="write the history of the (last) seed here, JSON lines")
    ap.add_argument("--trace", action="store_true",
                    help="print the nemesis' actions and, for a failing seed, the story of each "
                         "failing key: client adds, reads out of bounds, and which node logged "
                         "which op when (APPLY, REPLICA, PUBLISHED, WITHDRAW)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    seeds = _seeds(args.seeds) if args.seeds else range(args.seed, args.seed + 1)
    faults = _names(args.faults, FAULTS, "faults")
    breaks = _names(args.breaks, BREAKS, "break")
    mix = _mix(args.mix)
    if args.ttl is not None and not args.ttl >= 1.0:
        ap.error("--ttl must be at least 1 (seconds)")
    runs = [(Options(seed=seed, nodes=args.nodes, rf=args.rf, ops=args.ops,
                     clients=args.clients, keys=args.keys, faults=faults, breaks=breaks,
                     mix=mix, ttl=args.ttl),
             args.trace, args.history if seed == seeds[-1] else None) for seed in seeds]
    failed = 0
    virtual = real = 0.0
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.jobs > 1 and len(runs) > 1:
            pool = stack.enter_context(ProcessPoolExecutor(args.jobs))
            results = pool.map(_one, *zip(*runs, strict=True), chunksize=4)
        else:
            results = (_one(*run) for run in runs)
        for ok, v, r, text in results:
            virtual, real = virtual + v, real + r
            print(text, flush=True)
            failed += not ok
    wall = time.perf_counter() - started
    print(f"{len(seeds)} seed(s), {failed} violation(s); {virtual:.0f} virtual s in "
          f"{real:.1f} real s of seed time ({virtual / max(real, 1e-9):.0f}x), {wall:.1f} s "
          f"wall with {args.jobs} job(s); {_kernels_line()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    again = os.environ.get("PYTHONHASHSEED") != "0"  # str hashing orders sets: pin it
    os.environ["PYTHONHASHSEED"] = "0"
    if _wants_reference(sys.argv[1:]) and any(os.environ.get(v) != "0" for v in KERNEL_SWITCHES):
        os.environ.update(dict.fromkeys(KERNEL_SWITCHES, "0"))
        again = True
    if again:  # replay exact, with the kernels asked for
        os.execv(sys.executable, [sys.executable, "-m", "cluster.sim", *sys.argv[1:]])
    sys.exit(main())
