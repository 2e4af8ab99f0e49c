"""The trust chain with real gloo runs (issue 21): a seeded bug IN the baseline is refused by the canonical run,
and setting the baseline's active families back one at a time names the knob family that carries it.

The gate (orchestrator.parity.trust.ParityGate) is driven as the sweep drives it (canonical, baseline, its
suspects, the verdict), with every run a real trainer run on the local launcher with the bug in every rank.
The sweep's own wiring of the same calls is tests/unit/test_sweep_loop.py (fake runner) and
tests/e2e/test_faults_parity.py (a real sweep, recompute bug).
"""

from __future__ import annotations

import types

import pytest

from orchestrator.backends.base import RunOutcome
from orchestrator.backends.ray_trials import RayTrials
from orchestrator.parity.trust import ParityGate, TrustError, canonical_config
from tests.distributed import seeded_bugs as bugs
from tests.distributed._common import cfg
from trainer.launch import RankFailed, spawn_many

pytestmark = pytest.mark.distributed


def run_all(configs, bug):
    """Each config's Result, one local world per world size (ranks fork from the launcher's warm server)."""
    out = {}
    for world in sorted({c.world_size for c in configs}):
        group = [c for c in configs if c.world_size == world]
        for c, r in zip(group, spawn_many(group, setup=bug)):
            assert not isinstance(r, RankFailed), r
            out[id(c)] = r
    return [out[id(c)] for c in configs]


def stop_message(tmp_path, baseline, bug) -> str:
    """What the sweep stops with: the canonical run, the baseline, each suspect, then the baseline's verdict."""
    gate = ParityGate(tmp_path / "refs")
    canonical = gate.canonical_to_run(baseline)
    assert canonical is not None and canonical.world_size == 1
    (second,) = gate.self_checks(canonical)
    canon_result, check, base_result = run_all([canonical, second, baseline], bug)
    assert gate.judge_canonical(canon_result, [check])["passed"]
    suspects = gate.suspects(baseline, base_result)
    assert suspects, "the baseline carries the bug: it must differ from the canonical run"
    # As the sweep asks (orchestrator.backends.ray_trials.suspect_runs): each family alone, then, when none agreed,
    # every two together; each batch run at once here.
    for batch in (lambda: suspects, lambda: gate.pairs(baseline)):
        tried = batch()
        configs = [c for _, c in tried]
        assert not any(isinstance(c, str) for c in configs), tried
        for (family, _), result in zip(tried, run_all(configs, bug)):
            gate.try_suspect(family, result, "")
    with pytest.raises(TrustError) as err:
        gate.judge_baseline(base_result)
    return str(err.value)


CASES = [
    # (bug, baseline layout, the family it must name, an inert or innocent family it must not name)
    (bugs.bug_bf16_small_buckets, {"parallel.dp": 2, "batch.micro_batch_size": 4, "data_parallel.bucket_mb": 0.02},
     "data_parallel.bucket_mb", "data_parallel.overlap_grad_reduce makes"),
    (bugs.bug_loss_normaliser_wrong_for_mbs_4, {"parallel.dp": 2, "batch.global_batch": 16,
                                                "batch.micro_batch_size": 4}, "batch.micro_batch_size", "bucket_mb makes"),
    (bugs.bug_last_bucket_not_averaged_under_overlap, {"parallel.dp": 2, "batch.micro_batch_size": 4,
                                                       "data_parallel.overlap_grad_reduce": True},
     "data_parallel.overlap_grad_reduce", "bucket_mb makes"),
    (bugs.bug_recompute_replays_perturbed_input, {"parallel.dp": 2, "batch.micro_batch_size": 4,
                                                  "recompute.kind": "full"}, "recompute", "parallel.dp makes"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bug,layout,family,innocent", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_bug_in_the_baseline_stops_the_sweep_naming_its_family(tmp_path, bug, layout, family, innocent):
    msg = stop_message(tmp_path, cfg({**layout, "run.steps": 3}), bug)  # each bug shows by step 1
    assert "the baseline does not match the canonical run of the same maths" in msg, msg
    assert f"Set back to canonical alone, {family} makes it agree with the canonical run" in msg, msg
    assert innocent not in msg, msg


@pytest.mark.timeout(240)
def test_two_bugs_in_the_baseline_are_named_as_the_pair_that_makes_it_agree(tmp_path):
    """Issue 27 item 2: overlap and recompute both buggy. No one family set back agrees; the pairs the layout
    activates run next and the narrowest agreeing pair is named (not "more than one")."""
    layout = {"parallel.dp": 2, "batch.micro_batch_size": 4, "data_parallel.overlap_grad_reduce": True,
              "recompute.kind": "full", "run.steps": 3}
    msg = stop_message(tmp_path, cfg(layout), bugs.bug_overlap_and_recompute)
    assert "No one family set back to canonical alone makes it agree" in msg, msg
    assert "set back together, data_parallel.overlap_grad_reduce and recompute make it agree" in msg, msg


@pytest.mark.timeout(240)
def test_a_pruned_trial_carrying_a_layout_bug_is_parity_failed(tmp_path):
    """A slow config (here: small buckets) is pruned after its probe; its probe's updates are compared with the
    reference's same updates, and the trial is infeasible with a parity verdict on those updates."""
    baseline = cfg({"parallel.dp": 2, "batch.micro_batch_size": 4, "data_parallel.bucket_mb": 1.0})
    trial = cfg({"parallel.dp": 2, "batch.micro_batch_size": 1, "data_parallel.bucket_mb": 0.02})
    probe = cfg({"parallel.dp": 2, "batch.micro_batch_size": 1, "data_parallel.bucket_mb": 0.02, "run.steps": 3})
    gate = ParityGate(tmp_path / "refs")
    canonical = gate.canonical_to_run(baseline)
    canon, check, base, probed = run_all([canonical, *gate.self_checks(canonical), baseline, probe],
                                         bugs.bug_bf16_small_buckets)
    gate.judge_canonical(canon, [check])
    assert gate.judge_baseline(base)["passed"]  # one 1 MB bucket: the bug is not in the baseline
    backend = types.SimpleNamespace(cfg=types.SimpleNamespace(resources=types.SimpleNamespace(memory_budget_gb=None)))
    outcome = RunOutcome("pruned", "probe: fastest of 2 measured updates ... > 1.5 x best", probed)
    judged = RayTrials.judge(backend, "trial", outcome, gate, [outcome])
    assert judged.status == "infeasible" and judged.parity["steps"] == 3 and not judged.parity["passed"], judged
    assert judged.reason.startswith("parity: ") and "on the probe's 3 updates); also probe:" in judged.reason
    assert trial.run.steps > 3 and canonical_config(trial) == canonical_config(baseline)


@pytest.mark.timeout(240)
def test_a_bug_in_the_canonical_run_itself_stops_at_its_self_check(tmp_path):
    """Issue 27 item 4: a loss scaled by 1/(n+1) for microbatches of n >= 4 sequences is in the canonical run (the
    whole batch as one microbatch). With a baseline of micro-batch 1 and of micro-batch 8 (dp 2) alike, the
    canonical run's self-check (the same maths as microbatches of one sequence) disagrees, the chain stops naming
    the micro-batch size, nothing is stored and no baseline or trial is judged. Without the self-check the
    micro-batch 8 baseline would have agreed with the buggy canonical run and become the answer."""
    from orchestrator.parity.verdict import compare, reference_from_result

    steps = {"run.steps": 2, "batch.global_batch": 16}
    baselines = [cfg({"parallel.dp": 2, "batch.micro_batch_size": m, **steps}) for m in (1, 8)]
    gates = [ParityGate(tmp_path / f"refs{i}") for i in range(2)]
    canonicals = [g.canonical_to_run(b) for g, b in zip(gates, baselines)]
    assert canonicals[0] == canonicals[1] and canonicals[0].batch.micro_batch_size == 16  # one canonical run for both
    (second,) = gates[0].self_checks(canonicals[0])
    canon, check, base8 = run_all([canonicals[0], second, baselines[1]], bugs.bug_loss_scaled_for_large_microbatch)
    assert compare(reference_from_result(canon), base8)["passed"]  # the trap: both carry the bug, and agree
    for gate in gates:
        with pytest.raises(TrustError) as err:
            gate.judge_canonical(canon, [check])
        msg = str(err.value)
        assert "the canonical run does not certify itself" in msg and "loss differs at step 0" in msg, msg
        assert "The decomposition that differs is batch.micro_batch_size (16 vs 1)" in msg, msg
        assert not list((gate.refs.root).glob("*.json")) if gate.refs.root.exists() else True  # nothing stored
        with pytest.raises(TrustError, match="does not certify itself"):
            gate.judge_baseline(base8)
        assert gate.reference is None and gate.judge(base8) is None  # no trial is judged
