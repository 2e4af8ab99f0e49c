"""Behaviour tests of the parity trust chain that the mutation run asked for (bench/mutation.py): the blame
sentence, the canonical run's self-check and the gate, each from small tables and hand-made results."""

from __future__ import annotations

import pytest

from orchestrator.parity.blame import sentence


# ---- blame: which family the stop message names ------------------------------------------------------------------

def test_no_suspect_run_gives_no_sentence():
    assert sentence([], {"a": None}) == ""


# ---- certify: the record the canonical run keeps of its self-check ----------------------------------------------

def _canonical(batch: int):
    from orchestrator.parity.trust import canonical_config
    from tests.unit.test_parity import make_result
    from trainer.config import TrainConfig, apply_overrides, flatten

    base = TrainConfig.from_dict(apply_overrides(TrainConfig().to_dict(), {"parallel.dp": 2 if batch > 1 else 1,
                                                                          "batch.global_batch": batch,
                                                                          "batch.micro_batch_size": 1}))
    return make_result([5.0, 4.9, 4.8], norms=[1.0, 0.9, 0.8], **flatten(canonical_config(base).to_dict()))


def test_the_self_check_record_names_the_knob_and_both_sizes_and_is_stored(tmp_path):
    from orchestrator.parity.trust import ParityGate
    from orchestrator.parity.verdict import ReferenceStore, maths_key
    from tests.unit.test_parity import second_of

    canon = _canonical(8)
    verdict = ParityGate(tmp_path / "refs").judge_canonical(canon, [second_of(canon)])
    record = verdict["self_check"]
    assert (record["knob"], record["values"], record["passed"]) == ("batch.micro_batch_size", [8, 1], True)
    assert record["max_loss_rel_diff"] == 0 and record["max_grad_norm_rel_diff"] == 0
    assert ReferenceStore(tmp_path / "refs").runs(maths_key(canon.config))[0]["self_check"] == record


def test_a_canonical_run_of_one_sequence_is_recorded_as_passed_with_nothing_to_compare(tmp_path):
    from orchestrator.parity.trust import ParityGate
    from orchestrator.parity.verdict import ReferenceStore, maths_key

    one = _canonical(1)
    record = ParityGate(tmp_path / "refs").judge_canonical(one)["self_check"]
    assert (record["knob"], record["values"], record["passed"]) == ("batch.micro_batch_size", [1], True)
    assert ReferenceStore(tmp_path / "refs").runs(maths_key(one.config))[0]["self_check"]["passed"] is True


# ---- trust: the canonical layout, the families, the gate ----------------------------------------------------------

def _cfg(**over):
    from trainer.config import TrainConfig, apply_overrides

    return TrainConfig.from_dict(apply_overrides(TrainConfig().to_dict(), over))


def test_the_canonical_run_keeps_the_run_settings_but_profiles_nothing():
    from orchestrator.parity.trust import canonical_config
    from orchestrator.parity.verdict import maths_key

    base = _cfg(**{"parallel.pp": 2, "run.steps": 5, "run.warmup_steps": 3, "run.profile_step": 2, "run.seed": 7,
                   "run.threads_per_rank": 3})
    canon = canonical_config(base)
    assert (canon.run.steps, canon.run.warmup_steps, canon.run.seed, canon.run.threads_per_rank) == (5, 3, 7, 3)
    assert canon.run.profile_step is None and maths_key(canon.to_dict()) == maths_key(base.to_dict())


@pytest.mark.parametrize("batch,holds,mbs", [
    (8, 1, 1),      # only one sequence fits
    (6, 3, 3),      # the divisors of 6 that fit: 3, 2, 1
    (8, 0, 1),      # nothing fits: the smallest microbatch is still the canonical run
    (12, 6, 6),
])
def test_the_canonical_microbatch_is_the_largest_divisor_that_fits(batch, holds, mbs):
    from orchestrator.parity.trust import canonical_config

    canon = canonical_config(_cfg(**{"batch.global_batch": batch, "parallel.dp": 2}),
                             lambda c: c.batch.micro_batch_size <= holds)
    assert canon.batch.micro_batch_size == mbs and canon.world_size == 1


@pytest.mark.parametrize("over,mbs", [
    ({"batch.global_batch": 6, "parallel.pp": 2}, 3),   # 1f1b at pp 2 needs two microbatches: 6 is not, 3 is
    ({"batch.global_batch": 8, "parallel.pp": 2}, 4),
    ({"batch.global_batch": 2, "parallel.pp": 2}, 1),
    ({"batch.global_batch": 6, "parallel.dp": 2}, 3),   # one microbatch per replica
])
def test_the_canonical_microbatch_of_a_layout_is_the_largest_valid_one(over, mbs):
    from orchestrator.parity.trust import one_microbatch_size

    assert one_microbatch_size(_cfg(**over)) == mbs


def test_a_knob_section_no_family_holds_is_a_family_of_its_own(monkeypatch):
    """What generic_families promises for a new knob section, shown by taking recompute's family away."""
    from orchestrator.parity import trust

    monkeypatch.setattr(trust, "FAMILIES", tuple(f for f in trust.FAMILIES if f.name != "recompute"))
    full = _cfg(**{"recompute.kind": "full", "parallel.dp": 2, "batch.micro_batch_size": 4,
                   "data_parallel.bucket_mb": 1e6,
                   "data_parallel.overlap_grad_reduce": False})
    generic = trust.generic_families(full)
    assert [(f.name, f.knobs) for f in generic] == [("recompute", ("recompute.",))]
    family = generic[0]
    assert family.active(full) and not family.active(_cfg())
    assert family.reset(full) == {"recompute": {"kind": "none"}}
    assert [f.name for f in trust.active_families(full)] == ["parallel.dp", "recompute"]
    assert dict(trust.suspects(full))["recompute"].recompute.kind == "none"


def test_a_family_that_cannot_be_set_back_alone_says_why():
    """A split of 1/3 layers with full recompute of 3: the balanced split (2/2) cannot recompute 3 layers."""
    from orchestrator.parity.trust import suspects

    base = _cfg(**{"parallel.pp": 2, "pipeline.split": {"kind": "first_last", "first": 1, "last": 3},
                   "recompute.kind": "full", "recompute.num_layers": 3, "pipeline.schedule": "gpipe",
                   "batch.micro_batch_size": 8})
    tried = dict(suspects(base))
    assert list(tried) == ["parallel.pp", "pipeline.split", "recompute"]
    assert isinstance(tried["pipeline.split"], str) and tried["pipeline.split"].startswith(
        "cannot be set back alone: recompute.num_layers=3")
    assert tried["recompute"].recompute.kind == "none" and tried["parallel.pp"].parallel.pp == 1


def test_the_pairs_are_every_two_active_families_in_order_once():
    from orchestrator.parity.trust import pairs

    base = _cfg(**{"parallel.pp": 2, "parallel.dp": 2, "recompute.kind": "full", "pipeline.schedule": "gpipe",
                   "batch.micro_batch_size": 2, "data_parallel.overlap_grad_reduce": False,
                   "data_parallel.bucket_mb": 1e6})
    assert [n for n, _ in pairs(base)] == ["parallel.pp + parallel.dp", "parallel.pp + batch.micro_batch_size",
                                          "parallel.pp + recompute", "parallel.dp + batch.micro_batch_size",
                                          "parallel.dp + recompute", "batch.micro_batch_size + recompute"]


def test_two_families_are_set_back_together_whichever_must_go_first():
    """The split alone cannot be set back (a balanced stage holds 2 of the 3 layers recomputed), the recompute
    alone can; set back together they are a valid layout, whichever family FAMILIES lists first."""
    from orchestrator.parity.trust import pairs

    base = _cfg(**{"parallel.pp": 2, "pipeline.split": {"kind": "first_last", "first": 1, "last": 3},
                   "recompute.kind": "full", "recompute.num_layers": 3, "pipeline.schedule": "gpipe",
                   "batch.micro_batch_size": 8})
    both = dict(pairs(base))["pipeline.split + recompute"]
    assert not isinstance(both, str), both
    assert (both.pipeline.split.kind, both.recompute.kind, both.parallel.pp) == ("balanced", "none", 2)


def test_a_family_whose_reset_is_never_valid_is_reported_alone_and_in_every_pair(monkeypatch):
    from orchestrator.parity import trust

    broken = trust.Family("broken", ("broken.",), lambda c: True, lambda c: {"parallel.dp": 0})
    monkeypatch.setattr(trust, "FAMILIES", trust.FAMILIES + (broken,))
    base = _cfg(**{"recompute.kind": "full"})
    alone = dict(trust.suspects(base))
    assert alone["broken"].startswith("cannot be set back alone: ") and alone["recompute"].recompute.kind == "none"
    together = dict(trust.pairs(base))
    assert together["recompute + broken"].startswith("cannot be set back together: ")
    assert "parallel.dp" in together["recompute + broken"]  # the reason, as the config check gives it


# ---- the gate: canonical run, baseline, suspects, trials ----------------------------------------------------------

def _result(losses, **over):
    from tests.unit.test_parity import make_result

    return make_result(list(losses), norms=[1.0, 0.9, 0.8][:len(losses)],
                       **{"run.steps": len(losses), "run.warmup_steps": 1, **over})


def _gate(tmp_path, **over):
    """A gate whose store holds a certified canonical run of losses 5.0, 4.9, 4.8 (one sequence per microbatch:
    nothing to decompose)."""
    from orchestrator.parity.trust import ParityGate

    gate = ParityGate(tmp_path / "refs")
    assert gate.judge_canonical(_result([5.0, 4.9, 4.8], **over))["passed"]
    return gate


def test_a_one_sequence_canonical_run_has_no_self_check_to_run(tmp_path):
    from orchestrator.parity.trust import ParityGate, canonical_config

    one = canonical_config(_cfg(**{"batch.global_batch": 1, "parallel.pp": 1}))
    assert ParityGate(tmp_path).self_checks(one) == []


def test_the_refusals_carry_a_failed_verdict(tmp_path):
    from orchestrator.parity.trust import ParityGate, TrustError, canonical_config
    from tests.unit.test_parity import second_of
    from trainer.config import flatten

    gate = ParityGate(tmp_path / "refs")
    canon = _result([5.0, 4.9, 4.8], **flatten(canonical_config(_cfg(**{"parallel.dp": 2})).to_dict()))
    with pytest.raises(TrustError) as missing:
        gate.judge_canonical(canon)  # its self-check run is missing
    assert missing.value.verdict["passed"] is False
    with pytest.raises(TrustError):
        gate.judge_canonical(canon, [second_of(canon, losses=[5.0, 4.95, 4.8])])
    with pytest.raises(TrustError) as broken:
        gate.judge_baseline(_result([5.0, 4.9, 4.8], **{"parallel.dp": 2}))
    assert broken.value.verdict["passed"] is False
    # A canonical run that does not reproduce the store: the verdict says where.
    other = _gate(tmp_path / "other")
    with pytest.raises(TrustError) as err:
        other.judge_canonical(_result([5.0, 4.95, 4.8]))
    assert (err.value.verdict["passed"], err.value.verdict["first_fail_step"]) == (False, 1)


def test_the_verdicts_name_what_the_canonical_run_shares_with_the_baseline(tmp_path):
    from orchestrator.parity.trust import ParityGate
    from tests.unit.test_parity import second_of
    from trainer.config import flatten

    base = _cfg(**{"parallel.pp": 2, "batch.micro_batch_size": 2, "pipeline.schedule": "gpipe"})
    gate = ParityGate(tmp_path / "refs")
    canon_cfg = gate.canonical_to_run(base, lambda c: c.batch.micro_batch_size <= 2)
    assert gate.shared == ["batch.micro_batch_size"]
    canon = _result([5.0, 4.9, 4.8], **flatten(canon_cfg.to_dict()))
    verdict = gate.judge_canonical(canon, [second_of(canon)])
    assert verdict["shared_with_canonical"] == ["batch.micro_batch_size"]
    verdict = gate.judge_baseline(_result([5.0, 4.9, 4.8], **flatten(base.to_dict())))
    assert verdict["passed"] and verdict["shared_with_canonical"] == ["batch.micro_batch_size"]


def test_a_baseline_with_nothing_stored_becomes_the_canonical_anchor(tmp_path):
    from orchestrator.parity.trust import ParityGate
    from orchestrator.parity.verdict import ReferenceStore, maths_key

    gate = ParityGate(tmp_path / "refs")
    result = _result([5.0, 4.9, 4.8], **{"parallel.pp": 2})
    assert gate.judge_baseline(result)["passed"]
    store = ReferenceStore(tmp_path / "refs")
    assert store.canonical(maths_key(result.config))["losses"] == [5.0, 4.9, 4.8]


def test_the_baseline_message_against_an_older_store_lists_no_settings(tmp_path):
    """A store from before canonical runs holds a baseline only: the settings the canonical layout would set back
    are not the question, the stored reference is."""
    from orchestrator.parity.trust import ParityGate, TrustError
    from orchestrator.parity.verdict import ReferenceStore, reference_from_result

    old = _result([5.0, 4.9, 4.8], **{"parallel.pp": 2, "recompute.kind": "full"})
    ReferenceStore(tmp_path / "refs").add(reference_from_result(old))
    with pytest.raises(TrustError) as err:
        ParityGate(tmp_path / "refs").judge_baseline(_result([5.0, 4.95, 4.8],
                                                             **{"parallel.pp": 2, "recompute.kind": "full"}))
    msg = str(err.value)
    assert msg.startswith("the baseline does not match the stored reference of the same maths: loss differs at step 1")
    assert "active settings" not in msg and "computes something else" not in msg and "Fix it" not in msg


def test_the_baseline_message_in_the_canonical_layout_lists_no_settings(tmp_path):
    from orchestrator.parity.trust import TrustError, canonical_config
    from trainer.config import flatten

    gate = _gate(tmp_path)
    canon = canonical_config(_cfg(**{"run.steps": 3, "run.warmup_steps": 1}))
    with pytest.raises(TrustError) as err:  # the canonical layout itself: nothing differs
        gate.judge_baseline(_result([5.0, 4.95, 4.8], **flatten(canon.to_dict())))
    msg = str(err.value)
    assert msg.startswith("the baseline does not match the canonical run of the same maths: loss differs at step 1")
    assert "active settings" not in msg and "computes something else" not in msg and "Fix it" not in msg


def test_the_baseline_message_blames_a_family_once_its_suspects_ran(tmp_path):
    from orchestrator.parity.trust import TrustError

    base = {"parallel.pp": 2, "recompute.kind": "full", "pipeline.schedule": "gpipe", "batch.micro_batch_size": 8}
    gate = _gate(tmp_path)
    with pytest.raises(TrustError) as err:
        gate.judge_baseline(_result([5.0, 4.95, 4.8], **base))
    assert "One of them computes something else" in str(err.value) and "Fix it" in str(err.value)
    assert "Set back to canonical" not in str(err.value)
    gate.tried = [("parallel.pp", False, "still differs"), ("recompute", True, "agrees")]
    with pytest.raises(TrustError) as err:
        gate.judge_baseline(_result([5.0, 4.95, 4.8], **base))
    msg = str(err.value)
    assert "Set back to canonical alone, recompute makes it agree" in msg and "One of them" not in msg


def test_a_disagreeing_baseline_has_its_active_families_as_suspects_and_their_runs_are_recorded(tmp_path):
    from orchestrator.parity.trust import ParityGate, canonical_config

    over = {"parallel.pp": 2, "recompute.kind": "full", "pipeline.schedule": "gpipe", "batch.micro_batch_size": 8}
    base = _cfg(**over)
    assert ParityGate(tmp_path / "empty").suspects(base, _result([5.0, 4.95, 4.8], **over)) == []  # no anchor
    gate = _gate(tmp_path)
    gate.tried = [("old", True, "")]
    assert gate.suspects(base, _result([5.0, 4.9, 4.8], **over)) == [] and gate.tried == []  # it agrees
    named = gate.suspects(base, _result([5.0, 4.95, 4.8], **over))
    assert [n for n, _ in named] == ["parallel.pp", "recompute"]
    assert canonical_config(named[0][1]) == canonical_config(base)
    pp_back = {**over, "parallel.pp": 1}
    assert gate.try_suspect("parallel.pp", _result([5.0, 4.95, 4.8], **pp_back), "") is False
    assert gate.try_suspect("recompute", _result([5.0, 4.9, 4.8], **{**over, "recompute.kind": "none"}), "") is True
    assert gate.try_suspect("pipeline.split", None, "did not run: oom") is None
    assert [(n, ok) for n, ok, _ in gate.tried] == [("parallel.pp", False), ("recompute", True),
                                                   ("pipeline.split", None)]
    whats = [w for _, _, w in gate.tried]
    assert whats[0].startswith("still differs (loss differs at step 1") and whats[1:] == ["agrees",
                                                                                         "did not run: oom"]


def test_a_fresh_gate_records_a_suspect_run(tmp_path):
    from orchestrator.parity.trust import ParityGate

    gate = ParityGate(tmp_path / "refs")
    assert gate.tried == [] and gate.pairs(_cfg(**{"recompute.kind": "full"})) == []
    gate.judge_canonical(_result([5.0, 4.9, 4.8]))
    assert gate.try_suspect("recompute", _result([5.0, 4.9, 4.8]), "") is True and len(gate.tried) == 1


def test_a_resumed_sweep_judges_by_the_stored_anchor_or_else_by_its_baseline(tmp_path):
    from orchestrator.parity.trust import ParityGate
    from orchestrator.parity.verdict import DEFAULT_TOLERANCE

    _gate(tmp_path)
    gate = ParityGate(tmp_path / "refs")
    gate.resume(_result([5.0, 4.95, 4.8], **{"parallel.pp": 2}))  # the ledger's baseline; the store has the anchor
    assert gate.reference["losses"] == [5.0, 4.9, 4.8] and gate.tolerance == DEFAULT_TOLERANCE["fp32"]
    assert gate.judge(_result([5.0, 4.9, 4.8], **{"parallel.pp": 2}))["passed"]
    fresh = ParityGate(tmp_path / "nothing")
    fresh.resume(_result([5.0, 4.95, 4.8], **{"parallel.pp": 2}))
    assert fresh.reference["losses"] == [5.0, 4.95, 4.8] and fresh.tolerance == DEFAULT_TOLERANCE["fp32"]
    assert fresh.judge(_result([5.0, 4.95, 4.8]))["passed"]


def test_a_trial_of_other_maths_fails_at_step_0(tmp_path):
    gate = _gate(tmp_path)
    gate.judge_baseline(_result([5.0, 4.9, 4.8], **{"parallel.pp": 2}))
    verdict = gate.judge(_result([5.0, 4.9, 4.8], **{"parallel.pp": 2, "optim.lr": 1e-4}))
    assert (verdict["passed"], verdict["first_fail_step"], verdict["first_fail_metric"]) == (False, 0,
                                                                                            "maths settings")


def test_bf16_repeats_widen_every_later_judgement_by_the_spread_from_the_first_repeat(tmp_path):
    """bf16: the baseline's repeats widen the tolerance to REPEAT_FACTOR x their spread, measured from the first
    run of the layout, and every later judgement (a trial, a later sweep's canonical run and baseline) uses it."""
    from orchestrator.parity.trust import ParityGate, canonical_config
    from orchestrator.parity.verdict import DEFAULT_TOLERANCE, REPEAT_FACTOR
    from tests.unit.test_parity import second_of
    from trainer.config import flatten

    bf16 = {"run.precision": "bf16"}
    floor = DEFAULT_TOLERANCE["bf16"].loss_rel
    s = 0.15 * floor  # widened: REPEAT_FACTOR x s = 1.5 floor
    off = lambda k, **over: _result([5.0, 4.9 * (1 + k), 4.8], **bf16, **over)  # noqa: E731
    gate = _gate(tmp_path, **bf16)
    assert gate.judge_baseline(off(0, **{"parallel.pp": 2}), [off(s, **{"parallel.pp": 2})])["passed"]
    assert gate.tolerance.loss_rel == pytest.approx(REPEAT_FACTOR * s, rel=1e-3)
    assert gate.judge(off(1.2 * floor, **{"parallel.pp": 2, "batch.micro_batch_size": 2}))["passed"]  # > floor
    # A later sweep: its repeat (the third run of the layout, -s) is measured from the first (0), not from +s.
    later = ParityGate(tmp_path / "refs")
    assert later.judge_baseline(off(-s, **{"parallel.pp": 2}), [])["passed"]
    assert later.tolerance.loss_rel == pytest.approx(REPEAT_FACTOR * s, rel=1e-3)
    assert not later.judge(off(2.2 * floor, **{"parallel.pp": 2}))["passed"]
    # A later canonical run of the whole batch (certified) is judged by the widened tolerance too.
    canon_cfg = canonical_config(_cfg(**bf16, **{"parallel.dp": 2, "run.steps": 3, "run.warmup_steps": 1}))
    canon = _result([5.0, 4.9 * (1 + 1.2 * floor), 4.8], **flatten(canon_cfg.to_dict()))
    assert ParityGate(tmp_path / "refs").judge_canonical(canon, [second_of(canon)])["passed"]
    # So are a later baseline's suspects: 1.2 floor from the anchor agrees, 2.2 floor does not.
    pp2 = {"parallel.pp": 2, "recompute.kind": "full"}
    gate = ParityGate(tmp_path / "refs")
    assert gate.suspects(_cfg(**bf16, **pp2), off(1.2 * floor, **pp2)) == []
    assert "recompute" in [n for n, _ in gate.suspects(_cfg(**bf16, **pp2), off(2.2 * floor, **pp2))]
    assert gate.try_suspect("recompute", off(1.2 * floor, **{"parallel.pp": 2}), "") is True
    assert gate.try_suspect("parallel.pp", off(2.2 * floor, **{"recompute.kind": "full"}), "") is False


def test_a_bf16_baseline_beyond_the_floor_passes_when_its_repeats_spread_that_wide(tmp_path):
    from orchestrator.parity.verdict import DEFAULT_TOLERANCE, REPEAT_FACTOR

    bf16 = {"run.precision": "bf16", "parallel.pp": 2}
    floor = DEFAULT_TOLERANCE["bf16"].loss_rel
    off = lambda k: _result([5.0, 4.9 * (1 + k), 4.8], **bf16)  # noqa: E731
    gate = _gate(tmp_path, **{"run.precision": "bf16"})
    assert gate.judge_baseline(off(1.2 * floor), [off(1.5 * floor)])["passed"]
    assert gate.tolerance.loss_rel == pytest.approx(REPEAT_FACTOR * 0.3 * floor, rel=1e-2)
