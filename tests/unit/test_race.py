"""The racing rules (orchestrator.sweep.race.next_round) from tables: hand-made answers, no ledger, no process.

Each row is an answer as ``decide`` would hand it over (the tie set, each member's paired rounds, how many more
common rounds would tell it apart from the leader, the target verdict) and the round the race must plan from it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.records import answer as A
from orchestrator.review import report
from orchestrator.sweep import race

RULE = A.SettleRule(top_k=2, min_rounds=3, max_rounds=4)


def fig(trial: int, ratio: float, rounds: int, baseline: bool = False) -> A.ConfigFigure:
    rec = SimpleNamespace(trial=trial, params={"t": trial}, predicted=False)
    return A.ConfigFigure(rec, f"k{trial}", (1.0,), {}, (), ratio, (ratio, ratio), None, 0, baseline, rounds)


def answer(ties: list[tuple], rest: list[tuple] = (), verdict: tuple = (A.MET, None, True),
           base_rounds: int = 3, winner: int | None = None) -> A.Answer:
    """``ties``/``rest``: (trial, ratio, paired rounds, more rounds to tell it apart) per config, the leader first;
    ``verdict``: (state, more rounds, relative)."""
    base = fig(0, 1.0, base_rounds, baseline=True)
    figures = {t[0]: fig(*t[:3]) if t[0] else base for t in [*ties, *rest]}
    figures.setdefault(0, base)
    tied = [figures[t[0]] for t in ties]
    gaps = {figures[t[0]].key: A.Gap(t[1] / ties[0][1], (0.9, 1.1), t[2], t in rest, t[3])
            for t in [*ties[1:], *rest]}
    win = figures[winner] if winner is not None else tied[0]
    state, more, relative = verdict
    return A.Answer(ranked=tuple(sorted(figures.values(), key=lambda c: c.ratio)), winner=win, leader=tied[0],
                    ties=tuple(tied), baseline=figures[0], baseline_s=1.0,
                    target=A.TargetVerdict(state, 0.5, (0.4, 0.6), more, True, relative=relative),
                    noise=A.Noise(1, None, None, None, None, None), rounds=base_rounds, settled=False,
                    why_unsettled="x", rule=RULE, gaps=gaps, band=None)


def planned(a: A.Answer, left: int = 4) -> tuple[list[int], bool] | None:
    r = race.next_round(a, RULE, left)
    return None if r is None else ([int(k[1:]) for k in r.configs], r.baseline)


@pytest.mark.parametrize("ties,base_rounds,expected", [
    # Every member of the tie set without two paired rounds runs, beside the leader, whatever its distance
    # (no member rests on its one search run); the baseline while it has fewer than two rounds.
    ([(1, 0.40, 0, None), (2, 0.41, 0, None), (3, 0.46, 0, None), (4, 0.50, 0, None)], 0, ([1, 2, 3, 4], True)),
    ([(1, 0.40, 1, None), (2, 0.41, 1, None), (3, 0.46, 1, None)], 1, ([1, 2, 3], True)),
    # A member that joined the tie later (the leader changed) races too; the others, paired twice, only if open.
    ([(2, 0.40, 3, None), (1, 0.41, 3, None), (5, 0.43, 0, None)], 3, ([2, 5], False)),
])
def test_every_tie_member_gets_its_paired_runs_before_anything_else(ties, base_rounds, expected):
    assert planned(answer(ties, base_rounds=base_rounds)) == expected


@pytest.mark.parametrize("rivals,left,expected", [
    # After their first rounds: the leader and the rivals more rounds can still tell apart within the rounds
    # left, the nearest first, at most winner.top_k (2) of them.
    ([(2, 0.42, 2, 1), (3, 0.45, 2, 2), (4, 0.47, 2, 1)], 4, [1, 2, 3]),
    ([(4, 0.47, 2, 1), (2, 0.42, 2, 1), (3, 0.45, 2, 2)], 4, [1, 2, 3]),
    # One that needs more rounds than are left, or that no number of rounds can tell apart (within the
    # threshold), does not run: rounds go where they can change the decision.
    ([(2, 0.42, 3, 9), (3, 0.45, 3, 2), (4, 0.47, 3, None)], 4, [1, 3]),
    ([(2, 0.42, 3, 3), (3, 0.45, 3, 2)], 2, [1, 3]),
])
def test_then_the_leader_and_its_nearest_open_rivals(rivals, left, expected):
    a = answer([(1, 0.40, 3, None), *rivals])
    assert planned(a, left) == (expected, False)  # paired with the leader: the baseline has its two rounds


def test_no_round_when_the_decision_cannot_change_within_the_budget():
    a = answer([(1, 0.40, 3, None), (2, 0.404, 3, None), (3, 0.44, 3, 7)])
    assert planned(a, 4) is None  # 2 sits within the threshold; 3 needs 7 more rounds, 4 are left
    assert planned(a, 8) == ([1, 3], False)  # a larger budget reaches it
    assert planned(answer([(1, 0.40, 2, None), (2, 0.5, 2, 1)]), 0) is None  # no rounds left


def test_a_leader_short_of_min_rounds_runs_beside_the_baseline():
    # Alone in a round it would pair with nothing: the baseline runs beside it.
    assert planned(answer([(1, 0.40, 2, None)])) == ([1], True)
    assert planned(answer([(1, 0.40, 3, None)])) is None


@pytest.mark.parametrize("verdict,expected", [
    ((A.UNDECIDED, 2, True), ([1], True)),  # a relative target: the winner beside the baseline
    ((A.UNDECIDED, 2, False), ([1], True)),  # absolute: the winner's runs decide; beside the baseline, not alone
    ((A.UNDECIDED, 29, True), None),  # 29 rounds would decide it, 4 are left: no round for it
    ((A.UNDECIDED, None, True), None),  # the figure sits on the target: no number of rounds decides it
    ((A.NOT_MET, None, True), None),
])
def test_the_target_verdict_gets_rounds_only_when_they_can_decide_it(verdict, expected):
    assert planned(answer([(1, 0.40, 3, None)], verdict=verdict)) == expected


def test_the_baseline_runs_only_where_pairing_or_the_verdict_needs_it():
    rivals = [(1, 0.40, 3, None), (2, 0.45, 3, 1)]
    assert planned(answer(rivals, base_rounds=3)) == ([1, 2], False)
    assert planned(answer(rivals, base_rounds=1)) == ([1, 2], True)  # the ratios need a second paired anchor
    assert planned(answer(rivals, base_rounds=3, verdict=(A.UNDECIDED, 3, True))) == ([1, 2], True)
    # The verdict is the winner's: the one the tie-break picked (not the leader) runs, beside the baseline.
    tied = [(1, 0.40, 3, None), (2, 0.402, 3, None)]
    assert planned(answer(tied, verdict=(A.UNDECIDED, 2, True), winner=2)) == ([2], True)


def test_the_baseline_in_the_race_runs_as_the_baseline():
    # The baseline leads (nothing was faster) and trial 3 is tied with it: the round is the two of them.
    a = answer([(0, 1.0, 1, None), (3, 1.01, 1, None)], base_rounds=1)
    assert planned(a) == ([3], True)


def test_a_prediction_is_never_raced():
    a = answer([(1, 0.40, 0, None), (2, 0.41, 0, None)])
    a.winner.record.predicted = True
    assert planned(a) is None


@pytest.mark.parametrize("verdict,winner_rounds,expected", [
    # A target check during the search races no tie: the winner beside the baseline, for the verdict only.
    ((A.UNDECIDED, 2, True), 1, ([1], True)),
    ((A.UNDECIDED, 9, True), 1, None),  # more rounds than the check has left
    ((A.MET, None, True), 1, ([1], True)),  # met on one paired run: to winner.min_rounds before the search stops
    ((A.MET, None, True), 3, None),
    ((A.NOT_MET, None, True), 1, None),  # not met: nothing for a target check to confirm
])
def test_a_target_check_runs_the_winner_for_its_verdict_only(verdict, winner_rounds, expected):
    a = answer([(1, 0.40, winner_rounds, None), (2, 0.41, 0, None), (3, 0.42, 1, 1)], verdict=verdict)
    r = race.next_round(a, RULE, 4, verdict_only=True)
    assert (None if r is None else ([int(k[1:]) for k in r.configs], r.baseline)) == expected


@pytest.mark.parametrize("more,expected", [
    (3, ["settle", "--sweep", "s", "--results-dir", "r", "--rounds", "3"]),
    (report.SETTLE_WORTH, ["settle", "--sweep", "s", "--results-dir", "r", "--rounds", str(report.SETTLE_WORTH)]),
    (report.SETTLE_WORTH + 1, None),  # hundreds of rounds: the winner sits within the noise of the target
    (None, None),  # no number of rounds decides it
])
def test_an_undecided_verdict_offers_the_rounds_it_needs_up_to_what_settling_is_worth(more, expected):
    cmd = report.settle_command(answer([(1, 0.40, 3, None)], verdict=(A.UNDECIDED, more, True)), "s", "r")
    assert (cmd if cmd is None else cmd.split()[cmd.split().index("settle"):]) == expected
