"""Data-parallel communication fitted from slices (plan.commfit): it recovers known parameters from noisy
synthetic slice timings made with the planner's own formulas, and refuses what the slices cannot pin down."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.plan import commfit
from orchestrator.plan.prefilter import load_cluster, plan_for_trial
from orchestrator.plan.slices import bucket_sizes, derive_trainer_slices, dp_comm_slices

REPO = Path(__file__).resolve().parents[2]
TRUE = {"dp_latency_us": 1400.0, "dp_bw_eff": 0.35, "dp_overlap_eff": 0.25}


def _observations(buckets, noise: float, runs: int = 7, seed: int = 0, overlap=(False, True)):
    sweep = yaml.safe_load((REPO / "search_spaces" / "default.yaml").read_text())
    cluster, prior = load_cluster(REPO / "search_spaces" / "clusters" / "cpu-local.yaml")
    base = derive_trainer_slices(sweep, ranks=2, layers=2).slices[0].config
    truth = dataclasses.replace(prior, **TRUE)
    rng = np.random.default_rng(seed)
    obs = []
    for s in dp_comm_slices(base, buckets, "ranks=2 layers=2"):
        if s.config.data_parallel.overlap_grad_reduce not in overlap:
            continue
        plan = plan_for_trial(s.config, cluster, prior)
        exact = commfit._dp(plan, truth)
        obs.append(commfit.DPObservation(s.name, plan, tuple(exact * rng.lognormal(0.0, noise, runs))))
    return obs, prior


def test_bucket_sizes_of_the_default_space_span_its_range():
    sweep = yaml.safe_load((REPO / "search_spaces" / "default.yaml").read_text())
    assert bucket_sizes(sweep["space"], 25.0) == [0.05, 0.5, 5.0]
    assert bucket_sizes({"params": {"data_parallel.bucket_mb": {"choices": [1, 10]}}}, 25.0) == [1.0, 10.0]
    assert bucket_sizes(None, 25.0) == [2.5, 25.0]


def test_fit_recovers_known_parameters_from_noisy_slices():
    obs, prior = _observations([0.05, 0.5, 5.0], noise=0.05)
    fit = commfit.fit_dp_comm(obs, prior, n_boot=100)
    assert fit.refusal is None
    assert fit.values["dp_latency_us"] == pytest.approx(1400.0, rel=0.15)
    assert fit.values["dp_bw_eff"] == pytest.approx(0.35, rel=0.2)
    assert fit.values["dp_overlap_eff"] == pytest.approx(0.25, abs=0.1)
    for k, (lo, hi) in fit.intervals.items():
        assert lo <= fit.values[k] <= hi
    # the fitted rows are the planner's own predictions, and they match what was measured
    assert all(abs(f / m - 1) < 0.15 for _, m, _, f in fit.rows)
    assert fit.buckets[obs[0].name] > fit.buckets[obs[-1].name] >= 1


def test_one_bucket_count_cannot_tell_latency_from_bandwidth():
    obs, prior = _observations([0.5], noise=0.05)
    with pytest.raises(ValueError, match=r"cannot be told apart.*add an overlap-off slice at bucket_mb 0\.05"):
        commfit.fit_dp_comm(obs, prior)


def test_no_overlapped_slice_leaves_the_overlap_share_unidentifiable():
    obs, prior = _observations([0.05, 5.0], noise=0.05, overlap=(False,))
    with pytest.raises(ValueError, match="dp_overlap_eff cannot be pinned.*overlap-on slice"):
        commfit.fit_dp_comm(obs, prior)


def test_scattered_runs_are_refused_naming_the_slice_to_measure_again():
    obs, prior = _observations([0.05, 5.0], noise=0.9, runs=3, seed=1)
    fit = commfit.fit_dp_comm(obs, prior, n_boot=100)
    assert fit.refusal is not None and "not pinned down" in fit.refusal and "measure slice ranks=2" in fit.refusal
