"""Configs run together (issue 26): the canonical run and its self-check in one local world (RankWorker.run_local),
and how that one run's outcome becomes one outcome per config (orchestrator.backends.ray_runner._outcome)."""

from __future__ import annotations

import pytest

from orchestrator.backends.ray_runner import _outcome, runs_local
from orchestrator.backends.workers import RunDone
from trainer.config import TrainConfig, apply_overrides
from trainer.measure.result import RankResult, StepRecord

CANONICAL = TrainConfig.from_dict(apply_overrides({}, {"batch.micro_batch_size": 8, "run.steps": 4}))
CHECK = TrainConfig.from_dict(apply_overrides({}, {"batch.micro_batch_size": 1, "run.steps": 4}))


def ranks(step_s: float) -> list[RankResult]:
    """One rank's results: 4 updates of ``step_s`` each (RunOutcome.work_s counts them all)."""
    return [RankResult(rank=0, pp_rank=0, dp_rank=0, stage_ids=[0], layer_ids=[0], device_name="cpu",
                       steps=[StepRecord(i, step_s, 5.0 - 0.1 * i, 1.0, 256) for i in range(4)], phase_s={},
                       reduce_start_after_backward_s=None, spans=[], memory={"peak_bytes": 1000},
                       fingerprint={"w": [4.0, 1.0, 0]}, replica_max_abs_diff=0.0, peak_flops=None,
                       peak_basis="none")]


def local(parts: list, wall_s: float) -> RunDone:
    return RunDone(None, None, "ok", wall_s, placement=[{"rank": 0}], local=parts)


def test_both_configs_come_back_and_the_one_launch_is_charged_to_the_first():
    first, second = _outcome((CANONICAL, CHECK), local([ranks(0.5), ranks(0.25)], wall_s=5.0))
    assert (first.status, second.status) == ("ok", "ok")
    assert first.result.config["batch"]["micro_batch_size"] == 8 and second.result.config["batch"]["micro_batch_size"] == 1
    assert (first.work_s, second.work_s) == (2.0, 1.0)
    # the walls add up to the run's; the self-check's is its updates alone, so its overhead is 0
    assert second.wall_s == 1.0 and first.wall_s == pytest.approx(4.0)
    assert first.placement == second.placement == [{"rank": 0}]


def test_a_self_check_that_raised_reads_as_a_raising_run_of_its_own_would():
    first, second = _outcome((CANONICAL, CHECK), local([ranks(0.5), "rank 0: ValueError: boom"], wall_s=3.0))
    assert first.status == "ok" and first.wall_s == 3.0
    assert (second.status, second.reason, second.wall_s) == ("failed", "RankFailed: rank 0: ValueError: boom (rank 0)",
                                                            0.0)


def test_a_local_run_of_one_config_is_one_outcome():
    outcome = _outcome(CANONICAL, local([ranks(0.5)], wall_s=2.5))
    assert outcome.status == "ok" and outcome.wall_s == 2.5 and outcome.work_s == 2.0


@pytest.mark.parametrize("kind,status", [("timeout", "timeout"), ("late", "timeout"), ("raised", "failed"),
                                         ("lost_actor", "lost")])
def test_a_run_that_failed_as_a_whole_fails_each_config(kind, status):
    error = TimeoutError("no result within resources.trial_timeout_s=1 s") if kind in ("timeout", "late") \
        else RuntimeError("killed by `ray.kill`")
    outcomes = _outcome((CANONICAL, CHECK), RunDone(None, error, kind, 7.0))
    assert [o.status for o in outcomes] == [status, status]
    assert [o.wall_s for o in outcomes] == [7.0, 0.0]


def test_a_late_result_is_a_timeout_that_keeps_the_group_and_says_so():
    late = _outcome(CANONICAL, RunDone(None, TimeoutError("the result came after resources.trial_timeout_s=1 s "
                                                          "(in 1.20 s)"), "late", 1.2))
    hung = _outcome(CANONICAL, RunDone(None, TimeoutError("no result within resources.trial_timeout_s=1 s"),
                                       "timeout", 1.0))
    assert late.status == hung.status == "timeout"
    assert late.reason == "the result came after resources.trial_timeout_s=1 s (in 1.20 s)"
    assert hung.reason.endswith("; the worker group was killed and is rebuilt")


@pytest.mark.parametrize("group,together,local", [(2, False, True), (1, False, False), (1, True, True),
                                                  (2, True, True)])
def test_configs_run_together_always_run_as_their_own_local_world(group, together, local):
    # A one-rank group (resources.world_size 1, two groups side by side) once refused the canonical run and its
    # self-check together: configs of the group's own size ran on the group, and a tuple cannot.
    cfg = (CANONICAL, CHECK) if together else CANONICAL
    assert runs_local(cfg, group) is local
