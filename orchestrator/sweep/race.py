"""Racing settle: what the next settling round runs, read from the answer (orchestrator.records.answer.decide).

A pure function of the answer, the settling rule and the rounds left, unit-tested from tables
(tests/unit/test_race.py). The loop (orchestrator.sweep.loop) runs what it returns, in a random order, and decides
the answer again after the round. The rules follow racing as the literature on configuring algorithms uses it
(docs/search.md#racing-settle):

- **Who races: the tie set.** Every config the answer cannot tell apart from the leader races; one told apart
  leaves (F-race, Birattari et al. 2002, drops a candidate as soon as a paired test over the instances seen so far
  says it is worse than the best; here the test is the interval of its ratio to the leader over the rounds both
  ran in). One that joins the tie later (the leader changed) races again.
- **First rounds: every member.** Until each member of the tie set has ``MIN_COMMON_ROUNDS`` paired runs, it runs
  in every round, beside the leader, so none rests on its one search run (irace's first test comes only after
  every candidate has run on ``firstTest`` instances, López-Ibáñez et al. 2016). The leader runs until it has
  ``winner.min_rounds``.
- **Then: the leader and its nearest rivals.** A round runs the leader and at most ``winner.top_k`` rivals, the
  nearest by figure first, and only those more rounds could still tell apart within the round budget (at their
  ratio as it stands). Rounds go where they can change the decision: the leader against its strongest challengers,
  as LUCB samples the empirical best and the most ambiguous rival (Kalyanakrishnan et al. 2012), and a shrinking
  field, as successive halving spends a fixed budget on fewer arms per round (Karnin et al. 2013; Jamieson &
  Talwalkar 2016).
- **The baseline only where it is needed.** It runs in a round while it has fewer than ``MIN_COMMON_ROUNDS`` rounds
  (every ratio to it needs a paired anchor), when it is itself in the race, beside a config that would run alone,
  and when the rounds left can decide a relative target's undecided verdict (the winner then runs too). Otherwise
  rivals are paired with the leader, which runs in every round they run in.
- **Stop when the decision cannot change.** No round when no member lacks its paired runs, no rival can be told
  apart within the rounds left, and the target verdict is decided or cannot be decided within them.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.records import answer as A


@dataclass(frozen=True)
class Round:
    """One settling round as the race plans it."""

    configs: tuple[str, ...]
    """Config keys (the baseline aside) the round runs: the leader first, then its rivals, nearest first."""
    baseline: bool
    """The baseline runs in the round too."""
    why: str
    """What the round is for, one line (the loop logs it)."""


def next_round(answer: A.Answer, rule: A.SettleRule, rounds_left: int, verdict_only: bool = False) -> Round | None:
    """The next settling round, or None when no round within ``rounds_left`` can change the decision.
    ``verdict_only``: a target check during the search, which asks only whether the winner meets the target (the
    final rounds settle the tie): the winner, beside the baseline, while its verdict is undecided and the rounds
    left can decide it, or while a verdict of met rests on fewer than ``winner.min_rounds`` paired runs."""
    win, leader = answer.winner, answer.leader
    if rounds_left <= 0 or win is None or leader is None or win.predicted:
        return None
    if verdict_only:
        return _verdict_round(answer, rule, rounds_left)
    rivals = sorted((c for c in answer.ties if c is not leader), key=lambda c: (c.ratio, c.trial))
    new = [c for c in rivals if c.rounds < A.MIN_COMMON_ROUNDS]

    def open_(c: A.ConfigFigure) -> bool:
        more = answer.gaps[c.key].more_rounds
        return more is not None and more <= rounds_left

    racing = [*new, *[c for c in rivals if c not in new and open_(c)][:rule.top_k]]
    why = []
    if new:
        why.append(f"trials {_trials(new)} are tied with fewer than {A.MIN_COMMON_ROUNDS} paired runs")
    if len(racing) > len(new):
        why.append(f"trials {_trials(racing[len(new):])} can still be told apart from trial {leader.trial} "
                   f"within {rounds_left} round(s)")
    if leader.rounds < rule.min_rounds:
        why.append(f"trial {leader.trial} has fewer than winner.min_rounds={rule.min_rounds} paired runs")
    runs = [leader, *racing] if racing or leader.rounds < rule.min_rounds else []
    verdict = answer.target
    decide_target = verdict.state == A.UNDECIDED and verdict.more_rounds is not None \
        and verdict.more_rounds <= rounds_left
    if decide_target:
        why.append(f"the target verdict needs about {verdict.more_rounds} more round(s)")
        if win not in runs:
            runs.append(win)
    if not runs:
        return None
    base = answer.baseline
    configs = tuple(c.key for c in runs if not c.is_baseline)
    # A run alone in its round pairs with nothing: a single config runs beside the baseline.
    baseline = any(c.is_baseline for c in runs) or (decide_target and verdict.relative) or len(configs) < 2 or (
        base is not None and base.rounds < A.MIN_COMMON_ROUNDS)
    return Round(configs, baseline and base is not None, "; ".join(why))


def _verdict_round(answer: A.Answer, rule: A.SettleRule, rounds_left: int) -> Round | None:
    win, v = answer.winner, answer.target
    if v.state == A.UNDECIDED and v.more_rounds is not None and v.more_rounds <= rounds_left:
        why = f"the target verdict needs about {v.more_rounds} more round(s)"
    elif v.state == A.MET and not win.is_baseline and win.rounds < rule.min_rounds:
        why = f"a verdict of met rests on fewer than winner.min_rounds={rule.min_rounds} paired runs"
    else:
        return None
    return Round(() if win.is_baseline else (win.key,), answer.baseline is not None, why)


def _trials(configs: list[A.ConfigFigure]) -> str:
    return ", ".join(str(c.trial) for c in configs)
