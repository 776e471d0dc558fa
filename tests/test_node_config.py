"""Node configuration from CLI flags and files: parsing, precedence, errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import config_from_args
from cluster.core.config import NodeConfig, from_mapping, parse_dedup, parse_peers
from cluster.core.errors import ConfigError

PEERS = "n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103"
BASE = ["--id", "n1", "--listen", "127.0.0.1:7101", "--peers", PEERS, "--data-dir", "/tmp/x"]


def test_cli_defaults() -> None:
    cfg, level = config_from_args(BASE)
    assert cfg.node_id == "n1" and cfg.listen == ("127.0.0.1", 7101)
    assert [p[0] for p in cfg.peers] == ["n1", "n2", "n3"]
    assert cfg.rf == 3 and cfg.quorum == 2 and cfg.read_quorum == 2
    assert cfg.dedup == "fbf" and cfg.fsync is True and level == "INFO"


def test_cli_dedup_per_table_and_flags() -> None:
    cfg, _ = config_from_args([*BASE, "--dedup", "fbf,t1=exact,t2=none", "--no-fsync",
                               "--write-quorum", "3", "--window", "30", "--target-fpp", "1e-4"])
    assert cfg.dedup_for("t1") == "exact" and cfg.dedup_for("t2") == "none"
    assert cfg.dedup_for("other") == "fbf"
    assert cfg.fsync is False and cfg.quorum == 3 and cfg.window == 30.0
    assert cfg.target_fpp == 1e-4


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_config_file_and_cli_precedence(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"node{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"id": "n2", "listen": "127.0.0.1:7102", "peers": PEERS,
                                    "data_dir": "/tmp/y", "rf": 2,
                                    "dedup_tables": {"hot": "adaptive-fbf"}}))
    else:
        path.write_text('id = "n2"\nlisten = "127.0.0.1:7102"\n'
                        f'peers = "{PEERS}"\ndata-dir = "/tmp/y"\nrf = 2\n'
                        '[dedup_tables]\nhot = "adaptive-fbf"\n')
    cfg, _ = config_from_args(["--config", str(path), "--window", "12"])
    assert cfg.node_id == "n2" and cfg.rf == 2 and cfg.window == 12.0
    assert cfg.dedup_for("hot") == "adaptive-fbf"
    cfg, _ = config_from_args(["--config", str(path), "--rf", "3"])
    assert cfg.rf == 3


@pytest.mark.parametrize(("change", "field"), [
    ({"rf": 4}, "rf"),
    ({"rf": -1}, "rf"),
    ({"write_quorum": 5}, "write_quorum"),
    ({"node_id": "n9"}, "node_id"),
    ({"window": 0}, "window"),
    ({"target_fpp": 1.5}, "target_fpp"),
    ({"dedup": "nonsense"}, "dedup"),
    ({"dedup": "fbf,t=nonsense"}, "dedup[t]"),
    ({"listen": "nowhere"}, "listen"),
    ({"peers": "n1=127.0.0.1"}, "peers[n1]"),
    ({"rf": "three"}, "rf"),
    ({"fsync": "yes"}, "fsync"),
    ({"bogus": 1}, "bogus"),
    ({"max_body_bytes": 0}, "max_body_bytes"),
])
def test_bad_values_name_the_field(change: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"node_id": "n1", "listen": "127.0.0.1:7101", "peers": PEERS,
                                 "data_dir": "/tmp/x", **change}
    with pytest.raises(ConfigError) as err:
        from_mapping(values)
    assert str(err.value).startswith(field), str(err.value)


def test_config_is_frozen_and_keyword_only() -> None:
    cfg = from_mapping({"node_id": "n1", "listen": "h:1", "peers": "n1=h:1", "data_dir": "d"})
    with pytest.raises(AttributeError):
        cfg.rf = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        NodeConfig("n1")  # type: ignore[misc]


def test_parsers() -> None:
    assert parse_peers("b=h:2, a=h:1") == (("a", "h", 1), ("b", "h", 2))
    assert parse_peers({"a": "h:1"}) == (("a", "h", 1),)
    with pytest.raises(ConfigError):
        parse_peers("a=h:1,a=h:2")
    assert parse_dedup("exact") == ("exact", ())
    assert parse_dedup("t=none") == ("fbf", (("t", "none"),))
