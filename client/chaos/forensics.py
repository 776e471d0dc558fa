"""Post-mortem of a chaos run: which node applied each op id, and when (``--explain``).

A node logs every op it leads as an APPLY record (its origin ``<id>@<incarnation>``, the pair
it raised, its clock), every op it merges from a leader as a REPLICA record, and every
application it cancels as a WITHDRAW. Read from every node's log directory (read-only, torn
tails skipped), they say which origins applied an op: more origins than withdrawals means the
op counts more than once. Run it on a data directory kept with ``--data-dir``:

    python -m client.chaos --nemesis pause --out out --data-dir data
    python -m client.chaos --explain data --check out/history.jsonl

The chaos driver starts its nodes with ``--keep-log`` when ``--data-dir`` is given, so the
segments a snapshot covers are archived (``log/archive/``), not deleted, and the whole run is
read; a data directory from nodes without it loses the records before each snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import wal

APPLY, REPLICA, WITHDRAW = (int(wal.RecordKind.APPLY), int(wal.RecordKind.REPLICA),
                            int(wal.RecordKind.WITHDRAW))


def records(node_dir: Path) -> Iterator[wal.LogRecord]:
    """Every whole record of one node's log, in order (segments only, nothing modified),
    the segments archived by ``--keep-log`` first."""
    log_dir = node_dir / "log"
    if log_dir.is_dir():
        yield from wal.read_segments(log_dir, archived=True)


@dataclass
class OpTrace:
    op_id: str
    table: str = ""
    key: str = ""
    delta: int = 0
    # origin -> [(node whose log says so, "APPLY"/"REPLICA", leader's clock, p, n)]
    applied: dict[str, list[tuple[str, str, float, int, int]]] = field(
        default_factory=lambda: defaultdict(list))
    withdrawn: list[tuple[str, str, float]] = field(default_factory=list)  # (node, origin, ts)

    @property
    def counted(self) -> int:
        """Applications that stand: per origin, each APPLY with its own pair (one leader that
        applied the op twice, its dedup having forgotten it, logs two), at least one per
        origin seen only in replicas' logs; less withdrawals."""
        return sum(max(1, len({(p, n) for _node, kind, _ts, p, n in rows if kind == "APPLY"}))
                   for rows in self.applied.values()) - len(self.withdrawn)


def trace(data_dir: str | Path) -> dict[str, OpTrace]:
    """op id -> its applications across every node directory under ``data_dir``."""
    out: dict[str, OpTrace] = {}
    for node_dir in sorted(p for p in Path(data_dir).iterdir() if p.is_dir()):
        for r in records(node_dir):
            if not r.op_id or r.kind not in (APPLY, REPLICA, WITHDRAW):
                continue
            t = out.get(r.op_id)
            if t is None:
                t = out[r.op_id] = OpTrace(r.op_id, r.table, r.key,
                                           -r.delta if r.kind == WITHDRAW else r.delta)
            if r.kind == WITHDRAW:
                t.withdrawn.append((node_dir.name, r.origin, r.ts))
            else:
                t.applied[r.origin].append((node_dir.name, "APPLY" if r.kind == APPLY
                                            else "REPLICA", r.ts, r.p, r.n))
    return out


def explain(data_dir: str | Path, events: Sequence[dict[str, Any]] = ()) -> str:
    """A report of every op counted more than once (and the ones withdrawn), with what the
    history says about each."""
    traces = trace(data_dir)
    by_op = {e["op_id"]: e for e in events
             if e.get("f") == "add" and e.get("type") != "invoke" and e.get("op_id")}
    starts = {e["index"]: e for e in events if e.get("process") == "nemesis"}
    lines = []
    twice = [t for t in traces.values() if t.counted > 1]
    multi = [t for t in traces.values() if len(t.applied) > 1]
    lines.append(f"{len(traces)} op ids in the logs; {len(multi)} applied by more than one "
                 f"origin, {sum(1 for t in multi if t.withdrawn)} of them withdrawn; "
                 f"counted more than once: {len(twice)}")
    if starts:
        lines.append("nemesis: " + "; ".join(
            f"{e['time']:.2f} {e['f']} {e['value']} {e.get('detail', {}).get('node', '')}"
            .rstrip() for e in starts.values()))
    lines.extend(audit(traces, events))
    for t in sorted(twice, key=lambda t: min(x[2] for xs in t.applied.values() for x in xs)):
        h = by_op.get(t.op_id, {})
        lines.append(f"{t.op_id} on {t.table}/{t.key} delta {t.delta}: counted {t.counted} "
                     f"times; history: {h.get('type', '?')} after {h.get('attempts', '?')} "
                     f"attempt(s){' (duplicate)' if h.get('duplicate') else ''}")
        for origin, rows in t.applied.items():
            holders = ",".join(sorted({r[0] for r in rows}))
            applies = sorted({(r[2], r[3], r[4]) for r in rows if r[1] == "APPLY"}) or [
                (rows[0][2], rows[0][3], rows[0][4])]
            for ts, p, n in applies:  # two with one origin: its leader applied it twice
                lines.append(f"  {origin:<8} applied at {ts:.3f} (p={p} n={n}), "
                             f"logged by {holders}")
        for node, origin, ts in t.withdrawn:
            lines.append(f"  withdrawn by {node} ({origin}) at {ts:.3f}")
    return "\n".join(lines)


def audit(traces: dict[str, OpTrace], events: Sequence[dict[str, Any]]) -> list[str]:
    """Per key, the final value the history read against what the logs account for (each op's
    delta times the number of applications that stand). A difference the op list cannot
    explain means a count no op id shows: records missing, or a pair that carried a delta
    without its op (a leader's later op carrying an earlier, unpublished one)."""
    finals: dict[str, int] = {}
    for e in events:
        if e.get("f") == "final-read" and e.get("type") == "ok" and e.get("key") not in finals:
            finals[str(e["key"])] = int(e["value"])
    if not finals:
        return []
    explained: dict[str, int] = defaultdict(int)
    for t in traces.values():
        explained[f"{t.table}/{t.key}"] += t.delta * max(t.counted, 0)
    out = []
    for key in sorted(finals):
        logged = explained.get(key, 0)
        if finals[key] != logged:
            out.append(f"{key}: final value {finals[key]}, the logs account for {logged} "
                       f"(unexplained {finals[key] - logged:+d}: records missing, or a pair "
                       "carried a delta without its op)")
    out.insert(0, f"keys audited: {len(finals)}, final values the logs do not account for: "
                  f"{len(out)}")
    return out
