"""Slice derivation at its boundaries (issue 30: each case is a mutant the older tests let through)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from orchestrator.calibration.slices import (bucket_sizes, density, derive_any, derive_slices, derive_trainer_slices,
                                           dp_comm_slices, job_world, pp_comm_slices, schedules, Slice)

from tests.unit.test_profile_slices import SWEEP, sweep

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())


def _space(**params) -> dict:
    out = copy.deepcopy(SWEEP)
    out["space"] = {"params": params}
    return out


def test_an_int_range_of_micro_batch_sizes_gives_both_ends():
    plan = derive_slices(_space(**{"batch.micro_batch_size": {"type": "int", "low": 1, "high": 4}}))
    assert [s.name for s in plan.slices] == ["mbs=1 recompute=full", "mbs=4 recompute=full"]
    assert plan.slices[1].config.batch.micro_batch_size == 4
    assert [s.name for s in derive_slices(_space(**{"batch.micro_batch_size": {"type": "float", "low": 1,
                                                                                "high": 4}})).slices] == \
        ["mbs=1 recompute=full"]


def test_shrink_rounds_heads_ffn_and_vocabulary_to_whole_tensor_parallel_shares():
    plan = derive_slices(sweep(model={"hidden_size": 3072, "num_heads": 48, "ffn_hidden_size": 12290,
                                      "vocab_size": 1012}), ranks=2, shrink=4)
    # heads 48/4 = 12, ffn 12290/4 = 3072.5 -> 3072, vocabulary 1012/4 = 253 -> 252 (a multiple of tp 2).
    assert plan.shape == {"d_model": 768, "n_heads": 12, "d_ff": 3072, "vocab_size": 252, "seq_len": 128,
                          "precision": "bf16"}
    assert all(type(plan.shape[k]) is int for k in ("d_model", "n_heads", "d_ff", "vocab_size"))
    assert any(n.startswith("--shrink 4: hidden 3072->768, heads 48->12, ffn 12290->3072, vocab 1012->252")
               for n in plan.notes)


def test_shrink_never_goes_below_one_head_per_rank_or_one_dimension_per_head():
    plan = derive_slices(sweep(), ranks=2, shrink=128)  # 8 heads, hidden 256
    assert (plan.shape["n_heads"], plan.shape["d_model"]) == (2, 2)
    assert plan.shape["d_ff"] == 8 and plan.shape["vocab_size"] == 6  # 1024 // 128, 1000 // 128 rounded to tp


def test_shrink_2_halves_and_shrink_1_changes_nothing():
    assert derive_slices(sweep(), shrink=2).shape["d_model"] == 128
    plan = derive_slices(sweep(), shrink=1)
    assert plan.shape["d_model"] == 256 and not any("--shrink" in n for n in plan.notes)


def _no_ffn(**changes) -> dict:
    out = sweep(**changes)
    del out["planner"]["model"]["ffn_hidden_size"]
    return out


def test_an_unset_ffn_width_is_four_times_hidden():
    plan = derive_slices(_no_ffn())
    assert plan.shape["d_ff"] == 1024 and plan.slices[0].config.model.ffn_dim == 1024
    plan = derive_slices(sweep(model={"ffn_hidden_size": 1536}))
    assert plan.slices[0].config.model.ffn_dim == 1536


def test_the_trainers_own_layer_gemms_need_no_note():
    standard = [[256, 768], [256, 256], [256, 1024], [1024, 256]]
    assert not any("layer_gemms" in n for n in derive_slices(sweep(model={"layer_gemms": standard})).notes)
    four_h = derive_slices(_no_ffn(model={"layer_gemms": standard})).notes
    assert not any("layer_gemms" in n for n in four_h)


def test_tp_comm_overlap_is_switched_off_on_cpu_and_kept_on_cuda():
    overlap = {"size": 2, "sequence_parallel": True, "comm_overlap": True}
    plan = derive_slices(sweep(tensor_parallel=overlap), ranks=2)
    assert all(not s.config.tensor_parallel.comm_overlap for s in plan.slices)
    assert "tensor_parallel.comm_overlap needs CUDA: the slice runs without it" in plan.notes
    assert not any("comm_overlap" in n for n in derive_slices(sweep(), ranks=2).notes)


def test_with_tp1_adds_one_tp1_slice_of_the_baseline():
    plan = derive_slices(sweep(), ranks=2, with_tp1=True)
    last = plan.slices[-1]
    assert last.name == "mbs=1 recompute=full tp=1" and len(plan.slices) == 6
    assert (last.config.tensor_parallel.size, last.config.parallel.dp, last.config.world_size) == (1, 2, 2)
    assert not last.config.tensor_parallel.comm_overlap and last.config.batch.global_batch == 1 * 2 * 2
    assert all(s.config.tensor_parallel.size == 2 for s in plan.slices[:-1])
    assert len(derive_slices(sweep(tensor_parallel={"size": 4}, parallel={"pp": 2, "dp": 1}), ranks=2,
                             with_tp1=True).slices) == 5  # already tp 1: nothing to add


def test_the_baseline_comes_from_the_baseline_section_else_the_planner():
    no_base = sweep()
    del no_base["baseline"]
    assert derive_slices(no_base).slices[0].name == "mbs=2 recompute=full"
    none_first = sweep()
    none_first["baseline"] = {"recompute.kind": "none"}
    names = [s.name for s in derive_slices(none_first).slices]
    assert names[0] == "mbs=2 recompute=none" and "mbs=2 recompute=full" in names


def test_recompute_kinds_of_the_space_become_their_own_settings():
    s = _space(**{"recompute.kind": {"type": "categorical", "choices": ["full", "op", "selective"]}})
    s["baseline"] = {"recompute.kind": "selective"}
    s["planner"]["recompute"] = {"kind": "selective"}
    by_name = {x.name: x.config.recompute for x in derive_slices(s).slices}
    full = by_name["mbs=2 recompute=full"]
    assert (full.kind, full.method, full.num_layers) == ("full", "uniform", 1)
    assert by_name["mbs=2 recompute=op"].kind == "op" and by_name["mbs=2 recompute=selective"].kind == "selective"


def test_defaults_and_the_lowest_accepted_flags():
    plan = derive_slices(sweep())
    c = plan.slices[0].config
    assert (plan.ranks, plan.layers, plan.shrink, c.run.steps, c.run.warmup_steps, c.run.timeline_steps) == \
        (2, 2, 1, 4, 1, 0)
    assert derive_slices(sweep(tensor_parallel={"size": 1}, parallel={"pp": 2, "dp": 4}), ranks=1).ranks == 1
    assert derive_slices(sweep(), steps=2).slices[0].config.run.steps == 2


def test_trainer_slices_defaults_flags_and_plan_fields():
    plan = derive_trainer_slices(DEFAULT)
    assert (plan.ranks, plan.layers, plan.tp, plan.shrink, plan.notes) == (2, 2, 1, 1, ())
    c = plan.slices[0].config
    assert (c.run.steps, c.run.warmup_steps, c.run.timeline_steps, c.parallel.pp) == (6, 2, 0, 1)
    assert derive_trainer_slices(DEFAULT, ranks=1).slices[0].config.world_size == 1
    assert derive_trainer_slices(DEFAULT, steps=4, warmup=3).slices[0].config.run.warmup_steps == 3
    for kwargs, message in (({"ranks": 0}, "--ranks: must be an integer >= 1, got 0"),
                            ({"layers": 0}, "--layers: must be an integer >= 1, got 0")):
        with pytest.raises(ValueError) as e:
            derive_trainer_slices(DEFAULT, **kwargs)
        assert str(e.value) == message


def test_trainer_slices_drop_the_baselines_layout_but_keep_its_knobs():
    s = copy.deepcopy(DEFAULT)
    s["trainer"]["parallel"] = {"pp": 2}
    s["baseline"].update({"parallel.pp": 2, "pipeline.schedule": "gpipe", "tensor_parallel.size": 2})
    plan = derive_trainer_slices(s, ranks=2, layers=2)
    for x in plan.slices:
        assert (x.config.parallel.pp, x.config.tensor_parallel.size, x.config.recompute.kind) == \
            (1, 1, x.name.rsplit("recompute=", 1)[1])
    s["trainer"]["tensor_parallel"] = {"size": 2}
    with pytest.raises(ValueError) as e:
        derive_trainer_slices(s)
    assert str(e.value) == "trainer.tensor_parallel.size: slices of a ray-backend file run at tp 1"


def test_a_model_sweep_without_a_planner_section_is_named():
    with pytest.raises(ValueError) as e:
        derive_slices({"backend": "model"})
    assert str(e.value) == "planner: section missing (profile reads a sweep file with backend: model)"


@pytest.mark.parametrize("layout", [{"parallel.dp": 3},  # 16 sequences do not split over 3 replicas
                                    {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b",
                                     "pipeline.virtual_stages": 3}])
def test_trainer_slices_take_none_of_the_baselines_layout(layout):
    s = copy.deepcopy(DEFAULT)
    s["baseline"] = {**s["baseline"], **layout}
    plan = derive_trainer_slices(s, ranks=2, layers=2)
    assert all((x.config.parallel.pp, x.config.parallel.dp) == (1, 2) for x in plan.slices)


def test_trainer_slices_run_the_default_pipeline_whatever_the_trainer_section_says():
    s = copy.deepcopy(DEFAULT)
    s["trainer"]["parallel"] = {"pp": 2}
    s["trainer"]["pipeline"] = {"schedule": "gpipe"}
    for x in derive_trainer_slices(s, ranks=2, layers=2).slices:
        assert x.config.pipeline == type(x.config.pipeline)()


def test_a_vocabulary_tp_does_not_divide_is_padded_up_as_megatron_does():
    """Found by tests/unit/test_props_slices.py: the planner accepts vocab 50257 at tp 2; the slice refused it."""
    plan = derive_slices(sweep(model={"vocab_size": 50257}), ranks=2)
    assert plan.shape["vocab_size"] == 50258 and all(s.config.model.vocab_size == 50258 for s in plan.slices)
    assert "model.vocab_size 50257 padded to 50258, a multiple of tensor_parallel.size 2" in plan.notes
    tp4 = derive_slices(sweep(model={"vocab_size": 50257}, tensor_parallel={"size": 4}, parallel={"pp": 2, "dp": 1}),
                        ranks=4)
    assert (tp4.tp, tp4.shape["vocab_size"]) == (4, 50260)
    assert not any("padded" in n for n in derive_slices(sweep(model={"vocab_size": 50256}), ranks=2).notes)


def test_on_cuda_tp_comm_overlap_is_kept_for_the_trainer_to_judge_and_dropped_at_tp_1():
    overlap = {"size": 2, "sequence_parallel": True, "comm_overlap": True}
    selective = sweep(tensor_parallel=overlap)
    selective["baseline"] = {"recompute.kind": "selective"}
    with pytest.raises(ValueError, match="^tensor_parallel.comm_overlap: the blocks it compiles cannot trace "
                                         "recompute.kind=selective"):
        derive_slices(selective, ranks=2, device="cuda")
    fallback = derive_slices(sweep(tensor_parallel={**overlap, "size": 4}, parallel={"pp": 2, "dp": 1}), ranks=2,
                             device="cuda")
    assert fallback.tp == 1 and not any(s.config.tensor_parallel.comm_overlap for s in fallback.slices)
    assert all(s.config.run.device == "cuda" for s in fallback.slices)


@pytest.mark.parametrize("space, base_mb, sizes", [
    (None, 25.0, [2.5, 25.0]),                                               # no knob: the trainer's and a tenth
    ({"params": {}}, 8, [0.8, 8.0]),
    ({"params": {"data_parallel.bucket_mb": {"choices": [10, 1, 10]}}}, 25.0, [1.0, 10.0]),
    ({"params": {"data_parallel.bucket_mb": {"choices": [4]}}}, 25.0, [0.4, 4.0]),   # at least two sizes
    ({"params": {"data_parallel.bucket_mb": {"low": 1, "high": 2}}}, 25.0, [1.0, 1.414214, 2.0]),
    ({"params": {"data_parallel.bucket_mb": {"low": 3, "high": 3}}}, 25.0, [0.3, 3.0]),
    ({"params": {"data_parallel.bucket_mb": {"low": 3}}}, 25.0, [2.5, 25.0]),  # not a range: as without it
])
def test_bucket_sizes_are_the_spaces_choices_or_its_range_else_the_trainers_own_and_never_fewer_than_two(
        space, base_mb, sizes):
    assert bucket_sizes(space, base_mb) == sizes


def test_each_dp_slice_runs_its_own_bucket_size_and_dp_1_is_refused_naming_the_flag():
    base = derive_trainer_slices(DEFAULT, ranks=2, layers=2).slices[0].config
    comm = dp_comm_slices(base, [0.5, 5.0], "x")
    assert [(c.config.data_parallel.bucket_mb, c.config.data_parallel.overlap_grad_reduce) for c in comm] == \
        [(0.5, False), (0.5, True), (5.0, False), (5.0, True)]
    one = derive_trainer_slices(DEFAULT, ranks=1, layers=2).slices[0].config
    with pytest.raises(ValueError) as e:
        dp_comm_slices(one, [0.5, 5.0], "x")
    assert str(e.value) == "--ranks: the data-parallel slices need dp >= 2 (this slice has dp 1)"


def test_any_sweep_at_one_rank_and_layer_count_keeps_plain_names_its_counts_and_the_default_steps():
    plan, _ = derive_any(sweep(), [2], [2])
    assert [s.name for s in plan.slices] == [s.name for s in derive_slices(sweep(), 2, 2).slices]
    assert (plan.ranks, plan.layers, plan.slices[0].config.run.steps) == (2, 2, 4)
    no_backend = sweep()
    del no_backend["backend"]  # a file without backend: is a model-backend file
    assert [s.name for s in derive_any(no_backend, [2], [2])[0].slices] == [s.name for s in plan.slices]
    on_gpu, _ = derive_any(sweep(), [2], [2], device="cuda")
    assert {s.config.run.device for s in on_gpu.slices} == {"cuda"}


@pytest.mark.parametrize("ranks, layers", [([2, 1], [2]), ([2], [1, 2])])
def test_several_rank_or_layer_counts_name_each_slice_and_merge_the_notes(ranks, layers):
    plan, _ = derive_any(sweep(), ranks, layers)
    assert (plan.ranks, plan.layers) == (0, 0)
    assert [s.name for s in plan.slices] == [f"ranks={r} layers={L} {s.name}" for r in ranks for L in layers
                                             for s in derive_slices(sweep(), r, L).slices]
    expected = tuple(dict.fromkeys(n for r in ranks for L in layers for n in derive_slices(sweep(), r, L).notes))
    assert plan.notes == expected


def test_tp_falling_back_at_one_rank_is_noted_even_when_another_rank_count_comes_first():
    plan, _ = derive_any(sweep(), [2, 1], [2])
    assert plan.notes[1].startswith("tensor_parallel.size=2 does not divide --ranks 1")
    assert len(plan.notes) == 2


def test_a_ray_sweep_runs_the_steps_asked_with_one_warmup_step_under_the_trainers_own_names():
    plan, _ = derive_any(DEFAULT, [1, 2], [2], steps=5)
    assert {(s.config.run.steps, s.config.run.warmup_steps) for s in plan.slices} == {(5, 1)}
    assert [s.name for s in plan.slices] == [s.name for r in (1, 2)
                                             for s in derive_trainer_slices(DEFAULT, r, 2, steps=5, warmup=1).slices]


def test_dp_slices_come_from_each_rank_counts_largest_microbatch_slice_at_the_most_layers():
    """The buckets hide under the last microbatch's backward, longest at the space's largest micro-batch size: the
    DP slices are that compute slice (the baseline's recompute) at each bucket size, overlap off and on."""
    s = sweep(tensor_parallel={"size": 1}, parallel={"pp": 2, "dp": 4})
    plan, comm = derive_any(s, [2, 4], [1, 2])
    assert [c.name.split(" dp ")[0] for c in comm] == ["ranks=2 layers=2"] * 6 + ["ranks=4 layers=2"] * 6
    for r in (2, 4):
        slices = derive_slices(s, r, 2).slices
        widest = max((x.config for x in slices if x.config.recompute == slices[0].config.recompute),
                     key=lambda c: c.batch.micro_batch_size)
        assert widest.batch.micro_batch_size > slices[0].config.batch.micro_batch_size
        for c in comm:
            if c.name.startswith(f"ranks={r} "):
                assert dataclasses.replace(c.config, data_parallel=widest.data_parallel) == widest


def test_without_a_bucket_knob_the_dp_slices_run_the_trainers_bucket_and_a_tenth():
    s = sweep(tensor_parallel={"size": 1}, parallel={"pp": 2, "dp": 4})
    del s["space"]["params"]["data_parallel.bucket_mb"]
    _, comm = derive_any(s, [2], [2])
    assert [c.name for c in comm] == [f"ranks=2 layers=2 dp bucket_mb={b} overlap={o}"
                                      for b in ("2.5", "25") for o in ("off", "on")]


def test_derive_any_names_a_model_file_without_a_planner_and_a_shrunk_ray_file():
    with pytest.raises(ValueError) as e:
        derive_any({"backend": "model"}, [2], [2])
    assert str(e.value) == "planner: section missing (a backend: model sweep file needs one)"
    with pytest.raises(ValueError) as e:
        derive_any(DEFAULT, [2], [2], shrink=2)
    assert str(e.value) == "--shrink: only for model-backend files (a ray sweep's trainer: shape is what runs)"


# ---- the job's world (job_world): the ranks a slice's density is taken from -------------------------------

@pytest.mark.parametrize("sweep_file, cluster_gpus, world", [
    # A ray or command sweep runs resources.world_size ranks (2 unless set), whatever a planner section says.
    ({"backend": "ray", "resources": {"world_size": 4}, "planner": {"cluster": {"num_gpus": 64}}}, 32, 4),
    ({"backend": "command", "resources": {"world_size": 3}}, None, 3),
    ({"backend": "command"}, 8, 2),
    ({"backend": "ray", "resources": None}, None, 2),
    ({"backend": "ray", "resources": {"world_size": None}}, None, 2),
    ({"backend": "ray", "resources": {"world_size": "6"}}, None, 6),
    # A model-backend file (the default backend): the file's own cluster size first ...
    ({"planner": {"cluster": {"num_gpus": 16}}, "resources": {"world_size": 4}}, 8, 16),
    ({"backend": "model", "planner": {"cluster": {"num_gpus": "16"}}}, None, 16),
    # ... else the cluster file's ...
    ({"planner": {"cluster": {}, "parallel": {"pp": 2, "dp": 3}}}, 8, 8),
    ({"planner": {"cluster": None}}, 8, 8),
    ({"planner": None}, 8, 8),
    ({"backend": "model"}, 8, 8),
    ({"planner": {"cluster": {"num_gpus": 0}}}, 8, 8),
    # ... else tp x pp x dp of its planner section, each 1 unless set.
    ({"planner": {"parallel": {"pp": 2, "dp": 3}, "tensor_parallel": {"size": 4}}}, None, 24),
    ({"planner": {"parallel": {"pp": "2", "dp": "3"}, "tensor_parallel": {"size": "4"}}}, 0, 24),
    ({"planner": {"parallel": {"pp": 2}}}, None, 2),
    ({"planner": {"parallel": {"dp": 3}, "tensor_parallel": {}}}, None, 3),
    ({"planner": {"tensor_parallel": {"size": 4}, "parallel": None}}, None, 4),
    ({"planner": {"tensor_parallel": None, "parallel": {}}}, None, 1),
    ({}, None, 1),
])
def test_the_jobs_world_is_the_ray_world_size_else_the_clusters_gpus_else_the_layout(sweep_file, cluster_gpus,
                                                                                     world):
    got = job_world(sweep_file, cluster_gpus)
    assert got == world and type(got) is int


# ---- the pipeline schedules of a space (schedules) ----------------------------------------------------------

def _params(**params) -> dict:
    return {"params": params}


PP2 = {"parallel.pp": {"type": "categorical", "choices": [1, 2]}}


@pytest.mark.parametrize("space, expected", [
    # No pipelining at all: no schedule to measure.
    (None, []), ({}, []), (_params(), []),
    (_params(**{"parallel.pp": {"choices": [1]}}), []),
    (_params(**{"parallel.pp": {"choices": [1]}, "pipeline.schedule": {"choices": ["gpipe"]}}), []),
    # Any pp above 1 pipelines; the space's schedules in order, each once, 1f1b when it names none.
    (_params(**{"parallel.pp": {"choices": [2]}}), [("1f1b", 1)]),
    (_params(**{"parallel.pp": {"type": "int", "low": 1, "high": 4}}), [("1f1b", 1)]),
    (_params(**PP2, **{"pipeline.schedule": {"choices": ["gpipe", "1f1b", "gpipe"]}}), [("gpipe", 1), ("1f1b", 1)]),
    # Interleaving runs the space's most virtual stages (above 1), else 2; every other schedule runs 1.
    (_params(**PP2, **{"pipeline.schedule": {"choices": ["interleaved_1f1b", "gpipe"]}}),
     [("interleaved_1f1b", 2), ("gpipe", 1)]),
    (_params(**PP2, **{"pipeline.schedule": {"choices": ["interleaved_1f1b"]},
                       "pipeline.virtual_stages": {"choices": [4, 3, 1]}}), [("interleaved_1f1b", 4)]),
    (_params(**PP2, **{"pipeline.schedule": {"choices": ["interleaved_1f1b"]},
                       "pipeline.virtual_stages": {"choices": [1]}}), [("interleaved_1f1b", 2)]),
    (_params(**PP2, **{"pipeline.schedule": {"choices": ["interleaved_1f1b", "1f1b"]},
                       "pipeline.virtual_stages": {"type": "int", "low": 1, "high": 3}}),
     [("interleaved_1f1b", 3), ("1f1b", 1)]),
])
def test_schedules_are_the_spaces_own_each_once_at_its_most_virtual_stages_and_none_without_pipelining(
        space, expected):
    assert schedules(space) == expected


# ---- the pipeline slices (pp_comm_slices): each schedule at the smallest and largest micro-batch size --------

def _base(ranks: int, global_batch: int = 16, mbs: int = 1):
    c = derive_trainer_slices(DEFAULT, ranks=ranks, layers=2).slices[0].config
    return dataclasses.replace(c, batch=dataclasses.replace(c.batch, global_batch=global_batch,
                                                            micro_batch_size=mbs))


def _pp(ranks: int, space: dict, global_batch: int = 16, mbs: int = 1):
    return pp_comm_slices(_base(ranks, global_batch, mbs), space, "r")


def test_pipeline_slices_run_two_stages_of_one_layer_per_chunk_with_the_other_ranks_as_replicas_and_no_recompute():
    space = _params(**PP2, **{"pipeline.schedule": {"choices": ["1f1b", "interleaved_1f1b"]},
                              "pipeline.virtual_stages": {"choices": [3]},
                              "batch.micro_batch_size": {"choices": [2]}})
    out = _pp(6, space, global_batch=24)
    assert [(s.name, s.role) for s in out] == [("r pp=2 1f1b mbs=2", "pp"), ("r pp=2 interleaved_1f1b mbs=2", "pp")]
    for s, v in zip(out, (1, 3)):
        c = s.config
        assert (c.parallel.pp, c.parallel.dp, c.world_size, c.model.n_layers) == (2, 3, 6, 2 * v)
        assert c.pipeline == type(c.pipeline)(schedule=s.name.split()[2], virtual_stages=v)
        assert c.stage_layers() == [[i] for i in range(2 * v)]  # one layer per model chunk
        assert c.recompute.kind == "none" and c.batch.micro_batch_size == 2
    assert _base(6, 24).recompute.kind == "full"  # the base recomputes; its pipeline slices do not


def test_pipeline_slices_take_the_smallest_and_largest_micro_batch_size_once_each():
    sizes = lambda space: [s.config.batch.micro_batch_size for s in _pp(2, space)]  # noqa: E731
    assert sizes(_params(**PP2, **{"batch.micro_batch_size": {"choices": [4, 1, 2, 8, 2]}})) == [1, 8]
    assert sizes(_params(**PP2, **{"batch.micro_batch_size": {"choices": [4, 4]}})) == [4]
    # Without the knob: the base's own micro-batch size.
    assert [s.config.batch.micro_batch_size for s in _pp(2, _params(**PP2), mbs=2)] == [2]
    assert _pp(2, _params(**{"parallel.pp": {"choices": [1]}})) == ()


@pytest.mark.parametrize("global_batch, schedule, mbs, expected", [
    # The job's global batch when the replicas split it into whole microbatches ...
    (16, "1f1b", 2, 16), (16, "interleaved_1f1b", 2, 16),
    # ... else the next multiple up; interleaving needs whole rounds of one microbatch per stage (2 at pp 2).
    (6, "1f1b", 4, 8), (6, "interleaved_1f1b", 4, 8), (4, "interleaved_1f1b", 4, 8),
    # torch's 1F1B needs at least 2 microbatches (pp) per replica: 1 would be refused; GPipe runs one.
    (4, "1f1b", 4, 8), (4, "gpipe", 4, 4), (4, "gpipe", 2, 4), (2, "1f1b", 2, 4), (4, "1f1b", 2, 4),
    (12, "1f1b", 8, 16), (12, "interleaved_1f1b", 8, 16), (8, "interleaved_1f1b", 2, 8),
    (10, "interleaved_1f1b", 2, 12), (10, "1f1b", 2, 10),
])
def test_pipeline_slices_keep_the_jobs_global_batch_in_whole_microbatches_per_replica(global_batch, schedule, mbs,
                                                                                     expected):
    space = _params(**PP2, **{"pipeline.schedule": {"choices": [schedule]},
                              "batch.micro_batch_size": {"choices": [mbs]}})
    (s,) = _pp(2, space, global_batch=global_batch)
    assert s.config.batch.global_batch == expected


@pytest.mark.parametrize("ranks, ok", [(1, False), (2, True), (3, False), (4, True), (5, False), (6, True)])
def test_pipeline_slices_need_an_even_number_of_ranks_of_at_least_two(ranks, ok):
    if ok:
        (s,) = _pp(ranks, _params(**PP2), global_batch=60)
        assert s.config.parallel.dp == ranks // 2
    else:
        with pytest.raises(ValueError) as e:
            _pp(ranks, _params(**PP2), global_batch=60)
        assert str(e.value) == (f"--ranks: the pipeline slices need an even number of ranks >= 2 (this slice has "
                                f"{ranks})")


# ---- the density rule (density): what is refused, naming the field --------------------------------------------

@pytest.mark.parametrize("world, per_node, field", [(0, 8, "world"), (True, 8, "world"), ("2", 8, "world"),
                                                    (2.0, 8, "world"), (2, False, "gpus_per_node"),
                                                    (2, 0, "gpus_per_node")])
def test_the_density_rule_takes_whole_positive_counts_and_names_the_field(world, per_node, field):
    with pytest.raises(ValueError) as e:
        density(world, per_node)
    assert str(e.value) == f"{field}: expected an integer >= 1, got {(world if field == 'world' else per_node)!r}"
    assert density(1, 1) == 1


# ---- a ray sweep's slices keep the job's global batch (derive_trainer_slices) --------------------------------

def test_ray_slices_run_each_micro_batch_size_on_the_jobs_global_batch_rounded_up_to_whole_microbatches():
    # DEFAULT: global batch 16, micro-batch sizes 1, 2, 4, 8. Over 3 replicas 16 is no multiple of mbs x 3: the
    # next one up; at 4 ranks and mbs 8 one microbatch per replica is already more than 16.
    for ranks, batches in ((2, {1: 16, 2: 16, 4: 16, 8: 16}), (3, {1: 18, 2: 18, 4: 24, 8: 24}),
                           (4, {1: 16, 2: 16, 4: 16, 8: 32})):
        plan = derive_trainer_slices(DEFAULT, ranks=ranks)
        by_mbs = {int(s.name.split("mbs=")[1].split()[0]): s.config.batch for s in plan.slices}
        assert {m: b.global_batch for m, b in by_mbs.items()} == batches
        assert all(b.micro_batch_size == m for m, b in by_mbs.items())


def test_the_dp_slices_are_of_the_baselines_recompute_even_when_the_second_slice_recomputes_otherwise():
    s = sweep(tensor_parallel={"size": 1}, parallel={"pp": 2, "dp": 4})
    del s["space"]["params"]["batch.micro_batch_size"]  # the second slice is another recompute kind
    plan, comm = derive_any(s, [2], [2])
    assert plan.slices[1].config.recompute != plan.slices[0].config.recompute
    assert comm and all(c.config.recompute == plan.slices[0].config.recompute for c in comm)


def test_the_default_sweep_at_four_ranks_has_pipeline_slices_at_its_largest_micro_batch():
    """Found by the table above: at dp 2 the job's 16 sequences are one microbatch of 8 per replica, which torch's
    1F1B refuses; the slice derivation raised that instead of running the fewest microbatches 1F1B can."""
    _, comm = derive_any(DEFAULT, [4], [2])
    pp = {(s.config.pipeline.schedule, s.config.batch.micro_batch_size): s.config for s in comm if s.role == "pp"}
    assert [(k, c.n_microbatches) for k, c in pp.items()] == [
        (("gpipe", 1), 8), (("gpipe", 8), 1), (("1f1b", 1), 8), (("1f1b", 8), 2),
        (("interleaved_1f1b", 1), 8), (("interleaved_1f1b", 8), 2)]


def test_a_slice_of_no_known_role_is_refused_naming_the_slice_and_the_roles():
    with pytest.raises(ValueError) as e:
        Slice("x", None, "tp")
    assert str(e.value) == "slice x: role 'tp' is not one of compute, dp, pp"
