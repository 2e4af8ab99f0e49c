"""The joint slice fit on synthetic slices: runs the planner generates at known efficiencies, with noise.

The default sweep's slices at its density (2 ranks: compute at 1 and 2 layers, data-parallel, pipeline), each
run's phases drawn around the planner's own figures at ``TRUE``: what the fit recovers, what it holds and why,
the intervals over the rounds, and the refusal that names the slice and the rounds a parameter would need.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from orchestrator.calibration import slicefit
from orchestrator.calibration.prefilter import load_cluster, plan_for_trial
from orchestrator.calibration.slices import derive_any
from orchestrator.calibration.stability import Unpinned, allowed_half_width, median_run, round_resamples, unpinned
from orchestrator.planner.calibrate import _evaluate
from orchestrator.planner.knobs import encode

REPO = Path(__file__).resolve().parents[2]
TRUE = {"matmul_eff": 0.3, "op_overhead_us": 500.0, "pass_overhead_us": 700.0, "optimizer_tensor_us": 30.0,
        "step_overhead_us": 1500.0, "dp_latency_us": 600.0, "pp_latency_us": 400.0}


def result(t: dict, scale: float) -> SimpleNamespace:
    """A trainer Result's fitted parts from the planner's figures, every phase scaled alike."""
    ph = {"forward": t["forward_s"], "backward": t["backward_s"] + t["recompute_s"], "optimizer": t["optimizer_s"],
          "dp_comm_wait": t["dp_exposed_s"], "pipeline_idle": t["pp_bubble_s"] + t["pp_p2p_s"]}
    return SimpleNamespace(summary=SimpleNamespace(step_time_s=t["step_time_s"] * scale,
                                                   peak_memory_bytes=t["peak_memory_bytes"]),
                           phases={k: {"max": v * scale} for k, v in ph.items()}, ranks=[], memory={})


def synthetic(noise: float, rounds: int, seed: int = 0, truth: dict = TRUE):
    sweep = yaml.safe_load((REPO / "search_spaces" / "default.yaml").read_text())
    cluster, prior = load_cluster(REPO / "search_spaces" / "clusters" / "cpu-local.yaml")
    true_eff = dataclasses.replace(prior, **truth)
    plan, comm = derive_any(sweep, [2], [1, 2], steps=8)
    slices = list(plan.slices) + list(comm)
    rng = np.random.default_rng(seed)
    runs = {}
    for s in slices:
        p = plan_for_trial(s.config, cluster, true_eff)
        t = _evaluate(p, encode([p]), true_eff)
        runs[s.name] = {r: result(t, float(rng.lognormal(0.0, noise))) for r in range(rounds)}
    return slices, runs, cluster, prior


@pytest.fixture(scope="module")
def clean():
    slices, runs, cluster, prior = synthetic(noise=0.02, rounds=5)
    return slicefit.fit(slices, runs, cluster, prior, n_boot=12)


def test_the_fit_recovers_the_costs_the_slices_pin_down(clean):
    for name in ("op_overhead_us", "pass_overhead_us", "dp_latency_us", "pp_latency_us", "step_overhead_us"):
        assert name in clean.fitted, clean.identified.held
        assert clean.fitted[name] == pytest.approx(TRUE[name], rel=0.25), name
    assert clean.fitted["matmul_eff"] == pytest.approx(TRUE["matmul_eff"], rel=0.25)
    assert max(abs(r.error_pct) for r in clean.rows) < 8
    # each slice's fitted step with its 90% interval for a measurement of its rounds; most hold the measured median
    assert all(r.low_s <= r.fitted_step_s <= r.high_s for r in clean.rows)
    assert sum(r.low_s <= r.measured_step_s <= r.high_s for r in clean.rows) >= 0.8 * len(clean.rows)


def test_what_a_single_layer_shape_cannot_separate_is_held_and_named(clean):
    """The elementwise kernels and the attention core scale with the tokens as the GEMMs do: one layer shape cannot
    tell them from matmul_eff, which comes first; they stay at the prior, each with the reason."""
    assert "elementwise_bw_eff" in clean.identified.held
    assert "not separable from" in clean.identified.held["elementwise_bw_eff"] or \
        "no visible effect" in clean.identified.held["elementwise_bw_eff"]
    assert not set(clean.identified.held) & set(clean.fitted)
    assert set(clean.identified.held) | set(clean.fitted) == set(slicefit.CANDIDATES)


def test_every_fitted_parameter_has_an_interval_over_the_rounds_that_holds_the_truth(clean):
    assert len(clean.uncertainty.samples) == 12
    for name in ("op_overhead_us", "pass_overhead_us", "dp_latency_us", "pp_latency_us"):
        lo, hi = clean.interval(name)
        assert lo <= clean.fitted[name] <= hi
        assert lo * 0.8 <= TRUE[name] <= hi * 1.25, (name, lo, hi)
    assert clean.uncertainty.residuals["step_time_s"]
    assert not clean.unpinned


def test_a_parameter_the_rounds_cannot_pin_names_its_slice_and_the_rounds_it_needs():
    slices, runs, cluster, prior = synthetic(noise=0.3, rounds=3, seed=1)
    fitted = slicefit.fit(slices, runs, cluster, prior, n_boot=12)
    assert fitted.unpinned
    u = fitted.unpinned[0]
    assert u.slice in runs and u.rounds == 3 and u.rounds_needed > 3
    assert f"measure slice {u.slice} in about {u.rounds_needed} rounds (it has 3)" in u.text()


def test_no_slice_ran_is_refused():
    slices, _, cluster, prior = synthetic(noise=0.0, rounds=1)
    with pytest.raises(ValueError, match="no slice ran to the end"):
        slicefit.fit(slices, {}, cluster, prior)


def test_round_resamples_keep_a_round_together_for_every_slice():
    runs = {"a": {0: "a0", 1: "a1", 2: "a2"}, "b": {0: "b0", 1: "b1", 2: "b2"}}
    seen = set()
    for drawn in round_resamples(runs, 30, seed=3):
        assert len(drawn["a"]) == 3  # as many draws as there are rounds
        assert [x[1:] for x in drawn["a"]] == [x[1:] for x in drawn["b"]]  # the same rounds for every slice
        seen.add(tuple(sorted(drawn["a"])))
    assert len(seen) > 3  # with replacement: repeats and other mixes
    assert list(round_resamples(runs, 2, seed=3)) == list(round_resamples(runs, 2, seed=3))
    assert list(round_resamples(runs, 5, seed=3)) != list(round_resamples(runs, 5, seed=4))


def test_a_slice_without_a_run_in_the_drawn_rounds_keeps_all_its_runs():
    runs = {"a": {0: "a0", 1: "a1"}, "late": {7: "l7"}}
    for drawn in round_resamples(runs, 30, seed=1):
        k = 3 - len(drawn["a"])  # rounds 0, 1, 7 drawn 3 times: a misses the draws of round 7
        assert drawn["late"] == (["l7"] * k if k else ["l7"])


def test_the_half_width_allowed_and_the_rounds_needed():
    assert allowed_half_width("matmul_eff", 0.4) == pytest.approx(0.2)
    assert allowed_half_width("dp_overlap_eff", 0.9) == 0.25  # a share of the window: absolute
    assert allowed_half_width("op_overhead_us", 0.0) == 25.0  # a floor for a cost that may fit to 0
    u = SimpleNamespace(field_interval=lambda name, v: SimpleNamespace(low=0.1, high=0.9, point=v))
    ident = SimpleNamespace(weighs_most={"matmul_eff": "s1: step_time_s"})
    (got,) = unpinned({"matmul_eff": 0.4}, u, ident, {"s1": 4, "s2": 9})
    # half-width 0.4 against 0.2 allowed: 4 rounds x (0.4 / 0.2)^2 = 16
    assert got == Unpinned("matmul_eff", 0.4, 0.1, 0.9, pytest.approx(0.2), "s1", 4, 16)
    narrow = SimpleNamespace(field_interval=lambda name, v: SimpleNamespace(low=0.35, high=0.45, point=v))
    assert unpinned({"matmul_eff": 0.4}, narrow, ident, {"s1": 4}) == ()


def test_median_run_is_a_real_run():
    rs = [SimpleNamespace(summary=SimpleNamespace(step_time_s=t)) for t in (3.0, 1.0, 2.0, 9.0)]
    assert median_run(rs).summary.step_time_s == 2.0
