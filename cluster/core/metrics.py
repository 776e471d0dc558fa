"""Prometheus text exposition, written by hand: a few counters, gauges and histograms.

Hand-written because the hot path only bumps plain ints and one ``bisect`` per request;
``prometheus_client`` would add a lock and a label lookup per observation.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.core import batch_kernel, store_kernel
from cluster.core.fbf import hotpath

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# how late a timer fires; 0.02 is the stall budget (no loop stall over 20 ms)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Cumulative-bucket histogram with fixed upper bounds (seconds)."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out, acc = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += n
            le = "+Inf" if bound == math.inf else repr(bound)
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {acc}')
        lab = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{lab} {self.total}")
        out.append(f"{name}_count{lab} {self.count}")
        return out


class Refusals:
    """Things refused at the door, counted by reason (each reason one of ``reasons``, the
    labels always exported) and logged at most once per reason every ``log_every`` seconds:
    whoever sends junk cannot flood the log."""

    def __init__(self, logger: logging.Logger, what: str, reasons: Sequence[str], *,
                 source: str, log_every: float = 10.0) -> None:
        self.counts: Counter[str] = Counter()
        self.reasons = tuple(reasons)
        self._log, self._what, self._source, self._every = logger, what, source, log_every
        self._last_logged: dict[str, float] = {}

    def __call__(self, reason: str, source: str, detail: object = None) -> None:
        self.counts[reason] += 1
        now = time.monotonic()
        if now - self._last_logged.get(reason, -1e9) >= self._every:
            self._last_logged[reason] = now
            fields = {"reason": reason, self._source: source}
            if detail is not None:
                fields["detail"] = str(detail)
            self._log.warning(self._what, extra={"fields": {
                **fields, "refused_so_far": self.counts[reason]}})


@dataclass
class NodeMetrics:
    applied: int = 0
    duplicates: int = 0
    unconfirmed_duplicates: int = 0
    unavailable: int = 0
    expired: int = 0
    bad_requests: int = 0
    forwarded: int = 0
    replicated_out: int = 0
    replicated_in: int = 0
    repairs_out: int = 0
    repairs_in: int = 0
    replayed: int = 0
    snapshots: int = 0
    published_late: int = 0
    withdrawn: int = 0
    fenced: int = 0
    deferred: int = 0
    antientropy_keys: int = 0
    antientropy_rounds: int = 0
    antientropy_bytes: int = 0
    antientropy_seconds: float = 0.0
    hints_delivered: int = 0
    retry_checks: int = 0
    unauthorized: int = 0
    overflows: int = 0
    clock_skew_refusals: int = 0
    clock_skew_episodes: int = 0
    minority_refusals: int = 0
    stale_ring_refusals: int = 0
    ring_conflicts: int = 0
    ring_version: int = 0
    shed_keys: int = 0  # keys dropped as no longer replicated here (``cluster.roles.shed``)
    foreign_keys: int = 0  # keys held but not replicated here, as the last pass left them
    shed_abandoned: int = 0  # keys dropped without a hand-off, left behind past the grace
    shed_version: int = 0  # the membership whose shedding pass left none (0: none yet)
    deletes: int = 0
    expired_keys: int = 0  # counters deleted by time (a ttl) by this node as their leader
    collected_keys: int = 0  # tombstones (deleted or expired keys) dropped after their grace
    reads: int = 0  # counters read (GET, POST /v1/read, scans)
    scanned: int = 0  # keys this node listed for scans
    requests: dict[str, Histogram] = field(default_factory=dict)
    loop_lag: Histogram = field(default_factory=lambda: Histogram(LOOP_LAG_BUCKETS))

    def request_histogram(self, route: str) -> Histogram:
        h = self.requests.get(route)
        if h is None:
            h = self.requests[route] = Histogram()
        return h


class Exposition:
    """Accumulates metric families and renders them in the text format."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        lab = ""
        if labels:
            lab = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"
        self._lines.append(f"{name}{lab} {_num(value)}")

    def simple(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text)
        self.sample(name, value)

    def histogram(self, name: str, help_text: str,
                  series: Iterable[tuple[str, Histogram]]) -> None:
        self.family(name, "histogram", help_text)
        for labels, h in series:
            self._lines.extend(h.lines(name, labels))

    def render(self) -> str:
        return "\n".join(self._lines) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return "NaN"
    return str(value)


def wal_histogram(stats: object) -> Histogram:
    """A ``Histogram`` view of the log's fsync latency (``LogStats``: per-bucket counts)."""
    bounds = tuple(b for b in getattr(stats, "fsync_buckets", ()) if b != math.inf)
    h = Histogram(bounds)
    counts = list(getattr(stats, "fsync_counts", ()))
    h.counts = (counts + [0] * len(h.counts))[: len(h.counts)]
    h.total = float(getattr(stats, "fsync_seconds_total", 0.0))
    h.count = int(getattr(stats, "fsyncs", 0))
    return h


def render(node: Any, auth: Any = None, edge: Any = None) -> str:
    """The node's /metrics page (``auth``: ``cluster.transport.auth.PeerAuth``, ``edge``:
    ``cluster.edge.listener.EdgeStats``, for what was refused at the door)."""
    m, ex = node.metrics, Exposition()
    for name, help_text in (
        ("applied", "ops applied by this node as leader"),
        ("duplicates", "ops answered as duplicates (retries caught, or dedup false positives)"),
        ("unconfirmed_duplicates", "duplicates answered 503: the op not yet visible on W "
         "replicas (its leader still settling it, or too few replicas answered)"),
        ("unavailable", "ops or reads answered 503: quorum not met in time"),
        ("expired", "ops refused as older than the dedup window (410)"),
        ("bad_requests", "requests refused as malformed (400/413)"),
        ("forwarded", "ops forwarded by this node to their leader"),
        ("replicated_out", "op copies sent to replicas"),
        ("replicated_in", "op copies received from leaders"),
        ("repairs_out", "read repairs sent"),
        ("repairs_in", "shard pairs raised by read repairs"),
        ("snapshots", "snapshots written"),
        ("published_late", "in-doubt ops published after their first quorum failed"),
        ("withdrawn", "in-doubt ops withdrawn because another leader applied them"),
        ("fenced", "op copies refused as a replica: the op was claimed for another leader"),
        ("deferred", "ops that waited for an unpublished op on the same key"),
        ("antientropy_keys", "keys exchanged by anti-entropy"),
        ("antientropy_rounds", "anti-entropy exchanges this node started"),
        ("antientropy_bytes", "bytes of digests, leaf digests and entries (as msgpack) "
                              "exchanged by the anti-entropy rounds this node started"),
        ("hints_delivered", "hinted writes delivered to a replica that came back"),
        ("retry_checks", "ops checked on the other replicas before being applied"),
        ("unauthorized", "client requests refused for a missing or wrong bearer token (401)"),
        ("overflows", "ops refused because they would take an entry past 2^64 - 1 (400)"),
        ("clock_skew_refusals", "ops refused (503 clock_skew) while this node's clock was "
         "beyond max_clock_skew from a majority of its peers'"),
        ("clock_skew_episodes", "times this node started refusing for its clock"),
        ("minority_refusals", "ops refused (503) while this node heard from no majority of "
         "the membership's voters: the other side may be changing the membership"),
        ("stale_ring_refusals", "op copies and forwards refused from a peer that showed an "
         "older membership version (it learns the new one at its next heartbeat)"),
        ("ring_conflicts", "memberships seen with our version but other content (refused)"),
        ("shed_keys", "keys this node dropped after a move, as it no longer replicates them "
         "(each handed off to every replica first)"),
        ("shed_abandoned", "keys no longer replicated here dropped without a hand-off: no "
         "replica took them within tombstone_grace of the move (cluster.roles.shed)"),
        ("deletes", "deletes applied by this node as leader"),
        ("expired_keys", "counters this node deleted by time (their table's ttl) as leader"),
        ("collected_keys", "deleted or expired counters this node dropped from memory and "
         "disk once their tombstone_grace passed"),
        ("reads", "counters read through this node (GET, POST /v1/read, scans)"),
        ("scanned", "keys this node listed for scans"),
    ):
        ex.simple(f"idc_{name}_total", "counter", help_text, getattr(m, name))
    ex.simple("idc_antientropy_cpu_seconds_total", "counter",
              "CPU time of anti-entropy's own steps (digests, leaves, entries, merges)",
              m.antientropy_seconds)
    digests = node.state.shards.digests
    ex.simple("idc_digest_pending", "gauge", "keys not yet hashed into the "
              "anti-entropy digests (after a restart; hashed in steps)",
              node.state.shards.digest_pending)
    ex.family("idc_digest_checksum", "gauge", "sum of every bucket digest of the table, as of "
              "the last rehash (low 48 bits): equal on two replicas holding equal entries")
    for table, total in sorted(digests.checksums().items()):
        ex.sample("idc_digest_checksum", total & ((1 << 48) - 1), {"table": table})
    ex.simple("idc_replayed_records", "gauge", "log records replayed at start", m.replayed)
    ex.simple("idc_counters", "gauge", "keys held by this node", node.state.shards.keys)
    _dedup_families(ex, node)
    ex.family("idc_batches_total", "counter", "merged batches run, by stage")
    ex.family("idc_batch_items_total", "counter", "ops in those batches, by stage")
    for stage, batcher in (("lead", node.leader.batcher), ("replica", node.replica.batcher)):
        ex.sample("idc_batches_total", batcher.batches, {"stage": stage})
        ex.sample("idc_batch_items_total", batcher.items, {"stage": stage})
    ex.family("idc_replication_pending", "gauge", "op copies sent and not yet acknowledged")
    for pid, link in node.links.items():
        ex.sample("idc_replication_pending", link.inflight, {"peer": pid})
    ex.family("idc_peer_connected", "gauge", "1 when the outbound peer link is up")
    for pid, link in node.links.items():
        ex.sample("idc_peer_connected", int(link.connected), {"peer": pid})
    ex.family("idc_peer_clock_offset_seconds", "gauge", "the peer's wall clock minus this "
              "node's, as heartbeats measure it (the shortest round trip of the last 16)")
    for pid, offset in node.clocks.offsets().items():
        ex.sample("idc_peer_clock_offset_seconds", offset, {"peer": pid})
    ex.simple("idc_clock_refusing", "gauge", "1 while this node refuses to count because its "
              "clock is beyond max_clock_skew from a majority of its peers'",
              int(node.clocks.refusing))
    _membership_families(ex, node)
    _wal_families(ex, node.log.stats())
    if auth is not None:
        _refusals(ex, "idc_peer_auth_rejected_total",
                  "peer frames or connections refused by authentication, by reason",
                  auth.reject)
        ex.simple("idc_peer_auth_accepted_total", "counter",
                  "inbound peer connections whose signed HELLO checked out", auth.accepted)
        ex.simple("idc_peer_auth_enabled", "gauge", "1 when peer frames are signed",
                  int(auth.enabled))
    if edge is not None:
        _refusals(ex, "idc_http_refused_total", "client connections refused at the door",
                  edge.refuse)
        ex.simple("idc_http_connections", "gauge", "client HTTP connections open",
                  edge.open_connections)
    ex.histogram("idc_request_seconds", "HTTP request latency by route",
                 ((f'route="{r}"', h) for r, h in sorted(m.requests.items())))
    ex.histogram("idc_loop_lag_seconds", "how late a periodic timer fires: the event loop's "
                 "stalls", [("", m.loop_lag)])
    return ex.render()


def _membership_families(ex: Exposition, node: Any) -> None:
    ms = node.membership
    ex.simple("idc_ring_version", "gauge", "the membership version this node holds",
              ms.version)
    ex.family("idc_ring_members", "gauge", "members by state (normal, joining, leaving, left)")
    for state in ("normal", "joining", "leaving", "left"):
        ex.sample("idc_ring_members", len(ms.ids(state)), {"state": state})
    ex.simple("idc_ring_move_seconds", "gauge", "seconds the move under way has lasted (0: "
              "none; it finishes after the dedup window, once the new replicas caught up)",
              max(0.0, node.clock() - ms.moving_since) if ms.moving else 0.0)
    ex.simple("idc_ring_foreign_keys", "gauge", "keys held here that this node no longer "
              "replicates and could not hand off yet, as the last shedding pass left them "
              "(they are dropped once every replica took them)", node.metrics.foreign_keys)


def _refusals(ex: Exposition, name: str, help_text: str, refusals: Refusals) -> None:
    ex.family(name, "counter", help_text)
    for reason in sorted(set(refusals.reasons) | set(refusals.counts)):
        ex.sample(name, refusals.counts.get(reason, 0), {"reason": reason})


def _dedup_families(ex: Exposition, node: Any) -> None:
    stats = {t: d.stats() for t, d in sorted(node.state.dedups.items())}
    names = {t: d.name for t, d in node.state.dedups.items()}
    ex.family("idc_dedup_bytes", "gauge", "memory of the table's dedup state")
    for t, d in sorted(node.state.dedups.items()):
        ex.sample("idc_dedup_bytes", d.nbytes(), {"table": t, "strategy": names[t]})
    ex.family("idc_fbf_kernel_info", "gauge", "1, labelled with what runs the FBF's hot "
              "operations: c (the compiled kernel) or numpy (not built, or IDC_FBF_KERNEL=0)")
    ex.sample("idc_fbf_kernel_info", 1, {"kernel": hotpath.KERNEL})
    ex.family("idc_store_kernel_info", "gauge", "1, labelled with what runs the shard store's "
              "hot methods: c (the compiled kernel) or python (not built, or IDC_STORE_KERNEL=0)")
    ex.sample("idc_store_kernel_info", 1, {"kernel": store_kernel.KERNEL})
    ex.family("idc_batch_kernel_info", "gauge", "1, labelled with what runs the write path's "
              "per-op batch loops: c (the compiled kernel) or python (not built, or "
              "IDC_BATCH_KERNEL=0)")
    ex.sample("idc_batch_kernel_info", 1, {"kernel": batch_kernel.KERNEL})
    ex.family("idc_dedup_estimated_fpp", "gauge", "dedup false-positive estimate (eq. 3 for FBF)")
    for t, d in sorted(node.state.dedups.items()):
        ex.sample("idc_dedup_estimated_fpp", d.estimated_fpp(), {"table": t})
    ex.family("idc_dedup_window_seconds", "gauge", "seconds a retry is guaranteed recognised")
    for t, d in sorted(node.state.dedups.items()):
        ex.sample("idc_dedup_window_seconds", d.window, {"table": t})
    for stat, metric in (("fill", "fbf_fill"), ("n_past", "fbf_n_past"),
                         ("period", "fbf_period_seconds")):
        ex.family(f"idc_{metric}", "gauge", f"FBF {stat} per table"
                  + (" (expected from the loads, no pass over the words)" if stat == "fill"
                     else ""))
        for t, s in stats.items():
            if stat in s:
                ex.sample(f"idc_{metric}", s[stat], {"table": t})


def _wal_families(ex: Exposition, stats: Any) -> None:
    ex.simple("idc_log_records_total", "counter", "records appended", stats.records_appended)
    ex.simple("idc_log_bytes_total", "counter", "bytes appended", stats.bytes_appended)
    ex.simple("idc_log_fsyncs_total", "counter", "group-commit fsyncs", stats.fsyncs)
    ex.histogram("idc_log_fsync_seconds", "fsync latency", [("", wal_histogram(stats))])
    ex.family("idc_log_writer_info", "gauge", "1, labelled with what writes and fsyncs the log: "
              "c (the writer thread's compiled loop), python (its Python loop: not built, or "
              "IDC_WAL_KERNEL=0) or loop (no thread: fsync off)")
    ex.sample("idc_log_writer_info", 1, {"writer": stats.writer})
