"""The parity verdict at its boundaries (issue 30: each case is a mutant the older tests let through)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.parity.verdict import (DEFAULT_TOLERANCE, ReferenceStore, Tolerance, compare, derive_tolerance,
                                         describe_failure, layout_key, maths_key, numerics_note, reference_from_result,
                                         tolerance_for)
from trainer.config import TrainConfig

from tests.unit.test_parity import make_result

LOSSES, NORMS = [5.0, 4.9, 4.8], [1.0, 0.9, 0.8]


def _ref(**kw):
    return reference_from_result(make_result(kw.pop("losses", LOSSES), kw.pop("norms", NORMS), **kw))


def test_a_full_length_run_judged_as_a_probe_still_compares_its_final_parameters():
    verdict = compare(_ref(), make_result(LOSSES, NORMS, fingerprint={"w": [2.5, 0.5]}), prefix=True)
    assert (verdict["passed"], verdict["first_fail_metric"], verdict["first_fail_step"]) == (False, "parameters", 2)
    assert verdict["max_fingerprint_rel_diff"] == pytest.approx(0.25)


def test_a_probe_of_one_update_is_compared_on_that_update_and_an_empty_one_fails():
    one = compare(_ref(), make_result([5.0], [1.0], fingerprint={"w": [9.0, 9.0]}), prefix=True)
    assert one["passed"] and one["steps"] == 1 and one["max_fingerprint_rel_diff"] is None
    empty = compare(_ref(), make_result([], []), prefix=True)
    assert (empty["passed"], empty["first_fail_metric"], empty["steps"]) == (False, "steps", 3)
    assert (empty["max_loss_rel_diff"], empty["max_grad_norm_rel_diff"]) == (0.0, 0.0)


@pytest.mark.parametrize("fingerprint, passed", [
    ({"w": [2.0, 0.6]}, False),                        # the sum moved, the norm did not
    ({"w": [2.0, 0.5], "b": [1.0, 1.0]}, False),       # a tensor the reference does not have
    ({"w": [1e4, 1.5]}, True),                         # sum moved 0.5 on a tensor of norm 1e4: 5e-5 relative
])
def test_the_fingerprint_compares_norm_and_sum_of_every_tensor(fingerprint, passed):
    ref = _ref(fingerprint={"w": [1e4, 1.0]} if fingerprint["w"][0] == 1e4 else {"w": [2.0, 0.5]})
    assert compare(ref, make_result(LOSSES, NORMS, fingerprint=fingerprint))["passed"] is passed


def test_every_tensor_counts_not_only_the_last():
    ref = _ref(fingerprint={"a": [2.0, 0.5], "b": [3.0, 1.0]})
    assert not compare(ref, make_result(LOSSES, NORMS, fingerprint={"a": [2.1, 0.5], "b": [3.0, 1.0]}))["passed"]


def test_a_tensor_that_is_zero_in_the_reference_must_stay_zero():
    ref = _ref(fingerprint={"w": [2.0, 0.5], "zero": [0.0, 0.0]})
    verdict = compare(ref, make_result(LOSSES, NORMS, fingerprint={"w": [2.0, 0.5], "zero": [1e-9, 1e-9]}))
    assert not verdict["passed"] and verdict["first_fail_metric"] == "parameters"
    losses = compare(_ref(losses=[0.0]), make_result([1e-9], [1.0]))
    assert not losses["passed"] and losses["first_fail_metric"] == "loss"


def test_each_metric_is_judged_by_its_own_tolerance_and_exactly_at_it_passes():
    # Differences exact in binary: loss 0.25, grad norm 0.5, parameters 0.25 (norm), replicas 0.125.
    ref = _ref(losses=[4.0], norms=[2.0], fingerprint={"w": [4.0, 0.0]})
    trial = make_result([5.0], [3.0], fingerprint={"w": [5.0, 0.0]}, replica=0.125)
    exact = Tolerance(loss_rel=0.25, grad_norm_rel=0.5, param_rel=0.25, replica_abs=0.125)
    assert compare(ref, trial, tolerance=exact)["passed"]
    for field, metric, diff in (("loss_rel", "loss", 0.25), ("grad_norm_rel", "grad_norm", 0.5),
                                ("param_rel", "parameters", 0.25), ("replica_abs", "replicas", 0.125)):
        tighter = Tolerance(**{**exact.__dict__, field: getattr(exact, field) * 0.99})
        v = compare(ref, trial, tolerance=tighter)
        assert (v["passed"], v["first_fail_metric"]) == (False, metric), field
        assert (v["first_fail_diff"], v["first_fail_tolerance"]) == (pytest.approx(diff), getattr(tighter, field))


def test_the_verdict_reports_the_worst_differences_and_the_replicas():
    v = compare(_ref(), make_result([5.0, 4.9 * 1.000001, 4.8], [1.0, 0.9, 0.8 * 1.00001],
                                    fingerprint={"w": [2.00002, 0.5]}, replica=5e-7))
    assert v["passed"] and v["replica_max_abs_diff"] == 5e-7
    assert v["max_loss_rel_diff"] == pytest.approx(1e-6) and v["max_grad_norm_rel_diff"] == pytest.approx(1e-5)
    assert v["max_fingerprint_rel_diff"] == pytest.approx(1e-5)


def test_failures_are_described_with_their_kind_of_difference():
    ref = _ref()
    loss = compare(ref, make_result([5.0, 4.9, 4.81], NORMS))
    assert describe_failure(loss) == (f"loss differs at step 2: relative difference "
                                      f"{loss['first_fail_diff']:.2e} > tolerance "
                                      f"{DEFAULT_TOLERANCE['fp32'].loss_rel:.1e}")
    replicas = compare(ref, make_result(LOSSES, NORMS, replica=1e-3))
    assert describe_failure(replicas) == ("data-parallel replicas differs at step 2: absolute difference 1.00e-03 > "
                                          "tolerance 1.0e-06")
    # An old ledger line may carry one of the two numbers: then none are printed.
    assert describe_failure({"first_fail_metric": "loss", "first_fail_step": 1, "first_fail_diff": 0.1,
                             "first_fail_tolerance": None}) == "loss differs at step 1"


def test_keys_do_not_depend_on_key_order_and_take_any_value():
    cfg = TrainConfig().to_dict()
    backwards = {k: dict(reversed(list(v.items()))) if isinstance(v, dict) else v for k, v in reversed(cfg.items())}
    assert maths_key(backwards) == maths_key(cfg) and layout_key(backwards) == layout_key(cfg)
    assert len(maths_key(cfg)) == 16 and len(layout_key(cfg)) == 16
    assert len(layout_key({**cfg, "where": Path("/tmp")})) == 16


def test_the_store_keeps_its_anchor_and_the_last_seven_under_a_new_directory(tmp_path):
    store = ReferenceStore(tmp_path / "a" / "b" / "refs")
    runs = [dict(_ref(), n=i) for i in range(10)]
    for r in runs:
        kept = store.add(r)
    assert [r["n"] for r in kept] == [0, 3, 4, 5, 6, 7, 8, 9]
    assert [r["n"] for r in store.runs(runs[0]["maths_key"])] == [0, 3, 4, 5, 6, 7, 8, 9]
    assert json.loads(store.path(runs[0]["maths_key"]).read_text())["maths_key"] == runs[0]["maths_key"]
    assert store.canonical(runs[0]["maths_key"]) is None


def test_certifying_marks_the_anchor_and_keeps_every_other_run(tmp_path):
    store = ReferenceStore(tmp_path / "refs")
    runs = [dict(_ref(), n=i) for i in range(3)]
    for r in runs:
        store.add(r)
    store.certify(runs[0]["maths_key"], {"passed": True})
    kept = store.runs(runs[0]["maths_key"])
    assert [(r["n"], r.get("self_check")) for r in kept] == [(0, {"passed": True}), (1, None), (2, None)]


@pytest.mark.parametrize("largest, expected", [
    # HEADROOM (5) x each metric, rounded up to one significant digit; an exact digit stays.
    ({"loss_rel": 2.3e-7, "grad_norm_rel": 1.5e-5, "param_rel": 3.5e-5}, (2e-6, 8e-5, 2e-4)),
    ({"loss_rel": 1.1e-3, "grad_norm_rel": 2.4e-2, "param_rel": 9.1e-2}, (6e-3, 0.2, 0.5)),
    ({"loss_rel": 4e-7, "grad_norm_rel": 1.0, "param_rel": 0.0}, (2e-6, 5.0, 1e-7)),   # never below 1e-7
    ({"loss_rel": 1e-9, "grad_norm_rel": 2.02e-3, "param_rel": 1.9e3}, (1e-7, 2e-2, 1e4)),
])
def test_a_tolerance_is_five_times_the_largest_legitimate_difference_rounded_up(largest, expected):
    tol = derive_tolerance(largest, replica_abs=3e-6)
    assert tol == Tolerance(*expected, replica_abs=3e-6)


def _widened(spread: float) -> float:
    """A GPU fp32 loss tolerance widened by a repeat spread: REPEAT_FACTOR x it, at most MAX_WIDENING x the floor."""
    from orchestrator.parity.verdict import MAX_WIDENING, REPEAT_FACTOR

    floor = DEFAULT_TOLERANCE["fp32"].loss_rel
    return max(floor, min(REPEAT_FACTOR * spread, MAX_WIDENING * floor))


def test_a_gpu_fp32_reference_widens_by_its_repeats():
    a = dict(_ref(losses=[5.0, 4.0]), device="cuda")
    b = dict(a, losses=[5.0, 4.0 * (1 + 2e-6)])
    assert tolerance_for([a, b]).loss_rel == pytest.approx(_widened(2e-6), rel=1e-3)
    assert tolerance_for([dict(a, device="cpu"), dict(b, device="cpu")]) == DEFAULT_TOLERANCE["fp32"]
    no_device = {k: v for k, v in a.items() if k != "device"}
    assert tolerance_for([no_device, dict(no_device, losses=b["losses"])]) == DEFAULT_TOLERANCE["fp32"]


def test_the_numerics_note_prints_the_measured_parameter_difference():
    verdict = compare(_ref(), make_result(LOSSES, NORMS))
    note = numerics_note({"parallel.dp": 2}, {"parallel.dp": 1}, verdict)
    assert "parameters 0.0e+00 " in note
    assert "parameters n/a " in numerics_note({"parallel.dp": 2}, {"parallel.dp": 1},
                                             {**verdict, "max_fingerprint_rel_diff": None})


def test_a_small_tensors_sum_is_judged_relative_to_its_own_norm():
    ref = _ref(fingerprint={"w": [2.0, 0.5], "tiny": [0.01, 0.002]})
    moved = make_result(LOSSES, NORMS, fingerprint={"w": [2.0, 0.5], "tiny": [0.01, 0.00201]})  # 1e-5 / 0.01
    assert compare(ref, moved)["first_fail_metric"] == "parameters"


def test_the_stored_reference_keeps_the_device_its_tolerance_depends_on():
    cuda = [reference_from_result(make_result([5.0, 4.0 * (1 + e)], **{"run.device": "cuda"})) for e in (0, 2e-6)]
    assert cuda[0]["device"] == "cuda"
    assert tolerance_for(cuda).loss_rel == pytest.approx(_widened(2e-6), rel=1e-3)
