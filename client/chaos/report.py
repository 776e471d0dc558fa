"""The chaos report for a terminal (the same facts as report.json, readable)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.chaos.runner import ChaosResult


def render(res: ChaosResult) -> str:
    r = res.report
    w = res.config["workload"]
    lines = [
        "=" * 72,
        f"chaos run: {len(res.nodes)} nodes ({', '.join(res.nodes)}), "
        f"{w['duration']:g} s workload, {w['clients'] * w['concurrency']} processes, "
        f"target {w['rate']:g} ops/s, {w['keys']} keys; total {res.duration_s:g} s",
        f"peer links through proxies: {'yes' if res.peer_links else 'no'}",
    ]
    played = Counter(p["nemesis"] for p in res.played)
    lines.append("nemeses played: " + (", ".join(f"{k} x{v}" for k, v in played.items())
                                       or "none"))
    for name, why in res.skipped.items():
        lines.append(f"  skipped {name}: {why}")
    lines += _membership(res)
    lines += _counts(res)
    lines += _finals(res)
    lines += ["", f"over-count {r.over_count}   under-count {r.under_count}   "
                  f"cluster healthy after heal: {'yes' if res.healthy else 'NO'}"]
    if res.valid:
        lines.append("RESULT: VALID - every read in bounds, final values exact, replicas agree"
                     + (", scans whole" if r.scans else ""))
    else:
        lines.append("RESULT: INVALID")
        for p in r.problems:
            lines.append(f"  - {p}")
        if not res.healthy:
            lines.append("  - some node did not answer /v1/health after healing")
        for p in res.membership_problems:
            lines.append(f"  - membership: {p}")
    lines.append(f"history: {res.history_path}")
    lines.append("=" * 72)
    return "\n".join(lines)


def _membership(res: ChaosResult) -> list[str]:
    """One line per membership change: what, ring versions, how the heal went."""
    lines = []
    for p in res.played:
        if p["nemesis"] == "split-membership":
            lines.append(_split(p))
            continue
        if p["nemesis"] != "membership":
            continue
        kind, node, healed = p.get("kind"), p.get("node"), p.get("healed") or {}
        what = {"join": f"join {node}", "decommission": f"decommission {node}",
                "replace": f"replace {p.get('replaces')} by {node}"}.get(
            str(kind), f"crash of {p.get('moving')} {node} "
                       f"({'mid-move' if p.get('killed_mid_move') else 'after the move'})")
        notes = []
        if "restarted" in healed:
            notes.append("restarted" if healed["restarted"] else
                         f"restart FAILED: {healed.get('restart_error')}")
        if "exit_code" in healed:
            notes.append(f"exit {healed['exit_code']}")
        if healed.get("settled") is False:
            notes.append("NOT settled")
        lines.append(f"  membership: {what}: v{p.get('version_before')} -> "
                     f"v{healed.get('version', '?')} in {healed.get('seconds', '?')} s"
                     + (f"; {', '.join(notes)}" if notes else "")
                     + (f"; members {' '.join(healed['members'])}" if healed.get("members")
                        else ""))
    return lines


def _split(p: dict[str, Any]) -> str:
    """One line for a split-membership play: the halves, what each was asked through whom and
    what it answered, and the membership every live member ended with."""
    healed = p.get("healed") or {}
    asked = []
    for c in p.get("changes", []):
        side = " ".join(c["side"])
        answer = (f"ok v{c.get('version')}" if c.get("accepted") else
                  "refused: no majority" if c.get("no_majority") else
                  f"refused: {str(c.get('answer'))[:80]}")
        if c.get("completed_later"):
            answer += ", completed after the heal"
        asked.append(f"[{side}]{' (majority)' if c.get('majority') else ''} "
                     f"{c['change']} {c['node']} via {c['via']} -> {answer}")
    if healed.get("one_membership"):
        end = (f"one membership v{healed.get('version')} on {len(healed.get('members', []))}"
               f" members ({' '.join(healed.get('members', []))})")
    else:
        end = "NOT one membership"
    took = ", ".join(healed.get("took_effect") or []) or "none"
    bridges = f" (bridges {' '.join(p['bridges'])})" if p.get("bridges") else ""
    return (f"  split-membership v{p.get('version_before')} cut {p.get('mode')}{bridges}: "
            + "; ".join(asked) + f"; healed: {end}, took effect: {took}"
            + (f", in {healed['seconds']} s" if "seconds" in healed else ""))


def _counts(res: ChaosResult) -> list[str]:
    """Ops, reads, retries, latency, client errors and the faults the proxies injected."""
    r = res.report
    lines: list[str] = []
    s = res.client_stats
    lines += [
        "",
        f"adds        {r.ops:>8}   acknowledged {r.acknowledged:>7}   failed {r.failed:>6}   "
        f"indeterminate {r.indeterminate:>5}",
        f"reads ok    {r.reads:>8}   read errors  {len(r.read_errors):>7}"
        + (f"   unjudged (consistency one) {r.reads_unjudged}" if r.reads_unjudged else ""),
        f"retries     {r.retries:>8}   duplicates absorbed {r.duplicates_absorbed:>6}   "
        f"(client: {s.get('attempts', 0)} attempts, {s.get('http_requests', 0)} requests, "
        f"{s.get('batches', 0)} batches)",
    ]
    if r.deletes:
        lines.append(f"deletes     {r.deletes:>8}   acknowledged {r.deletes_ok:>7}   "
                     f"failed {r.deletes_failed:>6}   indeterminate {r.deletes_indeterminate:>5}")
    if r.multigets or r.scans:
        kinds = Counter(e.kind for e in r.scan_errors)
        lines.append(f"multi-gets  {r.multigets:>8}   ({r.multiget_values} values)   scans "
                     f"{r.scans} ({r.scan_values} values); scan violations: "
                     + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
    if res.latency_ms:
        lat = res.latency_ms
        lines.append(f"ack latency ms: p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  "
                     f"max {lat['max']}")
    errs = s.get("errors") or {}
    if errs:
        lines.append("attempt errors: " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(errs.items(), key=lambda t: -t[1])))
    hits = Counter[str]()
    for counters in res.proxies.values():
        for k, v in counters.items():
            if not k.startswith(("messages_", "connections", "bytes_")):
                hits[k] += v
    if hits:
        lines.append("faults injected by proxies: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(hits.items())))
    return lines


def _finals(res: ChaosResult) -> list[str]:
    """The final reads, one line per key (the first 20)."""
    r = res.report
    lines: list[str] = []
    lines += ["", "final reads (after heal, consistency=one on every node):"]
    conv = sum(1 for f in r.finals if f.converged)
    agreed = (f"agreed after {res.converged_after_s} s" if res.converged_after_s is not None
              else "did NOT agree within the quiet timeout")
    lines.append(f"  {len(r.finals)} keys, converged {conv}/{len(r.finals)}; replicas {agreed}")
    left = res.extra.get("in_doubt_left")
    if left:
        lines.append("  in-doubt ops still unsettled at the final reads: "
                     + ", ".join(f"{n}={v}" for n, v in sorted(left.items())))
    for f in r.finals[:20]:
        vals = " ".join(f"{n}={v}" for n, v in f.values.items())
        rng = _ranges(f.ranges)
        mark = "ok " if f.valid else "BAD"
        since = f" (after {f.deletes} deletes)" if f.deletes else ""
        lines.append(f"  {mark} {f.key:<14} {vals:<36} acked {f.acknowledged:<6} "
                     f"+subset of {f.indeterminate} unknown{since} -> {rng}")
    return lines


def _ranges(ranges: list[tuple[int, int]]) -> str:
    parts = [f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in ranges[:3]]
    more = f" (+{len(ranges) - 3} ranges)" if len(ranges) > 3 else ""
    return "{" + ", ".join(parts) + "}" + more
