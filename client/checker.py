"""Jepsen's counter checker, extended to decrements, deletes, multi-gets, scans and final reads on
every replica.

Pure: it takes a history (a sequence of event mappings, in real-time order) and returns a report;
it does no I/O. An event is

    {"type": "invoke"|"ok"|"fail"|"info", "f": "add"|"read"|"final-read"|"delete", "process": ...,
     "key": "table/key", "value": int|None, "time": float, "op_id": ..., "node": ...,
     "attempts": int, "duplicate": bool, "consistency": "one"|"quorum"|"all"}
    {"type": ..., "f": "multiget", "process": ..., "keys": ["table/key", ...],
     "value": None (invoke) | [int, ...] (ok, one per key, in order), "consistency": ...}
    {"type": ..., "f": "scan", "process": ..., "table": "t", "prefix": "k1",
     "value": None (invoke) | [["t/k1", int], ...] (ok: every page's counters, in order),
     "consistency": ...}

The position in the history is the time: an op's invocation and completion are the indexes of
their events (``time`` is only reported). A completion is paired with its process's open
invocation; an invocation never completed counts as ``info``.

Keys without deletes: the walk (jepsen.checker/counter). An ``add`` whose completion is not
``fail`` widens the bounds at its invocation (``upper`` for an increment, ``lower`` for a
decrement) and narrows them at its ``ok`` (``lower`` for an increment, ``upper`` for a
decrement); failed adds are removed with their invocations. A read that completes ``ok`` is
valid when its value lies in [lower(t), upper(t)] for some t between its invocation and its
completion. Consecutive intervals always overlap, so that union is [min lower, max upper] over
the read's span. With increments only, lower and upper never fall, and this is exactly Jepsen's
rule (lower at invocation, upper at completion); with decrements the bounds can fall during a
read (a decrement invoked, or acknowledged), which Jepsen's counter does not allow for.

Keys with deletes (the contract's observed-remove rule): a delete removes every add acknowledged
before the delete was invoked and none invoked after it was acknowledged; an add concurrent with
it is removed whole or kept whole. An indeterminate delete may take effect at any point after its
invocation, or never (its acknowledgement is taken as never: it may remove any add invoked after
it); a failed one never. A read (or each value of a multi-get, or of a scan) over the span
[s, e] sees every add acknowledged before s and no add invoked after e, and is bound by every
delete acknowledged before s and by none invoked after e. Of the deletes that bind it, take D,
the one invoked last (``_KeyOps.candidates`` tries each delete that may be D, and "none" when no
delete certainly binds it): every add acknowledged before D's invocation is gone; an add seen for
certain and invoked after every delete invoked up to D was acknowledged certainly survives
(``base``); every other add invoked before e may count or not. The allowed values are the union,
over the candidates for D, of base plus a subset of those; that is exactly the contract's set
(tests/test_checker_deletes.py holds it equal to a brute force over every set of binding
deletes). Final reads take it exactly; intermediate reads take the hull of each candidate's
subset sums (as the walk does), which over-approximates it: a value in a gap between subset sums
passes. The contract's rule is itself looser than the walk's: the uncertain adds count
independently of each other (a read may see a concurrent add and miss an earlier one), and a
read is judged over its span, not at one instant.

Scans: no key may come back twice; a key outside the scan's table or prefix, or one that cannot
exist during the scan (never written, or every add certainly deleted and none written since) is a
violation; a key that certainly exists for the whole scan (an add acknowledged before it began
that no delete invoked before it ended can have removed) and certainly has a nonzero value
throughout (0 lies outside the hull of every candidate's values over the scan's span) must come
back: a scan that leaves it out skipped it. This is conservative: a written key whose value may
be 0 need not be returned. Each value returned is judged as a read over the scan's span. The
checker takes every counter to start at 0, and a table to have no ttl unless ``ttl`` names it.
Reads, multi-gets and scans at consistency ``one`` are counted, not judged (the contract lets
them show any stale value); a scan's repeats and keys outside it are judged at any level.

Expiry (tables in ``ttl``, table -> seconds, set before the history begins; needs each event's
``time``). A key expires once its last change (an add's or a delete's application) is ``ttl``
old, on the clock of the node that judges it; ``margin`` bounds how far two such clocks, and
the history's clock, can disagree (the nodes' allowed skew plus the clocks' own offsets). Two
rules, both sound for any margin at least that large:

- *May have expired.* Expiry is a delete the history does not show. At every stretch between two
  acknowledgements of the key's adds and deletes where time T reaches M + ttl - margin (M: the
  latest invocation among those acknowledged before T, or the key's first invocation), the
  checker adds an indeterminate delete invoked at T; reads are then judged as with deletes.
- *Must have expired.* A judged read (a multi-get's or a scan's value, a final read) invoked at
  time t of a key whose every add invoked before the read completed was settled before
  t - ttl - margin must read 0: settled is acknowledged, or for an add not acknowledged its
  invocation plus ``in_flight`` (how long after its invocation an add can still be applied;
  None: ever). Deletes need no such bound: one applied after every add was acknowledged saw them
  all, and leaves 0. Reads nearer the boundary are judged by the first rule alone.

Final reads (``f = "final-read"``, one per node, taken after healing and quiet) must each equal
the sum of acknowledged adds plus the sum of some subset of the indeterminate adds (with deletes:
one of the allowed values above, exactly): the set of reachable sums is computed as sorted integer
ranges. All final reads of a key must be equal (convergence). Keys are checked independently
(Jepsen's ``independent`` checker).
"""

from __future__ import annotations

import heapq
import sys
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Range = tuple[int, int]
MAX_RANGES = 100_000
NEVER = sys.maxsize  # the acknowledgement of an op that was not acknowledged


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
    """One judged read value. ``ranges``, when set (keys with deletes), are the allowed values
    and ``lower``/``upper`` their hull; ``source`` is read, multiget, scan or final-read."""

    key: str
    process: Any
    lower: int
    value: int
    upper: int
    time: float | None = None
    source: str = "read"
    ranges: tuple[Range, ...] = ()
    expired: bool = False  # the key had certainly expired: 0 was the only value allowed

    @property
    def valid(self) -> bool:
        if self.ranges:
            return distance(self.value, self.ranges) == 0
        return self.lower <= self.value <= self.upper


@dataclass(frozen=True, slots=True)
class ScanProblem:
    """kind: repeated (a key returned twice), skipped (a key that existed for the whole scan
    left out), phantom (a key that cannot exist returned), outside (not the scan's table or
    prefix)."""

    kind: str
    key: str
    process: Any
    time: float | None
    detail: str = ""


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
    deletes: int = 0  # non-failed deletes of the key (then acknowledged/indeterminate: after
    #                   the last delete that may have taken effect); with expiry, its deletes too
    expired: bool = False  # the key had certainly expired: every final read must be 0

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
    duplicates_absorbed: int = 0  # adds and deletes
    retries: int = 0  # adds and deletes
    reads: int = 0
    read_errors: list[Read] = field(default_factory=list)  # reads, multi-gets and scans
    finals: list[FinalCheck] = field(default_factory=list)
    over_count: int = 0
    under_count: int = 0
    problems: list[str] = field(default_factory=list)
    all_reads: list[Read] = field(default_factory=list)  # filled with check(keep_reads=True)
    deletes: int = 0
    deletes_ok: int = 0
    deletes_failed: int = 0
    deletes_indeterminate: int = 0
    multigets: int = 0
    multiget_values: int = 0
    scans: int = 0
    scan_values: int = 0
    scan_errors: list[ScanProblem] = field(default_factory=list)
    reads_unjudged: int = 0  # consistency one
    expired_reads: int = 0  # judged values of keys that had certainly expired (must be 0)
    malformed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["read_errors"] = [asdict(r) for r in self.read_errors[:100]]
        out["scan_errors"] = [asdict(s) for s in self.scan_errors[:100]]
        out["malformed"] = self.malformed[:100]
        out["all_reads"] = len(self.all_reads)
        out["finals"] = [{**asdict(f), "ranges": f.ranges[:20], "converged": f.converged,
                          "valid": f.valid} for f in self.finals]
        return out


def _prefix(deltas: Iterable[int]) -> tuple[list[int], list[int]]:
    """Running sums of the positive and of the negative deltas, each starting at 0."""
    pos, neg = [0], [0]
    for d in deltas:
        pos.append(pos[-1] + max(d, 0))
        neg.append(neg[-1] + min(d, 0))
    return pos, neg


def _prefix_max(xs: Iterable[int]) -> list[int]:
    out = [-1]
    for x in xs:
        out.append(max(out[-1], x))
    return out


class _KeyOps:
    """A key's non-failed adds and deletes as (invocation, acknowledgement) history indexes
    (``NEVER`` for one not acknowledged), and the delete-aware bounds over them. ``freeze``
    once every op is in; each query is then a few bisections (and a scan of the adds in flight
    at one instant, at most one per process)."""

    def __init__(self) -> None:
        self.add_inv: list[int] = []
        self.add_ack: list[int] = []
        self.add_delta: list[int] = []
        self.del_inv: list[int] = []
        self.del_ack: list[int] = []

    def freeze(self) -> None:
        adds = list(zip(self.add_inv, self.add_ack, self.add_delta, strict=True))
        self.pos_inv, self.neg_inv = _prefix(self.add_delta)
        ok = sorted((a, i, d) for i, a, d in adds if a != NEVER)
        self.ok_ack = [a for a, _, _ in ok]
        self.pos_ack, self.neg_ack = _prefix(d for _, _, d in ok)
        self.inv_by_ack = _prefix_max(i for _, i, _ in ok)
        # reach[j]: the latest acknowledgement among the first j+1 deletes by invocation
        self.reach = _prefix_max(self.del_ack)[1:]
        okd = sorted((a, i) for i, a in zip(self.del_inv, self.del_ack, strict=True)
                     if a != NEVER)
        self.okdel_ack = [a for a, _ in okd]
        self.okdel_inv = _prefix_max(i for _, i in okd)
        # the acknowledged adds in flight at each finite reach (invoked before, acked after)
        self.inflight: dict[int, list[tuple[int, int]]] = {}
        heap: list[tuple[int, int]] = []
        oks = [(i, a, d) for i, a, d in adds if a != NEVER]
        k = 0
        for m in sorted(set(self.reach) - {NEVER}):
            while k < len(oks) and oks[k][0] < m:
                heapq.heappush(heap, (oks[k][1], oks[k][2]))
                k += 1
            while heap and heap[0][0] < m:
                heapq.heappop(heap)
            self.inflight[m] = list(heap)

    def candidates(self, s: int, e: int) -> list[tuple[int, int]]:
        """For a read over [s, e]: (I, m) for each delete that may be the last-invoked of those
        that bind it (I its invocation, m the latest acknowledgement among the deletes invoked
        up to it), and (-1, -1) for "none" when no delete certainly binds it. A candidate with
        the same m as the one before it allows a subset of its values and is left out."""
        k = bisect_left(self.okdel_ack, s)
        cut = self.okdel_inv[k]  # invocation of the last-invoked delete certainly binding it
        out = [] if k else [(-1, -1)]
        prev = None
        for j in range(bisect_left(self.del_inv, cut) if k else 0,
                       bisect_left(self.del_inv, e)):
            if self.reach[j] != prev:
                prev = self.reach[j]
                out.append((self.del_inv[j], prev))
        return out

    def hull(self, s: int, e: int, inv: int, m: int) -> tuple[int, int, int]:
        """(base, sum of the negative, sum of the positive uncertain deltas) for candidate
        (inv, m): adds acknowledged before ``inv`` are gone, those seen for certain and
        invoked after ``m`` are the base, every other add invoked before ``e`` may count."""
        c = bisect_left(self.add_inv, e)
        x = bisect_left(self.ok_ack, inv) if inv >= 0 else 0
        base_pos = base_neg = 0
        if m < s:  # else nothing seen for certain was invoked after m
            b, bm = bisect_left(self.ok_ack, s), (bisect_left(self.ok_ack, m) if m >= 0 else 0)
            base_pos = self.pos_ack[b] - self.pos_ack[bm]
            base_neg = self.neg_ack[b] - self.neg_ack[bm]
            for ack, d in self.inflight.get(m, ()):
                if ack < s:  # acknowledged after m but invoked before it
                    base_pos -= max(d, 0)
                    base_neg -= min(d, 0)
        return (base_pos + base_neg,
                self.neg_inv[c] - self.neg_ack[x] - base_neg,
                self.pos_inv[c] - self.pos_ack[x] - base_pos)

    def ranges(self, s: int, e: int) -> list[Range]:
        """The values a read over [s, e] may show: each candidate's hull, merged."""
        out = []
        for inv, m in self.candidates(s, e):
            base, neg, pos = self.hull(s, e, inv, m)
            out.append((base + neg, base + pos))
        return _merge(out)

    def exact(self, s: int, e: int) -> tuple[list[Range], bool, int, int]:
        """The values a read over [s, e] may show, each candidate's subset sums exactly (for
        final reads: one pass over the adds per candidate; approximate only as
        ``reachable_sums`` says); with the base and the number of uncertain adds of the last
        candidate."""
        out: list[Range] = []
        approx = False
        base, unc = 0, list[int]()
        for inv, m in self.candidates(s, e):
            base, unc = 0, []
            for i, a, d in zip(self.add_inv, self.add_ack, self.add_delta, strict=True):
                if i >= e:
                    break
                if a < inv:
                    continue
                if a < s and i > m:
                    base += d
                else:
                    unc.append(d)
            got, ap = reachable_sums(base, unc)
            out += got
            approx = approx or ap
        return _merge(out), approx, base, len(unc)

    def certainly_exists(self, s: int, e: int) -> bool:
        """An add acknowledged before s that no delete invoked before e can have removed."""
        j = bisect_left(self.del_inv, e)
        m = self.reach[j - 1] if j else -1
        return self.inv_by_ack[bisect_left(self.ok_ack, s)] > m

    def possibly_exists(self, s: int, e: int) -> bool:
        """Some add invoked before e that no delete certainly binding [s, e] removed."""
        cut = self.okdel_inv[bisect_left(self.okdel_ack, s)]
        gone = bisect_left(self.ok_ack, cut) if cut >= 0 else 0
        return bisect_left(self.add_inv, e) > gone


class _KeyWalk:
    """The bounds walk for one key, and its ops for the delete-aware rules."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lower = self.upper = 0
        self.pending_reads: dict[Any, list[int]] = {}  # process -> [min lower, max upper, inv]
        self.acked = 0
        self.unknown: list[int] = []
        self.finals: dict[str, int] = {}
        self.final_failed: set[str] = set()
        self.final_span = [NEVER, -1]
        self.ops = _KeyOps()
        self.ttl: float | None = None  # its table's ttl (``check(ttl=...)``)
        self.settled: list[float] = []  # expiry: latest settling among the first j adds

    def widen(self) -> None:
        """A bound moved: every pending read may have seen the new one."""
        for span in self.pending_reads.values():
            if self.lower < span[0]:
                span[0] = self.lower
            if self.upper > span[1]:
                span[1] = self.upper

    def open_read(self, process: Any, i: int) -> None:
        self.pending_reads[process] = [self.lower, self.upper, i]


def check(history: Iterable[Mapping[str, Any]], *, nodes: Sequence[str] = (),
          keep_reads: bool = False, ttl: Mapping[str, float] | None = None,
          margin: float = 0.0, in_flight: float | None = None) -> CounterReport:
    """Judge a counter history; ``nodes`` (when given) must each have a final read per key;
    ``keep_reads`` keeps every read's [lower, value, upper] in ``all_reads``. ``ttl`` (table ->
    seconds), ``margin`` and ``in_flight``: expiry (module docstring)."""
    run = _Run(list(history), keep_reads, dict(ttl or {}), margin, in_flight)
    for i, ev in enumerate(run.events):
        run.step(i, ev)
    return run.finish(nodes)


def _pair(events: list[Mapping[str, Any]]) -> dict[int, tuple[str, int | None]]:
    """Invocation index -> (type of its completion, its index); ("info", None) when the process
    invoked again first (the old op hangs), ("never", None) when it never completed."""
    open_by_process: dict[Any, int] = {}
    out: dict[int, tuple[str, int | None]] = {}
    for i, ev in enumerate(events):
        t, p = ev.get("type"), ev.get("process")
        if t == "invoke":
            if p in open_by_process:
                out[open_by_process[p]] = ("info", None)
            open_by_process[p] = i
        elif p in open_by_process:
            out[open_by_process.pop(p)] = (str(t), i)
    for i in open_by_process.values():
        out[i] = ("never", None)
    return out


class _Run:
    """One pass over the history: the walk, the ops of every key, and the reads, multi-gets and
    scans that can only be judged once every op is known (``finish``)."""

    def __init__(self, events: list[Mapping[str, Any]], keep_reads: bool,
                 ttl: dict[str, float] | None = None, margin: float = 0.0,
                 in_flight: float | None = None) -> None:
        self.events = events
        self.ttl, self.margin, self.in_flight = ttl or {}, margin, in_flight
        self.times: list[float] = []
        if self.ttl:
            try:
                self.times = [float(ev["time"]) for ev in events]
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError("expiry (ttl) is judged from each event's time") from exc
            if any(b < a for a, b in zip(self.times, self.times[1:], strict=False)):
                raise ValueError("expiry (ttl): event times must not go back")
        self.fates = _pair(events)
        self.rep = CounterReport()
        self.keep = self.rep.all_reads if keep_reads else None
        self.walks: dict[str, _KeyWalk] = {}
        self.later: list[tuple[_KeyWalk, Any, int, int, int, str, Any]] = []
        self.scans: list[tuple[int, int, Mapping[str, Any]]] = []
        self.open_multi: dict[Any, list[str]] = {}
        self.open_scans: dict[Any, int] = {}

    def walk(self, key: str) -> _KeyWalk:
        w = self.walks.get(key)
        if w is None:
            w = self.walks[key] = _KeyWalk(key)
            w.ttl = self.ttl.get(key.partition("/")[0])
        return w

    def step(self, i: int, ev: Mapping[str, Any]) -> None:
        f = ev.get("f")
        if f == "multiget":
            self.multiget(i, ev)
        elif f == "scan":
            self.scan(i, ev)
        else:
            w = self.walk(str(ev.get("key", "")))
            if f == "add":
                self.add(i, w, ev)
            elif f == "delete":
                self.delete(i, w, ev)
            elif f in ("read", "final-read"):
                p = ev.get("process")
                if ev.get("type") == "invoke":
                    w.open_read(p, i)
                else:
                    self.read_done(i, w, ev, w.pending_reads.pop(p, None), ev.get("value"),
                                   str(f))

    def add(self, i: int, w: _KeyWalk, ev: Mapping[str, Any]) -> None:
        rep, t, d = self.rep, ev.get("type"), int(ev.get("value") or 0)
        if t == "invoke":
            fate, done = self.fates.get(i, ("never", None))
            rep.ops += 1
            if fate == "fail":
                rep.failed += 1
                return
            if fate == "never":
                rep.never_completed += 1
            if fate in ("info", "never"):
                rep.indeterminate += 1
                w.unknown.append(d)
            w.ops.add_inv.append(i)
            w.ops.add_ack.append(done if fate == "ok" and done is not None else NEVER)
            w.ops.add_delta.append(d)
            if d >= 0:
                w.upper += d
            else:
                w.lower += d
            w.widen()
            return
        if t == "ok":
            rep.acknowledged += 1
            w.acked += d
            if d >= 0:
                w.lower += d
            else:
                w.upper += d
            w.widen()
        self.completed(ev)

    def delete(self, i: int, w: _KeyWalk, ev: Mapping[str, Any]) -> None:
        rep, t = self.rep, ev.get("type")
        if t == "invoke":
            fate, done = self.fates.get(i, ("never", None))
            rep.deletes += 1
            if fate == "fail":
                rep.deletes_failed += 1
                return
            if fate in ("info", "never"):
                rep.deletes_indeterminate += 1
            w.ops.del_inv.append(i)
            w.ops.del_ack.append(done if fate == "ok" and done is not None else NEVER)
            return
        if t == "ok":
            rep.deletes_ok += 1
        self.completed(ev)

    def completed(self, ev: Mapping[str, Any]) -> None:
        self.rep.retries += max(0, int(ev.get("attempts") or 1) - 1)
        self.rep.duplicates_absorbed += 1 if ev.get("duplicate") else 0

    def read_done(self, i: int, w: _KeyWalk, ev: Mapping[str, Any], span: list[int] | None,
                  value: Any, source: str) -> None:
        rep, p = self.rep, ev.get("process")
        low, high, s = span if span is not None else (w.lower, w.upper, i)
        final = source == "final-read"
        if ev.get("type") != "ok" or value is None:
            if final:
                w.final_failed.add(str(ev.get("node", p)))
            return
        if source == "multiget":
            rep.multiget_values += 1
        else:
            rep.reads += 1
        if final:
            w.finals[str(ev.get("node", p))] = int(value)
            w.final_span = [min(w.final_span[0], s), max(w.final_span[1], i)]
        elif ev.get("consistency") == "one":
            rep.reads_unjudged += 1
            return
        if w.ops.del_inv or w.ttl is not None:  # a delete invoked before it completed, or
            # expiry: judged once every op is known
            self.later.append((w, p, s, i, int(value), source, ev.get("time")))
            return
        self.judged(Read(w.key, p, low, int(value), max(high, w.upper), ev.get("time"),
                         source))

    def judged(self, r: Read) -> None:
        if not r.valid and r.source != "final-read":  # final reads: judged, more strictly,
            self.rep.read_errors.append(r)            # in _final
        if self.keep is not None:
            self.keep.append(r)

    def multiget(self, i: int, ev: Mapping[str, Any]) -> None:
        p = ev.get("process")
        if ev.get("type") == "invoke":
            keys = self.open_multi[p] = [str(k) for k in ev.get("keys") or ()]
            for k in keys:
                self.walk(k).open_read(p, i)
            return
        keys = self.open_multi.pop(p, []) or [str(k) for k in ev.get("keys") or ()]
        spans = {k: self.walk(k).pending_reads.pop(p, None) for k in keys}
        values = ev.get("value")
        if ev.get("type") != "ok":
            return
        if (not isinstance(values, list) or len(values) != len(keys)
                or not all(isinstance(v, int) for v in values)):
            self.rep.malformed.append(f"multiget at {ev.get('time')} (process {p}): "
                                      f"{len(keys)} keys, values {str(values)[:80]}")
            return
        self.rep.multigets += 1
        for k, v in zip(keys, values, strict=True):
            self.read_done(i, self.walk(k), ev, spans[k], v, "multiget")

    def scan(self, i: int, ev: Mapping[str, Any]) -> None:
        p = ev.get("process")
        if ev.get("type") == "invoke":
            self.open_scans[p] = i
            return
        s = self.open_scans.pop(p, i)
        if ev.get("type") != "ok":
            return
        pairs = ev.get("value")
        if not isinstance(pairs, list) or not all(
                isinstance(x, list | tuple) and len(x) == 2 and isinstance(x[1], int)
                for x in pairs):
            self.rep.malformed.append(f"scan at {ev.get('time')} (process {p}): "
                                      f"{str(pairs)[:80]}")
            return
        self.rep.scans += 1
        self.scans.append((s, i, ev))

    def finish(self, nodes: Sequence[str]) -> CounterReport:
        rep = self.rep
        for w in self.walks.values():
            if w.ttl is not None:
                self.may_expire(w, w.ttl)
            w.ops.freeze()
        for w, p, s, e, v, source, t in self.later:
            self.judged(self.read_of(w, p, s, e, v, t, source))
        ordered = sorted(self.walks)
        for s, e, ev in self.scans:
            self.judge_scan(s, e, ev, ordered)
        # Final reads are judged when the history has any (a Jepsen-style history without them
        # is judged by the walk alone); then every key that saw adds must have them.
        if any(w.finals or w.final_failed for w in self.walks.values()):
            end = len(self.events)
            for w in self.walks.values():
                if w.finals or w.final_failed or w.acked or w.unknown or w.ops.del_inv:
                    s, e = w.final_span if w.finals else (end, end)
                    expired = s < end and self.must_expire(w, s, e)
                    rep.finals.append(_final(w, nodes, end, expired))
        rep.keys = len(self.walks)
        rep.over_count = sum(f.over_count for f in rep.finals)
        rep.under_count = sum(f.under_count for f in rep.finals)
        _judge(rep)
        return rep

    def read_of(self, w: _KeyWalk, p: Any, s: int, e: int, v: int, t: float | None,
                source: str) -> Read:
        """A value read over [s, e], judged by the delete-aware bounds, or as 0 when the key
        had certainly expired."""
        if self.must_expire(w, s, e):
            self.rep.expired_reads += 1
            return Read(w.key, p, 0, v, 0, t, source, ((0, 0),), expired=True)
        ranges = tuple(w.ops.ranges(s, e))
        return Read(w.key, p, ranges[0][0], v, ranges[-1][1], t, source, ranges)

    def may_expire(self, w: _KeyWalk, ttl: float) -> None:
        """Expiry's indeterminate deletes, one per stretch between two acknowledgements of the
        key's ops where it may have expired (module docstring); and the adds' settling times
        for ``must_expire``. Each delete is invoked just before the first event at or after
        the time it may take effect (no later than that: sound)."""
        ops, times = w.ops, self.times
        spans = list(zip(ops.add_inv, ops.add_ack, strict=True))
        spans += list(zip(ops.del_inv, ops.del_ack, strict=True))
        if not spans:
            return
        late = self.in_flight
        settled = [times[a] if a != NEVER else (times[i] + late if late is not None
                                                 else float("inf"))
                   for i, a in zip(ops.add_inv, ops.add_ack, strict=True)]
        w.settled = [float("-inf")]
        for x in settled:
            w.settled.append(max(w.settled[-1], x))
        acks = sorted((times[a], times[i]) for i, a in spans if a != NEVER)
        latest = min(times[i] for i, _a in spans)  # M: no change is older than the first op
        since = float("-inf")  # the stretch under way began at the acknowledgement before
        added: list[int] = []
        for at, invoked in [*acks, (float("inf"), latest)]:
            start = max(since, latest + ttl - self.margin)
            if start < at and start <= times[-1]:
                added.append(max(0, bisect_left(times, start) - 1))
            latest, since = max(latest, invoked), at
        pairs = sorted([*zip(ops.del_inv, ops.del_ack, strict=True),
                        *((i, NEVER) for i in sorted(set(added)))])
        ops.del_inv = [i for i, _a in pairs]
        ops.del_ack = [a for _i, a in pairs]

    def must_expire(self, w: _KeyWalk, s: int, e: int) -> bool:
        """Had the key certainly expired when the read over [s, e] was invoked: every add
        invoked before e settled more than ttl + margin before s?"""
        if w.ttl is None or not w.settled:
            return False
        n = bisect_left(w.ops.add_inv, e)
        return n > 0 and w.settled[n] < self.times[s] - w.ttl - self.margin

    def judge_scan(self, s: int, e: int, ev: Mapping[str, Any], ordered: list[str]) -> None:
        """Repeats, keys outside the scan or that cannot exist, values, and skipped keys."""
        rep, p, t = self.rep, ev.get("process"), ev.get("time")
        want = f"{ev.get('table', '')}/{ev.get('prefix') or ''}"
        pairs = [(str(k), int(v)) for k, v in ev.get("value") or ()]
        seen = Counter(k for k, _ in pairs)
        rep.scan_errors += [ScanProblem("repeated", k, p, t, f"returned {n} times")
                            for k, n in seen.items() if n > 1]
        loose = ev.get("consistency") == "one"
        for k, v in pairs:
            w = self.walks.get(k)
            if not k.startswith(want):
                rep.scan_errors.append(ScanProblem("outside", k, p, t, f"scan of {want}*"))
            elif loose:
                rep.reads_unjudged += 1
            elif w is None or not w.ops.possibly_exists(s, e):
                rep.scan_errors.append(ScanProblem("phantom", k, p, t, f"value {v}"))
            else:
                rep.scan_values += 1
                self.judged(self.read_of(w, p, s, e, v, t, "scan"))
        if loose:
            return
        for k in ordered[bisect_left(ordered, want):bisect_left(ordered, want + "\x7f")]:
            ops = self.walks[k].ops
            if k not in seen and ops.certainly_exists(s, e):
                allowed = ops.ranges(s, e)
                if distance(0, allowed) != 0:
                    rep.scan_errors.append(ScanProblem(
                        "skipped", k, p, t, f"existed throughout, values {allowed[:3]}"))


def _final(w: _KeyWalk, nodes: Sequence[str], end: int, expired: bool = False) -> FinalCheck:
    """A key's final reads; ``expired``: the key had certainly expired (they must read 0)."""
    missing = sorted((set(nodes) | w.final_failed) - set(w.finals))
    if w.ops.del_inv:
        s, e = w.final_span if w.finals else (end, end)
        ranges, approx, acked, unknown = w.ops.exact(s, e)
    else:
        ranges, approx = reachable_sums(w.acked, w.unknown)
        acked, unknown = w.acked, len(w.unknown)
    if expired:
        ranges, approx = [(0, 0)], False
    fc = FinalCheck(w.key, dict(sorted(w.finals.items())), acked, unknown, ranges, approx,
                    missing, deletes=len(w.ops.del_inv), expired=expired)
    for v in fc.values.values():
        d = distance(v, ranges)
        fc.over_count = max(fc.over_count, d)
        fc.under_count = max(fc.under_count, -d)
    return fc


def _judge(rep: CounterReport) -> None:
    probs = rep.problems
    if rep.read_errors:
        by_source = Counter(r.source for r in rep.read_errors)
        expired = sum(r.expired for r in rep.read_errors)
        probs.append(f"{len(rep.read_errors)} read(s) outside [lower, upper]"
                     + ("" if set(by_source) == {"read"} else
                        " (" + ", ".join(f"{n} {s}" for s, n in sorted(by_source.items())) + ")")
                     + (f"; {expired} of a key that had expired (must read 0)" if expired
                        else ""))
    by_kind: defaultdict[str, list[str]] = defaultdict(list)
    for s in rep.scan_errors:
        by_kind[f"scan {s.kind} key"].append(f"{s.key} at {s.time} ({s.detail})")
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
    if rep.malformed:
        by_kind["malformed answer"] += rep.malformed
    for kind, keys in by_kind.items():
        shown = "; ".join(keys[:5]) + (f"; ... ({len(keys)} keys)" if len(keys) > 5 else "")
        probs.append(f"{kind}: {shown}")
    if any(f.approximate for f in rep.finals):
        probs.append("note: reachable sums approximated by their hull for some key")
    rep.valid = (not rep.read_errors and not rep.scan_errors and not rep.malformed
                 and all(f.valid for f in rep.finals))
