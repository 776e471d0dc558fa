"""The rolling upgrade play (client.chaos.upgrade) from release 0.4.0 to this tree, bounded: the
nodes start on 0.4.0's tree (``git archive v0.4.0``, run under this venv's python with its
Python kernels), are replaced one at a time by this code under load, one is rolled back and
forward, the cluster finalized; the checker must find every acknowledged add counted once. And a
planted incompatible frame change (``IDC_TEST_FRAME_FORM=2`` on the new nodes) must fail it.
``make upgrade-check`` runs the full play on several seeds with a venv of the old release."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from client.chaos.upgrade import UpgradeConfig, plants, run_upgrade, verdict
from cluster.local import NodeCode

REPO = Path(__file__).resolve().parent.parent
FROM = "v0.4.0"


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
    return dest


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    got = _archive(FROM, tmp_path_factory.mktemp("old") / FROM)
    if isinstance(got, str):
        pytest.skip(got)
    return got


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
