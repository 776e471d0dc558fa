"""Hostile clients: throw many classes of junk at live nodes while a well-behaved client
counts, then check that the junk changed nothing and every node is still up.

    python -m client.hostile --nodes http://127.0.0.1:7101,http://127.0.0.1:7102 \\
        --secret-file DATA/cluster.secret --token-file TOKENS --duration 30 --out hostile.json

Every junk class is a small async function in ``REGISTRY`` that takes the run's context and one
target node and returns an ``Outcome``: how many requests or connections it sent, what came back
(HTTP statuses, "closed", "open", peer "reply" frames ...) and every broken expectation. The
classes speak raw HTTP/1.1 and the raw peer protocol over asyncio streams, so nothing between
them and the node tidies the junk up.

While the junk runs (in rounds, each class once per round, at most ``--concurrency`` at a time),
a ``CounterClient`` adds small deltas to a few keys of the ``good`` table, with unique op ids and
retries under the same id. At the end the runner checks, from every node at consistency=all:

* the good keys: each equals the sum of the acknowledged adds, plus some subset of the adds
  whose outcome is unknown (``client.checker.reachable_sums``; with none unknown: exact);
* the junk keys (table ``junk``): every one reads 0 (the valid ops carried by refused,
  truncated, slow or unauthorised requests, and the forged peer frames, changed nothing);
* every node answers ``/v1/health`` with status ok;
* ``/metrics``: ``idc_peer_auth_rejected_total`` and ``idc_http_refused_total`` by reason
  (deltas over the run), and each reason the classes that ran should raise went up.

What a class expects: an HTTP junk request gets a 4xx in the contract's shape
``{"error": {"code", "message"}}`` (JSON or msgpack), never a 5xx. The node may instead just
close the connection where no HTTP answer is possible or owed: requests the sender truncates,
connections that never say anything, bytes that are not HTTP at all (``closes=True`` in the
registry). Forged or replayed peer traffic gets the connection closed with no reply frame.

Bounded: ``--duration`` caps the junk (no round starts after it), every class call has its own
timeout, ``--max-requests`` caps the junk requests, and the good client stops with the junk.

The last classes of the registry found node bugs when they were written (all fixed since; see
``tests/test_hostile.py``). ``counter_overflow`` writes two valid ops of 2**63-1 to a key of
its own table (``<table>_ovf``) before the ones the node must refuse. The delete classes raise a
fresh counter of ``<table>_del`` with a valid add before their junk, and check it keeps its
value; ``table_bad_settings`` sets the ttl of ``<table>_ttl`` first, and checks it after.

The modules, each importing only those above it:

* ``context``: the run's context (``Ctx``, ``Limits``, ``Target``) and the request budget;
* ``outcome``: what came back (``Answer``, ``Outcome``) and ``expect_reject``;
* ``http_client``, ``peer_client``: raw HTTP/1.1 and the raw peer protocol;
* ``registry``: ``JunkClass`` and the ``@junk`` decorator;
* ``cases_http``, ``cases_http_limits``, ``cases_http_routes`` (reads, scans, deletes, table
  settings), ``cases_connection``, ``cases_peer``, ``cases_regressions``: the classes, by
  family; ``cases`` imports them in registry order;
* ``good_client``: the well-behaved SDK client;
* ``runner``: the run and its checks (``run_hostile``, ``try_class``);
* ``cli``: ``python -m client.hostile`` and ``format_report``.
"""

from client.hostile.cases import REGISTRY, JunkClass
from client.hostile.cli import config_from_args, format_report, main
from client.hostile.context import INT64_MAX, INT64_MIN, BudgetExhausted, Ctx, Limits, Target
from client.hostile.good_client import GoodStats, good_client
from client.hostile.http_client import exchange, http_request, parse_response
from client.hostile.outcome import Answer, Failure, Outcome, error_shape, expect_reject
from client.hostile.peer_client import PeerAnswer, expect_closed, peer_exchange
from client.hostile.registry import junk
from client.hostile.runner import (
    METRICS,
    HostileConfig,
    Runner,
    parse_metrics,
    run_hostile,
    try_class,
)

__all__ = [
    "INT64_MAX", "INT64_MIN", "METRICS", "REGISTRY", "Answer", "BudgetExhausted", "Ctx",
    "Failure", "GoodStats", "HostileConfig", "JunkClass", "Limits", "Outcome", "PeerAnswer",
    "Runner", "Target", "config_from_args", "error_shape", "exchange", "expect_closed",
    "expect_reject", "format_report", "good_client", "http_request", "junk", "main",
    "parse_metrics", "parse_response", "peer_exchange", "run_hostile", "try_class",
]
