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
    full = _cfg(**{"recompute.kind": "full", "parallel.dp": 2, "batch.micro_batch_size": 4, "data_parallel.bucket_mb": 1e6,
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
