"""What measurements can pin down (planner.identify), intervals carried to predictions (planner.uncertainty),
and the density rule (calibration.slices.density): pure, from tables, no runs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from orchestrator.calibration.slices import density, derive_any, job_world, pp_comm_slices, schedules
from orchestrator.planner import apply_params, plan_config_from_dict
from orchestrator.planner.calibrate import _evaluate
from orchestrator.planner.identify import identify
from orchestrator.planner.knobs import encode
from orchestrator.planner.uncertainty import Interval, Uncertainty, intervals, predictions
from orchestrator.records.answer import MET, NOT_MET, UNDECIDED, interval_state

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def preset():
    doc = yaml.safe_load((REPO / "search_spaces" / "preset-500b.yaml").read_text())
    return plan_config_from_dict(doc["planner"])


def records(base, knob_sets, metrics=("step_time_s",)):
    out = []
    for knobs in knob_sets:
        cfg = apply_params(base, knobs)
        t = _evaluate(cfg, encode([cfg]), cfg.efficiency)
        out.append({"config": cfg, "measured": {m: t[m] for m in metrics}})
    return out


def test_a_parameter_the_measurements_cannot_see_is_held_with_the_reason(preset):
    """Without overlap of the parameter gather there is nothing for the per-send pipeline cost to be seen in...
    here: a pipeline-send latency on configs whose sends are a sliver; and the attention efficiency on a fused
    model whose scores are a sliver of its step, beside the GEMM efficiency."""
    recs = records(preset, [{"batch.micro_batch_size": b} for b in (1, 2, 3)])
    got = identify(recs, preset, ["matmul_eff", "pp_latency_us", "step_overhead_us"])
    assert "matmul_eff" in got.fit
    assert got.held["step_overhead_us"].startswith("no visible effect: doubling it moves no measurement by 2%")
    assert set(got.fit) | set(got.held) == {"matmul_eff", "pp_latency_us", "step_overhead_us"}


def test_of_two_parameters_that_do_the_same_thing_the_one_asked_first_stays(preset):
    """A per-update cost and the per-tensor optimizer cost are both constants of every config here: not separable.
    Beside them, the GEMM efficiency scales every config's compute alike: a constant on steps that differ by 40%
    is as good as a scale, so it is not separable either, and the one asked for first stays."""
    base = dataclasses.replace(preset, efficiency=dataclasses.replace(
        preset.efficiency, step_overhead_us=5e5, optimizer_tensor_us=3000.0))
    recs = records(base, [{"batch.micro_batch_size": b} for b in (1, 2, 3)])
    first = identify(recs, base, ["step_overhead_us", "optimizer_tensor_us"])
    assert first.fit == ("step_overhead_us",)
    assert first.held["optimizer_tensor_us"].startswith("not separable from step_overhead_us: ")
    swapped = identify(recs, base, ["optimizer_tensor_us", "step_overhead_us"])
    assert swapped.fit == ("optimizer_tensor_us",)
    assert identify(recs, base, ["matmul_eff", "step_overhead_us"]).fit == ("matmul_eff",)
    assert first.weighs_most["step_overhead_us"].startswith("measurement ")


def test_identify_refuses_a_field_it_cannot_fit(preset):
    with pytest.raises(ValueError, match="'hbm_gb' is not a fittable efficiency field"):
        identify(records(preset, [{}]), preset, ["hbm_gb"])


def test_intervals_carry_the_replicates_and_the_residuals(preset):
    e = preset.efficiency
    point = predictions([preset], e, ("step_time_s",))["step_time_s"][0]
    none = intervals([preset], e, None)[0]["step_time_s"]
    assert none.low == none.point == none.high == pytest.approx(point)
    flat = Uncertainty(({"matmul_eff": e.matmul_eff},) * 4)  # replicates equal to the point, no residuals
    iv = intervals([preset], e, flat)[0]["step_time_s"]
    assert iv.low == pytest.approx(point) and iv.high == pytest.approx(point)
    wide = Uncertainty(({"matmul_eff": e.matmul_eff},) * 4, {"step_time_s": (-0.1, 0.1)})
    iv = intervals([preset], e, wide, seed=1)[0]["step_time_s"]
    assert iv.low == pytest.approx(point * math.exp(-0.1)) and iv.high == pytest.approx(point * math.exp(0.1))
    slower = Uncertainty(({"matmul_eff": e.matmul_eff}, {"matmul_eff": e.matmul_eff / 2}))
    iv = intervals([preset], e, slower)[0]
    assert iv["step_time_s"].point == pytest.approx(point) and iv["step_time_s"].high > 1.2 * point
    with pytest.raises(ValueError, match="'peak' is not a planner figure"):
        intervals([preset], e, slower, metrics=("peak",))


def test_uncertainty_round_trips_and_refuses_nonsense_naming_the_field():
    u = Uncertainty(({"matmul_eff": 0.5, "op_overhead_us": 10.0},), {"step_time_s": (0.01, -0.02)}, 0.9, "b")
    assert Uncertainty.from_dict(u.to_dict()) == u
    assert u.fields == ("matmul_eff", "op_overhead_us")
    with pytest.raises(ValueError, match=r"uncertainty.samples\[0\].nope: not an efficiency field"):
        Uncertainty(({"nope": 1.0},))
    with pytest.raises(ValueError, match="uncertainty.samples: need at least one"):
        Uncertainty(())
    with pytest.raises(ValueError, match="f.samples: expected a list"):
        Uncertainty.from_dict({"samples": 3}, where="f")
    with pytest.raises(ValueError, match="uncertainty.level"):
        Uncertainty(({"matmul_eff": 0.5},), level=1.5)


@pytest.mark.parametrize("low, high, target, state", [
    (8.0, 9.0, 9.3, MET), (8.0, 9.3, 9.3, MET), (9.31, 10.0, 9.3, NOT_MET), (9.0, 9.5, 9.3, UNDECIDED),
    (9.3, 9.3, 9.3, MET)])
def test_the_one_target_rule_on_an_interval(low, high, target, state):
    assert interval_state(low, high, target) == state


def test_interval_text_and_checks():
    iv = Interval(8.8, 9.12, 9.61)
    assert iv.text() == "9.12 s (90%: 8.80-9.61 s)" and iv.contains(9.0) and not iv.contains(9.7)
    with pytest.raises(ValueError, match="interval: low 2 above high 1"):
        Interval(2, 1.5, 1)


@pytest.mark.parametrize("world, per_node, here, ranks", [
    (2, 64, 2, 2),      # the CPU demo: both ranks of the host busy
    (1, 64, 2, 1),      # a job that runs alone is timed alone
    (5120, 8, 8, 8),    # the 500B job: every GPU of a node busy
    (4, 8, None, 4),    # half a node
])
def test_the_density_rule(world, per_node, here, ranks):
    assert density(world, per_node, here) == ranks


def test_the_density_rule_refuses_a_node_too_small_and_bad_input():
    with pytest.raises(ValueError, match=r"the job runs 8 rank\(s\) per node .* this node has 2 device\(s\)"):
        density(5120, 8, 2)
    with pytest.raises(ValueError, match="gpus_per_node: expected an integer >= 1, got 0"):
        density(2, 0)


def test_job_world_of_each_backend():
    assert job_world({"backend": "ray", "resources": {"world_size": 4}}) == 4
    assert job_world({"backend": "ray"}) == 2
    assert job_world({"backend": "model", "planner": {"cluster": {"num_gpus": 5120}}}) == 5120
    assert job_world({"planner": {"parallel": {"pp": 2, "dp": 3}, "tensor_parallel": {"size": 4}}}) == 24


def test_pipeline_slices_cover_each_schedule_at_the_fewest_and_most_microbatches():
    sweep = yaml.safe_load((REPO / "search_spaces" / "default.yaml").read_text())
    assert schedules(sweep["space"]) == [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]
    plan, comm = derive_any(sweep, [2], [1, 2], steps=8)
    pp = [s for s in comm if s.role == "pp"]
    assert [(s.config.pipeline.schedule, s.config.batch.micro_batch_size, s.config.n_microbatches,
             s.config.model.n_layers) for s in pp] == [
        ("gpipe", 1, 16, 2), ("gpipe", 8, 2, 2), ("1f1b", 1, 16, 2), ("1f1b", 8, 2, 2),
        ("interleaved_1f1b", 1, 16, 4), ("interleaved_1f1b", 8, 2, 4)]
    assert all(s.config.parallel.pp == 2 and s.config.parallel.dp == 1 for s in pp)
    # compute slices keep the job's global batch: the job's microbatches per replica
    assert {s.config.batch.global_batch for s in plan.slices} == {16}
    assert schedules({"params": {"parallel.pp": {"choices": [1]}}}) == []
    with pytest.raises(ValueError, match="--ranks: the pipeline slices need an even number of ranks"):
        pp_comm_slices(dataclasses.replace(plan.slices[0].config, parallel=dataclasses.replace(
            plan.slices[0].config.parallel, dp=1), batch=dataclasses.replace(plan.slices[0].config.batch,
                                                                             global_batch=8)), sweep["space"], "x")


def test_the_guided_ranking_carries_a_profiles_interval_to_each_pick_and_the_ledger(tmp_path):
    """A profile's uncertainty gives every candidate its interval: relative to the starting prediction, kept
    around the refitted point; planner_fields writes it into the ledger's planner entry."""
    from orchestrator import backends
    from orchestrator.calibration import guided
    from orchestrator.calibration.prefilter import load_cluster
    from orchestrator.sweep.config import load_sweep

    cfg = load_sweep(str(REPO / "search_spaces" / "default.yaml"), [], check=False)
    configs = backends.build(cfg).configs
    cluster, eff = load_cluster(REPO / "search_spaces" / "clusters" / "cpu-local.yaml")
    u = Uncertainty(({"matmul_eff": eff.matmul_eff},) * 3, {"step_time_s": (-0.1, 0.0, 0.1)})
    r = guided.PlannerRanking(cfg.space, configs, cluster, eff, uncertainty=u)
    params = configs.baseline_params(cfg.space)
    iv = r.interval(params)
    assert iv.point == pytest.approx(r.predict(params))
    assert iv.low < iv.point < iv.high and iv.high / iv.point == pytest.approx(math.exp(0.1))
    assert guided.PlannerRanking(cfg.space, configs, cluster, eff).interval(params) is None
    r.efficiency = dataclasses.replace(eff, matmul_eff=eff.matmul_eff / 2)
    r._pred = None
    moved = r.interval(params)
    assert moved.point > iv.point and moved.high / moved.point == pytest.approx(iv.high / iv.point)
    sampler = guided.GuidedSampler.__new__(guided.GuidedSampler)
    sampler.ranking, sampler._picks = r, {}
    got = guided.planner_fields(sampler, params, {"step_time_s": moved.point}, 1)["planner"]
    assert got["predicted_low_s"] == pytest.approx(moved.low) and got["within_interval"] is True
