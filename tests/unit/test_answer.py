"""The decision object (orchestrator.records.answer.decide): from ledgers built by hand, no processes.

Each ledger is a list of TrialRecords: a baseline (trial 0), trials, and settling-round re-runs (kind repeat,
with ``round``). Parity passed on every trial line, so only the figures decide.
"""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from orchestrator.records import answer as A
from orchestrator.records.record import Metrics, ParityVerdict, TrialRecord
from orchestrator.search.target import Target

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
PARAMS = {0: {"mbs": 1}, 1: {"mbs": 2}, 2: {"mbs": 4}, 3: {"mbs": 8}}


def line(trial: int, t: float, kind: str = "trial", rnd: int | None = None, repeat: int | None = None,
         mem: float = 1000.0, params: dict | None = None, status: str = "ok") -> TrialRecord:
    kind = "baseline" if trial == 0 and kind == "trial" else kind
    return TrialRecord(
        sweep="s", trial=trial, kind=kind, backend="ray", params=params or PARAMS[trial], config={},
        status=status, reason=None, metrics=Metrics(step_time_s=t, peak_memory_bytes=mem), meets_target=False,
        wall_s=1.0, overhead_s=0.1, started_at=T0, finished_at=T0,
        parity=None if kind == "baseline" else ParityVerdict(passed=True), repeat=repeat, round=rnd)


def rounds(times: dict[int, list[float]]) -> list[TrialRecord]:
    """Settling rounds: ``times[trial][k]`` is the trial's run in round k + 1 (the baseline is trial 0)."""
    out = []
    for k in range(len(times[0])):
        for trial, ts in times.items():
            out.append(line(trial, ts[k], kind="repeat", rnd=k + 1, repeat=k + 1))
    return out


NONE, REL = Target(), Target(relative_to_baseline=0.5)


def test_a_clear_winner_has_no_ties_and_a_met_target():
    ledger = [line(0, 1.0), line(1, 0.40), line(2, 0.60)] + rounds({0: [1.0, 1.02, 0.98], 1: [0.40, 0.41, 0.39],
                                                                    2: [0.60, 0.61, 0.60]})
    a = A.decide(ledger, REL)
    assert a.winner.trial == 1 and not a.tie and a.settled
    assert a.target.state == A.MET and a.target.paired
    assert a.winner.ratio == pytest.approx(0.40, rel=0.01)
    assert [c.trial for c in a.ranked] == [1, 2, 0]


def test_configs_within_the_threshold_are_a_tie_and_the_tie_break_prefers_the_closer_config():
    base = {"mbs": 1, "pp": 2}
    p1, p2 = {"mbs": 2, "pp": 1}, {"mbs": 2, "pp": 2}  # trial 2 changes one param, trial 1 two
    ledger = [line(0, 1.0, params=base), line(1, 0.500, params=p1), line(2, 0.502, params=p2)]
    for k, (b, x, y) in enumerate([(1.0, 0.500, 0.502), (1.0, 0.503, 0.501), (1.0, 0.499, 0.501)], 1):
        ledger += [line(0, b, "repeat", k, k, params=base), line(1, x, "repeat", k, k, params=p1),
                   line(2, y, "repeat", k, k, params=p2)]
    a = A.decide(ledger, NONE)
    assert a.tie and {c.trial for c in a.ties} == {1, 2}
    assert a.winner.trial == 2  # fewest params changed from the baseline
    assert a.ranked[0].trial == 2


def test_a_figure_astride_the_target_is_undecided_with_the_rounds_that_would_decide_it():
    ledger = [line(0, 1.0), line(1, 0.50)] + rounds({0: [1.0, 1.0, 1.0], 1: [0.47, 0.52, 0.505]})
    a = A.decide(ledger, REL)
    assert a.target.state == A.UNDECIDED and a.target.more_rounds is not None and a.target.more_rounds >= 1
    assert not a.settled and a.why_unsettled == "the target verdict is undecided"
    assert A.decide(ledger, Target(relative_to_baseline=0.6)).target.state == A.MET
    assert A.decide(ledger, Target(relative_to_baseline=0.4)).target.state == A.NOT_MET


def test_drift_between_rounds_cancels_in_the_paired_figure_and_not_in_the_absolute_one():
    # The machine slows down 30% per round. Trial 1 is truly 0.50 of the baseline, trial 2 0.55; trial 1's
    # search run landed in a slow period and trial 2's in a fast one, so by absolute medians trial 2 looks faster.
    drift = [1.0, 1.3, 1.69]
    ledger = [line(0, 1.0), line(1, 0.50 * 1.69), line(2, 0.55 * 1.0)]
    for k, d in enumerate(drift, 1):
        ledger += [line(0, d, "repeat", k, k), line(1, 0.50 * d, "repeat", k, k), line(2, 0.55 * d, "repeat", k, k)]
    a = A.decide(ledger, NONE)
    assert a.winner.trial == 1 and a.winner.ratio == pytest.approx(0.5) and not a.tie
    t2 = a.figure_of(A.key_of(PARAMS[2]))
    assert t2.ratio == pytest.approx(0.55)
    # Unpaired, by the median of the runs, trial 2 would have been named.
    assert t2.step_time_s < a.winner.step_time_s


def test_the_baseline_of_a_relative_target_is_the_median_of_its_rounds():
    ledger = [line(0, 2.0), line(1, 0.5)] + rounds({0: [1.0, 1.1, 0.9], 1: [0.5, 0.5, 0.5]})
    a = A.decide(ledger, Target(relative_to_baseline=0.25))
    assert a.baseline_s == pytest.approx(1.05)  # median of 2.0, 1.0, 1.1, 0.9
    assert a.target.target_s == pytest.approx(0.25 * 1.05)


def test_ledger_order_does_not_change_the_answer():
    ledger = [line(0, 1.0), line(1, 0.40), line(2, 0.41), line(3, 0.9)] + rounds(
        {0: [1.0, 1.05, 0.97], 1: [0.40, 0.43, 0.39], 2: [0.41, 0.40, 0.42]})
    first = A.decide(ledger, REL)
    rng = random.Random(3)
    for _ in range(5):
        shuffled = ledger[:]
        rng.shuffle(shuffled)
        again = A.decide(shuffled, REL)
        assert again.winner.key == first.winner.key and [c.key for c in again.ties] == [c.key for c in first.ties]
        assert again.target == first.target


def test_before_any_round_the_tie_set_is_judged_by_the_runs_alone():
    # One search run each: 0.42 cannot be told from 0.40 by one run (a run is off by the assumed spread), 0.95 can.
    ledger = [line(0, 1.0), line(1, 0.40), line(2, 0.42), line(3, 0.95)]
    a = A.decide(ledger, NONE)
    assert [c.trial for c in a.ties] == [1, 2] and not a.settled
    assert a.why_unsettled == "trials 1, 2 have fewer than winner.min_rounds=3 paired runs; trials 1, 2 cannot be told apart"
    g = a.gaps[A.key_of(PARAMS[3])]
    assert g.apart and g.rounds == 0 and g.ratio == pytest.approx(0.95 / 0.40)


def test_a_failed_or_parity_failed_run_is_no_candidate():
    bad = line(1, 0.1)
    bad.parity = ParityVerdict(passed=False)
    ledger = [line(0, 1.0), bad, line(2, 0.5, status="ok")]
    a = A.decide(ledger, NONE)
    assert a.winner.trial == 2 and a.figure_of(A.key_of(PARAMS[1])) is None


def test_a_zero_step_time_is_not_a_run():
    ledger = [line(0, 1.0), line(1, 0.0), line(2, 0.5)]
    assert A.decide(ledger, NONE).winner.trial == 2


def test_noise_reports_the_baseline_spread_and_the_load():
    ledger = [line(0, 1.0), line(1, 0.5)] + rounds({0: [1.0, 1.2, 0.8], 1: [0.5, 0.6, 0.4]})
    for i, r in enumerate(ledger):
        r.load_1m = float(i)
    a = A.decide(ledger, NONE)
    assert a.noise.baseline_runs == 4 and a.noise.baseline_spread == pytest.approx(0.4)
    assert a.noise.paired_spread == pytest.approx(0.0) and a.noise.load_max == float(len(ledger) - 1)


@pytest.mark.parametrize("field,value", [("top_k", 0), ("min_rounds", 0), ("max_rounds", -1), ("threshold", 0.0),
                                         ("confidence", 1.0), ("single_run_spread", 0.0)])
def test_the_rule_names_a_bad_field(field, value):
    with pytest.raises(ValueError, match=f"winner.{field}="):
        A.SettleRule(**{field: value})


def test_a_noisy_tie_does_not_hand_the_answer_to_a_far_slower_config():
    # Trial 2 changes fewer params than trial 1 but measured 60% slower, once: the wide interval of one noisy
    # run ties it with the leader, yet the tie-break chooses only among configs practically equal by figure.
    base = {"mbs": 1, "pp": 2}
    p1, p2 = {"mbs": 8, "pp": 1}, {"mbs": 8, "pp": 2}
    ledger = [line(0, 1.0, params=base), line(1, 0.22, params=p1), line(2, 0.36, params=p2)]
    for k, (b, x) in enumerate([(1.0, 0.22), (1.3, 0.27), (0.8, 0.19)], 1):
        ledger += [line(0, b, "repeat", k, k, params=base), line(1, x, "repeat", k, k, params=p1)]
    a = A.decide(ledger, NONE, A.SettleRule(single_run_spread=1.9))
    assert a.winner.trial == 1 and {c.trial for c in a.ties} >= {1, 2}
