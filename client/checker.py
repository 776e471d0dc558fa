"""Jepsen's counter checker, extended to decrements and to final reads on every replica.

Pure: it takes a history (a sequence of event mappings, in real-time order) and returns a report;
it does no I/O. An event is

    {"type": "invoke"|"ok"|"fail"|"info", "f": "add"|"read"|"final-read", "process": ...,
     "key": "table/key", "value": int|None, "time": float, "op_id": ..., "node": ...,
     "attempts": int, "duplicate": bool}

The walk (jepsen.checker/counter): an ``add`` whose completion is not ``fail`` widens the bounds
at its invocation (``upper`` for an increment, ``lower`` for a decrement) and narrows them at its
``ok`` (``lower`` for an increment, ``upper`` for a decrement); failed adds are removed with
their invocations. An invocation never completed counts as ``info``.

A read that completes ``ok`` is valid when its value lies in [lower(t), upper(t)] for some t
between its invocation and its completion. Consecutive intervals always overlap, so that union
is [min lower, max upper] over the read's span. With increments only, lower and upper never
fall, and this is exactly Jepsen's rule (lower at invocation, upper at completion); with
decrements the bounds can fall during a read (a decrement invoked, or acknowledged), which
Jepsen's counter does not allow for.

Final reads (``f = "final-read"``, one per node, taken after healing and quiet) must each equal
the sum of acknowledged adds plus the sum of some subset of the indeterminate adds: the set of
reachable sums is computed exactly as sorted integer ranges. All final reads of a key must be
equal (convergence). Keys are checked independently (Jepsen's ``independent`` checker).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Range = tuple[int, int]
MAX_RANGES = 100_000


def reachable_sums(base: int, deltas: Iterable[int], *,
                   max_ranges: int = MAX_RANGES) -> tuple[list[Range], bool]:
    """Every ``base + sum(S)`` for S a subset of ``deltas``, as merged inclusive ranges.

    Equal deltas are taken together: c copies of d reach shifts 0, d, ..., c*d, which fill a
    whole range as soon as a range is at least |d| wide. Returns (ranges, approximate); when the
    ranges would exceed ``max_ranges`` the gaps are filled and ``approximate`` is True (looser,
    reported as such, never silently)."""
    ranges: list[Range] = [(base, base)]
    approximate = False
    for d, c in sorted(Counter(x for x in deltas if x != 0).items(), key=lambda t: abs(t[0])):
        lo_shift, hi_shift = min(0, c * d), max(0, c * d)
        out: list[Range] = []
        for lo, hi in ranges:
            if hi - lo + 1 >= abs(d):
                out.append((lo + lo_shift, hi + hi_shift))
            else:
                out.extend((lo + j * d, hi + j * d) for j in range(c + 1))
            if len(out) > 4 * max_ranges:
                break
        ranges = _merge(out)
        if len(ranges) > max_ranges:
            ranges = [(ranges[0][0], ranges[-1][1])]
            approximate = True
    return ranges, approximate


def _merge(ranges: list[Range]) -> list[Range]:
    ranges.sort()
    out: list[Range] = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def distance(value: int, ranges: Sequence[Range]) -> int:
    """Signed distance from ``value`` to the nearest range: > 0 above it (over-count), < 0
    below it (under-count), 0 inside one."""
    best: int | None = None
    for lo, hi in ranges:
        if lo <= value <= hi:
            return 0
        d = value - hi if value > hi else value - lo
        if best is None or abs(d) < abs(best) or (abs(d) == abs(best) and d > 0):
            best = d
    return 0 if best is None else best


@dataclass(frozen=True, slots=True)
class Read:
    key: str
    process: Any
    lower: int
    value: int
    upper: int
    time: float | None = None

    @property
    def valid(self) -> bool:
        return self.lower <= self.value <= self.upper


@dataclass(slots=True)
class FinalCheck:
    key: str
    values: dict[str, int]
    acknowledged: int
    indeterminate: int
    ranges: list[Range]
    approximate: bool
    missing: list[str] = field(default_factory=list)
    over_count: int = 0
    under_count: int = 0

    @property
    def converged(self) -> bool:
        return len(set(self.values.values())) <= 1

    @property
    def valid(self) -> bool:
        return (self.converged and not self.missing and bool(self.values)
                and self.over_count == 0 and self.under_count == 0)


@dataclass(slots=True)
class CounterReport:
    valid: bool = True
    keys: int = 0
    ops: int = 0
    acknowledged: int = 0
    failed: int = 0
    indeterminate: int = 0
    never_completed: int = 0
    duplicates_absorbed: int = 0
    retries: int = 0
    reads: int = 0
    read_errors: list[Read] = field(default_factory=list)
    finals: list[FinalCheck] = field(default_factory=list)
    over_count: int = 0
    under_count: int = 0
    problems: list[str] = field(default_factory=list)
    all_reads: list[Read] = field(default_factory=list)  # filled with check(keep_reads=True)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["read_errors"] = [asdict(r) for r in self.read_errors[:100]]
        out["all_reads"] = len(self.all_reads)
        out["finals"] = [{**asdict(f), "ranges": f.ranges[:20], "converged": f.converged,
                          "valid": f.valid} for f in self.finals]
        return out


class _KeyWalk:
    """The bounds walk for one key."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lower = self.upper = 0
        self.pending_reads: dict[Any, list[int]] = {}  # process -> [min lower, max upper]
        self.acked = 0
        self.unknown: list[int] = []
        self.finals: dict[str, int] = {}
        self.final_failed: set[str] = set()

    def widen(self) -> None:
        """A bound moved: every pending read may have seen the new one."""
        for span in self.pending_reads.values():
            if self.lower < span[0]:
                span[0] = self.lower
            if self.upper > span[1]:
                span[1] = self.upper


def check(history: Iterable[Mapping[str, Any]], *, nodes: Sequence[str] = (),
          keep_reads: bool = False) -> CounterReport:
    """Judge a counter history; ``nodes`` (when given) must each have a final read per key;
    ``keep_reads`` keeps every read's [lower, value, upper] in ``all_reads``."""
    events = list(history)
    outcome = _pair(events)
    rep = CounterReport()
    keep = rep.all_reads if keep_reads else None
    walks: dict[str, _KeyWalk] = {}
    for i, ev in enumerate(events):
        key = str(ev.get("key", ""))
        w = walks.get(key)
        if w is None:
            w = walks[key] = _KeyWalk(key)
        _step(rep, w, ev, outcome.get(i), keep)
    # Final reads are judged when the history has any (a Jepsen-style history without them is
    # judged by the walk alone); then every key that saw adds must have them.
    if any(w.finals or w.final_failed for w in walks.values()):
        for w in walks.values():
            if w.finals or w.final_failed or w.acked or w.unknown:
                rep.finals.append(_final(w, nodes))
    rep.keys = len(walks)
    rep.over_count = sum(f.over_count for f in rep.finals)
    rep.under_count = sum(f.under_count for f in rep.finals)
    _judge(rep, nodes)
    return rep


def _pair(events: list[Mapping[str, Any]]) -> dict[int, str]:
    """Invocation index -> type of its completion ("info" when it never completed)."""
    open_by_process: dict[Any, int] = {}
    out: dict[int, str] = {}
    for i, ev in enumerate(events):
        t, p = ev.get("type"), ev.get("process")
        if t == "invoke":
            if p in open_by_process:
                out[open_by_process[p]] = "info"  # a process re-invoked: the old op hangs
            open_by_process[p] = i
        elif p in open_by_process:
            out[open_by_process.pop(p)] = str(t)
    for i in open_by_process.values():
        out[i] = "never"
    return out


def _step(rep: CounterReport, w: _KeyWalk, ev: Mapping[str, Any], fate: str | None,
          keep: list[Read] | None) -> None:
    t, f, value = ev.get("type"), ev.get("f"), ev.get("value")
    if f == "add":
        d = int(value or 0)
        if t == "invoke":
            rep.ops += 1
            if fate == "fail":
                rep.failed += 1
                return
            if fate == "never":
                rep.never_completed += 1
            if fate in ("info", "never"):
                rep.indeterminate += 1
                w.unknown.append(d)
            if d >= 0:
                w.upper += d
            else:
                w.lower += d
            w.widen()
        elif t == "ok":
            rep.acknowledged += 1
            w.acked += d
            if d >= 0:
                w.lower += d
            else:
                w.upper += d
            w.widen()
        if t != "invoke":
            rep.retries += max(0, int(ev.get("attempts") or 1) - 1)
            rep.duplicates_absorbed += 1 if ev.get("duplicate") else 0
        return
    if f in ("read", "final-read"):
        p = ev.get("process")
        if t == "invoke":
            w.pending_reads[p] = [w.lower, w.upper]
            return
        low, high = w.pending_reads.pop(p, [w.lower, w.upper])
        if t != "ok" or value is None:
            if f == "final-read":
                w.final_failed.add(str(ev.get("node", p)))
            return
        rep.reads += 1
        r = Read(w.key, p, low, int(value), max(high, w.upper), ev.get("time"))
        if not r.valid and f == "read":  # final reads are judged, more strictly, below
            rep.read_errors.append(r)
        if keep is not None:
            keep.append(r)
        if f == "final-read":
            w.finals[str(ev.get("node", p))] = int(value)


def _final(w: _KeyWalk, nodes: Sequence[str]) -> FinalCheck:
    ranges, approx = reachable_sums(w.acked, w.unknown)
    missing = sorted((set(nodes) | w.final_failed) - set(w.finals))
    fc = FinalCheck(w.key, dict(sorted(w.finals.items())), w.acked, len(w.unknown), ranges,
                    approx, missing)
    for v in fc.values.values():
        d = distance(v, ranges)
        fc.over_count = max(fc.over_count, d)
        fc.under_count = max(fc.under_count, -d)
    return fc


def _judge(rep: CounterReport, nodes: Sequence[str]) -> None:
    probs = rep.problems
    if rep.read_errors:
        probs.append(f"{len(rep.read_errors)} read(s) outside [lower, upper]")
    by_kind: defaultdict[str, list[str]] = defaultdict(list)
    for f in rep.finals:
        if not f.values:
            by_kind["no final read"].append(f.key)
        if f.missing:
            by_kind["final read missing on " + ",".join(f.missing)].append(f.key)
        if not f.converged:
            by_kind["replicas diverge"].append(f"{f.key} {f.values}")
        if f.over_count:
            by_kind["over-count"].append(f"{f.key} +{f.over_count}")
        if f.under_count:
            by_kind["under-count (acknowledged adds lost)"].append(
                f"{f.key} -{f.under_count}")
    for kind, keys in by_kind.items():
        shown = "; ".join(keys[:5]) + (f"; ... ({len(keys)} keys)" if len(keys) > 5 else "")
        probs.append(f"{kind}: {shown}")
    if any(f.approximate for f in rep.finals):
        probs.append("note: reachable sums approximated by their hull for some key")
    rep.valid = not rep.read_errors and all(f.valid for f in rep.finals)
