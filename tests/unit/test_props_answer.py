"""Properties of the answer rule (orchestrator.records.answer.decide) over small generated ledgers (issue 30).

A ledger: the baseline (trial 0) and trials 1-3 each measured once in the search (ok or failed, parity passed
or not), then up to four settling rounds, each running the baseline and some of the trials once. Step times are
drawn from a few values (so figures tie exactly and within the threshold) and from a range.
"""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from orchestrator.records import answer as A
from orchestrator.records.record import ParityVerdict, Status
from orchestrator.search.target import Target
from tests.unit.test_answer import line

TIMES = st.one_of(st.sampled_from([0.3, 0.4, 0.5, 0.502, 0.505, 0.6, 1.0, 1.01, 1.2]),
                  st.floats(min_value=0.1, max_value=3.0))
TARGETS = st.one_of(st.just(Target()), st.builds(lambda x: Target(relative_to_baseline=x), st.floats(0.2, 1.0)),
                    st.builds(lambda x: Target(step_time_s=x), st.floats(0.1, 2.0)))
OUTCOME = st.sampled_from(["ok", "ok", "ok", "failed", "parity failed"])


def _run(trial: int, t: float, outcome: str, **kw):
    r = line(trial, t, status="failed" if outcome == "failed" else "ok", **kw)
    if outcome == "parity failed" and trial != 0:
        r.parity = ParityVerdict(passed=False)
    return r


@st.composite
def ledgers(draw):
    out = [_run(0, draw(TIMES), "ok", mem=1000.0)]
    for trial in (1, 2, 3):
        out.append(_run(trial, draw(TIMES), draw(OUTCOME), mem=draw(st.sampled_from([800.0, 1000.0, 1200.0]))))
    for k in range(1, draw(st.integers(0, 4)) + 1):
        out.append(line(0, draw(TIMES), kind="repeat", rnd=k, repeat=k))
        for trial in draw(st.lists(st.sampled_from([1, 2, 3]), unique=True, max_size=3)):
            out.append(_run(trial, draw(TIMES), draw(OUTCOME), kind="repeat", rnd=k, repeat=k))
    return out


def _what(a: A.Answer):
    return (a.winner.key if a.winner else None, [c.key for c in a.ties], a.target)


@settings(max_examples=60, deadline=None)
@given(ledger=ledgers(), target=TARGETS, seed=st.integers(0, 2**16))
def test_permuting_the_ledger_never_changes_the_answer(ledger, target, seed):
    first = A.decide(ledger, target)
    shuffled = ledger[:]
    random.Random(seed).shuffle(shuffled)
    assert _what(A.decide(shuffled, target)) == _what(first)


@settings(max_examples=60, deadline=None)
@given(ledger=ledgers(), target=TARGETS)
def test_the_winner_heads_its_tie_set_and_the_ranking_and_every_ranked_config_ran_ok_and_passed_parity(ledger,
                                                                                                          target):
    a = A.decide(ledger, target)
    if a.winner is None:
        assert a.ranked == () and a.ties == ()
        return
    assert a.ties[0] is a.winner and a.ranked[0] is a.winner and a.leader in a.ties
    assert len({c.key for c in a.ranked}) == len(a.ranked)
    for c in a.ranked:
        mine = [r for r in ledger if A.key_of(r.params) == c.key and r.status is Status.OK
                and (r.parity is None or r.parity.passed)]
        assert mine and any(r.kind in ("baseline", "trial") for r in mine)
        assert len(c.runs) == len(mine)


@settings(max_examples=60, deadline=None)
@given(ledger=ledgers(), target=TARGETS)
def test_a_met_verdict_has_its_whole_interval_at_or_under_the_target_and_not_met_above_it(ledger, target):
    v = A.decide(ledger, target).target
    if v.state == A.MET:
        assert v.interval_s[1] <= v.target_s
    elif v.state == A.NOT_MET:
        assert v.interval_s[0] > v.target_s
    elif v.state == A.UNDECIDED and v.interval_s is not None:
        assert v.interval_s[0] <= v.target_s < v.interval_s[1]


@settings(max_examples=60, deadline=None)
@given(ledger=ledgers(), target=TARGETS, which=st.integers(0, 2), slower=st.floats(1.0, 2.0))
def test_a_slower_run_of_a_loser_never_changes_the_winner(ledger, target, which, slower):
    # A loser: neither the winner nor the leader (the tie-break's band is measured from the leader's figure) nor
    # the baseline (its median scales every unpaired figure). Its new run is outside the rounds, slower than any
    # of its runs.
    a = A.decide(ledger, target)
    losers = [c for c in a.ranked if c is not a.winner and c is not a.leader and not c.is_baseline]
    if not losers:
        return
    c = losers[which % len(losers)]
    extra = line(c.trial, max(c.runs) * slower, kind="confirm", repeat=9, params=c.params)
    assert A.decide([*ledger, extra], target).winner.key == a.winner.key
