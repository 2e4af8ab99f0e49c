"""The same loop, ledger and stores with the planner backend, and with several worker groups at once."""

from __future__ import annotations

from datetime import datetime

import optuna
import pytest

from orchestrator.config import REPO_ROOT, load_sweep
from orchestrator.ledger import Ledger
from orchestrator.sweep import run_sweep

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(120)
def test_model_backend_runs_the_500b_preset_through_the_same_loop(tmp_path):
    cfg = load_sweep(REPO_ROOT / "search_spaces" / "preset-500b.yaml",
                     [f"storage.results_dir={tmp_path}", "search.n_trials=12", "tracking.enabled=true",
                      "resources.memory_budget_gb=120",
                      # the preset's calibrated set (its default is blind), which reproduces the article's 8 + 4 s
                      "planner.efficiency.matmul_eff=0.88", "planner.efficiency.dp_bw_eff=0.251",
                      "planner.efficiency.basis=calibrated"])
    summary, lines = run_sweep(cfg)
    assert summary["verdict"]["efficiency_basis"] == "calibrated"
    assert summary["verdict"]["verdict"] in ("robust", "point only", "not met")
    assert all(r["prediction"]["step_time_high_s"] > r["prediction"]["step_time_s"] for r in lines
               if r["status"] == "ok")
    assert lines == Ledger(cfg.results_dir / "trials.jsonl").read() and len(lines) == 12
    assert lines[0]["kind"] == "baseline" and lines[0]["backend"] == "model"
    for r in lines:
        assert r["backend"] == "model" and r["result"] is None and r["parity"] is None
        if r["status"] in ("ok", "oom"):
            assert r["prediction"]["step_time_s"] == r["metrics"]["step_time_s"] > 0
        assert r["overhead_s"] is None  # nothing was measured, so there is no overhead to claim
    assert summary["stopped_because"] == "the trial budget is spent"  # predictions are cheap: the whole budget
    # The summary says where each reported config's predicted time goes (baseline: ~8 s compute + ~4 s comm).
    (base_line,) = [b for b in summary["breakdowns"] if "(baseline)" in b]
    assert "exposed dp comm 4.0" in base_line and "forward" in base_line and "pp bubble" in base_line
    assert round(summary["target_s"], 2) == 9.30
    study = optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url)
    oom = [t for t in study.trials if t.user_attrs["status"] == "oom"]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.constraints["memory"] > 0 for t in oom)
    over = [r for r in lines if r["status"] == "infeasible"]  # resources.memory_budget_gb=120 below
    assert over and all("peak memory" in r["reason"] for r in over)
    assert all(study.trials[r["trial"]].constraints["memory"] > 0 for r in over)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow_uri)
    assert len(client.search_runs([client.get_experiment_by_name("steptune").experiment_id])) == 13


@pytest.mark.timeout(60)
def test_the_wall_time_budget_stops_new_trials(tmp_path):
    cfg = load_sweep(REPO_ROOT / "search_spaces" / "preset-500b.yaml",
                     [f"storage.results_dir={tmp_path}", "search.n_trials=100000", "search.wall_time_s=2",
                      "tracking.enabled=false"])
    summary, lines = run_sweep(cfg)
    assert summary["stopped_because"] == "the wall-time budget (2 s) is spent"
    # Stopped rather than ran on (the bound leaves room for a loaded machine).
    assert 1 < len(lines) < 100000 and summary["sweep_wall_s"] < 30


# (each actor's node: ip, free port, its GPU ids) -> the env each rank gets
ENV_TABLE = [
    ([{"ip": "a", "port": 1, "gpu_ids": []}, {"ip": "a", "port": 2, "gpu_ids": []}],
     [{"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
      {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}]),
    ([{"ip": "a", "port": 7, "gpu_ids": ["3"]}, {"ip": "a", "port": 8, "gpu_ids": ["1"]},
      {"ip": "b", "port": 9, "gpu_ids": ["0"]}, {"ip": "b", "port": 5, "gpu_ids": ["10"]}],
     [{"RANK": "0", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1,3", "MASTER_ADDR": "a", "MASTER_PORT": "7"},
      {"RANK": "1", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1,3", "LOCAL_WORLD_SIZE": "2"},
      {"RANK": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,10", "MASTER_ADDR": "a", "WORLD_SIZE": "4"},
      {"RANK": "3", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,10"}]),
]


@pytest.mark.parametrize("nodes,expected", ENV_TABLE)
def test_rank_environment(nodes, expected):
    """torchrun's variables per actor; on GPU nodes each rank sees its node's group GPUs, LOCAL_RANK its own."""
    from orchestrator.workers import rank_envs

    envs = rank_envs(nodes)
    for env, want in zip(envs, expected):
        assert want.items() <= env.items(), (env, want)


@pytest.mark.timeout(180)
def test_two_worker_groups_run_trials_at_the_same_time(ray_address, sweep_file):
    space = {"params": {"batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4, 8]},
                        "recompute.kind": {"type": "categorical", "choices": ["none", "selective", "full"]}}}
    cfg = load_sweep(sweep_file(space=space, baseline={"batch.micro_batch_size": 2},
                                resources={"world_size": 1, "cpus_per_rank": 1, "concurrent_trials": 2,
                                           "trial_timeout_s": 60}),
                     ["search.n_trials=6", "trainer.run.steps=30"])
    summary, lines = run_sweep(cfg)
    assert len(lines) == 6 and all(r["status"] in ("ok", "skipped") for r in lines), [r["reason"] for r in lines]
    spans = [(datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"]))
             for r in lines if r["kind"] == "trial" and r["status"] == "ok"]
    overlapping = any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans) for b0, b1 in spans[i + 1:])
    assert overlapping, spans
    # The baseline ran alone: nothing starts before it is measured.
    base_end = datetime.fromisoformat(lines[0]["finished_at"])
    assert all(s >= base_end for s, _ in spans)


@pytest.mark.timeout(240)
def test_prefilter_skips_configs_predicted_over_the_memory_budget(ray_address, sweep_file):
    from orchestrator.backends import configs_for
    from orchestrator.prefilter import MemoryPrefilter, load_cluster

    cluster_file = REPO_ROOT / "search_spaces" / "clusters" / "cpu-local.yaml"
    big = {"parallel.pp": 1, "batch.micro_batch_size": 4, "recompute.kind": "none",
           "data_parallel.overlap_grad_reduce": True}
    path = sweep_file(enqueue=[big], search={"n_trials": 3})
    cfg = load_sweep(path, [])
    cluster, priors = load_cluster(cluster_file)
    predict = MemoryPrefilter(cluster, priors).verdict
    configs = configs_for(cfg)
    base_b = predict(configs.baseline).predicted_bytes
    big_b = predict(configs.build(configs.overrides_for(cfg.space, big))).predicted_bytes
    assert big_b > base_b
    budget_gib = (base_b + big_b) / 2 / 2**30  # the baseline fits, the enqueued config does not
    cfg = load_sweep(path, [f"prefilter.cluster={cluster_file}", f"prefilter.memory_budget_gb={budget_gib}"])
    summary, lines = run_sweep(cfg)
    assert lines[0]["kind"] == "baseline" and lines[0]["status"] == "ok"  # never filtered
    skipped = [r for r in lines if r["status"] == "skipped" and r["reason"].startswith("prefilter:")]
    assert skipped and skipped[0]["params"] == {**skipped[0]["params"], **big}
    assert skipped[0]["result"] is None and skipped[0]["prediction"]["peak_memory_bytes"] > budget_gib * 2**30
    assert summary["prefilter"]["skipped"] == len(skipped)
    study = optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url)
    assert study.trials[skipped[0]["trial"]].constraints["memory"] > 0


@pytest.mark.timeout(240)
def test_bf16_baseline_runs_twice_and_the_reference_is_reused_by_the_next_sweep(ray_address, sweep_file):
    import json

    from orchestrator.parity import DEFAULT_TOLERANCE, maths_key

    path = sweep_file(search={"n_trials": 2})
    over = ["trainer.run.precision=bf16", "pruning.enabled=false"]
    cfg = load_sweep(path, over)
    summary, lines = run_sweep(cfg)
    base = lines[0]
    assert base["kind"] == "baseline" and base["status"] == "ok" and base["parity"]["passed"]
    key = maths_key(base["config"])
    store = cfg.results_dir.parent / "parity_refs" / f"{key}.json"
    runs = json.loads(store.read_text())["runs"]
    assert len(runs) == 2 and all(r["precision"] == "bf16" for r in runs)  # the baseline and its repeat
    assert base["parity"]["tolerance"]["loss_rel"] >= DEFAULT_TOLERANCE["bf16"].loss_rel
    # Another sweep with the same maths (different name) compares against the stored reference.
    again = load_sweep(path, over + ["name=t2"])
    _, lines2 = run_sweep(again)
    assert lines2[0]["parity"]["passed"] and len(json.loads(store.read_text())["runs"]) == 3
    # Different maths: a new key, never the old reference.
    fp32 = load_sweep(path, ["name=t3", "pruning.enabled=false"])
    _, lines3 = run_sweep(fp32)
    assert maths_key(lines3[0]["config"]) != key
    assert len(json.loads((store.parent / f"{maths_key(lines3[0]['config'])}.json").read_text())["runs"]) == 1
