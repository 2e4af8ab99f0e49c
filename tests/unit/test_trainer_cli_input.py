"""``python -m trainer``'s front door, as a user meets it in a shell: a plain --help, and a bad --config file refused in
one line naming the file (exit 2), not a traceback. Subprocesses, so the exit status and stderr are the real ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _trainer(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_help_is_plain_text():
    proc = _trainer("--help")
    assert proc.returncode == 0, proc.stderr
    assert "`" not in proc.stdout and "usage: python -m trainer" in proc.stdout
    assert "--config FILE" in proc.stdout and "KEY=VALUE" in proc.stdout


@pytest.mark.parametrize("name,text,says", [
    ("missing.yaml", None, "--config {path}: no such file"),
    ("broken.yaml", "model:\n  d_model: [64,\n", "--config {path}: not valid YAML at line 3, column 1"),
    ("tabs.yaml", "model:\n\td_model: 64\n", "--config {path}: not valid YAML at line 2"),
])
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, name, text, says):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    proc = _trainer("--config", str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says.format(path=path) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout
