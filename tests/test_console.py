"""The ``idemcount`` command that ``pip install`` puts on the PATH ([project.scripts]): every
subcommand explains itself, says its version, and runs its ``python -m`` entry point."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cluster import console
from cluster.console import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def _script() -> str:
    """The installed script: beside this interpreter (the venv's bin), else on the PATH."""
    beside = Path(sys.executable).parent / "idemcount"
    found = str(beside) if beside.exists() else shutil.which("idemcount")
    if found is None:
        pytest.fail("no idemcount script: reinstall the project (pip install -e .)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    return subprocess.run([_script(), *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=env)


def _project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_installed_script_says_its_version_and_explains_up() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["idemcount"] == "cluster.console:main"
    done = _run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"idemcount {_project_version()}", \
        done
    up = _run("up", "--help")
    assert up.returncode == 0, up
    assert " ".join(up.stdout.split()).startswith(f"idemcount up: {COMMANDS['up'].about}")
    for flag in ("--nodes", "--rf", "--base-port", "--data-dir", "--no-secret"):
        assert flag in up.stdout
    done = _run("frobnicate")
    assert done.returncode == 2 and "unknown command 'frobnicate'" in done.stderr
    done = _run("up", "--no-such-flag")
    assert done.returncode == 2 and "--no-such-flag" in done.stderr


def test_the_installed_script_runs_the_simulator_with_its_hash_seed_pinned() -> None:
    """Arguments reach the entry point unchanged, and the simulator's own rule (it re-runs
    itself with PYTHONHASHSEED=0, so a seed replays exactly) still applies."""
    first = _run("sim", "--seed", "3", "--ops", "20", "--nodes", "3")
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run(
        [sys.executable, "-m", "cluster.sim", "--seed", "3", "--ops", "20", "--nodes", "3"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert second.returncode == 0, second.stderr

    def lines(out: str) -> list[str]:  # without the wall-clock times
        return [re.sub(r" real=\S+", "", ln) for ln in out.splitlines() if "seed(s)" not in ln]

    assert lines(first.stdout) == lines(second.stdout) and lines(first.stdout)


def test_version_on_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert console.main(["--version"]) == 0
    want = capsys.readouterr().out
    assert want.startswith("idemcount ")
    for name in COMMANDS:
        assert console.main([name, "--version"]) == 0
        assert capsys.readouterr().out == want, name


def test_help_lists_every_subcommand_with_its_python_m_form(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert console.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, cmd in COMMANDS.items():
        assert f"  {name} " in out
        assert f"python -m {' '.join((cmd.module, *cmd.lead))}" in out
    assert console.main([]) == 2 and "usage: idemcount" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_subcommand_explains_itself_then_lists_its_options(
        name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # or cluster.sim would re-execute this process
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the dispatcher sets argv
    for mod in (COMMANDS[name].module, f"{COMMANDS[name].module}.__main__"):
        # runpy warns when the module it runs as __main__ was imported already (other tests)
        monkeypatch.delitem(sys.modules, mod, raising=False)
    assert console.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith(f"idemcount {name}: {COMMANDS[name].about}"), out
    if COMMANDS[name].options:  # then the entry point's own help follows
        assert "usage:" in out and "--help" in out, out
    if name == "node":
        for flag in ("--id", "--listen", "--peers", "--data-dir", "--rf", "--secret-file",
                     "--config", "--join", "--replace"):
            assert flag in out


def test_only_the_arguments_before_the_separator_are_the_subcommands_own() -> None:
    """``idemcount up -- --version`` passes --version on to every node."""
    assert console._before_separator(["--nodes", "1", "--", "--version"]) == ["--nodes", "1"]
    assert console._before_separator(["--version"]) == ["--version"]
