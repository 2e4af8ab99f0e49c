"""Behaviour tests of the answer rule (orchestrator.records.answer) that its mutants showed missing (issue 30).

Each gives a ledger and the answer it must get; the ledgers are built with test_answer's helpers.
"""

from __future__ import annotations

import pytest

from orchestrator.records import answer as A
from orchestrator.records.record import ParityVerdict
from orchestrator.search.target import Target
from tests.unit.test_answer import NONE, PARAMS, line, rounds


def test_a_tie_of_equally_changed_configs_goes_to_the_lower_peak_memory():
    base = {"mbs": 1, "pp": 2}
    p1, p2 = {"mbs": 2, "pp": 2}, {"mbs": 4, "pp": 2}  # one param changed each
    ledger = [line(0, 1.0, params=base), line(1, 0.500, params=p1, mem=2000.0),
              line(2, 0.501, params=p2, mem=1500.0)]
    a = A.decide(ledger, NONE)
    assert a.tie and a.winner.trial == 2 and a.leader.trial == 1
    assert [c.trial for c in a.ties] == [2, 1] and [c.trial for c in a.ranked] == [2, 1, 0]


def test_no_ok_run_is_no_answer():
    bad = line(1, 0.5, status="failed")
    a = A.decide([bad], NONE)
    assert a.winner is None and a.ranked == () and a.settled and a.target.state == A.NO_TARGET
    assert a.why_unsettled == "no config ran ok and passed parity"
