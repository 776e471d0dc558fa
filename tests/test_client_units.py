"""SDK pieces without a network: config, op ids, node order, backoff, error tree."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from client import ClientConfig, ConfigurationError
from client import errors as e
from client.nodes import NodePool
from client.opids import OpIdSource
from client.retry import backoff
from client.transport import status_error


def test_config_validates_and_names_the_field() -> None:
    cfg = ClientConfig(nodes=("127.0.0.1:1", "http://127.0.0.1:1/"))
    assert cfg.nodes == ("http://127.0.0.1:1",)
    for bad, field in [({"nodes": ()}, "nodes"), ({"attempt_timeout": 0}, "attempt_timeout"),
                       ({"window_margin": 1.0}, "window_margin"),
                       ({"client_id": "a:b"}, "client_id"),
                       ({"max_backoff_interval": 0.001}, "max_backoff_interval")]:
        kw = {"nodes": ("h:1",), **bad}
        with pytest.raises(ConfigurationError, match=field):
            ClientConfig(**kw)  # type: ignore[arg-type]


def test_budget_stays_inside_the_window() -> None:
    cfg = ClientConfig(nodes=("h:1",), total_timeout=30.0)
    assert cfg.budget(10.0) == 7.5
    assert cfg.budget(1.0) == 0.5
    assert ClientConfig(nodes=("h:1",), total_timeout=2.0).budget(10.0) == 2.0
    # the nodes refuse ops older than their window less max_clock_skew: no retry past it
    assert cfg.budget(2.0, skew=1.0) == 1.0 and cfg.budget(10.0, skew=1.0) == 7.5


def test_op_ids_reserve_blocks_and_never_repeat(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    a = OpIdSource("cli", path, block=4)
    first = [a.next() for _ in range(5)]
    assert first == [f"cli:{i}" for i in range(5)] and a.reservations == 2
    b = OpIdSource(None, path, block=4)  # restart, id from the file
    assert b.client_id == "cli" and b.next() == "cli:8"
    with pytest.raises(ConfigurationError, match="client_id"):
        OpIdSource("other", path)
    no_file = OpIdSource()
    assert no_file.client_id != OpIdSource().client_id


def test_node_order_rotates_and_puts_failed_last() -> None:
    now = [0.0]
    pool = NodePool(["a:1", "b:1", "c:1"], failure_backoff_interval=1.0, clock=lambda: now[0])
    assert [pool.order()[0] for _ in range(3)] == ["http://a:1", "http://b:1", "http://c:1"]
    pool.record("http://a:1", False)
    assert pool.order()[-1] == "http://a:1"
    now[0] = 2.0
    assert [pool.order()[0] for _ in range(3)].count("http://a:1") == 1


def test_discovery_and_window_from_health() -> None:
    pool = NodePool(["a:1"])
    new = pool.learn("http://a:1", {"node": "n1", "window_s": 4.0, "members": ["n1", "n2"],
                                    "addresses": {"n1": "a:1", "n2": "b:2"}}, discover=True)
    assert new == ["http://b:2"] and pool.members == ("n1", "n2")
    assert pool.window(9.0) == 4.0 and NodePool(["x:1"]).window(9.0) == 9.0
    assert pool.skew() == 0.0
    pool.learn("http://b:2", {"node": "n2", "clock": {"tolerance_s": 1.0}}, discover=False)
    assert pool.skew() == 1.0
    assert pool.learn("http://a:1", {"addresses": {"n3": "c:3"}}, discover=False) == []


def test_backoff_is_full_jitter_and_capped() -> None:
    rng = random.Random(0)
    draws = [backoff(n, 0.01, 0.1, rng) for n in range(1, 40)]
    assert all(0 <= d <= 0.1 for d in draws) and max(draws[8:]) > 0.05


def test_every_error_says_whether_a_retry_helps() -> None:
    assert status_error(503, {}, "n").retriable  # type: ignore[attr-defined]
    assert isinstance(status_error(410, {"error": {"code": "op_expired"}}, "n"),
                      e.OutcomeUnknownError)
    bad = status_error(400, {"error": {"code": "bad_delta", "message": "m"}}, "n")
    assert isinstance(bad, e.BadRequestError) and bad.code == "bad_delta" and not bad.retriable
    for cls in (e.OutcomeUnknownError, e.DeadlineExceededError, e.OpExpiredError):
        assert cls.retriable is False and cls.applied is None
    for cls in (e.TransientError, e.UnavailableError, e.NotAppliedError):
        assert cls.retriable is True
    assert e.ConnectFailedError.applied is False and e.RejectedError.applied is False


def test_the_pool_learns_the_ring_and_names_each_keys_leader() -> None:
    from idc_contract.ring import Ring

    pool = NodePool(["a:1", "b:1", "c:1"])
    assert pool.leader_url("t", "k") is None  # nothing known yet
    ring = {"vnodes": 16, "hash": "murmur3_x64_128", "key": "<table>/<key>"}
    for url, nid in (("a:1", "n1"), ("b:1", "n2"), ("c:1", "n3")):
        pool.learn(f"http://{url}", {"node": nid, "members": ["n1", "n2", "n3"], "rf": 3,
                                     "ring": ring}, discover=False)
    same = Ring(["n1", "n2", "n3"], vnodes=16, rf=3)
    urls = {"n1": "http://a:1", "n2": "http://b:1", "n3": "http://c:1"}
    for i in range(50):
        assert pool.leader_url("t", f"k{i}") == urls[same.leader("t", f"k{i}") or ""]
    leader = pool.leader_url("t", "k0")
    assert leader is not None and pool.order(leader)[0] == leader
    pool.record(leader, False)  # a leader that just failed is tried last
    assert pool.order(leader)[-1] == leader
    other = NodePool(["a:1"])
    other.learn("http://a:1", {"node": "n1", "members": ["n1"], "rf": 1,
                               "ring": {**ring, "hash": "something-else"}}, discover=False)
    assert other.ring is None and other.leader_url("t", "k") is None  # unknown placement


def test_the_pool_forgets_a_node_that_left() -> None:
    ring = {"vnodes": 16, "hash": "murmur3_x64_128", "key": "<table>/<key>"}
    pool = NodePool(["a:1", "b:1"])
    for url, nid in (("a:1", "n1"), ("b:1", "n2")):
        pool.learn(f"http://{url}", {"node": nid, "window_s": 2.0 if nid == "n2" else 5.0,
                                     "members": ["n1", "n2"], "rf": 2, "ring": ring},
                   discover=False)
    pool.record("http://b:1", False)
    assert pool.remove("b:1") and not pool.remove("b:1") and not pool.remove("a:1")
    assert pool.urls == ["http://a:1"] and pool.order() == ["http://a:1"]
    assert pool.window(9.0) == 5.0 and "http://b:1" not in pool.failed_at
    assert all(pool.leader_url("t", f"k{i}") in (None, "http://a:1") for i in range(20))
    assert pool.add("c:1") and pool.urls == ["http://a:1", "http://c:1"]


def test_the_pool_forgets_a_member_that_left_but_never_a_url_it_was_given() -> None:
    """After a decommission the SDK stops trying the departed node (its machine may be gone: a
    connect timeout a turn), as soon as an answer of the newest membership version says it
    left. A node behind the membership is not believed, a URL in front of the node (a load
    balancer) stays, and a member that joins again comes back."""
    pool = NodePool(["lb:80", "c:3", "a:1"])
    pool.learn("http://lb:80", {"node": "n3", "ring_version": 3}, discover=True)
    members = {"n1": "a:1", "n2": "b:2", "n3": "c:3"}
    assert pool.learn("http://a:1", {"node": "n1", "ring_version": 3, "addresses": members,
                                     "left": {}}, discover=True) == ["http://b:2"]
    gone = {"addresses": {"n1": "a:1", "n2": "b:2"}, "left": {"n3": "c:3"}}
    pool.learn("http://b:2", {"node": "n2", "ring_version": 2, **gone},
               discover=True)  # behind the newest version seen: not believed
    assert "http://c:3" in pool.urls
    pool.learn("http://b:2", {"node": "n2", "ring_version": 6, **gone}, discover=True)
    assert pool.urls == ["http://lb:80", "http://a:1", "http://b:2"]
    assert pool.learn("http://a:1", {"node": "n1", "ring_version": 8, "addresses": members,
                                     "left": {}}, discover=True) == ["http://c:3"]


def test_the_op_budget_follows_what_the_nodes_say() -> None:
    """``CounterClient.op_budget`` is kept between ops (every op asks), and computed again when a
    node says another window or clock tolerance, a node is removed, or the config changes."""
    from client.sdk import CounterClient

    c = CounterClient(["http://a:1", "http://b:2"])
    cfg = c.config
    assumed = c.op_budget
    assert assumed == cfg.budget(cfg.assumed_window, 0.0)
    c.pool.learn("http://a:1", {"node": "n1", "window_s": 4.0}, discover=False)
    assert c.op_budget == cfg.budget(4.0, 0.0) != assumed
    c.pool.learn("http://b:2", {"node": "n2", "window_s": 2.0, "clock": {"tolerance_s": 0.5}},
                 discover=False)
    assert c.op_budget == cfg.budget(2.0, 0.5)
    c.pool.remove("http://b:2")
    assert c.op_budget == cfg.budget(4.0, 0.0)
    c.config = cfg.replace(total_timeout=0.25)
    assert c.op_budget == min(0.25, cfg.budget(4.0, 0.0))
