"""The rolling upgrade play (client.chaos.upgrade) from releases 0.4.0 and 0.5.0 to this tree,
bounded: the nodes start on the release's tree (``git archive v0.4.0``, run under this venv's
python with its Python kernels), are replaced one at a time by this code under load, one is
rolled back and forward, the cluster finalized; the checker must find every acknowledged add
counted once. A planted incompatible frame change (``IDC_TEST_FRAME_FORM`` at this code's highest
protocol on the new nodes) must fail it from 0.4.0, and is refused from a release that speaks
that form already. ``make upgrade-check`` runs the full play on several seeds with a venv of the
old release (``UPGRADE_FROM=v0.4.0`` or ``v0.5.0``)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from client.chaos.upgrade import (
    OLDEST,
    Speaks,
    UpgradeConfig,
    answered,
    plants,
    probe,
    run_upgrade,
    verdict,
)
from cluster.core import versions
from cluster.core.shards import ShardStore
from cluster.local import NodeCode

REPO = Path(__file__).resolve().parent.parent
FROM = "v0.4.0"
FROM_05 = "v0.5.0"  # the first release whose /v1/health names its protocol and release


def _archive(tag: str, dest: Path) -> Path | str:
    """``git archive tag`` unpacked in ``dest``; a string saying why not."""
    if shutil.which("git") is None:
        return "no git on this machine"
    if not (REPO / ".git").exists():
        return f"{REPO} is no git checkout (a tarball?): no {tag} to upgrade from"
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "-q", "--verify",
                            f"refs/tags/{tag}"], capture_output=True)
    if found.returncode != 0:
        return f"this checkout has no tag {tag} (a shallow clone?)"
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", tag],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    # its own package metadata, as `pip install -e` leaves in the tree (make upgrade-check):
    # run under this venv's python, the release would otherwise say this venv's version
    meta = tomllib.loads((dest / "pyproject.toml").read_text())["project"]
    (dest / "idemcount.egg-info").mkdir(exist_ok=True)
    (dest / "idemcount.egg-info" / "PKG-INFO").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    return dest


def _tree(tag: str, factory: pytest.TempPathFactory) -> Path:
    got = _archive(tag, factory.mktemp("old") / tag)
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tree(FROM, tmp_path_factory)


@pytest.fixture(scope="module")
def old_tree_05(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tree(FROM_05, tmp_path_factory)


def _codes(old_tree: Path) -> tuple[NodeCode, NodeCode]:
    old = NodeCode(python=sys.executable, tree=old_tree, label="old")
    new = NodeCode(python=sys.executable, tree=REPO, label="new")
    return old, new


def test_the_old_tree_imports_its_own_cluster(old_tree: Path) -> None:
    """PYTHONPATH and the working directory beat this venv's editable install."""
    old, new = _codes(old_tree)
    assert old.check() == (old_tree / "cluster" / "__init__.py").resolve()
    assert new.check() == (REPO / "cluster" / "__init__.py").resolve()
    assert NodeCode().module_file() == (REPO / "cluster" / "__init__.py").resolve()


def test_what_each_code_speaks_is_learned(old_tree: Path, old_tree_05: Path) -> None:
    """From the code itself (its cluster.core.versions, none in 0.4.0) and from a health."""
    old, new = _codes(old_tree)
    assert probe(old) == OLDEST
    assert probe(new) == Speaks(versions.PROTOCOL_MIN, versions.PROTOCOL_MAX, versions.release())
    assert probe(_codes(old_tree_05)[0]) == Speaks(1, 2, "0.5.0")
    assert answered({"status": "ok"}) == OLDEST
    said = answered({"release": "0.5.0", "protocol": {"speaks": [1, 2], "cluster": 1}})
    assert said == Speaks(1, 2, "0.5.0") and said.answers_as(Speaks(1, 2, None))
    assert not said.answers_as(Speaks(1, 2, "0.6.0")) and not said.answers_as(OLDEST)
    with pytest.raises(ValueError):
        answered({"protocol": {"speaks": [2, 1]}})


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_rolling_upgrade_from_the_last_release_counts_every_add_once(
        old_tree: Path, tmp_path: Path) -> None:
    old, new = _codes(old_tree)
    cfg = UpgradeConfig(old=old, new=new, seed=1, rate=150, keys=30, phase_seconds=3.0,
                        out_dir=str(tmp_path / "out"), data_dir=str(tmp_path / "data"))
    lines: list[str] = []
    res = await run_upgrade(cfg, echo=lines.append)
    text = "\n".join([*lines, *res.failures, verdict(res)])
    assert res.valid, text
    assert verdict(res).startswith("VALID"), text
    names = [p.name.split()[0] for p in res.phases]
    assert names == ["old", "upgrade", "upgrade", "upgrade", "rollback", "forward", "finalize",
                     "finalized", "restart"], text
    assert res.phases[0].codes == {"n1": "old", "n2": "old", "n3": "old"}
    assert res.phases[3].codes == {"n1": "new", "n2": "new", "n3": "new"}
    assert sorted(res.phases[4].codes.values()) == ["new", "new", "old"]
    assert all(p.ok > 0 for p in res.phases), text
    assert res.finalize.startswith("ok"), text
    # after finalize every node wrote segments in format 2, and a restart read them back
    assert "segments in format 2" in res.phases[-1].note, text
    r = res.report
    assert r.acknowledged > 1000 and r.over_count == 0 and r.under_count == 0, text
    assert all(f.converged and len(f.values) == 3 for f in r.finals), text


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_planted_incompatible_frame_change_fails_the_play(old_tree: Path,
                                                            tmp_path: Path) -> None:
    _, new = _codes(old_tree)
    if not plants(new):
        pytest.skip("this tree does not read IDC_TEST_FRAME_FORM yet: nothing to plant")
    out = subprocess.run(
        [sys.executable, "-m", "client.chaos.upgrade", "--old-tree", str(old_tree),
         "--seed", "2", "--rate", "150", "--keys", "30", "--phase-seconds", "1.5", "--plant",
         "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data")],
        cwd=REPO, capture_output=True, text=True, timeout=140)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "VALID:" not in text.replace("INVALID:", ""), text
    assert "INVALID:" in text, text
    # the 0.4.0 nodes' logs refuse the new nodes' frames
    assert "refused" in text and "undecodable frame" in text, text


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_rolling_upgrade_from_0_5_0_counts_every_add_once(old_tree_05: Path,
                                                                 tmp_path: Path) -> None:
    """0.5.0 names its protocol: the play learns its range and release from its health. While
    it speaks this code's highest protocol too, finalize is not expected to be refused with a
    node rolled back (said in the rollback phase), and finalize still moves the cluster from
    protocol 1 to it. Short phases: the 0.4.0 play above covers the load."""
    old, new = _codes(old_tree_05)
    target = versions.PROTOCOL_MAX
    cfg = UpgradeConfig(old=old, new=new, seed=3, rate=150, keys=30, phase_seconds=2.0,
                        out_dir=str(tmp_path / "out"), data_dir=str(tmp_path / "data"))
    lines: list[str] = []
    res = await run_upgrade(cfg, echo=lines.append)
    text = "\n".join([*lines, *res.failures, verdict(res)])
    assert res.valid and verdict(res).startswith("VALID"), text
    assert res.target == target and "release 0.5.0" in res.old_speaks, text
    assert sorted(res.phases[4].codes.values()) == ["new", "new", "old"]
    rollback = res.phases[4].note
    if probe(old).hi >= target:
        assert f"finalize not tried: the old code speaks protocol {target} too" in rollback, text
    else:
        assert "finalize refused" in rollback, text
    assert res.finalize.startswith("ok"), text
    assert f"segments in format {target}" in res.phases[-1].note, text
    r = res.report
    assert r.acknowledged > 300 and r.over_count == 0 and r.under_count == 0, text


def test_a_plant_the_old_release_reads_is_refused(old_tree_05: Path, tmp_path: Path) -> None:
    """0.5.0 reads frames of form 2: planted on the new nodes they prove nothing, so --plant is
    refused before any node starts (one line, exit 2)."""
    old, new = _codes(old_tree_05)
    if probe(old).hi < versions.PROTOCOL_MAX:
        pytest.skip(f"{FROM_05} does not speak protocol {versions.PROTOCOL_MAX}: a plant counts")
    out = subprocess.run(
        [sys.executable, "-m", "client.chaos.upgrade", "--old-tree", str(old_tree_05),
         "--plant", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data")],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("error: --plant: the old code") and "prove nothing" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not out.stdout, out.stderr
    assert not (tmp_path / "data").exists()


_READ_SNAPSHOT = """
import json, sys
from cluster.core.shards import ShardStore
s = ShardStore.from_bytes(open(sys.argv[1], 'rb').read(), 'n1')
print(json.dumps({f'{t}/{k}': s.entry(t, k).to_wire() for t in s.tables() for k in s.keys_of(t)}))
"""


def test_each_release_reads_this_code_s_snapshots(old_tree: Path, old_tree_05: Path,
                                                  tmp_path: Path) -> None:
    """A node rolled back to an earlier release loads the snapshot the new code wrote: pages of
    several leaves (and of more keys than a machine word has bits) are written a leaf a record,
    the layout every release reads."""
    store = ShardStore("n1")
    for i in range(9000):
        store.merge_pair("t", f"k{i}", "n2@1", i + 1, i % 3)
        if i % 4 == 0:
            store.apply_local("u", f"k{i}", -i)
    snap = tmp_path / "shards.snap"
    snap.write_bytes(store.to_bytes())
    want = {f"{t}/{k}": store.entry(t, k).to_wire() for t in store.tables()
            for k in store.keys_of(t)}
    for tree in (old_tree, old_tree_05):
        out = subprocess.run([sys.executable, "-c", _READ_SNAPSHOT, str(snap)], cwd=tree,
                             env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=120, check=True).stdout
        assert json.loads(out) == want, tree.name
