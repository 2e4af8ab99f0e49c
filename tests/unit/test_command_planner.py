"""The guided sampler on the command backend: the planner's model from the sweep file's planner: section, each
trial's knobs on it, its picks and its refits to measured command trials; never a silent TPE."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import yaml

from orchestrator import REPO_ROOT
from orchestrator.calibration import guided
from orchestrator.records.answer import key_of
from orchestrator.sweep.config import check_sweep, from_dict
from tests.unit._nested import set_nested

GUIDED = REPO_ROOT / "search_spaces" / "command-custom-guided.yaml"


def _data(tmp_path, **changes) -> dict:
    data = yaml.safe_load(GUIDED.read_text())
    data["storage"] = {"results_dir": str(tmp_path)}
    data["planner"]["cluster_file"] = str(REPO_ROOT / "search_spaces" / "clusters" / "cpu-local.yaml")
    return set_nested(data, changes)


def _backend(tmp_path, **changes):
    return check_sweep(from_dict(_data(tmp_path, **changes), source=GUIDED))


def test_the_planner_models_the_declared_model_with_each_trials_knobs(tmp_path):
    b = _backend(tmp_path)
    cfg = b.configs.build({"batch.micro_batch_size": 4, "recompute.kind": "none"})
    plan = b.planner.plan_for(cfg)
    assert (plan.model.num_layers, plan.model.hidden_size, plan.model.ffn_hidden_size) == (2, 64, 256)
    assert plan.job.seq_len == 64 and plan.cluster.num_gpus == 2 and plan.cluster.name == "cpu-local"
    assert plan.batch.micro_batch_size == 4 and plan.batch.global_batch == 32 and plan.recompute.kind == "none"
    assert plan.parallel.dp == 2


def test_guided_ranks_the_space_before_the_first_trial_and_picks_its_best_first(tmp_path):
    b = _backend(tmp_path)
    import optuna

    pred = b.ranking.predictions()
    assert len(pred) == 15 and not b.ranking.not_modelled
    best = min(b.ranking.candidates, key=lambda c: pred[key_of(c)])
    # The planner's view of this script: the whole batch per replica in one micro-batch, nothing recomputed.
    assert best == {"batch.micro_batch_size": 16, "recompute.kind": "none"}
    assert pred[key_of(best)] < pred[key_of({"batch.micro_batch_size": 1, "recompute.kind": "full"})] / 2
    sampler = b.guided_sampler(optuna.samplers.TPESampler(seed=0), lambda: [])
    assert isinstance(sampler, guided.GuidedSampler) and sampler.ranking is b.ranking
    assert sampler._first[0] == best


def _line(b, number: int, params: dict, step_time_s: float) -> SimpleNamespace:
    """A measured command trial as the refit reads its ledger line (its config, status, step time; no phases)."""
    cfg = b.configs.build(b.configs.overrides_for(b.cfg.space, params))
    result = SimpleNamespace(summary=SimpleNamespace(step_time_s=step_time_s, peak_memory_bytes=None), phases={})
    return SimpleNamespace(measured=True, status=SimpleNamespace(value="ok"), trial=number, config=cfg.to_dict(),
                           result=result)


def test_the_refit_learns_from_measured_command_trials(tmp_path):
    b = _backend(tmp_path)
    r = b.ranking.fresh()
    before = dict(r.predictions())
    # Measured: micro-batches are 10x dearer than the prior thinks (a slow dispatch), recompute as predicted.
    lines = [_line(b, i, p, 10 * before[key_of(p)] - 9 * before[key_of({**p, "batch.micro_batch_size": 16})])
             for i, p in enumerate([{"batch.micro_batch_size": 1, "recompute.kind": "full"},
                                    {"batch.micro_batch_size": 2, "recompute.kind": "none"},
                                    {"batch.micro_batch_size": 8, "recompute.kind": "selective"}])]
    assert r.refit(lines) and r.n_fits == 1
    after = r.predictions()
    assert after != before
    for line in lines:  # closer to what was measured than the prior was
        k = key_of({"batch.micro_batch_size": line.config["batch"]["micro_batch_size"],
                    "recompute.kind": line.config["recompute"]["kind"]})
        measured = line.result.summary.step_time_s
        assert abs(after[k] - measured) < abs(before[k] - measured)


@pytest.mark.parametrize("changes,message", [
    ({"planner": None}, r"sampler.kind=guided: the command backend needs a planner: section"),
    ({"planner__recompute": {"kind": "full"}}, r"planner.recompute.kind: the command backend takes every knob from "
                                               r"the trial's own config"),
    ({"planner__batch": {"global_batch": 16}}, r"planner.batch.global_batch=16: the trials' global batch is "
                                               r"trainer.batch.global_batch=32"),
    ({"planner__model": None}, r"planner.model: required"),
    ({"planner__cluster_file": None}, r"planner.cluster_file: required"),
    ({"planner__model__num_heads": 3}, r"planner: .*num_heads"),
])
def test_a_planner_section_that_cannot_guide_is_refused_at_load(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        _backend(tmp_path, **changes)


def test_tpe_needs_no_planner_and_the_ray_backend_still_refuses_one(tmp_path):
    b = _backend(tmp_path, planner=None, sampler__kind="tpe")
    assert b.planner is None and b.ranking is None
    data = yaml.safe_load((REPO_ROOT / "search_spaces" / "default.yaml").read_text())
    data["planner"] = copy.deepcopy(_data(tmp_path)["planner"])
    data["storage"] = {"results_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"planner: only used with backend: model .* or backend: command"):
        check_sweep(from_dict(data))
