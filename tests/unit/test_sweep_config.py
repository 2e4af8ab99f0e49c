"""Sweep file validation: every mistake is rejected before anything launches, with the field named."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.sweep.config import DEFAULT_SWEEP, load_sweep


def test_default_sweep_is_valid_and_covers_all_four_knob_families():
    cfg = load_sweep()
    assert cfg.name == "default" and cfg.backend == "ray" and cfg.resources.world_size == 2
    keys = set(cfg.space.override_keys)
    assert {"data_parallel.overlap_grad_reduce", "data_parallel.bucket_mb"} & keys       # overlap
    assert {"recompute.kind", "recompute.num_layers"} <= keys                             # recompute
    assert {"parallel.pp", "pipeline.split.first", "pipeline.split.last"} <= keys          # pipeline split
    assert "batch.micro_batch_size" in keys                                              # microbatching
    assert cfg.source == str(DEFAULT_SWEEP)


def test_cli_overrides_and_target_replacement(sweep_file):
    path = sweep_file(target={"relative_to_baseline": 0.8})
    cfg = load_sweep(path, ["search.n_trials=30", "target.step_time_s=9.3", "ray.address=auto"])
    assert cfg.search.n_trials == 30 and cfg.ray.address == "auto"
    assert cfg.target.kind == "absolute" and cfg.target.seconds(None) == 9.3
    cfg = load_sweep(path, ["target.schedule.days=76", "target.schedule.availability=0.9",
                            "target.schedule.updates=635782"])
    assert round(cfg.target.seconds(None), 2) == 9.30


def test_trainer_config_file_is_relative_to_the_sweep(sweep_file, tmp_path):
    (tmp_path / "tr.yaml").write_text(yaml.safe_dump({"model": {"n_layers": 4, "d_model": 32, "n_heads": 4}}))
    cfg = load_sweep(sweep_file(trainer_config="tr.yaml", trainer={"run": {"steps": 5}}))
    assert cfg.trainer["model"]["d_model"] == 32 and cfg.trainer["run"]["steps"] == 5


# (changes to the tiny sweep, or CLI overrides, and the message the error must contain)
BAD = [
    ({}, ["budget.n_trials=3"], "unknown field budget (did you mean search.n_trials?)"),
    ({}, ["search.n_trails=3"], "unknown field search.n_trails (did you mean search.n_trials?)"),
    ({}, ["search.n_trials=many"], "search.n_trials: expected an integer"),
    ({}, ["search.min_trials=-1"], "search.min_trials=-1 must be 0 or more"),
    ({}, ["resources.world_size=0"], "resources.world_size=0 is out of range"),
    ({}, ["resources.placement=ANYWHERE"], "resources.placement='ANYWHERE' must be one of"),
    ({}, ["sampler.kind=grid"], "sampler.kind='grid' must be one of"),
    ({}, ["backend=slurm"], "backend='slurm' must be one of"),
    ({}, ["name=a/b"], "name='a/b'"),
    ({}, ["pruning.slower_than_best=0.5"], "pruning.slower_than_best=0.5 is out of range"),
    ({}, ["tracking.enabled=maybe"], "tracking.enabled: expected true or false"),
    ({}, ["target.speed=2"], "unknown field(s) target.speed"),
    ({"target": {"step_time_s": 1, "relative_to_baseline": 0.5}}, [], "target: give exactly one"),
    ({"trainer_config": "missing.yaml"}, [], "trainer_config:"),
    ({"trainer": {"model": {"n_layer": 4}}}, [], "unknown field model.n_layer (did you mean model.n_layers?)"),
    ({"baseline": {"parallel.pp": 3}}, [], "tensor_parallel.size x parallel.pp = 1 x 3 = 3 does not divide resources.world_size=2"),
    ({"baseline": {"parallel.pp": 2, "parallel.dp": 2}}, [], "leave parallel.dp out, it is derived"),
    ({"baseline": {"tensor_parallel.size": 4}}, [],
     "tensor_parallel.size x parallel.pp = 4 x 1 = 4 does not divide resources.world_size=2"),
    ({"space": {"params": {"tensor_parallel.size": {"type": "categorical", "choices": [1, 2]},
                           "parallel.pp": {"type": "categorical", "choices": [1, 2]}}}}, [],
     "tensor_parallel.size x parallel.pp = 2 x 2 = 4 does not divide resources.world_size=2"),
    ({"baseline": {"tensor_parallel.size": 2, "model.vocab_size": 255}}, [], "model.vocab_size: 255 is not divisible by"),
    ({"baseline": {"batch.micro_batch_size": 3}}, [], "batch.global_batch=8 is not divisible"),
    ({"resources": {"world_size": 2, "gpus_per_rank": 1}}, [], "resources.gpus_per_rank=1.0 does not match"),
    ({"space": {"params": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}}}, [],
     "space.params varies optim.lr: these change what the model learns"),
    ({"space": {"params": {"parallel.dp": {"type": "categorical", "choices": [1, 2]}}}}, [],
     "space.params.parallel.dp: dp is derived"),
    ({"space": {"params": {"parallel.pp": {"type": "categorical", "choices": [1, 2, 4]}}}}, [],
     "tensor_parallel.size x parallel.pp = 1 x 4 = 4 does not divide resources.world_size=2"),
    ({"space": {"params": {"parallel.pp": {"type": "categorical", "choices": [2]},
                           "batch.micro_batch_size": {"type": "categorical", "choices": [2, 8]}}}}, [],
     "batch.micro_batch_size=8: pipeline.schedule=1f1b needs at least parallel.pp=2 microbatches"),
    ({"space": {"params": {"parallel.pp": {"type": "categorical", "choices": [1]}}}}, [],
     "the baseline has parallel.pp=2, which is not among the space's choices"),
    ({"space": {"params": {"parallel.pp": {"type": "categorical", "choices": [1, 2]},
                           "pipeline.split": {"type": "layer_split", "first": [1, 1], "last": [1, 1],
                                              "when": {"parallel.pp": 2}}}}}, [],
     "pipeline.split: no first in [1, 1] and last in [1, 1]"),
    ({"space": {"params": {"parallel.pp": {"type": "categorical", "choices": [2]},
                           "recompute.kind": {"type": "categorical", "choices": ["none", "full"]},
                           "recompute.num_layers": {"type": "int", "low": 1, "high": 3,
                                                    "when": {"recompute.kind": "full"}}}}}, [],
     "recompute.kind=full, recompute.num_layers=3: recompute.num_layers=3 exceeds the layers of every stage"),
    ({"enqueue": [{"parallel.pp": 1}]}, [], "enqueue[0] parallel.pp=1: no value for batch.micro_batch_size"),
    ({"backend": "model"}, [], "planner: backend: model needs a planner: section"),
    ({"sampler": {"kind": "tpe", "calibration": "cal.yaml"}}, [],
     "sampler.calibration: only sampler.kind=guided reads it (kind is tpe)"),
    ({"sampler": {"kind": "guided", "calibration": "missing.yaml"}}, [], "no such calibration file"),
    ({}, ["winner.top_k=0"], "winner.top_k=0: a whole number >= 1"),
    ({}, ["winner.max_rounds=-1"], "winner.max_rounds=-1: a whole number >= 0"),
    ({}, ["winner.max_repeats=3"], "winner.max_repeats: replaced by winner.max_rounds"),
    ({}, ["confirm.repeats=1"], "confirm: removed; a met target now stops the search only once settling rounds"),
    ({}, ["winner.single_run_spread=0"], "winner.single_run_spread=0.0: a number in (0.0, 2.0)"),
]


@pytest.mark.parametrize("changes,dotlist,message", BAD)
def test_bad_sweeps_are_rejected_naming_the_field(sweep_file, changes, dotlist, message):
    with pytest.raises(ValueError) as e:
        load_sweep(sweep_file(**changes), dotlist)
    assert message in str(e.value)


def test_missing_file():
    with pytest.raises(ValueError, match="no such sweep file"):
        load_sweep("/nonexistent/sweep.yaml")


def test_cli_reports_errors_without_a_traceback(capsys):
    from orchestrator.__main__ import main

    assert main(["sweep", "--dry-run", "search.n_trials=x"]) == 2
    assert "error: search.n_trials: expected an integer" in capsys.readouterr().err
    assert main(["sweep", "--dry-run"]) == 0
