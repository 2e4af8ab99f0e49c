"""Real sweeps on a real local Ray: trials on warm worker groups, failures isolated, a killed driver resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from orchestrator.sweep.config import load_sweep
from orchestrator.records.ledger import Ledger
from orchestrator.records.record import LINE_KEYS, line_bytes
from orchestrator.sweep.loop import run_sweep

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def study_of(cfg) -> optuna.Study:
    return optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url)


def measured_lines(ledger: Ledger) -> list[dict]:
    return [r for r in ledger.read() if r.kind in ("baseline", "trial")]


def _parent(pid: int) -> int:
    stat = (Path("/proc") / str(pid) / "stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces


def rank_pids(title: bytes = b"ray::RankWorker") -> set[int]:
    """This session's RankWorker actor processes (Ray titles them ray::RankWorker, and ray::RankWorker.run inside
    a run). Only descendants of this test process (its embedded Ray's raylet starts them): on a shared machine
    other sweeps' ranks carry the same title and must never be signalled."""
    me, pids = os.getpid(), set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if not (d / "cmdline").read_bytes().startswith(title):
                    continue
                pid = int(d.name)
                while pid > 1 and pid != me:
                    pid = _parent(pid)
                if pid == me:
                    pids.add(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return pids


@pytest.mark.timeout(240)
def test_sweep_measures_trials_on_a_warm_group_and_reports(ray_address, sweep_file, capsys):
    cfg = load_sweep(sweep_file(pruning={"enabled": True, "after_steps": 2, "slower_than_best": 1.2}),
                     ["search.n_trials=5", "target.step_time_s=1e-6", "tracking.enabled=true", "trainer.run.steps=8",
                      "trainer.run.profile_step=0"])
    summary, records = run_sweep(cfg)
    lines = Ledger(cfg.results_dir / "trials.jsonl").read()
    assert lines == records and lines[0].kind == "canonical" and lines[0].status == "ok"
    lines = lines[1:]  # after the canonical reference run of the baseline's maths (orchestrator.parity.trust)
    assert len(lines) == 5
    assert lines[0].kind == "baseline" and lines[0].trial == 0 and lines[0].status == "ok"
    assert lines[0].parity.passed and lines[0].metrics.speedup_vs_baseline == 1.0
    raw = Ledger(cfg.results_dir / "trials.jsonl").lines()
    assert all(set(LINE_KEYS) <= set(line) and line["schema"] == 2 for line in raw)  # what the file holds, typed or not
    # Lean lines: a measured trial's 2-rank run is a few KB; its detail (spans, per-rank steps) lies beside it.
    measured = [line for line in raw if line["result"] is not None]
    assert all((cfg.results_dir / line["detail"]).is_file() and "ranks" not in line["result"] for line in measured)
    # Lean lines: a few KB, not the 25-47 KB of per-rank spans a line held before (issue 20's goal of a typical
    # line <= 4 KB is measured on the default sweep: docs/testing.md, 3,962 B median). This sweep's lines also
    # carry probes and a profiled step, so the bound here is 4.5 KB median, 5 KB each; the references keep
    # their per-step series (docs/architecture.md).
    sizes = sorted(line_bytes(line) for line in measured if line["kind"] not in ("baseline", "canonical"))
    assert sizes[len(sizes) // 2] <= 4608 and sizes[-1] <= 5120, \
        [(line["trial"], line["kind"], line_bytes(line)) for line in measured]
    assert sorted(r.trial for r in lines) == list(range(5))
    for r in lines:
        assert r.status in ("ok", "infeasible", "pruned", "skipped"), r.reason
        assert r.config["parallel"]["pp"] * r.config["parallel"]["dp"] == 2 and not r.meets_target
        if r.status == "skipped":  # TPE proposed a config already measured: reused, not re-run
            first = lines[r.duplicate_of]
            assert first.params == r.params and first.metrics.step_time_s == r.metrics.step_time_s
        else:
            assert r.result.world_size == 2 and r.wall_s > 0 and r.overhead_s is not None
            # run.profile_step: each rank's trace came back from its actor and lies beside the ledger.
            traces = [Path(p) for p in r.artifacts]
            assert [p.name for p in traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
            assert all(p.parent.parent == cfg.results_dir / "traces" and p.stat().st_size > 1000 for p in traces)
            assert sorted(k.trace_file for k in r.result.ranks) == r.artifacts
    study = study_of(cfg)
    states = [t.state for t in study.trials]
    assert len(states) == 5 and set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert study.trials[0].user_attrs["kind"] == "baseline"
    assert all(set(t.user_attrs["constraints"]) == {"crash", "parity", "memory"} for t in study.trials)
    assert summary["stopped_because"] == "the trial budget is spent" and not summary["target_met"]
    # Warm: one worker group for the canonical run and every trial (a rebuild per trial used to pass unseen).
    assert summary["group_builds"] == 1
    # MLflow mirrors the ledger: a parent run and one child per line.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("steptune").experiment_id])
    assert len(runs) == 7  # the parent, the canonical run and the 5 trials
    baseline_run = next(x for x in runs if x.data.tags.get("steptune.kind") == "baseline")
    assert {a.path for a in client.list_artifacts(baseline_run.info.run_id, "traces")} == {
        "traces/rank0.pt.trace.json.gz", "traces/rank1.pt.trace.json.gz"}
    # The report command prints the same table from the ledger alone.
    from orchestrator.__main__ import main

    capsys.readouterr()
    assert main(["report", "--sweep", "t", "--results", cfg.storage.results_dir]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "per-trial overhead" in out and "target not met" in out
    # ... and the export command writes the best trial's configs.
    assert main(["export", "--sweep", "t", "--results", cfg.storage.results_dir]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    assert written and all(p.exists() for p in written)
    # The summary names the exported trial's MLflow run, looked up in the sweep's store by its tags.
    summary_md = next(p for p in written if p.name == "summary.md").read_text()
    trial, kind = summary_md.split(", trial ")[1].split("\n")[0].split()
    child = next(x for x in runs if x.data.tags.get("steptune.trial") == trial  # the canonical run shares trial 0
                 and x.data.tags.get("steptune.kind") == kind.strip("()"))
    assert f"- MLflow run: `{child.info.run_id}`" in summary_md


@pytest.mark.timeout(240)
def test_killed_driver_resumes_without_losing_or_duplicating_trials(ray_address, sweep_file, tmp_path):
    path = sweep_file()
    cmd = [sys.executable, "-m", "orchestrator", "sweep", "--config", str(path), f"ray.address={ray_address}",
           "search.n_trials=6", "trainer.run.steps=12"]
    cfg = load_sweep(path, cmd[6:])
    ledger = Ledger(cfg.results_dir / "trials.jsonl")
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    # Kill once the baseline and a trial are measured and the next run is in flight on the ranks: tied to
    # what the driver is doing, not to a sleep, so a faster machine cannot run the whole sweep first.
    deadline = time.time() + 150
    while proc.poll() is None and time.time() < deadline:
        if len(measured_lines(ledger)) >= 2 and rank_pids(b"ray::RankWorker.run"):
            break
        time.sleep(0.01)
    assert proc.poll() is None, (tmp_path / "first.log").read_text()
    proc.kill()
    proc.wait()
    killed_at = len(measured_lines(ledger))
    assert 2 <= killed_at < 6, (tmp_path / "first.log").read_text()
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    lines = ledger.read()
    measured = [r for r in lines if r.kind in ("baseline", "trial")]
    numbers = [r.trial for r in measured]
    assert len(numbers) == len(set(numbers)) == 6, numbers
    study = study_of(cfg)
    done = {t.number: t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    assert set(done) == set(numbers)
    for r in measured:  # what Optuna learnt is what the ledger measured
        assert done[r.trial].params == r.params
        assert done[r.trial].user_attrs["status"] == r.status
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(failed) <= 1  # the trial the kill interrupted, if it landed inside one
    for t in failed:
        # The kill may land while the trial's params were still being drawn (each suggest is a storage write):
        # the params drawn so far are queued again and ran; the sampler drew the rest.
        again = [u for u in study.trials if u.user_attrs.get("requeued_from") == t.number]
        assert len(again) == 1 and again[0].number in done, [(u.number, u.state) for u in again]
        assert t.params.items() <= again[0].params.items(), (t.params, again[0].params)
        assert "interrupted; its params are queued again" in second.stderr  # a log line


@pytest.mark.timeout(240)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the impossible config is run.device=cuda on a CPU-only machine")
def test_failing_trials_are_recorded_and_the_sweep_goes_on(ray_address, sweep_file, monkeypatch):
    """A config that raises on every rank, a rank killed mid-sweep, a rank that hangs past the timeout."""
    from orchestrator.sweep import timeouts

    # The hung trial waits out max(floor, MEASURED_MULTIPLE x the slowest ok wall) x load: 5 x the canonical
    # run's ~4 s cold wall made it ~22 s (38 s under load), most of the test. 2x keeps the 10 s floor in force
    # (still ~2x any healthy run here); the multiple's own rule is tests/unit/test_timeouts.py's.
    monkeypatch.setattr(timeouts, "MEASURED_MULTIPLE", 2.0)
    space = {"params": {
        "parallel.pp": {"type": "categorical", "choices": [1, 2]},
        "batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4]},
        # Valid for the trainer's config checks, impossible on a CPU-only machine: fails inside run() on each rank.
        "run.device": {"type": "categorical", "choices": ["cpu", "cuda"], "when": {"batch.micro_batch_size": 4}},
    }}
    path = sweep_file(space=space, baseline={"parallel.pp": 2, "batch.micro_batch_size": 2},
                      enqueue=[{"parallel.pp": 1, "batch.micro_batch_size": 4, "run.device": "cuda"}],
                      resources={"world_size": 2, "cpus_per_rank": 1, "trial_timeout_s": 10})  # a 12-step run: ~0.5 s idle
    cfg = load_sweep(path, ["search.n_trials=7", "sampler.kind=random", "trainer.run.steps=12"])
    ledger = Ledger(cfg.results_dir / "trials.jsonl")
    hit: list[int] = []
    done = threading.Event()

    def sabotage() -> None:
        # The first trial to run after the cuda one loses a rank (SIGKILL inside its run); the next trial to run
        # after that hangs (SIGSTOP inside its run) until the trial timeout. Only a rank first seen running after
        # the threshold is hit, never one of an earlier, failed group that is still being torn down.
        first_seen: dict[int, int] = {}
        threshold = 2
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            target = None
            while target is None:
                if done.is_set():
                    return
                n = len(measured_lines(ledger))
                running = rank_pids(b"ray::RankWorker.run")
                for pid in running:
                    first_seen.setdefault(pid, n)
                target = next((p for p in sorted(running) if first_seen[p] >= threshold and p not in hit), None)
                time.sleep(0.05)  # a /proc scan takes 10-40 ms on 2 cores: polling harder starves the ranks
            os.kill(target, sig)
            hit.append(target)
            threshold = n + 1

    saboteur = threading.Thread(target=sabotage, daemon=True)
    saboteur.start()
    try:
        summary, lines = run_sweep(cfg)
    finally:
        done.set()
        saboteur.join(timeout=5)
        for pid in hit:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert lines[0].kind == "canonical" and lines[0].status == "ok"
    lines = lines[1:]
    statuses = [(r.trial, r.status, r.reason) for r in lines]
    assert len(lines) == 7 and lines[0].status == "ok", statuses
    cuda = lines[1]
    assert cuda.params["run.device"] == "cuda" and cuda.status == "failed", statuses
    assert "rank" in cuda.reason, cuda.reason
    assert any(s == "failed" and "lost a rank" in (why or "") for _, s, why in statuses), statuses
    assert any(s == "timeout" for _, s, _ in statuses), statuses
    assert any(s == "ok" for _, s, _ in statuses[3:]), statuses  # the rebuilt group measures again
    study = study_of(cfg)
    for t in study.trials:  # crashes are told as complete-with-constraint, never FAIL (no re-sampling)
        assert t.state == TrialState.COMPLETE
        assert (t.user_attrs["constraints"]["crash"] > 0) == (t.user_attrs["status"] in ("failed", "timeout"))
    assert json.dumps(summary)


@pytest.mark.timeout(60)
def test_resume_tells_a_measured_trial_from_the_ledger_and_requeues_an_unmeasured_one(sweep_file):
    """The two ways a driver dies mid-trial: after its ledger line (told from the ledger) or before (re-queued)."""
    from orchestrator.records.record import Metrics, TrialRecord
    from orchestrator.search.space import suggest
    from orchestrator.sweep.loop import Sweep

    cfg = load_sweep(sweep_file(), ["search.n_trials=4"])
    first = Sweep(cfg)
    first.recover()  # a new study: the baseline is queued
    measured = first.study.ask()
    params, _ = suggest(measured, cfg.space, first.backend.configs.fixed, first.backend.configs.split_context)
    first.ledger.append(TrialRecord(sweep="t", trial=measured.number, kind="baseline", backend="ray", params=params,
                                    config={}, status="ok", reason=None, metrics=Metrics(step_time_s=0.5),
                                    meets_target=False, wall_s=1.0, overhead_s=0.1, started_at=0.0, finished_at=1.0))
    lost = first.study.ask()
    lost_params, _ = suggest(lost, cfg.space, first.backend.configs.fixed, first.backend.configs.split_context)
    half = first.study.ask()
    with pytest.raises(KeyboardInterrupt):  # killed after its first suggest, before the rest were drawn
        suggest(_DiesAfter(half, 1), cfg.space, first.backend.configs.fixed, first.backend.configs.split_context)
    drawn = study_of(cfg).trials[2].params
    assert len(drawn) == 1 and len(lost_params) > 1
    # ... the driver dies here: trial 0 has its ledger line but was never told, trials 1 and 2 have neither.
    again = Sweep(cfg)
    again.recover()
    trials = study_of(cfg).trials
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == 0.5
    assert trials[1].state == trials[2].state == TrialState.FAIL
    assert trials[3].state == TrialState.WAITING and trials[3].user_attrs["requeued_from"] == 1
    assert trials[3].system_attrs["fixed_params"] == lost_params  # what enqueue_trial stores for the next ask
    assert trials[4].state == TrialState.WAITING and trials[4].user_attrs["requeued_from"] == 2
    assert trials[4].system_attrs["fixed_params"] == drawn
    assert len(trials) == 5  # the baseline is measured, so it is not queued again
    # Re-asked, the half-drawn trial keeps the param it had and gets the rest from the sampler.
    again.study.ask()
    redo = again.study.ask()
    params, _ = suggest(redo, cfg.space, again.backend.configs.fixed, again.backend.configs.split_context)
    assert redo.number == 4 and drawn.items() <= params.items() and len(params) > len(drawn)


class _DiesAfter:
    """An Optuna trial whose driver is killed after ``n`` suggests."""

    def __init__(self, trial, n):
        self.trial, self.left = trial, n

    def __getattr__(self, name):
        method = getattr(self.trial, name)

        def call(*args, **kwargs):
            if self.left == 0:
                raise KeyboardInterrupt
            self.left -= 1
            return method(*args, **kwargs)
        return call


@pytest.mark.timeout(120)
def test_a_met_target_is_settled_and_a_finished_sweep_stays_finished(ray_address, sweep_file):
    cfg = load_sweep(sweep_file(), ["search.n_trials=8", "target.step_time_s=30", "winner.max_rounds=3"])
    summary, lines = run_sweep(cfg)
    # The baseline's own run meets a 30 s target: the target check settles it met (one run, far under it).
    assert [(r.kind, r.trial) for r in lines] == [("canonical", 0), ("baseline", 0)]
    assert summary["target_verdict"] == "met" and summary["best"]["trial"] == 0
    assert summary["stopped_because"].startswith("settling rounds found the target met: trial 0")
    assert (cfg.results_dir / "run.json").is_file()
    again, more = run_sweep(cfg)  # rerunning a finished sweep runs nothing and names the same answer
    assert len(more) == len(lines) and again["already_finished"] == 8
    assert again["best"]["trial"] == 0 and again["stopped_because"] == summary["stopped_because"]


def test_the_winner_is_settled_by_real_interleaved_rounds(ray_address, sweep_file):
    # Three configs of the tiny model, each run once; with single runs assumed to vary by 200% they cannot be
    # told apart, so rounds of the baseline and the top run (for real, on the warm group) before the answer.
    space = {"params": {"data_parallel.bucket_mb": {"type": "categorical", "choices": [0.02, 50.0, 100.0]}}}
    cfg = load_sweep(sweep_file(space=space, baseline={"parallel.pp": 1, "batch.micro_batch_size": 2},
                                enqueue=[{"data_parallel.bucket_mb": 50.0}, {"data_parallel.bucket_mb": 100.0}]),
                     ["search.n_trials=3", "winner.max_rounds=2", "winner.min_rounds=2",
                      "winner.single_run_spread=1.9"])
    summary, lines = run_sweep(cfg)
    repeats = [r for r in lines if r.kind == "repeat"]
    assert {r.round for r in repeats} == {1, 2}
    for k in (1, 2):  # every round holds the baseline (trial 0) and at least one contender, once each
        trials = [r.trial for r in repeats if r.round == k]
        assert trials.count(0) == 1 and len(trials) == len(set(trials)) >= 2
    assert all(r.status == "ok" and r.parity.passed and r.result is not None and r.load_1m is not None
               for r in repeats)
    assert summary["answer"]["rounds"] == 2 and summary["baseline_runs"] == 3
    assert Ledger(cfg.results_dir / "trials.jsonl").read() == lines
    again, more = run_sweep(cfg)  # finished: a rerun measures nothing more
    assert len(more) == len(lines)


@pytest.mark.timeout(240)
def test_report_export_and_mlflow_name_one_answer(ray_address, sweep_file, capsys):
    """A real sweep settled in rounds: the summary's best, the table's rank 1 (and its * mark), the default
    export, the MLflow parent's tags and description and its children (one per ledger line) name one answer."""
    from mlflow.tracking import MlflowClient

    from orchestrator.__main__ import main

    space = {"params": {"data_parallel.bucket_mb": {"type": "categorical", "choices": [0.02, 50.0, 100.0]}}}
    cfg = load_sweep(sweep_file(space=space, baseline={"parallel.pp": 1, "batch.micro_batch_size": 2},
                                enqueue=[{"data_parallel.bucket_mb": 50.0}, {"data_parallel.bucket_mb": 100.0}]),
                     ["search.n_trials=3", "winner.max_rounds=2", "winner.min_rounds=2",
                      "winner.single_run_spread=1.9", "tracking.enabled=true", "target.step_time_s=10",
                      "search.min_trials=3"])
    summary, lines = run_sweep(cfg)
    best = summary["best"]
    assert any(r.kind == "repeat" for r in lines) and summary["target_met"]
    results = cfg.storage.results_dir
    capsys.readouterr()
    assert main(["report", "--sweep", "t", "--results", results]) == 0
    out = capsys.readouterr().out
    assert f"best (trial {best['trial']}): {best['describe']}" in out
    assert f"target met: trial {best['trial']}, {best['describe']} <= 10.000 s" in out
    rank1 = next(line for line in out.splitlines() if line.startswith("1 ") or line.startswith("1= "))
    assert rank1.split()[1] == str(best["trial"]) and f"({best['runs']})" in rank1 and "ok *" in rank1
    assert main(["export", "--sweep", "t", "--results", results]) == 0
    summary_md = next(Path(p) for p in capsys.readouterr().out.split() if p.endswith("summary.md")).read_text()
    assert summary_md.startswith(f"# steptune export: sweep `t`, trial {best['trial']} ")
    assert f"(the sweep's best), by {best['describe']}" in summary_md
    client = MlflowClient(cfg.mlflow_uri)
    exp = client.get_experiment_by_name("steptune").experiment_id
    parent = client.search_runs([exp], "tags.\"steptune.role\" = 'parent'")[0]
    assert parent.data.metrics["best_step_time_s"] == pytest.approx(best["step_time_s"])
    assert parent.data.tags["steptune.best_trial"] == str(best["trial"])
    assert parent.data.tags["steptune.target_verdict"] == "met"
    assert f"best (trial {best['trial']})" in parent.data.tags["mlflow.note.content"]
    assert f"best (trial {best['trial']})" in Path(client.download_artifacts(
        parent.info.run_id, "summary.md")).read_text()
    children = client.search_runs([exp], f"tags.\"mlflow.parentRunId\" = '{parent.info.run_id}'")
    assert len(children) == len(lines)  # every ledger line, each settling run included
    assert {c.data.tags.get("steptune.round") for c in children if c.data.tags["steptune.kind"] == "repeat"} == \
        {"1", "2"}


@pytest.mark.timeout(120)
def test_a_baseline_that_cannot_run_stops_the_sweep_with_its_reason(ray_address, sweep_file):
    from orchestrator.sweep.loop import SweepError

    cfg = load_sweep(sweep_file(), ["resources.trial_timeout_s=0.001"])
    # The first run of the baseline's trial is the canonical reference run of its maths; it cannot run either.
    with pytest.raises(SweepError, match=r"the canonical reference run of the baseline \(trial 0\) did not run: "
                                         r"timeout"):
        run_sweep(cfg)
    (line,) = Ledger(cfg.results_dir / "trials.jsonl").read()
    assert line.kind == "canonical" and line.status == "timeout"
    first, again = study_of(cfg).trials  # nothing was measured for the baseline: queued again, not counted
    assert first.state == TrialState.FAIL and again.state == TrialState.WAITING
    assert again.user_attrs == {"kind": "baseline", "requeued_from": 0}
    # Rerunning with a sane timeout measures the canonical run and the baseline, and goes on.
    summary, lines = run_sweep(load_sweep(sweep_file(), ["search.n_trials=3"]))
    assert [(r.kind, r.status) for r in lines][:3] == [("canonical", "timeout"), ("canonical", "ok"),
                                                             ("baseline", "ok")]
    assert summary["baseline_trial"] == 1 and len(lines) == 5


@pytest.mark.timeout(240)
def test_an_undecided_verdict_prints_the_command_that_settles_it_and_that_command_works(ray_address, sweep_file,
                                                                                        capsys):
    """The baseline alone, its one run widened by a 190% assumed spread: against half its own time the verdict is
    undecided, about 3 rounds would decide it, and the summary prints the `settle` command for them. Run as
    printed, it measures settling rounds of the same sweep only (no new trial), decides the verdict, and leaves the
    sweep finished."""
    import shlex

    from orchestrator.__main__ import main

    path = sweep_file(search={"n_trials": 1}, winner={"max_rounds": 0, "single_run_spread": 1.9},
                      target={"relative_to_baseline": 0.5})
    assert main(["sweep", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "target undecided: trial 0" in out and "about 3 more round(s) would decide it" in out
    line = next(ln for ln in out.splitlines() if "to decide it, run those rounds" in ln)
    argv = shlex.split(line.split("(no new trials): ", 1)[1])
    results = str(path.parent / "results")
    assert argv[argv.index("settle"):] == ["settle", "--sweep", "t", "--results-dir", results, "--rounds", "3"]
    cfg = load_sweep(path)
    before = Ledger(cfg.results_dir / "trials.jsonl").read()
    assert [r.kind for r in before] == ["canonical", "baseline"]

    assert main(argv[argv.index("settle"):]) == 0  # the printed command, as the shell would pass it
    out = capsys.readouterr().out
    after = Ledger(cfg.results_dir / "trials.jsonl").read()
    assert after[:2] == before and {r.kind for r in after[2:]} == {"repeat"} and {r.trial for r in after[2:]} == {0}
    assert 1 <= len({r.round for r in after[2:]}) <= 3
    summary = json.loads((cfg.results_dir / "summary.json").read_text())
    assert summary["target_verdict"] == "not met" and summary["settle_command"] is None
    assert "target not met: trial 0" in out and "stopped because settling only (steptune settle --rounds 3)" in out
    assert len(study_of(cfg).trials) == 1  # no trial was asked
    assert json.loads((cfg.results_dir / "run.json").read_text())["finished"]["n_trials"] == 1
