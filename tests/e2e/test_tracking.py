"""Tracker against a real sqlite MLflow store, read back through a fresh MlflowClient."""

from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib.image as mpimg
import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator import commands
from orchestrator.records import answer as A
from orchestrator.review import report
from orchestrator.search.target import Target
from orchestrator.records.record import Metrics, TrialRecord
from orchestrator.review.tracking import Tracker, tracking_uri_for
from trainer.config import TrainConfig, apply_overrides, flatten
from trainer.measure.result import RankResult, Span, StepRecord, merge

pytestmark = pytest.mark.e2e
PNG = b"\x89PNG\r\n\x1a\n"


def make_result(config: dict, step_time: float, n_steps: int = 4) -> dict:
    """A Result built with the trainer's own dataclasses and merge(), spans on the last two steps."""
    cfg = TrainConfig.from_dict(config)
    ranks = []
    for pp in range(cfg.parallel.pp):
        for dp in range(cfg.parallel.dp):
            spans = []
            for step in (n_steps - 2, n_steps - 1):
                spans += [Span(step, "forward", 0.0, 0.3 * step_time), Span(step, "backward", 0.3 * step_time,
                                                                              0.8 * step_time),
                          Span(step, "dp_reduce", 0.6 * step_time, 0.85 * step_time),
                          Span(step, "dp_comm_wait", 0.8 * step_time, 0.85 * step_time),
                          Span(step, "optimizer", 0.85 * step_time, step_time)]
            steps = [StepRecord(i, step_time * (1.5 if i == 0 else 1.0), 5.5 - 0.1 * i, 1.0 + 0.01 * i, 512)
                     for i in range(n_steps)]
            ranks.append(RankResult(
                rank=pp * cfg.parallel.dp + dp, pp_rank=pp, dp_rank=dp, stage_ids=[pp], layer_ids=[0], device_name="cpu",
                steps=steps, phase_s={"forward": 0.3 * step_time, "backward": 0.5 * step_time,
                                      "optimizer": 0.15 * step_time, "dp_comm_wait": 0.05 * step_time * (dp + 1),
                                      "pipeline_idle": 0.0},
                reduce_start_after_backward_s=-0.2 * step_time, spans=spans,
                memory={"peak_bytes": (5 + pp) * 2 ** 20, "param_bytes": 2 ** 20},
                fingerprint={"w": [1.0, 2.0, 0.0]}, replica_max_abs_diff=0.0, peak_flops=1e11, peak_basis="test"))
    return merge(ranks, config=cfg.to_dict(), n_microbatches=cfg.n_microbatches, warmup_steps=1,
                 model_flops_per_step=1e9, hardware_flops_per_step=1.2e9, peak_memory_basis="test").to_dict()


def make_record(trial, kind, step_time=0.05, status="ok", parity=True, backend="ray", sweep="demo",
                **overrides) -> TrialRecord:
    config = apply_overrides(TrainConfig().to_dict(), {k.replace("__", "."): v for k, v in overrides.items()})
    measured = status == "ok"
    status = "infeasible" if measured and not parity else status  # as the sweep records a parity failure
    ok = status == "ok"
    result = make_result(config, step_time) if measured and backend == "ray" else None
    verdict = None if kind == "baseline" or not measured or backend == "model" else {
        "passed": parity, "first_fail_step": None if parity else 1, "first_fail_metric": None if parity else "loss",
        "max_loss_rel_diff": 2e-7 if parity else 4e-3, "max_grad_norm_rel_diff": 1e-6,
        "max_fingerprint_rel_diff": 3e-7, "replica_max_abs_diff": 0.0, "tolerance": {"loss_rel": 1e-5, "grad_norm_rel": 1e-5, "param_rel": 1e-5, "replica_abs": 1e-6}}
    metrics = {"step_time_s": step_time, "tokens_per_s": 512 / step_time, "mfu": 0.1, "hfu": 0.12,
               "peak_memory_bytes": 6 * 2 ** 20, "speedup_vs_baseline": 0.1 / step_time} if measured else {}
    return TrialRecord.from_line({
            "sweep": sweep, "trial": trial, "kind": kind, "backend": backend, "repeat": 1 if kind in ("confirm", "repeat") else None,
            "params": {k.replace("__", "."): v for k, v in overrides.items()}, "config": config, "status": status,
            "reason": None if ok else ("parity: loss differs from the baseline at step 1" if measured
                                       else "RankFailed: rank 1: CUDA out of memory"), "result": result,
            "prediction": {"step_time_s": step_time, "peak_memory_bytes": 7e10} if backend == "model" else None,
            "parity": verdict, "metrics": metrics, "meets_target": ok and step_time <= 0.06, "wall_s": 1.5,
            "overhead_s": 0.2, "started_at": time.time() - 2, "finished_at": time.time()})


def log_ledger(tracker, parent: str, records: list[TrialRecord]) -> list[str]:
    """Log each line as the sweep's recorder does: with the best config's figure once it is counted."""
    ids = []
    for i, r in enumerate(records):
        best = A.decide(records[:i + 1], Target()).leader
        ids.append(tracker.log_trial(parent, r, best.step_time_s if best else None))
    return ids


def _png_ok(client: MlflowClient, run_id: str, name: str, tmp: Path) -> bool:
    local = Path(client.download_artifacts(run_id, name, str(tmp)))
    return local.read_bytes()[:8] == PNG and mpimg.imread(local).shape[0] > 100


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # One store for the module (creating a sqlite store runs MLflow's migrations, ~1-2 s); each test
    # uses its own sweep name.
    results = tmp_path_factory.mktemp("tracking") / "results"
    return results, Tracker(tracking_uri_for(results), "steptune-test")


def test_sweep_parent_children_params_metrics_artifacts(store, tmp_path):
    results, tracker = store
    sweep_cfg = {"name": "demo", "search": {"n_trials": 6, "sampler": "tpe"}, "target": {"step_time_s": 0.06},
                 "trainer": {"parallel": {"pp": 2}}, "notes": "x" * 400}
    parent = tracker.start_sweep("demo", sweep_cfg, 0.06)
    records = [
        make_record(0, "baseline", 0.10),
        make_record(1, "trial", 0.055, parallel__dp=2, batch__micro_batch_size=2),
        make_record(2, "trial", 0.045, parity=False, parallel__pp=2),
        make_record(3, "trial", status="oom", recompute__kind="none", batch__micro_batch_size=8),
        make_record(4, "trial", 9.3, backend="model", parallel__pp=2),
        make_record(1, "confirm", 0.056, parallel__dp=2, batch__micro_batch_size=2),
    ]
    ids = log_ledger(tracker, parent, records)
    tracker.log_best(parent, records[1])
    # Resume: a new Tracker, the same sweep name and the same ledger lines change nothing.
    again = Tracker(tracking_uri_for(results), "steptune-test")
    assert again.start_sweep("demo", sweep_cfg, 0.06) == parent
    assert [again.log_trial(parent, r) for r in records] == ids

    study = optuna.create_study(direction="minimize")
    dist = {"parallel.dp": optuna.distributions.IntDistribution(1, 2)}
    for value, dp in ((0.10, 1), (0.055, 2), (0.045, 1), (0.07, 2)):
        study.add_trial(optuna.trial.create_trial(params={"parallel.dp": dp}, distributions=dist, value=value))
    summary = report.summarize(records, Target(step_time_s=0.06))
    best = summary["best"]  # trial 1: 55 and 56 ms, the median of its trial and confirm runs
    again.finish_sweep(parent, summary, study, "the table\n", {"1": (True, 1), "0": (False, 2)})

    client = MlflowClient(tracking_uri_for(results))
    p = client.get_run(parent)
    assert p.info.status == "FINISHED"
    assert p.data.tags["steptune.sweep"] == "demo" and p.data.tags["steptune.best_trial"] == "1"
    assert p.data.params["search.n_trials"] == "6" and "notes" not in p.data.params  # long values: YAML only
    assert p.data.metrics["target_step_time_s"] == 0.06
    # The parent's metrics are its per-trial history and the target: its chart view is the sweep converging.
    assert set(p.data.metrics) == {"target_step_time_s", "step_time_s", "best_step_time_s"}
    # The answer's figure after its confirm run is the latest point (trial 4's 9.3 s, a prediction, is no best).
    assert best["trial"] == 1 and p.data.metrics["best_step_time_s"] == pytest.approx(0.0555)
    top = {a.path for a in client.list_artifacts(parent)}
    assert {"sweep_config.yaml", "summary.md", "summary.json", "plots"} <= top
    plots = {a.path for a in client.list_artifacts(parent, "plots")}
    assert {"plots/optimization_history.png", "plots/param_importances.png",
            "plots/step_time_vs_peak_memory.png"} <= plots
    for name in plots - {"plots/NOTES.txt"}:
        assert _png_ok(client, parent, name, tmp_path / "dl")

    children = client.search_runs([p.info.experiment_id], f"tags.\"mlflow.parentRunId\" = '{parent}'")
    assert sorted(c.info.run_id for c in children) == sorted(ids) and len(children) == 6
    by = {(c.data.tags["steptune.trial"], c.data.tags["steptune.kind"]): c for c in children}

    ok = by[("1", "trial")]
    cfg = TrainConfig.from_dict(records[1].config)
    for key, value in flatten(cfg.to_dict()).items():  # every knob, flat dotted
        assert ok.data.params[key] == (value if isinstance(value, str) else json.dumps(value)), key
    assert ok.data.params["derived.dp"] == "2" and ok.data.params["derived.n_microbatches"] == "2"
    assert ok.data.params["derived.world_size"] == "2"
    m = ok.data.metrics
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes", "phase.dp_comm_wait_s",
                "phase.pipeline_idle_s", "parity.max_loss_rel_diff", "parity.passed", "trial.overhead_s",
                "memory.peak_bytes", "speedup_vs_baseline"):
        assert key in m, key
    assert m["step_time_s"] == 0.055 and m["parity.passed"] == 1.0
    assert m["phase.dp_comm_wait_s"] == pytest.approx(0.05 * 0.055 * 2)  # max over ranks, not min
    loss = client.get_metric_history(ok.info.run_id, "step/loss")
    assert [h.step for h in loss] == [0, 1, 2, 3] and loss[0].value == 5.5
    assert len(client.get_metric_history(ok.info.run_id, "step/time_s")) == 4
    t = ok.data.tags
    assert (t["steptune.status"], t["steptune.parity"], t["steptune.meets_target"], t["steptune.backend"],
            t["steptune.measurement"], t["steptune.optuna_trial"]) == ("ok", "passed", "true", "ray", "measured", "1")
    assert ok.info.status == "FINISHED"
    arts = {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert {"trainer_config.yaml", "result.json", "timeline.png", "ledger_record.json"} <= arts
    assert _png_ok(client, ok.info.run_id, "timeline.png", tmp_path / "dl2")
    yaml_path = client.download_artifacts(ok.info.run_id, "trainer_config.yaml", str(tmp_path / "dl3"))
    assert TrainConfig.from_dict(yaml.safe_load(Path(yaml_path).read_text())) == cfg

    bad = by[("2", "trial")]
    assert bad.data.tags["steptune.parity"] == "failed" and bad.data.tags["steptune.parity_first_fail"] == "step 1: loss"
    assert bad.data.tags["steptune.status"] == "infeasible" and bad.info.status == "FAILED"
    assert "timeline.png" in {a.path for a in client.list_artifacts(bad.info.run_id)}  # measured, so pictured
    oom = by[("3", "trial")]
    assert oom.info.status == "FAILED" and oom.data.tags["steptune.status"] == "oom"
    assert "out of memory" in oom.data.tags["steptune.failure_reason"]
    assert "timeline.png" not in {a.path for a in client.list_artifacts(oom.info.run_id)}
    pred = by[("4", "trial")]
    assert pred.data.tags["steptune.measurement"] == "prediction" and pred.data.tags["steptune.backend"] == "model"
    assert pred.data.metrics["prediction.step_time_s"] == 9.3
    assert by[("0", "baseline")].info.run_id == p.data.tags["steptune.baseline_run_id"]
    assert by[("1", "confirm")].data.tags["steptune.kind"] == "confirm"
    # Nothing left open (the UI would show it as still running forever).
    assert not client.search_runs([p.info.experiment_id],
                                  "attributes.status = 'RUNNING' and tags.\"steptune.sweep\" = 'demo'")


def test_half_logged_child_is_replaced(store):
    _, tracker = store
    parent = tracker.start_sweep("crash", {}, None)
    stale = tracker.client.create_run(tracker.experiment_id, tags={
        "mlflow.parentRunId": parent, "steptune.trial": "5", "steptune.kind": "trial"}).info.run_id
    new = tracker.log_trial(parent, make_record(5, "trial", 0.05))
    assert new != stale
    assert tracker.client.get_run(stale).info.lifecycle_stage == "deleted"
    tracker.finish_sweep(parent, {}, None, "")
    notes = Path(tracker.client.download_artifacts(parent, "plots/NOTES.txt"))
    assert "no Optuna study" in notes.read_text()


def test_importances_skipped_with_a_note(store):
    _, tracker = store
    parent = tracker.start_sweep("few", {"a": 1}, 1.0)
    study = optuna.create_study()
    t = study.ask({"parallel.dp": optuna.distributions.IntDistribution(1, 2)})
    study.tell(t, 1.0)
    tracker.finish_sweep(parent, {"n": 1}, study, "t")
    arts = {a.path for a in tracker.client.list_artifacts(parent, "plots")}
    assert "plots/param_importances.png" not in arts and "plots/optimization_history.png" in arts
    notes = Path(tracker.client.download_artifacts(parent, "plots/NOTES.txt")).read_text()
    assert "parameter importances skipped" in notes


def test_ui_command_is_absolute(store, monkeypatch):
    results, _ = store
    monkeypatch.chdir(results.parent)
    tracker = Tracker("sqlite:///results/mlflow.db", "ui-test")  # relative: resolved against the cwd
    monkeypatch.chdir("/")
    db = (results / "mlflow.db").resolve()
    assert tracker.ui_command() == (f"{commands.mlflow()} ui --backend-store-uri sqlite:///{db} "
                                    f"--default-artifact-root {(results / 'mlartifacts').resolve().as_uri()}")
    assert tracker.client.get_experiment(tracker.experiment_id).artifact_location.startswith(
        (results / "mlartifacts").resolve().as_uri())


def test_real_trainer_result(store, tmp_path):
    from trainer import launch

    _, tracker = store
    cfg = TrainConfig.from_dict({"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "seq_len": 16},
                                 "batch": {"global_batch": 4, "micro_batch_size": 1}, "parallel": {"pp": 2, "dp": 1},
                                 "run": {"steps": 4, "warmup_steps": 1}})
    result = launch.spawn(cfg)
    record = TrialRecord(sweep="real", trial=0, kind="baseline", backend="ray", params={}, config=cfg.to_dict(),
                         status="ok", reason=None, result=result, metrics=Metrics.of_summary(result.summary),
                         meets_target=False, wall_s=1.0, overhead_s=0.1, started_at=time.time() - 1,
                         finished_at=time.time())
    parent = tracker.start_sweep("real", {}, None)
    run_id = tracker.log_trial(parent, record)
    assert _png_ok(tracker.client, run_id, "timeline.png", tmp_path / "dl")
    assert len(tracker.client.get_metric_history(run_id, "step/loss")) == 4
    assert tracker.client.get_run(run_id).data.params["derived.stage_layers"] == "1,1"
    tracker.finish_sweep(parent, {}, None, "")
