"""Trainer config: parsing, round trip, overrides, and bad input refused with the field named."""

from __future__ import annotations

import re

import pytest
import yaml

from trainer.config import (FullRecompute, NoRecompute, TrainConfig, apply_overrides, flatten, parse_dotlist)


def test_defaults_round_trip_through_yaml():
    cfg = TrainConfig.from_dict({"parallel": {"pp": 2}, "recompute": {"kind": "full", "method": "block"},
                                 "pipeline": {"split": {"kind": "first_last", "first": 1}}})
    again = TrainConfig.from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again == cfg


def test_kind_override_switches_the_option_type():
    base = TrainConfig.from_dict({"recompute": {"kind": "full", "method": "block", "num_layers": 2}}).to_dict()
    cfg = TrainConfig.from_dict(apply_overrides(base, {"recompute.kind": "none"}))
    assert cfg.recompute == NoRecompute()
    cfg = TrainConfig.from_dict(apply_overrides(base, {"recompute.num_layers": 1}))
    assert cfg.recompute == FullRecompute("block", 1)
    cfg = TrainConfig.from_dict(apply_overrides({"recompute": "none"}, {"recompute.kind": "full"}))
    assert cfg.recompute == FullRecompute()


def test_dotlist_parsing():
    assert parse_dotlist(["parallel.pp=2", "recompute.modules=[mlp, norm]", "run.precision=bf16"]) == {
        "parallel.pp": 2, "recompute.modules": ["mlp", "norm"], "run.precision": "bf16"}
    with pytest.raises(ValueError, match="key=value"):
        parse_dotlist(["parallel.pp"])


def test_flatten_names_every_knob():
    flat = flatten(TrainConfig().to_dict())
    assert flat["data_parallel.kind"] == "replicate" and flat["batch.micro_batch_size"] == 1
    assert "recompute.kind" in flat and "pipeline.split.kind" in flat


@pytest.mark.parametrize("data,field", [
    ({"foo": 1}, "foo"),
    ({"model": {"d_modle": 3}}, "unknown field model.d_modle (did you mean model.d_model?)"),
    ({"model": {"d_model": 30, "n_heads": 4}}, "model.d_model"),
    ({"batch": {"global_batch": 8, "micro_batch_size": 3}}, "batch.global_batch"),
    ({"parallel": {"pp": 2}, "batch": {"micro_batch_size": 8}}, "pipeline.schedule=1f1b needs"),
    ({"parallel": {"pp": 2}, "pipeline": {"virtual_stages": 2}}, "pipeline.virtual_stages"),
    ({"parallel": {"pp": 2}, "pipeline": {"split": {"kind": "explicit", "layers": [1, 2]}}}, "pipeline.split.layers"),
    ({"parallel": {"pp": 5}}, "model.n_layers"),
    ({"recompute": {"kind": "selective", "method": "block"}}, "recompute.method"),
    ({"recompute": {"kind": "full", "method": "cyclic"}}, "recompute.method"),
    ({"recompute": {"kind": "full", "num_layers": 5}}, "recompute.num_layers"),
    ({"recompute": {"kind": "partial"}}, "recompute.kind"),
    ({"recompute": {"kind": "selective", "modules": ["attn"]}}, "recompute.modules"),
    ({"recompute": {"kind": "op", "matmul_period": -1}}, "recompute.matmul_period"),
    ({"recompute": {"kind": "op", "modules": ["mlp"]}}, "recompute.modules"),
    ({"data_parallel": {"kind": "replicate", "bucket_mb": 0}}, "data_parallel.bucket_mb"),
    ({"data_parallel": {"kind": "fsdp", "overlap_grad_reduce": True}}, "data_parallel.overlap_grad_reduce"),
    ({"data_parallel": {"kind": "torch_ddp"}, "parallel": {"pp": 2}}, "data_parallel.kind=torch_ddp"),
    ({"run": {"precision": "fp16"}}, "run.precision"),
    ({"run": {"device": "tpu"}}, "run.device"),
    ({"run": {"steps": 3, "warmup_steps": 3}}, "run.warmup_steps"),
    ({"run": {"steps": 4, "warmup_steps": 2, "profile_step": 2}}, "run.profile_step"),  # a measured update
    ({"run": {"profile_step": -1}}, "run.profile_step"),
    ({"run": {"steps": "ten"}}, "run.steps"),
    ({"data_parallel": {"kind": "replicate", "overlap_grad_reduce": "yes"}}, "data_parallel.overlap_grad_reduce"),
    ({"data": {"kind": "token_file"}}, "data.path"),
    ({"optim": {"lr": 0}}, "optim.lr"),
])
def test_bad_config_names_the_field(data, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        TrainConfig.from_dict(data)


def test_derived_quantities():
    cfg = TrainConfig.from_dict({"parallel": {"pp": 2, "dp": 2}, "batch": {"global_batch": 16, "micro_batch_size": 2},
                                 "pipeline": {"schedule": "interleaved_1f1b", "virtual_stages": 2}})
    assert (cfg.world_size, cfg.n_microbatches, cfg.n_stages) == (4, 4, 4)
    assert cfg.stage_layers() == [[0], [1], [2], [3]]
