"""Planner configs: parsing, validation errors that name the field, knobs, layer splits."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.planner import (FirstLastSplit, FullRecompute, NoRecompute, PlanConfig, SelectiveRecompute,
                                  apply_params, knob_values, plan_config_from_dict, plan_config_to_dict)
from orchestrator.planner.config import rank_chunks, rank_layers
from trainer.knobs import BalancedSplit, ExplicitSplit
from trainer import knobs, layout
from trainer.config import TrainConfig

PRESET = Path(__file__).resolve().parents[2] / "search_spaces" / "preset-500b.yaml"


@pytest.fixture(scope="module")
def preset() -> dict:
    return yaml.safe_load(PRESET.read_text())


@pytest.fixture(scope="module")
def base(preset) -> PlanConfig:
    return plan_config_from_dict(preset["planner"])


def _planner(preset: dict, section: str, **changes) -> dict:
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in preset["planner"].items()}
    d[section] = {**d[section], **changes}
    return d


def test_preset_parses_and_round_trips(preset, base):
    assert base.tensor_parallel.size * base.parallel.pp * base.parallel.dp == base.cluster.num_gpus == 5120
    assert base.microbatches == 24
    assert abs(base.model.total_params - 500e9) / 500e9 < 0.02
    assert plan_config_from_dict(plan_config_to_dict(base)) == base
    flat = {f"{sec}.{k}": v for sec, d in base.to_dict().items() for k, v in d.items()}
    assert flat["recompute.kind"] == "full" and flat["pipeline.split"] == {"kind": "balanced"}


@pytest.mark.parametrize("section, changes, field", [
    ("parallel", {"pp": 0}, "planner.parallel.pp"),
    ("parallel", {"pp": 4}, "planner.parallel.dp"),           # tp*pp*dp no longer 5120
    ("tensor_parallel", {"size": 3}, "planner.parallel.dp"),    # 3*8*80 GPUs
    ("tensor_parallel", {"size": 16, "sequence_parallel": True}, "planner.parallel.dp"),
    ("model", {"num_heads": 7}, "planner.model.num_heads"),
    ("model", {"num_layers": "96"}, "planner.model.num_layers"),
    ("recompute", {"method": "blocky"}, "planner.recompute.method"),
    ("recompute", {"num_layers": 0}, "planner.recompute.num_layers"),
    ("data_parallel", {"bucket_size": 40}, "planner.data_parallel.bucket_size"),
    ("data_parallel", {"bucket_mb": -1}, "planner.data_parallel.bucket_mb"),
    ("optimizer", {"distributed": False, "overlap_param_gather": True}, "planner.optimizer.overlap_param_gather"),
    ("batch", {"micro_batch_size": 7}, "planner.batch.micro_batch_size"),
    ("pipeline", {"schedule": "zb"}, "planner.pipeline.schedule"),
    ("pipeline", {"schedule": "1f1b", "virtual_stages": 2}, "planner.pipeline.virtual_stages"),
    ("pipeline", {"schedule": "interleaved_1f1b", "virtual_stages": 0}, "planner.pipeline.virtual_stages"),
    ("pipeline", {"split": {"kind": "first_last", "first": 10, "last": 9}}, "planner.pipeline.split.first"),
    ("pipeline", {"split": {"kind": "uneven"}}, "planner.pipeline.split.kind"),
    ("efficiency", {"matmul_eff": 1.5}, "planner.efficiency.matmul_eff"),
    ("cluster", {"hbm_gb": 0}, "planner.cluster.hbm_gb"),
])
def test_bad_planner_values_name_the_field(preset, section, changes, field):
    with pytest.raises(ValueError) as err:
        plan_config_from_dict(_planner(preset, section, **changes))
    msg = str(err.value)   # "<field>: ..." or, for a key the config lacks, "unknown field <field> (did you mean ...)"
    assert msg.startswith(field) or msg.startswith(f"unknown field {field}"), msg


@pytest.mark.parametrize("section, changes, message", [
    ("data_parallel", {"bucket_mbs": 40}, "did you mean planner.data_parallel.bucket_mb?"),
    ("parallel", {"tp": 8}, "moved: use planner.tensor_parallel.size"),
    ("job", {"global_batch": 1920}, "moved: use planner.batch.global_batch"),
])
def test_unknown_keys_get_a_hint(preset, section, changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_config_from_dict(_planner(preset, section, **changes))


def test_unknown_section_and_shorthand(preset):
    with pytest.raises(ValueError, match=r"^unknown field planner\.optimiser \(did you mean planner\.optimizer\?\)"):
        plan_config_from_dict({**preset["planner"], "optimiser": {}})
    cfg = plan_config_from_dict({**preset["planner"], "recompute": "none"})
    assert cfg.recompute == NoRecompute()


@pytest.mark.parametrize("params, field", [
    ({"batch.micro_batch_size": 5}, "batch.micro_batch_size"),
    ({"batch.micro_batch_size": 0}, "batch.micro_batch_size"),
    ({"recompute.num_layers": 0}, "recompute.num_layers"),
    ({"recompute.kind": "full", "recompute.method": "zigzag"}, "recompute.method"),
    ({"recompute.kind": "sometimes"}, "recompute.kind"),
    ({"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 0}, "pipeline.virtual_stages"),
    ({"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "batch.micro_batch_size": 2},
     "pipeline.schedule"),   # 12 microbatches is not a multiple of pp=8 (Megatron's rule)
    ({"pipeline.split.kind": "first_last", "pipeline.split.first": 9}, "pipeline.split.first"),  # 87 over 7
    ({"pipeline.split.kind": "first_last", "pipeline.split.first": 11, "pipeline.split.last": 11},
     "pipeline.split.first"),
    ({"data_parallel.bucket_mb": 0}, "data_parallel.bucket_mb"),
    ({"data_parallel.overlap_grad_reduce": "yes"}, "data_parallel.overlap_grad_reduce"),
    ({"parallel.pp": 16}, "parallel.dp"),
    ({"pipeline.stages": 3}, "pipeline.stages"),
])
def test_bad_knobs_name_the_knob(base, params, field):
    with pytest.raises(ValueError) as err:
        apply_params(base, params)
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_apply_params_switches_kinds_and_ignores_inactive_sub_knobs(base, preset):
    cfg = apply_params(base, preset["baseline"])
    assert cfg.recompute == FullRecompute("block", 2)
    # A trial's conditional params merged over the baseline: method/num_layers belong to 'full' only.
    none = apply_params(cfg, {**preset["baseline"], "recompute.kind": "none"})
    assert none.recompute == NoRecompute()
    assert apply_params(none, {"recompute.kind": "selective"}).recompute == SelectiveRecompute(("core_attn",))
    inter = apply_params(cfg, {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 3})
    assert (inter.pipeline.schedule, inter.pipeline.virtual_stages) == ("interleaved_1f1b", 3)
    back = apply_params(inter, {"pipeline.schedule": "1f1b"})
    assert back.pipeline.virtual_stages == 1
    split = apply_params(cfg, {"pipeline.split.kind": "first_last", "pipeline.split.first": 9,
                               "pipeline.split.last": 9})
    assert split.pipeline.split == FirstLastSplit(9, 9) and split.stage_layers == [9] + [13] * 6 + [9]
    assert apply_params(split, {"pipeline.split.first": 12, "pipeline.split.last": 12}).stage_layers == [12] * 8
    assert apply_params(split, {"pipeline.split.kind": "balanced"}).pipeline.split == BalancedSplit()
    assert cfg == apply_params(cfg, {}) and cfg is not base  # a new config; the base is untouched
    assert knob_values(cfg)["recompute.num_layers"] == 2


def test_planner_and_trainer_share_the_knob_classes():
    """One definition: the planner's knob sections ARE the trainer's classes, not look-alikes."""
    import dataclasses
    import typing

    plan = typing.get_type_hints(PlanConfig)
    train = typing.get_type_hints(TrainConfig)
    for section in knobs.KNOB_SECTIONS:
        assert plan[section] is train[section] is knobs.KNOB_SECTIONS[section], section
    own = {f.name for f in dataclasses.fields(PlanConfig)} - set(knobs.KNOB_SECTIONS)
    assert own == {"cluster", "model", "job", "efficiency", "optimizer", "pipeline_comm"}


@pytest.mark.parametrize("num_layers, pp", [(96, 8), (95, 8), (24, 4), (30, 2), (7, 3), (64, 64)])
def test_every_layer_on_exactly_one_rank(num_layers, pp):
    seen = 0
    for first, last in itertools.product(range(1, num_layers), repeat=2):
        try:
            counts = rank_layers(num_layers, pp, 1, FirstLastSplit(first, last))
        except ValueError as err:
            assert str(err).startswith("pipeline.split.first:")
            continue
        seen += 1
        assert counts == layout.split_counts(num_layers, pp, first=first, last=last)  # the one rule
        assert len(counts) == pp and sum(counts) == num_layers and min(counts) >= 1
        assert (counts[0], counts[-1]) == (first, last)
        assert len(set(counts[1:-1])) <= 1   # the middle is balanced
    assert seen > 0 or pp > num_layers
    if num_layers >= pp:
        assert rank_layers(num_layers, pp, 1, BalancedSplit()) == layout.split_counts(num_layers, pp)


def test_ranks_may_hold_chunks_of_unequal_size():
    assert rank_layers(96, 8, 3, BalancedSplit()) == [12] * 8           # 24 chunks of 4
    # 40 chunks of 2 or 3 layers: each rank holds the chunks c = r, r + 8, ... of the one split rule.
    counts = layout.split_counts(96, 40)
    assert rank_chunks(96, 8, 5, BalancedSplit()) == [counts[r::8] for r in range(8)]
    assert sum(rank_layers(96, 8, 5, BalancedSplit())) == 96
    # Llama 3's layout: an embedding-only first chunk and a loss-only last chunk, one layer in every other.
    llama = ExplicitSplit((0,) + (1,) * 126 + (0,))
    assert rank_layers(126, 16, 8, llama) == [7] + [8] * 14 + [7]
    assert rank_chunks(126, 16, 8, llama)[0] == [0] + [1] * 7 and rank_chunks(126, 16, 8, llama)[15] == [1] * 7 + [0]


def test_baseline_lies_within_the_space(preset, base):
    space = preset["space"]["params"]
    cfg = apply_params(base, preset["baseline"])
    flat = knob_values(cfg)
    for name, spec in space.items():
        if spec["type"] == "layer_split":
            continue
        active = all(flat.get(k) in (v if isinstance(v, list) else [v]) for k, v in spec.get("when", {}).items())
        if not active:
            continue
        value = flat[name]
        if spec["type"] == "categorical":
            assert value in spec["choices"], name
        else:
            assert spec["low"] <= value <= spec["high"], name


def test_the_preset_searches_the_comm_levers_and_opts_in_to_bf16_reduction(preset, tmp_path):
    """The new levers enumerate without an invalid config (load_sweep checks every config the space makes),
    and bf16 gradient reduction, which changes the maths, is searched only because the file opts in."""
    from orchestrator.sweep.config import load_sweep

    cfg = load_sweep(PRESET)
    assert {"tensor_parallel.comm_overlap", "pipeline_comm.overlap_p2p", "optimizer.grad_reduce_dtype"} <= set(cfg.space.names)
    assert cfg.space.allow_numerics_change == ("optimizer.grad_reduce_dtype",)
    no_opt_in = {**preset, "space": {"params": preset["space"]["params"]}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(no_opt_in))
    with pytest.raises(ValueError) as e:
        load_sweep(tmp_path / "p.yaml")
    assert str(e.value).startswith("space.params.optimizer.grad_reduce_dtype: changes the maths")
    assert "add `allow_numerics_change: [optimizer.grad_reduce_dtype]` under space:" in str(e.value)
    assert "\n" not in str(e.value)
