"""The interval a model-backend prediction carries and its verdict: where the interval comes from (a corpus set's
stored bootstrap, a calibration file's uncertainty: section, else the corpus band), the one met / not met /
undecided rule at the interval's edges, what `plan` prints, and the loader's refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.backends.planner_predictions import ModelRunner, PlannerConfigs
from orchestrator.calibration import sources as S
from orchestrator.calibration.ledger_fit import load_uncertainty
from orchestrator.calibration.cli import plan
from orchestrator.calibration.interval import StepInterval, step_intervals
from orchestrator.planner import apply_params, corpus, fidelity, plan_config_from_dict
from orchestrator.planner.corpus_uncertainty import corpus_set
from orchestrator.planner.uncertainty import Interval, Uncertainty
from orchestrator.records import answer as A
from orchestrator.records.record import TrialRecord
from orchestrator.search.target import parse_target

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "search_spaces" / "preset-500b.yaml"


def _preset() -> dict:
    return yaml.safe_load(PRESET.read_text())


def _baseline():
    raw = _preset()
    planner, sources = S.resolve(raw["planner"], PRESET.parent)
    return apply_params(plan_config_from_dict(planner), raw["baseline"]), sources


# ---- the bootstrap over the corpus fit rows ---------------------------------------------------------------

def test_bootstrap_draws_are_fixed_by_the_seed_and_stay_in_their_generation():
    rows = corpus.load()
    ids = lambda d: {g: [r.id for r in v] for g, v in d.items()}  # noqa: E731
    a, b = fidelity.resample(rows, 3, seed=0), fidelity.resample(rows, 3, seed=0)
    assert ids(a) == ids(b)
    assert ids(fidelity.resample(rows, 3, seed=1)) != ids(a) and ids(fidelity.resample(rows, 4, seed=0)) != ids(a)
    fit = {g: [r for r in rows if r.split == "fit" and r.gpu == g] for g in a}
    for g, drawn in a.items():
        assert len(drawn) == len(fit[g]) and {r.id for r in drawn} <= {r.id for r in fit[g]}
        assert len({r.id for r in drawn}) < len(drawn)  # with replacement: some row twice (true for seed 0, 3)


def test_a_transferred_set_carries_the_h100_replicates_and_says_so():
    b200, h100 = corpus_set("b200"), corpus_set("h100-sxm")
    assert b200.uncertainty.samples == h100.uncertainty.samples and b200.point == h100.point
    assert "transferred to b200" in b200.uncertainty.basis and "transferred" not in h100.uncertainty.basis
    assert set(b200.point) == set(fidelity.A100_FIT) | set(fidelity.H100_FIT)
    with pytest.raises(ValueError, match="'tpu' has no stored set; choose from"):
        corpus_set("tpu")


# ---- which interval a prediction carries ------------------------------------------------------------------

def test_the_preset_carries_the_b200_corpus_sets_interval():
    base, sources = _baseline()
    assert sources.uncertainty is not None and sources.uncertainty.source == "the b200 corpus set"
    (si,) = step_intervals([base], sources)
    assert si.from_fit and si.interval.level == 0.9 and "bootstrap of the h100-sxm corpus fit" in si.basis
    assert si.interval.low < si.interval.point < si.interval.high


def test_an_override_of_a_fitted_field_falls_back_to_the_band_and_says_why():
    base, sources = _baseline()
    calibrated = dataclasses.replace(base, efficiency=dataclasses.replace(base.efficiency, matmul_eff=0.80))
    (si,) = step_intervals([calibrated], sources)
    assert not si.from_fit and si.interval.level == 0.8
    assert "the corpus band, not the fit's uncertainty (the b200 corpus set has matmul_eff = 0.5838" in si.basis
    p = si.interval.point
    assert si.interval.low < p < si.interval.high


def test_a_calibration_files_uncertainty_section_replaces_the_corpus_one(tmp_path):
    eff = {**_preset()["planner"]["efficiency"], "matmul_eff": 0.7}
    u = Uncertainty(({"matmul_eff": 0.69}, {"matmul_eff": 0.71}, {"matmul_eff": 0.70}), {"step_time_s": (0.0,)},
                    basis="three refits")
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"efficiency": eff, "uncertainty": u.to_dict()}))
    planner, sources = S.resolve({**_preset()["planner"], "calibration_file": str(path)})
    assert sources.uncertainty.source == "calibration file cal.yaml" and sources.uncertainty.point == {"matmul_eff": 0.7}
    base = apply_params(plan_config_from_dict(planner), _preset()["baseline"])
    (si,) = step_intervals([base], sources)
    assert si.from_fit and "three refits" in si.basis and si.interval.high / si.interval.low < 1.05
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"efficiency": eff}))  # no uncertainty: section -> the band, and why
    _, sources = S.resolve({**_preset()["planner"], "calibration_file": str(plain)})
    assert sources.uncertainty is None and sources.no_uncertainty == "calibration file plain.yaml has no uncertainty: section"


@pytest.mark.parametrize("spec, needle", [
    ("b200", "planner.uncertainty: expected {corpus: GENERATION}"),
    ({"corpus": "b200", "extra": 1}, "planner.uncertainty: expected {corpus: GENERATION}"),
    ({"corpus": "tpu"}, "planner.uncertainty.corpus: 'tpu' has no stored set"),
])
def test_a_bad_uncertainty_declaration_names_the_field(spec, needle):
    with pytest.raises(ValueError) as e:
        S.resolve({**_preset()["planner"], "uncertainty": spec})
    assert needle in str(e.value)


# ---- the one rule at the interval's edges ------------------------------------------------------------------

@pytest.mark.parametrize("low, high, state", [
    (8.0, 9.30, "met"),          # the upper end on the target: met
    (8.0, 9.3000001, "undecided"),
    (9.30, 10.0, "undecided"),   # the lower end on the target: not wholly above
    (9.3000001, 10.0, "not met"),
    (9.30, 9.30, "met"),         # a point on the target
])
def test_verdict_states_at_the_intervals_edges(low, high, state):
    si = StepInterval(Interval(low, (low + high) / 2, high, 0.9), "b", True)
    assert si.verdict(9.30) == state == A.interval_state(low, high, 9.30)
    # The sweep's answer judges a predicted winner by the interval its prediction carries, with the same rule.
    rec = _predicted(1, (low + high) / 2, {**si.to_dict()})
    verdict = A.decide([rec], parse_target({"step_time_s": 9.30})).target
    assert (verdict.state, verdict.interval_s, verdict.level) == (state, (low, high), 0.9)


def _predicted(trial: int, point: float, interval: dict | None, **band) -> TrialRecord:
    prediction = {"step_time_s": point, "peak_memory_bytes": 1e9, **band}
    if interval is not None:
        prediction["interval"] = interval
    return TrialRecord.from_line({
        "sweep": "s", "started_at": 0.0, "finished_at": 1.0, "trial": trial, "kind": "baseline" if trial == 0 else "trial",
        "backend": "model", "params": {"x": trial}, "config": {"efficiency": {"basis": "blind"}}, "status": "ok",
        "reason": None, "result": None, "parity": None, "meets_target": False, "wall_s": 0.0, "overhead_s": None,
        "prediction": prediction, "metrics": {"step_time_s": point, "peak_memory_bytes": 1e9}})


def test_an_older_line_is_judged_by_its_band_and_a_bare_prediction_at_its_point():
    target = parse_target({"step_time_s": 9.30})
    banded = _predicted(1, 9.0, None, step_time_low_s=8.8, step_time_high_s=10.6)
    assert A.decide([banded], target).target.state == "undecided"
    assert A.decide([banded], target).target.level == 0.8
    assert A.decide([_predicted(1, 9.0, None)], target).target.state == "met"


def test_the_summary_words_an_undecided_prediction_and_names_the_lowest_upper_end():
    from orchestrator.review import report

    iv = lambda lo, p, hi: {"low": lo, "point": p, "high": hi, "level": 0.9, "basis": "fit", "from_fit": True}  # noqa
    records = [_predicted(0, 12.0, iv(11.5, 12.0, 15.0)), _predicted(2, 8.8, iv(8.6, 8.8, 11.2)),
               _predicted(3, 9.0, iv(8.8, 9.0, 9.25))]
    text = report.summary_text(report.summarize(records, parse_target({"step_time_s": 9.30})))
    assert "target undecided: trial 2, predicted ~8.800 s against ~9.300 s (90% interval ~8.600 s-~11.200 s)" in text
    assert "a prediction's interval is the model's uncertainty" in text
    assert "interval (trial 2): ~8.80 s (90%: 8.60-11.20 s); fit" in text
    assert "lowest upper end: trial 3, ~9.00 s, upper end ~9.25 s; against the target: met" in text


def test_model_backend_predictions_carry_their_interval():
    raw = _preset()
    configs = PlannerConfigs(raw["planner"], raw["baseline"], PRESET.parent)
    runner = ModelRunner(configs.sources)
    runner.submit(0, configs.build({}))
    [(_, out)] = runner.poll(0)
    iv = out.prediction["interval"]
    assert iv["from_fit"] and iv["level"] == 0.9 and iv["low"] < out.prediction["step_time_s"] < iv["high"]
    bare = ModelRunner()  # no sources (a test runner): the band, labelled
    bare.submit(0, configs.build({}))
    [(_, out)] = bare.poll(0)
    assert not out.prediction["interval"]["from_fit"] and out.prediction["interval"]["level"] == 0.8


# ---- plan's lines -------------------------------------------------------------------------------------------

def test_plan_prints_the_interval_its_basis_and_the_verdict(capsys):
    out = plan(PRESET, [])
    iv = Interval(*(out["interval"][k] for k in ("low", "point", "high", "level")))
    assert main(["plan", "--config", str(PRESET)]) == 0
    text = capsys.readouterr().out
    assert f"step time: {iv.text()} per update" in text and iv.text().startswith("11.82 s (90%: ")
    assert "interval: 90% interval from the fit's uncertainty (the b200 corpus set: bootstrap" in text
    assert out["target_verdict"] == "not met"
    assert (f"not met (the whole 90% interval {iv.low:.2f}-{iv.high:.2f} s is above 9.30 s)") in text
    # every phase of the breakdown with its interval, from the same replicates
    fwd = out["interval"]["phases"]["forward_s"]
    assert fwd["low"] < fwd["point"] < fwd["high"] and fwd["point"] == pytest.approx(out["prediction"]["forward_s"])
    assert "breakdown (critical path, s; 90% intervals): forward " in text
    assert f"forward {fwd['point']:.3f} ({fwd['low']:.3f}-{fwd['high']:.3f})" in text


def test_plan_of_a_config_that_straddles_the_target_is_undecided(capsys):
    best = ["batch.micro_batch_size=1", "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=12",
            "recompute.kind=none", "data_parallel.overlap_grad_reduce=true", "optimizer.overlap_param_gather=true",
            "data_parallel.bucket_mb=1036", "optimizer.grad_reduce_dtype=bf16"]
    out = plan(PRESET, best)
    iv = out["interval"]
    assert iv["low"] < out["target_s"] < iv["high"] and out["target_verdict"] == "undecided"
    assert main(["plan", "--config", str(PRESET), *best]) == 0
    assert (f"undecided (the 90% interval {iv['low']:.2f}-{iv['high']:.2f} s straddles 9.30 s; the point estimate "
            f"{iv['point']:.2f} s is under it)") in capsys.readouterr().out


def test_plan_best_searches_the_files_space_and_judges_its_best(tmp_path, capsys):
    raw = _preset()
    raw["space"] = {"params": {"recompute.kind": {"type": "categorical", "choices": ["full", "selective"]},
                               "data_parallel.overlap_grad_reduce": {"type": "categorical", "choices": [False, True]},
                               "data_parallel.bucket_mb": {"type": "float", "low": 40, "high": 2000, "log": True}}}
    raw["planner"]["uncertainty"] = {"corpus": "b200"}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = plan(path, [], best=True)
    b = out["best"]
    assert b["params"]["recompute.kind"] == "selective" and b["params"]["data_parallel.overlap_grad_reduce"] is True
    assert b["interval"]["point"] == pytest.approx(b["step_time_s"])
    assert b["step_time_s"] < out["prediction"]["step_time_s"]
    assert b["target_verdict"] == A.interval_state(b["interval"]["low"], b["interval"]["high"], out["target_s"])
    assert main(["plan", "--config", str(path), "--best"]) == 0
    text = capsys.readouterr().out
    assert "best config of the file's space: " + Interval(*(b["interval"][k] for k in ("low", "point", "high", "level"))
                                                          ).text() in text
    raw.pop("space")
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--config", str(path), "--best"]) == 2
    assert "--best: " in capsys.readouterr().err


# ---- the loader ---------------------------------------------------------------------------------------------

def _cal(tmp_path: Path, uncertainty) -> Path:
    path = tmp_path / "cal.yaml"
    doc = {"efficiency": {"matmul_eff": 0.5, "basis": "fitted"}}
    if uncertainty is not ...:
        doc["uncertainty"] = uncertainty
    path.write_text(yaml.safe_dump(doc))
    return path


def test_load_uncertainty_reads_the_section_and_tolerates_its_absence(tmp_path):
    u = Uncertainty(({"matmul_eff": 0.49}, {"matmul_eff": 0.51}), {"step_time_s": (0.01, -0.02)}, basis="b")
    assert load_uncertainty(_cal(tmp_path, u.to_dict())) == u
    assert load_uncertainty(_cal(tmp_path, ...)) is None


@pytest.mark.parametrize("section, field", [
    ({"samples": "many"}, "uncertainty.samples"),
    ({"samples": []}, "uncertainty.samples"),
    ({"samples": [{"matmul_effx": 0.5}]}, "samples[0].matmul_effx"),
    ({"samples": [{"matmul_eff": 0.5}, {"matmul_eff": 1.5}]}, "uncertainty.samples[1].matmul_eff"),
    ({"samples": [{"matmul_eff": 0.5}], "residuals": {"step_time_s": ["x"]}}, "uncertainty"),
    ({"samples": [{"matmul_eff": 0.5}], "residuals": [0.1]}, "uncertainty.residuals"),
    ({"samples": [{"matmul_eff": 0.5}], "level": 2}, "uncertainty.level"),
    ("all of it", "uncertainty"),
])
def test_load_uncertainty_refusals_name_the_field(tmp_path, section, field):
    path = _cal(tmp_path, section)
    with pytest.raises(ValueError) as e:
        load_uncertainty(path)
    assert str(path) in str(e.value) and field in str(e.value), e.value
    with pytest.raises(ValueError, match="no such calibration file"):
        load_uncertainty(tmp_path / "missing.yaml")
