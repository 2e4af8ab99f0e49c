"""How the commands steptune prints for the user to run next are spelled, so that they run as shown.

A hint such as ``steptune report --sweep NAME`` or ``mlflow ui ...`` fails with "command not found" in a shell
where the virtual environment is not activated (``make sweep`` runs ``.venv/bin/python`` without activating it).
``invocation`` says how this shell reaches a console script of this interpreter: by its bare name when ``PATH``
finds exactly this interpreter's script, else through the interpreter itself (``.venv/bin/python -m
orchestrator``), which needs nothing on ``PATH``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def invocation(script: str, module: str, *, path: str | None = None, executable: str | None = None,
               cwd: Path | None = None) -> str:
    """The shell words that run console script ``script`` (or ``python -m module``) of this interpreter.

    ``script`` when ``PATH`` resolves it to this interpreter's bin directory's entry (an activated venv, or an
    install on ``PATH``); otherwise the interpreter's path with ``-m module``: relative to the working directory
    when the interpreter lies inside it (``.venv/bin/python -m orchestrator``), else absolute. ``path``,
    ``executable`` and ``cwd`` default to this process's ``PATH``, ``sys.executable`` and working directory.
    """
    python = Path(os.path.abspath(executable or sys.executable or "python"))  # abspath: a venv's python is a symlink
    ours = python.parent / script
    found = shutil.which(script, path=path if path is not None else os.environ.get("PATH", os.defpath))
    if found and ours.exists() and os.path.samefile(found, ours):
        return script
    here = Path(os.path.abspath(cwd or os.getcwd()))
    shown = python.relative_to(here).as_posix() if python.is_relative_to(here) else str(python)
    if "/" not in shown:  # a bare name would be looked up on PATH: say it is the file here
        shown = f"./{shown}"
    return f"{shlex.quote(shown)} -m {module}"


def steptune() -> str:
    """``steptune``, or ``.venv/bin/python -m orchestrator`` where this shell would not find it."""
    return invocation("steptune", "orchestrator")


def mlflow() -> str:
    """``mlflow``, or ``.venv/bin/python -m mlflow`` where this shell would not find it."""
    return invocation("mlflow", "mlflow")


def subcommand(name: str, sweep: str, results_dir: str | Path, *extra: str) -> str:
    """``steptune NAME --sweep SWEEP [--results-dir DIR] [EXTRA ...]``, spelled so that this shell can run it as
    printed (the results directory only when it is not the default ``results``)."""
    where = "" if str(results_dir) == "results" else f" --results-dir {shlex.quote(str(results_dir))}"
    tail = "".join(f" {shlex.quote(x)}" for x in extra)
    return f"{steptune()} {name} --sweep {shlex.quote(sweep)}{where}{tail}"
