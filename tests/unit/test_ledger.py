"""The ledger: append-only JSON lines, torn tails, and the numbers read back from its records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.records import ledger as L
from orchestrator.records import query as Q
from orchestrator.records import answer as A
from orchestrator.search.target import Target
from orchestrator.records.ledger import read_records
from orchestrator.records.record import Metrics, ParityVerdict, Probe, TrialRecord
from orchestrator.records.query import OverheadStats, PruningStats
from trainer.measure.result import Result

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ledger_v0.jsonl"
RESULT = Result.from_dict(json.loads(FIXTURE.read_text().splitlines()[0])["result"])  # a real measured run


def line(trial, kind="trial", status="ok", step=1.0, meets=False, measured=False, **fields) -> TrialRecord:
    return TrialRecord(sweep="s", trial=trial, kind=kind, backend="ray", params={"parallel.pp": 1}, config={},
                       status=status, reason=None if status == "ok" else "why",
                       result=RESULT if measured else None, metrics=Metrics(step_time_s=step), meets_target=meets,
                       wall_s=2.0, overhead_s=0.5, started_at=0.0, finished_at=1.0, **fields)


def test_record_line_has_the_schema_and_refuses_bad_values():
    r = line(3, "confirm", repeat=1).to_line()
    assert r["repeat"] == 1 and r["schema"] == 2
    assert r["started_at"] == "1970-01-01T00:00:00.000+00:00"
    with pytest.raises(ValueError, match="status='weird'"):
        line(1, status="weird")


def test_append_read_and_torn_tail(tmp_path):
    led = L.Ledger(tmp_path / "s" / "trials.jsonl")
    assert led.read() == []
    led.append(line(0, "baseline"))
    led.append(line(1, step=float("nan")))
    with open(led.path, "a") as f:  # a driver killed mid-write
        f.write('{"sweep": "s", "tri')
    assert [r.trial for r in read_records(led.path)] == [0, 1]
    led.append(line(2))
    assert [r.trial for r in read_records(led.path)] == [0, 1, 2]
    assert (tmp_path / "s" / "trials.jsonl.torn").read_text() == '{"sweep": "s", "tri\n'
    assert all(json.loads(x) for x in led.path.read_text().splitlines())


def test_corrupt_line_is_an_error(tmp_path):
    led = L.Ledger(tmp_path / "trials.jsonl")
    led.path.write_text("not json\n")
    with pytest.raises(ValueError, match="trials.jsonl:1: not a JSON line"):
        led.read()


def test_best_and_baseline():
    passed = ParityVerdict(passed=True)
    recs = [line(0, "baseline", step=2.0), line(1, step=1.0, meets=True, measured=True, parity=passed),
            line(2, status="failed", step=None), line(3, status="pruned", step=0.5),
            line(1, "confirm", step=1.1, meets=True, repeat=1, measured=True, parity=passed)]
    for r in recs:
        r.params = {"config": r.trial}  # one config per trial (the confirm's is its trial's)
    assert Q.baseline_of(recs).trial == 0
    best = A.decide(recs, Target()).winner  # by the median of its runs (a pruned probe is no run)
    assert (best.trial, best.runs, best.step_time_s, best.describe()) == (1, (1.0, 1.1), 1.05,
                                                                         "median of 2 runs 1.050 s")
    # An old ledger's confirm runs count as runs of their config, unpaired (no settling round).
    assert best.paired == () and A.decide(recs, Target(step_time_s=1.2)).target.state == "met"


def test_the_answer_counts_only_runs_that_passed_parity():
    failed = ParityVerdict(passed=False, first_fail_step=2, first_fail_metric="loss")
    recs = [line(0, "baseline", step=2.0), line(1, step=1.0, measured=True),  # measured, never checked
            line(2, step=0.5, measured=True, parity=failed), line(3, step=1.5, measured=True,
                                                                  parity=ParityVerdict(passed=True)),
            line(4, step=0.1, duplicate_of=3), line(5, "canonical", step=0.01)]
    for r, p in zip(recs, ({"t": 0}, {"t": 1}, {"t": 2}, {"t": 3}, {"t": 3}, {"t": 5})):
        r.params = p
    assert [(s.trial, s.runs) for s in A.decide(recs, Target()).ranked] == [(3, (1.5,)), (0, (2.0,))]


def test_overhead_and_pruning_stats():
    recs = [line(0, "baseline"), line(1, probe=Probe(steps=4, step_time_s=0.2, wall_s=1.0, skipped_steps=0)),
            line(2, status="pruned", probe=Probe(steps=4, step_time_s=0.5, wall_s=2.0, skipped_steps=10))]
    assert Q.overhead_stats(recs) == OverheadStats(median_s=0.5, max_s=0.5, n=3)
    assert Q.pruning_stats(recs) == PruningStats(pruned=1, saved_s=5.0, probe_cost_s=1.0)
    assert Q.pruning_stats(recs).net_s == 4.0
