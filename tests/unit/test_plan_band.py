"""Every planner prediction carries its band and the basis of its efficiency set; a model-backend summary judges
the target on the interval a prediction carries (here, older lines' band) by the answer's one rule."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.review import report
from orchestrator.calibration.verdict import verdict, verdict_lines
from orchestrator.records.record import TrialRecord
from orchestrator.planner import ClusterSpec, Efficiency, PlanConfig, predict
from orchestrator.planner.band import Band, load_band
from orchestrator.search.target import parse_target


def test_every_prediction_carries_the_stored_band_and_basis():
    p = predict(PlanConfig(cluster=ClusterSpec(num_gpus=1)))
    band = load_band()
    assert p.step_time_low_s == pytest.approx(p.step_time_s / (1 + band.hi))
    assert p.step_time_high_s == pytest.approx(p.step_time_s / (1 + band.lo))
    assert p.step_time_low_s <= p.step_time_s <= p.step_time_high_s
    assert "held-out" in p.band_basis and f"{band.n} held-out" in p.band_basis
    d = p.to_dict()
    assert {"step_time_low_s", "step_time_high_s", "band_basis", "efficiency_basis"} <= set(d)
    assert d["efficiency_basis"] == "prior"


def test_model_backend_outcomes_carry_the_band():
    from orchestrator.backends.planner_predictions import ModelRunner, PlannerConfigs

    configs = PlannerConfigs({"cluster": {"num_gpus": 2}, "parallel": {"dp": 2}}, {})
    runner = ModelRunner()
    runner.submit(0, configs.build({"batch.micro_batch_size": 2}))
    [(_, out)] = runner.poll(0)
    assert out.status == "ok" and out.prediction["step_time_high_s"] > out.prediction["step_time_s"]
    assert out.prediction["efficiency_basis"] == "prior"


def test_band_direction_residual_is_pred_over_truth():
    """e = pred / truth - 1: a model that runs 20% fast (e = -0.2) puts the truth above the prediction."""
    b = Band(lo=-0.2, hi=0.1, coverage=0.8, n=10)
    lo, hi = b.apply(8.0)
    assert hi == pytest.approx(10.0) and lo == pytest.approx(8.0 / 1.1)
    with pytest.raises(ValueError, match="band"):
        Band(lo=0.1, hi=0.2, coverage=0.8, n=3)


@pytest.mark.parametrize("n, ranks", [(9, (1, 9)), (10, (1, 10)), (19, (2, 18)), (25, (2, 24)), (48, (4, 45)),
                                      (99, (10, 90))])
def test_conformal_ranks_from_a_table(n, ranks):
    """k_lo = floor((n + 1) 0.1), k_hi = ceil((n + 1) 0.9) for an 80% band."""
    from orchestrator.planner.band import conformal_ranks

    assert conformal_ranks(n) == ranks


def test_too_few_residuals_for_the_stated_coverage_name_the_minimum():
    from orchestrator.planner.band import conformal_ranks
    from orchestrator.planner.fidelity import band_from_residuals

    with pytest.raises(ValueError, match="at least 9 held-out residuals, got 8"):
        conformal_ranks(8)
    with pytest.raises(ValueError, match="at least 9"):
        band_from_residuals([0.01 * i for i in range(8)])
    with pytest.raises(ValueError, match="at least 19 held-out residuals"):
        Band(lo=-0.1, hi=0.1, coverage=0.9, n=10)


def test_band_is_cut_at_the_conformal_ranks_and_holds_zero():
    from orchestrator.planner.fidelity import band_from_residuals

    r = [-0.30, -0.20, -0.10, -0.05, 0.0, 0.01, 0.02, 0.05, 0.10, 0.25]  # n = 10: ranks 1 and 10
    b = band_from_residuals(list(reversed(r)))
    assert (b.lo, b.hi, b.n) == (-0.30, 0.25, 10)
    r25 = [-0.5, -0.4] + [0.01 * i for i in range(1, 22)] + [0.6, 0.9]  # ranks 2 and 24: -0.4 and 0.6
    b = band_from_residuals(r25)
    assert (b.lo, b.hi) == (-0.4, 0.6) and "2nd and 24th smallest" in b.basis
    assert band_from_residuals([0.01 * i for i in range(1, 26)]).lo == 0.0  # all slow: the band still holds 0


@pytest.mark.parametrize("bad", ["guess", "", None])
def test_efficiency_basis_is_validated(bad):
    with pytest.raises(ValueError, match="basis: must be one of prior, blind, calibrated, fitted"):
        Efficiency(basis=bad)
    with pytest.raises(ValueError, match="basis_note"):
        Efficiency(basis_note=3)


def _line(trial, point, high, basis="blind", kind="trial", **changes):
    return TrialRecord.from_line({**_raw(trial, point, high, basis, kind), **changes})


def _raw(trial, point, high, basis, kind):
    return {"sweep": "s", "started_at": 0.0, "finished_at": 1.0, "trial": trial, "kind": kind, "backend": "model", "params": {"x": trial},
            "config": {"efficiency": {"basis": basis, "basis_note": "note"}}, "status": "ok", "reason": None,
            "result": None, "parity": None, "meets_target": False, "wall_s": 0.0, "overhead_s": None,
            "prediction": {"step_time_s": point, "step_time_low_s": point * 0.9, "step_time_high_s": high,
                           "band_basis": "80% band", "peak_memory_bytes": 1e9},
            "metrics": {"step_time_s": point, "peak_memory_bytes": 1e9}}


@pytest.mark.parametrize("target, want, words", [
    (10.0, "met", "target met: trial 2"),
    (9.3, "undecided", "target undecided: trial 2"),
    (7.0, "not met", "target not met: trial 2"),
])
def test_summary_judges_the_point_pick_by_its_interval(target, want, words):
    """Lines written before intervals carry a band (80%): the answer and the verdict judge the point pick's band
    by the one rule (met / not met / undecided); the config with the lowest upper end is named beside it."""
    # trial 2 is fastest at the point ([7.65, 9.8]), trial 3 has the lowest upper end ([7.83, 9.2])
    records = [_line(0, 12.0, 14.0, kind="baseline"), _line(2, 8.5, 9.8), _line(3, 8.7, 9.2)]
    v = verdict(records, target)
    assert v["verdict"] == want and v["point_trial"] == 2 and v["robust_trial"] == 3 and v["level"] == 0.8
    s = report.summarize(records, parse_target({"step_time_s": target}))
    assert s["target_verdict"] == want
    text = report.summary_text(s)
    assert words in text and "efficiency set: blind (note)" in text
    assert "lowest upper end: trial 3" in text and "(80% interval" in text


def test_calibrated_answer_is_labelled_and_measured_sweeps_get_no_verdict():
    lines = verdict_lines(verdict([_line(1, 8.0, 9.0, basis="calibrated")], 9.3))
    assert any("CALIBRATED" in ln for ln in lines)
    measured = _line(1, 8.0, 9.0, backend="ray", prediction=None)  # a measured line carries no prediction
    assert verdict([measured], 9.3) is None and verdict_lines(None) == []


def test_old_ledger_lines_without_a_band_say_so():
    old = _line(1, 8.0, 9.0, prediction={"step_time_s": 8.0}, config={})
    lines = verdict_lines(verdict([old], 9.3))
    assert lines[0] == "efficiency set: unrecorded" and "not recorded" in lines[1]
    assert verdict([old], 9.3)["verdict"] is None
