"""Calibration evaluates the model once per batch of records sharing a fixed context: the residuals, the fit and
the error tables are the record-by-record ones, on a table of mixed layouts, recompute kinds, models and clusters."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

from orchestrator.planner import Efficiency, PlanConfig, apply_params, predict
from orchestrator.planner.knobs import Consts, encode
from tests.unit.test_planner_calibrate import _base  # the same base plan the unbatched fit is tested on

cal = importlib.import_module("orchestrator.planner.calibrate")  # the module (the package exports the function)

TRUE = Efficiency(matmul_eff=0.55, attention_eff=0.35, op_overhead_us=40.0, tp_bw_eff=0.6, pp_bw_eff=0.7,
                  dp_bw_eff=0.4, collective_latency_us=15.0, mem_reserved_gb=6.0, mem_activation_factor=1.15)
FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "pp_bw_eff", "dp_bw_eff", "collective_latency_us",
       "mem_activation_factor")
BASE_LAYOUT = [  # tp 4, pp 4, dp 8 with sequence parallelism, as the base: one batch among them
    {},
    {"batch.micro_batch_size": 4, "recompute.kind": "selective", "recompute.modules": ["core_attn", "mlp"]},
    {"recompute.kind": "full", "recompute.method": "block", "recompute.num_layers": 2},
    {"recompute.kind": "full", "recompute.method": "uniform", "recompute.num_layers": 1,
     "data_parallel.overlap_grad_reduce": True},
    {"recompute.kind": "op", "recompute.matmul_period": 2},
    {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "pipeline_comm.overlap_p2p": True},
    # ranks holding chunks of unequal size (3 + 2 layers on rank 0): the Knobs' uneven path
    {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "pipeline.split.kind": "first_last",
     "pipeline.split.first": 3, "pipeline.split.last": 1},
    {"tensor_parallel.comm_overlap": True, "batch.micro_batch_size": 2},
    {"data_parallel.kind": "fsdp"},
    {"optimizer.distributed": True, "optimizer.overlap_param_gather": True, "data_parallel.bucket_mb": 20.0},
    {"pipeline.schedule": "gpipe"},
]
OTHER_LAYOUTS = [
    {"tensor_parallel.sequence_parallel": False},
    {"parallel.pp": 2, "parallel.dp": 16},
    {"parallel.pp": 2, "parallel.dp": 16, "recompute.kind": "full", "data_parallel.overlap_grad_reduce": True},
    {"tensor_parallel.size": 8, "parallel.dp": 4},
    {"tensor_parallel.size": 1, "parallel.dp": 32, "recompute.kind": "selective"},
    {"batch.global_batch": 512},
]


def _configs(eff: Efficiency) -> list[PlanConfig]:
    """The knob table on the base, then the base layout with another model, cluster and precision: same
    (pp, dp, tp), other fixed context, so none of them may share the base's batch."""
    base = _base(eff)
    cfgs = [apply_params(base, k) for k in BASE_LAYOUT + OTHER_LAYOUTS]
    cfgs.append(dataclasses.replace(base, model=dataclasses.replace(base.model, num_layers=8, hidden_size=2048)))
    cfgs.append(dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, inter_node_bw_GBps=50)))
    cfgs.append(dataclasses.replace(base, job=dataclasses.replace(base.job, precision="bf16_autocast")))
    return cfgs


def _records(seed: int = 0) -> list[dict]:
    """Measurements of the table with 2% noise: every third record with its memory peak, the others with a
    varying subset of times, in varying order."""
    rng = np.random.default_rng(seed)
    times = ["step_time_s", "forward_s", "backward_incl_recompute_s", "dp_exposed_s", "pp_idle_s", "tp_comm_s"]
    records = []
    for i, cfg in enumerate(_configs(Efficiency())):
        p = predict(dataclasses.replace(cfg, efficiency=TRUE))
        exact = {**dataclasses.asdict(p), "backward_incl_recompute_s": p.backward_s + p.recompute_s,
                 "pp_idle_s": p.pp_bubble_s + p.pp_p2p_s}
        names = list(rng.permutation(times)[: 2 + i % 4])
        if i % 3 == 0:
            names.append("peak_memory_bytes")
        records.append({"config": cfg, "measured": {n: float(exact[n]) * (1 + 0.02 * rng.standard_normal())
                                                    for n in names}})
    return records


def _residuals_per_record(records, base, fit, prior_weight=cal.PRIOR_WEIGHT, weights=None):
    """The record-by-record residuals calibrate computed before batching: one model call per record."""
    weights = weights or {}
    eff0 = base.efficiency
    z0 = np.array([cal._to_z(n, getattr(eff0, n)) for n in fit])
    prepared = [(r["config"], encode([r["config"]]), cal._metrics(r)) for r in records]

    def residuals(z):
        eff = dataclasses.replace(eff0, **{n: cal._from_z(n, v) for n, v in zip(fit, z)})
        out = []
        for cfg, knobs, meas in prepared:
            pred = cal._evaluate(cfg, knobs, eff)
            floor = 0.02 * meas.get("step_time_s", 0.0) or 1e-3
            for name, value in meas.items():
                denom = max(abs(value), floor) if name != "peak_memory_bytes" else abs(value)
                out.append(weights.get(name, 1.0) * (pred[name] - value) / denom)
        out.extend(prior_weight * (z - z0))
        return np.asarray(out)

    return residuals, z0


def _captured_residuals(monkeypatch, records, base, fit, **kw):
    """The residual function calibrate hands its solver (the solver stops at the start)."""
    seen = {}

    def solver(f, z0):
        seen["f"] = f
        return z0

    monkeypatch.setattr(cal, "_scipy_solver", lambda tol=cal.SOLVER_TOL, max_evals=cal.MAX_EVALS, method="lm": solver)
    cal.calibrate(records, base, fit=fit, **kw)
    return seen["f"]


def test_batches_share_one_consts_and_keep_other_contexts_apart():
    cfgs = _configs(Efficiency())
    batches = cal._batches(cfgs, Efficiency())
    rows = sorted(int(i) for b in batches for i in b.rows)
    assert rows == list(range(len(cfgs)))  # every record in exactly one batch
    keys = [Consts.of(b.cfg, TRUE) for b in batches]
    assert len(set(keys)) == len(batches)
    for b in batches:
        assert all(Consts.of(cfgs[i], TRUE) == Consts.of(b.cfg, TRUE) for i in b.rows)
        assert b.knobs.n == len(b.rows)
    # the whole knob table on the base layout is one batch; the other model, cluster and precision are not in it
    base_batch = next(b for b in batches if 0 in b.rows)
    assert sorted(int(i) for i in base_batch.rows) == list(range(len(BASE_LAYOUT)))


@pytest.mark.parametrize("weights, prior_weight", [(None, cal.PRIOR_WEIGHT), ({"dp_exposed_s": 3.0}, 0.0)])
def test_batched_residuals_equal_the_record_by_record_ones(monkeypatch, weights, prior_weight):
    records = _records()
    base = _base(Efficiency())
    batched = _captured_residuals(monkeypatch, records, base, FIT, weights=weights, prior_weight=prior_weight)
    reference, z0 = _residuals_per_record(records, base, FIT, prior_weight, weights)
    rng = np.random.default_rng(1)
    for z in (z0, z0 + 0.3 * rng.standard_normal(len(z0)), z0 - 0.5):
        want = reference(z)
        got = batched(z)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("use_scipy", [True, False])
def test_fit_and_error_tables_equal_the_record_by_record_fit(use_scipy):
    if use_scipy:
        pytest.importorskip("scipy.optimize")
    records = _records(seed=2)
    base = _base(Efficiency())
    got = cal.calibrate(records, base, fit=FIT, use_scipy=use_scipy)
    reference, z0 = _residuals_per_record(records, base, FIT)
    z = cal._scipy_solver()(reference, z0) if use_scipy else cal._levenberg_marquardt(reference, z0)
    eff = dataclasses.replace(base.efficiency, **{n: cal._from_z(n, v) for n, v in zip(FIT, z)})
    for name in FIT:
        assert got.fitted[name] == pytest.approx(getattr(eff, name), rel=1e-9), name
    rows = [(cal._config(r, base, i), cal._metrics(r)) for i, r in enumerate(records)]
    before = cal._errors([(cal._evaluate(c, encode([c]), base.efficiency), m) for c, m in rows])
    after = cal._errors([(cal._evaluate(c, encode([c]), eff), m) for c, m in rows])
    for table, want in ((got.errors_before, before), (got.errors_after, after)):
        assert table.keys() == want.keys()
        for metric, stats in want.items():
            assert table[metric] == pytest.approx(stats, rel=1e-9, abs=1e-9), metric


def test_calibrate_refuses_a_solver_method_it_does_not_know_naming_the_field():
    with pytest.raises(ValueError, match=r"^method: expected one of lm, trf, got 'dogbox'$"):
        cal.calibrate(_records(), _base(Efficiency()), fit=FIT, method="dogbox")
