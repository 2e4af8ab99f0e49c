"""Issue 10, items 9-15: bad input is one line, exit 2, nothing written; the faults around the baseline.

Each test states the outcome it holds the code to. Tiny sweeps (conftest.TINY_SWEEP), few trials.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import ray
from optuna.trial import TrialState

from orchestrator.__main__ import main
from orchestrator.sweep.config import load_sweep
from orchestrator.records.ledger import Ledger
from orchestrator.sweep.loop import SweepError, run_sweep

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_9_a_malformed_sweep_yaml_is_one_line_naming_the_file_and_where(tmp_path, capsys):
    """Outcome: exit 2, one line naming the file, the line/column and the fix; no traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsearch:\n  n_trials: 3\n   wall_time_s: [1, 2\n")
    assert main(["sweep", "--config", str(bad)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(bad) in line and "not valid YAML at line 4" in line and "fix the file" in line


@pytest.mark.parametrize("dry_run", [True, False])
def test_9_an_unwritable_results_dir_is_one_line_naming_the_field(sweep_file, capsys, dry_run):
    """Outcome: exit 2 before anything launches, naming storage.results_dir and the fix."""
    argv = ["sweep", "--config", str(sweep_file()), "storage.results_dir=/dev/null/x"]
    assert main(argv + (["--dry-run"] if dry_run else [])) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "storage.results_dir=/dev/null/x" in line and "set storage.results_dir to a writable directory" in line


@pytest.mark.timeout(120)
def test_10_a_bad_ray_address_writes_nothing(sweep_file, tmp_path):
    """Outcome: exit 2, one line naming ray.address; no optuna.db, mlflow.db, sweep.yaml, ledger or lock."""
    path = sweep_file(tracking={"enabled": True})
    # A subprocess: this test process may already hold a Ray, which a driver reuses whatever the address.
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--config", str(path),
                           "ray.address=127.0.0.1:1"], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ray.address=127.0.0.1:1: nothing answers there" in one_error_line(proc.stderr)
    results = tmp_path / "results"
    assert not results.exists(), sorted(str(p) for p in results.rglob("*"))


@pytest.mark.timeout(120)
def test_10_a_refused_run_keeps_the_old_sweep_yaml_and_names_the_real_results_dir(ray_address, sweep_file,
                                                                                   capsys):
    """Outcome: a corrupt ledger (exit 2) or a study made for another sweep (exit 1) leaves sweep.yaml as it
    was, so `report` still judges by the old target; the mismatch names the results dir actually in use."""
    path = sweep_file()
    cfg = load_sweep(path)
    cfg.results_dir.mkdir(parents=True)
    saved = cfg.results_dir / "sweep.yaml"
    saved.write_text("target: {step_time_s: 1.0}\n")
    ledger = cfg.results_dir / "trials.jsonl"
    ledger.write_text("{not json\n")
    assert main(["sweep", "--config", str(path), "target.step_time_s=0.5"]) == 2
    assert "trials.jsonl:1: not a JSON line" in one_error_line(capsys.readouterr().err)
    assert saved.read_text() == "target: {step_time_s: 1.0}\n"

    ledger.unlink()
    study = optuna.create_study(study_name=cfg.name, storage=cfg.optuna_url)
    study.set_user_attr("fingerprint", "made-by-another-sweep")
    assert main(["sweep", "--config", str(path), "target.step_time_s=0.5"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"delete {cfg.results_dir} and the study" in line
    assert saved.read_text() == "target: {step_time_s: 1.0}\n"


def test_11_a_budget_below_min_trials_is_capped_with_a_note(caplog, capsys):
    """Outcome: `sweep search.n_trials=4` on the default file (min_trials 12) is accepted with min_trials=4."""
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        cfg = load_sweep(None, ["search.n_trials=4"])
    assert cfg.search.min_trials == 4 and cfg.raw["search"]["min_trials"] == 4
    assert "search.min_trials=12 is more than search.n_trials=4; using search.min_trials=4" in caplog.text
    assert main(["sweep", "--dry-run", "search.n_trials=4"]) == 0
    assert "budget 4 trials" in capsys.readouterr().out


def test_12_report_and_export_default_to_the_most_recent_ledger(tmp_path, capsys):
    """Outcome (README and code agree): without --sweep, the most recently written ledger, named on stderr."""
    from tests.unit.test_cli import _ledger

    results = tmp_path / "results"
    _ledger(results, "b-newer", 2_000_000_000)
    _ledger(results, "a-older", 1_000_000_000)
    for command in ("report", "export"):
        assert main([command, "--results-dir", str(results)]) == 0
        assert "sweep 'b-newer': the most recently written ledger" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_13_a_lost_rank_is_one_line_and_rays_page_stays_off_the_terminal(ray_address, sweep_file, capfd):
    """Outcome: the progress line and the table show one line; the ledger keeps Ray's whole text; Ray's own
    "A worker died or was killed ..." paragraph is not printed by the driver."""
    from orchestrator.backends.ray_runner import _outcome
    from orchestrator.review.report import one_line
    from orchestrator.backends.workers import WorkerGroup

    cfg = load_sweep(sweep_file(), ["trainer.run.steps=2000"])
    configs = cfg.built.configs
    group = WorkerGroup(2, 1, 0, "STRICT_PACK", configs.device, start_timeout_s=60)
    group.start()
    try:
        # This group's own rank (never a process found by name: other sweeps may run on this machine).
        pid = ray.get(group.actors[1].node.remote(), timeout=30)["pid"]
        group.submit(configs.baseline.to_dict(), timeout_s=60)
        _wait_until_running(pid, timeout_s=30)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 30
        while (run := group.collect()) is None and time.time() < deadline:
            time.sleep(0.1)
        assert run is not None and run.kind == "lost_rank"
        outcome = _outcome(configs.baseline, run)
        time.sleep(3)  # the raylet's error page reaches the driver a moment after the actor's death
    finally:
        group.kill()
    assert outcome.status == "failed" and "\n" in outcome.reason  # the whole page, for the ledger
    shown = one_line(outcome.reason)
    assert shown.startswith("lost a rank: ") and "\n" not in shown and len(shown) <= 120
    out, err = capfd.readouterr()
    assert "A worker died or was killed" not in out + err
    assert "The actor died unexpectedly" not in out + err


def _wait_until_running(pid: int, timeout_s: float) -> None:
    """Until the actor process retitles itself ray::RankWorker.run (inside the run)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RankWorker.run"):
            return
        time.sleep(0.05)
    raise AssertionError(f"rank pid {pid} did not start its run")


@pytest.mark.timeout(180)
def test_14_15_a_baseline_over_the_memory_budget_is_infeasible_in_mib_and_not_counted(ray_address, sweep_file):
    """Outcome: the stop names memory and the measured peak in MiB (not "did not run", not "0.00 GiB"); the
    attempt is FAIL in Optuna (not counted against the budget), the baseline is queued again, nothing RUNNING."""
    # A budget of 1/10 MiB: the tiny model's measured peak is about 1 MiB.
    cfg = load_sweep(sweep_file(), ["resources.memory_budget_gb=0.0001"])
    with pytest.raises(SweepError) as e:
        run_sweep(cfg)
    msg = str(e.value)
    assert "the baseline (trial 0) ran but is infeasible: memory: peak " in msg, msg
    assert re.search(r"peak \d+(\.\d+)? (KiB|MiB) > resources\.memory_budget_gb=0\.0001 GiB", msg), msg
    assert "0.00 GiB" not in msg and "did not run" not in msg
    (line,) = [r for r in Ledger(cfg.results_dir / "trials.jsonl").read() if r.kind == "baseline"]
    assert line.status == "infeasible" and line.metrics.peak_memory_bytes > 2**19
    trials = optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url).trials
    assert [(t.state, t.user_attrs["kind"]) for t in trials] == [(TrialState.FAIL, "baseline"),
                                                                 (TrialState.WAITING, "baseline")]
    assert trials[0].user_attrs["status"] == "infeasible"


@pytest.mark.timeout(180)
def test_15_a_trial_asked_before_the_baseline_waits_for_it_and_none_is_left_running(ray_address, sweep_file):
    """Outcome: a trial queued ahead of the (re-queued) baseline goes back to the queue instead of stopping the
    sweep with a trial left RUNNING; the baseline is measured first and the budget counts only finished trials."""
    from orchestrator.sweep.loop import Sweep

    cfg = load_sweep(sweep_file(), ["search.n_trials=2"])
    first = Sweep(cfg)
    first.study.study.enqueue_trial({"parallel.pp": 1, "batch.micro_batch_size": 2}, user_attrs={"kind": "trial"})
    first.study.release()
    summary, lines = run_sweep(cfg)
    lines = [r for r in lines if r.kind != "canonical"]  # the trust chain's reference run comes first
    assert [(r.kind, r.status) for r in lines] == [("baseline", "ok"), ("trial", "ok")], lines
    assert lines[1].params["parallel.pp"] == 1 and summary["baseline_trial"] == lines[0].trial
    states = [t.state for t in optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url).trials]
    assert TrialState.RUNNING not in states and states.count(TrialState.COMPLETE) == 2
