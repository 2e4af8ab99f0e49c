"""Parity verdicts from hand-made results (pure: no processes)."""

from __future__ import annotations

import pytest

from orchestrator.parity import (DEFAULT_TOLERANCE, check_space_is_throughput_only, compare, maths_key,
                                 reference_from_result, tolerance_from_repeats)
from trainer.config import TrainConfig, apply_overrides
from trainer.result import Result, StepRecord, Summary


def make_result(losses, norms=None, fingerprint=None, replica=0.0, **cfg_over) -> Result:
    cfg = TrainConfig.from_dict(apply_overrides({}, cfg_over)).to_dict()
    norms = norms or [1.0] * len(losses)
    steps = [StepRecord(i, 0.1, l, n, 512) for i, (l, n) in enumerate(zip(losses, norms))]
    summary = Summary(0.1, 0.1, 0.1, len(steps), 512, 5120.0, 1.0, 1.0, None, None, None, "n/a", 0, "n/a")
    return Result(config=cfg, world_size=1, n_microbatches=8, steps=steps, summary=summary, phases={}, memory={},
                  reduce_start_after_backward_s=None,
                  fingerprint=fingerprint or {"w": [2.0, 0.5]}, replica_max_abs_diff=replica)


def test_maths_key_ignores_throughput_knobs_and_sees_maths_changes():
    base = TrainConfig().to_dict()
    assert maths_key(base) == maths_key(apply_overrides(base, {"parallel.pp": 2, "recompute.kind": "full",
                                                               "batch.micro_batch_size": 2}))
    for change in ({"optim.lr": 1e-4}, {"batch.global_batch": 16}, {"run.seed": 1}, {"data.seed": 2},
                   {"run.precision": "bf16"}, {"optim.weight_decay": 0.1}):
        assert maths_key(apply_overrides(base, change)) != maths_key(base), change


@pytest.mark.parametrize("name", ["batch.global_batch", "optim.lr", "optim.warmup_steps", "run.seed", "data.seed",
                                  "optim.weight_decay", "model.n_layers", "run.precision"])
def test_space_varying_the_maths_is_refused(name):
    with pytest.raises(ValueError, match="change what the model learns") as err:
        check_space_is_throughput_only(["parallel.pp", name])
    assert name in str(err.value)


def test_throughput_space_is_accepted():
    check_space_is_throughput_only(["parallel.pp", "batch.micro_batch_size", "recompute.kind",
                                    "data_parallel.bucket_mb", "pipeline.split"])


def test_identical_run_passes():
    ref = reference_from_result(make_result([5.0, 4.9, 4.8]))
    verdict = compare(ref, make_result([5.0, 4.9, 4.8]))
    assert verdict["passed"] and verdict["first_fail_step"] is None and verdict["max_loss_rel_diff"] == 0


@pytest.mark.parametrize("kwargs,step,metric", [
    ({"losses": [5.0, 4.9, 4.81]}, 2, "loss"),
    ({"losses": [5.0, 4.9, 4.8], "norms": [1.0, 1.01, 1.0]}, 1, "grad_norm"),
    ({"losses": [5.0, 4.9, 4.8], "fingerprint": {"w": [2.001, 0.5]}}, 2, "parameters"),
    ({"losses": [5.0, 4.9, 4.8], "fingerprint": {"v": [2.0, 0.5]}}, 2, "parameters (2 differ in name)"),
    ({"losses": [5.0, 4.9, 4.8], "replica": 1e-3}, 2, "replicas"),
    ({"losses": [5.0, 4.9]}, 0, "steps"),
    ({"losses": [5.0, float("nan"), 4.8]}, 1, "loss"),
])
def test_first_failing_step_and_metric(kwargs, step, metric):
    ref = reference_from_result(make_result([5.0, 4.9, 4.8]))
    verdict = compare(ref, make_result(**kwargs))
    assert not verdict["passed"]
    assert (verdict["first_fail_step"], verdict["first_fail_metric"]) == (step, metric)


def test_tolerance_just_inside_and_outside():
    ref = reference_from_result(make_result([5.0]))
    tol = DEFAULT_TOLERANCE["fp32"].loss_rel
    assert compare(ref, make_result([5.0 * (1 + tol / 2)]))["passed"]
    assert not compare(ref, make_result([5.0 * (1 + tol * 2)]))["passed"]


def test_bf16_tolerance_widens_with_run_to_run_spread():
    a = reference_from_result(make_result([5.0, 4.0]))
    b = reference_from_result(make_result([5.0, 4.0 * (1 + 1e-4)]))
    tol = tolerance_from_repeats(a, b, "bf16")
    assert tol.loss_rel == pytest.approx(10 * 1e-4, rel=1e-3)
    same = tolerance_from_repeats(a, a, "bf16")
    assert same == DEFAULT_TOLERANCE["bf16"]


def test_reference_store_keeps_runs_by_maths_key(tmp_path):
    from orchestrator.parity import ReferenceStore, needs_repeat, tolerance_for

    store = ReferenceStore(tmp_path / "refs")
    a = reference_from_result(make_result([5.0, 4.0]))
    assert store.runs(a["maths_key"]) == []
    assert store.add(a) == [a]
    other = reference_from_result(make_result([5.0, 4.0], **{"optim.lr": 1e-4}))
    assert other["maths_key"] != a["maths_key"] and store.runs(other["maths_key"]) == []
    b = reference_from_result(make_result([5.0, 4.0 * (1 + 2e-4)]))
    assert store.add(b) == [a, b]
    assert tolerance_for([a]) == DEFAULT_TOLERANCE["fp32"]
    assert tolerance_for([a, b]).loss_rel == pytest.approx(2e-3, rel=1e-3)
    assert not needs_repeat(TrainConfig().to_dict())
    assert needs_repeat(apply_overrides(TrainConfig().to_dict(), {"run.precision": "bf16"}))


def test_numerics_note_names_reduction_order_knobs_with_measured_differences():
    from orchestrator.parity import numerics_note

    ref = reference_from_result(make_result([5.0, 4.9]))
    verdict = compare(ref, make_result([5.0, 4.9 * (1 + 1e-7)]))
    note = numerics_note({"batch.micro_batch_size": 4, "recompute.kind": "none"},
                         {"batch.micro_batch_size": 1, "recompute.kind": "none"}, verdict)
    assert "batch.micro_batch_size" in note and "recompute" not in note and "loss 1.0e-07" in note
    assert numerics_note({"recompute.kind": "full"}, {"recompute.kind": "none"}, verdict) is None
