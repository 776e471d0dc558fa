"""What happened to one key in a simulated run, in virtual time: the clients' adds and deletes
(each invocation and how it ended), the reads (multi-get and scan values too) the checker found
out of bounds, the scans that skipped or repeated it, and every record each node's log made
durable for the key (APPLY, REPLICA, PUBLISHED, WITHDRAW: which node applied which op when; a
delete's floors are REPLICA records of origin ``~<origin>``, the key's last change ``~``), at the
virtual time of the fsync that made it durable. The disks keep every
synced frame for this (``SimDisk.archive``), so a failing seed's story is read after the run,
from the real log encoding, without instrumenting a node.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.sim.world import EPOCH
from cluster.wal import RecordKind, decode_segment, scan

if TYPE_CHECKING:
    from cluster.sim.run import Result

__all__ = ["failing_keys", "key_story"]


def failing_keys(res: Result) -> list[str]:
    """The keys (``table/key``) the checker found a problem with, in a stable order."""
    keys = {r.key for r in res.report.read_errors}
    keys |= {f.key for f in res.report.finals if not f.valid}
    keys |= {s.key for s in res.report.scan_errors}
    return sorted(keys)


def key_story(res: Result, key: str) -> list[str]:
    """The events of ``key`` (``table/key``), one line each, ordered by virtual time."""
    table, _, name = key.partition("/")
    lines: list[tuple[float, int, str]] = []
    invoked: dict[str, dict[str, Any]] = {}
    for i, ev in enumerate(res.history):
        if ev.get("key") != key or ev.get("f") not in ("add", "delete"):
            continue
        op = ev["op_id"]
        if ev["type"] == "invoke":
            invoked[op] = ev
            what = (f"{op} ({ev['value']:+d})" if ev["f"] == "add" else f"{op} (delete)")
            what += f" invoked at {ev['node']}"
        elif ev["type"] == "ok":
            how = "duplicate" if ev.get("duplicate") else "applied"
            what = f"{op} ok ({how}) at {ev['node']}, attempt {ev['attempts']}"
        else:
            what = f"{op} {ev['type']} after {ev.get('attempts', '?')} attempt(s)"
        lines.append((ev["time"], i, f"client   {what}"))
    for r in res.report.read_errors:
        if r.key == key and r.time is not None:
            allowed = (" (expired: must read 0)" if r.expired else
                       f" (allowed {list(r.ranges)[:4]})" if r.ranges else "")
            lines.append((r.time, 0, f"{r.source.upper()} OUT OF BOUNDS: {r.value} not in "
                                     f"[{r.lower}, {r.upper}]{allowed} (process {r.process})"))
    for sp in res.report.scan_errors:
        if sp.key == key and sp.time is not None:
            lines.append((sp.time, 0, f"SCAN {sp.kind.upper()}: {sp.detail} "
                                      f"(process {sp.process})"))
    if res.world is not None:
        for host in res.world.hosts.values():
            for synced, data in host.disk.archive:
                for rec in decode_segment(Path(f"sim:{host.id}"), data[:scan(data)]):
                    if rec.table != table or rec.key != name:
                        continue
                    kind = RecordKind(rec.kind).name
                    op = rec.op_id or "(repair)"
                    # the op's time: the leader's clock at the apply, as virtual time
                    stamped = (rec.ts - EPOCH - host.skew) / (1.0 + host.drift)
                    lines.append((synced, 1, f"{host.id:<8} {kind:<9} {op:<8} origin "
                                             f"{rec.origin} P {rec.p} N {rec.n} delta "
                                             f"{rec.delta:+d} (op at {stamped:.3f})"))
    lines.sort(key=lambda t: (t[0], t[1]))
    return [f"{t:9.3f} {text}" for t, _, text in lines]
