"""A joining node's flags that depend on the cluster (its rf): held back until it knows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import admin
from cluster.cli import parse
from cluster.core.errors import ConfigError
from cluster.core.membership import Membership
from tests.cluster_util import inprocess_configs, inprocess_nodes


def _joiner(tmp_path: Path, *extra: str) -> list[str]:
    return ["--id", "n4", "--listen", "127.0.0.1:7999", "--join", "127.0.0.1:1",
            "--data-dir", str(tmp_path / "n4"), *extra]


def test_a_joiner_keeps_its_write_quorum_until_it_knows_the_clusters_rf(tmp_path: Path) -> None:
    config, _level, join, _replaces = parse(_joiner(tmp_path, "--write-quorum", "3"))
    assert join == "127.0.0.1:1"
    ms = Membership.bootstrap([("n1", "h", 1), ("n2", "h", 2), ("n3", "h", 3), ("n4", "h", 4)],
                              rf=3, vnodes=8)  # as the join answers it: the joiner listed
    assert admin.configured(config, ms).write_quorum == 3 == admin.configured(config, ms).quorum
    small = Membership.bootstrap([("n1", "h", 1), ("n2", "h", 2), ("n4", "h", 4)], rf=2, vnodes=8)
    with pytest.raises(ConfigError, match="write_quorum"):
        admin.configured(config, small)
    plain, *_ = parse(_joiner(tmp_path))  # no flag: the majority of the cluster's rf
    assert admin.configured(plain, ms).quorum == 2


async def test_a_join_with_a_write_quorum_above_the_clusters_rf_is_refused_before_joining(
        tmp_path: Path) -> None:
    cfgs = inprocess_configs(tmp_path, rf=2)
    async with inprocess_nodes(cfgs) as servers:
        seed = ("127.0.0.1", servers[0].address[1])
        config, *_ = parse(_joiner(tmp_path, "--write-quorum", "3"))
        with pytest.raises(ConfigError, match="the cluster's rf=2, got 3"):
            await admin.join(config, [seed], "127.0.0.1:7999", None)
        assert servers[0].node.membership.version == 1  # nobody was admitted
        assert servers[0].node.membership.get("n4") is None
