"""The ledger: append-only JSON lines, torn tails, and the numbers read back from it."""

from __future__ import annotations

import json

import pytest

from orchestrator import ledger as L
from orchestrator.record import TrialRecord


def line(trial, kind="trial", status="ok", step=1.0, meets=False, **extra):
    return L.record(sweep="s", trial=trial, kind=kind, backend="ray", params={"parallel.pp": 1}, config={},
                    status=status, reason=None if status == "ok" else "why", result=None, prediction=None,
                    parity=None, metrics={"step_time_s": step} if step else {}, meets_target=meets, wall_s=2.0,
                    overhead_s=0.5, started_at=0.0, finished_at=1.0, **extra)


def test_record_has_the_schema_keys_in_order():
    r = line(3, repeat=1)
    assert tuple(r)[:len(L.KEYS)] == L.KEYS and r["repeat"] == 1
    assert r["started_at"] == "1970-01-01T00:00:00.000+00:00"
    with pytest.raises(ValueError, match="status='weird'"):
        line(1, status="weird")


def test_append_read_and_torn_tail(tmp_path):
    led = L.Ledger(tmp_path / "s" / "trials.jsonl")
    assert led.read() == []
    led.append(TrialRecord.from_line(line(0, "baseline")))
    led.append(TrialRecord.from_line(line(1, step=float("nan"))))
    with open(led.path, "a") as f:  # a driver killed mid-write
        f.write('{"sweep": "s", "tri')
    assert [r.trial for r in led.read()] == [0, 1]
    led.append(TrialRecord.from_line(line(2)))
    assert [r.trial for r in led.read()] == [0, 1, 2]
    assert (tmp_path / "s" / "trials.jsonl.torn").read_text() == '{"sweep": "s", "tri\n'
    assert all(json.loads(x) for x in led.path.read_text().splitlines())


def test_corrupt_line_is_an_error(tmp_path):
    led = L.Ledger(tmp_path / "trials.jsonl")
    led.path.write_text("not json\n")
    with pytest.raises(ValueError, match="trials.jsonl:1: not a JSON line"):
        led.read()


def test_best_baseline_and_confirmation():
    recs = [line(0, "baseline", step=2.0), line(1, step=1.0, meets=True), line(2, status="failed", step=None),
            line(3, status="pruned", step=0.5), line(1, "confirm", step=1.1, meets=True, repeat=1)]
    assert L.baseline_of(recs)["trial"] == 0
    assert L.best_of(recs)["trial"] == 1
    assert L.confirmed_winner(recs, repeats=1)["trial"] == 1
    assert L.confirmed_winner(recs, repeats=2) is None and L.unconfirmed(recs, repeats=2)["trial"] == 1
    recs.append(line(1, "confirm", step=1.3, meets=False, repeat=2))
    assert L.confirmed_winner(recs, repeats=2) is None and L.unconfirmed(recs, repeats=2) is None


def test_overhead_and_pruning_stats():
    recs = [line(0, "baseline"), line(1, probe={"steps": 4, "step_time_s": 0.2, "wall_s": 1.0, "skipped_steps": 0}),
            line(2, status="pruned", probe={"steps": 4, "step_time_s": 0.5, "wall_s": 2.0, "skipped_steps": 10})]
    assert L.overhead_stats(recs) == {"median_s": 0.5, "max_s": 0.5, "n": 3}
    assert L.pruning_stats(recs) == {"pruned": 1, "saved_s": 5.0, "probe_cost_s": 1.0, "net_s": 4.0}
