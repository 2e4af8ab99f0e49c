"""The commands steptune prints for the user to run next run as shown, with or without the venv on PATH
(orchestrator/commands.py): a table over fake bin directories, then the real printed commands run in a shell whose
PATH lacks the venv."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands import invocation, mlflow, steptune

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NO_VENV = "/usr/local/bin:/usr/bin:/bin"
"""A PATH as in a shell where the virtual environment was never activated."""


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A project directory holding .venv/bin/{python, steptune}."""
    bin_dir = tmp_path / "proj" / ".venv" / "bin"
    _script(bin_dir / "python")
    _script(bin_dir / "steptune")
    return tmp_path / "proj"


def test_the_bare_name_when_path_finds_this_interpreters_script(venv):
    python = str(venv / ".venv" / "bin" / "python")
    on_path = f"{venv / '.venv' / 'bin'}:{NO_VENV}"
    assert invocation("steptune", "orchestrator", path=on_path, executable=python, cwd=venv) == "steptune"


def test_the_interpreter_relative_to_the_cwd_when_path_lacks_the_venv(venv):
    python = str(venv / ".venv" / "bin" / "python")
    assert invocation("steptune", "orchestrator", path=NO_VENV, executable=python,
                      cwd=venv) == ".venv/bin/python -m orchestrator"
    # mlflow is not even installed as a script in this venv: the module still runs through the interpreter.
    assert invocation("mlflow", "mlflow", path=NO_VENV, executable=python, cwd=venv) == ".venv/bin/python -m mlflow"


def test_the_absolute_interpreter_when_the_cwd_is_elsewhere(venv, tmp_path):
    python = str(venv / ".venv" / "bin" / "python")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert invocation("steptune", "orchestrator", path=NO_VENV, executable=python,
                      cwd=elsewhere) == f"{python} -m orchestrator"


def test_another_install_on_path_is_not_this_one(venv, tmp_path):
    """A `steptune` on PATH from another environment would run other code (or none of this checkout's)."""
    other = _script(tmp_path / "other" / "bin" / "steptune")
    python = str(venv / ".venv" / "bin" / "python")
    assert invocation("steptune", "orchestrator", path=f"{other.parent}:{NO_VENV}", executable=python,
                      cwd=venv) == ".venv/bin/python -m orchestrator"


def test_an_interpreter_in_the_cwd_itself_is_not_looked_up_on_path(tmp_path):
    python = _script(tmp_path / "python")
    assert invocation("steptune", "orchestrator", path=NO_VENV, executable=str(python),
                      cwd=tmp_path) == "./python -m orchestrator"


def test_a_path_with_a_space_is_quoted(tmp_path):
    python = _script(tmp_path / "my env" / "bin" / "python")
    shown = invocation("mlflow", "mlflow", path=NO_VENV, executable=str(python), cwd=tmp_path)
    assert shown == "'my env/bin/python' -m mlflow" and shlex.split(shown)[0] == "my env/bin/python"


# ---- the real printed commands, in a shell without the venv on PATH ----------------------------------------

def _printed(expr: str) -> str:
    """What a fresh process started as the CLI is (cwd: the repository root, PATH without the venv) prints for
    ``expr``: the sweep's `again:` line is ``orchestrator.__main__.next_command('report', ...)``."""
    proc = subprocess.run([sys.executable, "-c", f"from orchestrator import commands; print({expr})"], cwd=ROOT,
                          env={"PATH": NO_VENV}, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.strip()


@pytest.mark.skipif(shutil.which("steptune", path=NO_VENV) is not None, reason="a steptune on the system PATH")
def test_the_printed_report_command_runs_as_shown_without_the_venv(tmp_path):
    """The sweep's `again:` line (`<prefix> report --sweep NAME --results-dir DIR`) on a real ledger, in a shell
    whose PATH lacks the venv: it must not need `steptune` on PATH."""
    prefix = _printed("commands.steptune()")
    assert prefix != "steptune" and prefix.endswith(" -m orchestrator")
    assert os.path.join(ROOT, shlex.split(prefix)[0]) == os.path.abspath(sys.executable)  # this interpreter
    results = tmp_path / "my results"  # a space: the printed line quotes it
    (results / "default").mkdir(parents=True)
    shutil.copy(FIXTURES / "ledger_v1.jsonl", results / "default" / "trials.jsonl")
    line = _printed(f"__import__('orchestrator.__main__').__main__.next_command('report', 'default', {str(results)!r})")
    assert line == f"{prefix} report --sweep default --results-dir {shlex.quote(str(results))}"
    proc = subprocess.run(line, shell=True, cwd=ROOT, env={"PATH": NO_VENV}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "baseline" in proc.stdout


@pytest.mark.skipif(shutil.which("mlflow", path=NO_VENV) is not None, reason="an mlflow on the system PATH")
def test_the_printed_mlflow_prefix_runs_as_shown_without_the_venv():
    prefix = _printed("commands.mlflow()")
    assert prefix != "mlflow" and prefix.endswith(" -m mlflow")
    proc = subprocess.run(f"{prefix} --version", shell=True, cwd=ROOT, env={"PATH": NO_VENV}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "version" in proc.stdout, proc.stderr


def test_in_this_process_the_prefix_follows_path(monkeypatch):
    bin_dir = str(Path(os.path.abspath(sys.executable)).parent)
    monkeypatch.setenv("PATH", NO_VENV)
    assert steptune().endswith(" -m orchestrator") and mlflow().endswith(" -m mlflow")
    monkeypatch.setenv("PATH", f"{bin_dir}:{NO_VENV}")
    if (Path(bin_dir) / "steptune").exists():  # installed by `pip install -e .`
        assert steptune() == "steptune"
    if (Path(bin_dir) / "mlflow").exists():
        assert mlflow() == "mlflow"
