"""The command line: subcommands with a real --help, one flag name everywhere, the console script, the log lines."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tomllib
from pathlib import Path

import pytest

from orchestrator.__main__ import COMMANDS, Command, build_parser, main
from orchestrator.records.record import Metrics, TrialRecord
from orchestrator.review.report import Progress, one_line, table
from orchestrator.units import fmt_bytes
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["sweep", "report", "export", "calibrate"])
def test_each_subcommand_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    command = next(c for c in COMMANDS if c.name == name)
    assert out.startswith(f"usage: steptune {name}") and command.description.split()[0] in out
    if name != "sweep":
        assert "--results-dir DIR" in out and "--sweep NAME" in out


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(c.name in out and c.help in out for c in COMMANDS)


def test_results_is_a_deprecated_alias_of_results_dir():
    parser = build_parser()
    for name in ("report", "export", "calibrate"):
        assert parser.parse_args([name, "--results", "r1"]).results_dir == "r1"
        assert parser.parse_args([name, "--results-dir", "r2"]).results_dir == "r2"
        assert parser.parse_args([name]).results_dir == "results" and parser.parse_args([name]).sweep is None


def test_a_subcommand_is_one_command_entry(monkeypatch, capsys):
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--n", type=int, default=1)

    monkeypatch.setattr("orchestrator.__main__.COMMANDS", [*COMMANDS, Command(
        "hello", "say hello", "Says hello n times.", add, lambda a: print("hello " * a.n) or 0)])
    assert main(["hello", "--n", "2"]) == 0
    assert capsys.readouterr().out.strip() == "hello hello"


def test_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"steptune": "orchestrator.__main__:main"}


def test_log_lines_go_to_stderr_one_per_message_warnings_prefixed(capsys):
    main(["sweep", "--dry-run", "search.n_trials=4"])  # sets up the console handler
    logging.getLogger("orchestrator.sweep.loop").info("resumed: trial 3")
    logging.getLogger("orchestrator.sweep.loop").warning("MLflow is off")
    err = capsys.readouterr().err.splitlines()
    assert "resumed: trial 3" in err and "warning: MLflow is off" in err
    assert "warning: search.min_trials=12 is more than search.n_trials=4; using search.min_trials=4" in err


def _line(trial: int, kind: str, step_time: float | None, status: str = "ok",
          reason: str | None = None) -> TrialRecord:
    return TrialRecord(sweep="s", trial=trial, kind=kind, backend="ray", params={}, config=TrainConfig().to_dict(),
                       status=status, reason=reason, metrics=Metrics(step_time_s=step_time), meets_target=False,
                       wall_s=1.0, overhead_s=0.1, started_at=0.0, finished_at=1.0)


def _ledger(results: Path, name: str, mtime: float) -> Path:
    path = results / name / "trials.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_line(0, "baseline", 0.5).to_line()) + "\n")
    os.utime(path, (mtime, mtime))
    return path


def test_report_and_export_without_sweep_pick_the_most_recent_ledger_and_say_so(tmp_path, capsys):
    results = tmp_path / "results"
    _ledger(results, "newer", 2_000_000_000)
    _ledger(results, "older", 1_000_000_000)
    assert main(["report", "--results-dir", str(results)]) == 0
    out = capsys.readouterr()
    assert "sweep 'newer': the most recently written ledger" in out.err and "baseline" in out.out
    assert main(["export", "--results-dir", str(results)]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    assert written and all(p.parent == results / "newer" / "export" for p in written)
    assert main(["report", "--results", str(results), "--sweep", "older"]) == 0
    assert "most recently" not in capsys.readouterr().err


def test_report_with_no_ledger_is_one_line_exit_2(tmp_path, capsys):
    assert main(["report", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no sweep ledger under")


def test_a_long_reason_is_one_line_on_the_progress_line_and_in_the_table(tmp_path):
    page = ("lost a rank: The actor died unexpectedly before finishing this task (rank 1)\n"
            "\tclass_name: RankWorker\n\tactor_id: 1234\n\tpid: 99\nThe actor is dead because its worker process "
            "has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits ...")
    line = _line(1, "trial", None, status="failed", reason=page)
    with open(tmp_path / "progress.txt", "w") as stream:
        Progress(4, stream).finished(line, 1, "-", "-")
    shown = (tmp_path / "progress.txt").read_text()
    assert shown.count("\n") == 1 and "The actor died unexpectedly before finishing this task" in shown
    assert "class_name" not in shown
    rows = table([_line(0, "baseline", 0.5), line]).splitlines()
    assert len(rows) == 5 and "lost a rank: The actor died" in rows[2] and "class_name" not in rows[2]
    assert one_line("x" * 200, 50) == "x" * 47 + "..." and one_line(None) == ""


@pytest.mark.parametrize("n,shown", [(None, "-"), (0, "-"), (512, "512 B"), (3 * 2**10, "3.00 KiB"),
                                     (187.4 * 2**20, "187 MiB"), (12.34 * 2**20, "12.3 MiB"),
                                     (1.5 * 2**30, "1.50 GiB"), (90.1 * 2**30, "90.1 GiB"),
                                     (1023 * 2**20, "1023 MiB")])
def test_sizes_are_written_at_their_scale(n, shown):
    assert fmt_bytes(n) == shown
