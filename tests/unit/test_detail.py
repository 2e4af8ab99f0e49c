"""Lean ledger lines: a measured result's detail (per-rank spans and steps, per-step series, fingerprint) in a
file beside the ledger, written before the line that names it; a lost one costs the pictures only.

tests/fixtures/ledger_v1.jsonl holds real schema-1 lines from the default sweep (`python -m orchestrator sweep`,
search_spaces/default.yaml, CPU, 2 ranks each): the baseline, trial 1 (whole, as written: 33 KB), the pruned
trial 9 and the first repeat of trial 4; every line but trial 1's has each rank's ``spans`` cut to 6.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from orchestrator.parity import verdict as parity
from orchestrator.calibration.ledger_fit import ledger_records
from orchestrator.records import jsonl
from orchestrator.records.detail import DETAIL_DIR, DetailFiles
from orchestrator.records.ledger import Ledger, read_records
from orchestrator.records.record import SCHEMA_VERSION, Kind, TrialRecord, line_bytes, load_records
from orchestrator.review import report, tracking_lines
from orchestrator.search.target import parse_target
from trainer.measure.result import Result
from test_calibration_ledger import CLUSTER

FIXTURES = Path(__file__).parent.parent / "fixtures"
V0, V1 = FIXTURES / "ledger_v0.jsonl", FIXTURES / "ledger_v1.jsonl"
LINE_BOUND = 4096
"""A typical (non-reference) line of a real 2-rank run, in bytes: the goal of issue 20."""


@pytest.fixture(scope="module")
def v1_lines() -> list[dict]:
    return Ledger(V1).lines()


@pytest.fixture()
def written(v1_lines, tmp_path) -> tuple[Ledger, list[TrialRecord]]:
    """The v1 fixture's records appended to a fresh ledger (schema 2 lines, detail files beside them)."""
    led = Ledger(tmp_path / "default" / "trials.jsonl")
    recs = load_records(copy.deepcopy(v1_lines))
    for r in recs:
        led.append(r)
    return led, recs


def test_each_schema_loads_and_its_figures_read_the_same():
    for path, schema in ((V0, 0), (V1, 1)):
        lines = Ledger(path).lines()
        assert {line.get("schema", 0) for line in lines} == {schema}
        for line, rec in zip(lines, read_records(path), strict=True):
            assert rec.detail is None and rec.detail_error is None
            if line["result"] is None:
                continue
            if schema == 0:  # the whole result, its own config and summary included
                assert rec.result == Result.from_dict(line["result"])
            assert rec.metrics.step_time_s == line["metrics"]["step_time_s"]
            assert rec.result.summary.step_time_s == line["metrics"]["step_time_s"]
            assert rec.result.phases == line["result"]["phases"] and rec.result.memory == line["result"]["memory"]
            assert [len(k.spans) for k in rec.result.ranks] == [len(k["spans"]) for k in line["result"]["ranks"]]
            assert [s.loss for s in rec.result.steps] == [s["loss"] for s in line["result"]["steps"]]
            assert rec.result.fingerprint == line["result"]["fingerprint"]
    v1 = read_records(V1)
    assert (v1[1].trial, v1[1].kind, v1[1].result.world_size, v1[1].probe.steps) == (1, Kind.TRIAL, 2, 5)
    assert v1[2].result.config["run"]["steps"] == 5 and v1[2].config["run"]["steps"] == 20  # a probe's result
    assert (v1[3].kind, v1[3].repeat) == (Kind.REPEAT, 1)


def test_a_real_2_rank_line_is_lean_and_names_its_detail(written, v1_lines):
    led, recs = written
    out = led.lines()
    assert [line["schema"] for line in out] == [SCHEMA_VERSION] * len(out)
    assert [line["detail"] for line in out] == ["detail/0-baseline.json.gz", "detail/1-trial.json.gz",
                                                "detail/9-trial.json.gz", "detail/4-repeat-1.json.gz"]
    for before, after in zip(v1_lines, out):
        assert "ranks" not in after["result"]
        if after["kind"] == "baseline":  # the parity anchor a resumed sweep falls back to stays in the line
            assert after["result"]["steps"] == before["result"]["steps"]
            assert after["result"]["fingerprint"] == before["result"]["fingerprint"]
        else:
            assert line_bytes(after) <= LINE_BOUND, (after["trial"], line_bytes(after))
            assert not {"steps", "fingerprint"} & set(after["result"])
    assert line_bytes(v1_lines[1]) > 30_000 and line_bytes(out[1]) <= LINE_BOUND  # trial 1: whole, as written


def test_read_back_whole(written):
    led, recs = written
    back = led.read()
    assert back == recs and read_records(led.path) == recs
    assert all(r.detail_error is None and r.result.ranks and r.result.steps for r in back)


def test_the_detail_file_is_whole_on_disk_before_its_line(v1_lines, tmp_path, monkeypatch):
    seen = []
    append = jsonl.JsonLines.append

    def checking_append(self, obj):
        path = self.path.parent / obj["detail"]
        payload = json.loads(gzip.decompress(path.read_bytes()))  # whole: gzip checks its length and CRC
        seen.append((obj["trial"], payload["trial"], sorted(payload["result"])))
        assert not list((self.path.parent / DETAIL_DIR).glob(".*.tmp"))
        append(self, obj)

    monkeypatch.setattr(jsonl.JsonLines, "append", checking_append)
    led = Ledger(tmp_path / "trials.jsonl")
    for r in load_records(copy.deepcopy(v1_lines)):
        led.append(r)
    assert seen == [(0, 0, ["ranks"]), (1, 1, ["fingerprint", "ranks", "steps"]),
                    (9, 9, ["fingerprint", "ranks", "steps"]), (4, 4, ["fingerprint", "ranks", "steps"])]


def test_a_taken_name_gets_a_sequence_number(tmp_path):
    files = DetailFiles(tmp_path)
    assert files.write("3-trial", {"a": 1}) == "detail/3-trial.json.gz"
    assert files.write("3-trial", {"a": 2}) == "detail/3-trial.2.json.gz"  # a killed driver's leftover stays
    assert files.read("detail/3-trial.json.gz") == {"a": 1} and files.read("detail/3-trial.2.json.gz") == {"a": 2}


def test_spans_round_trip_to_the_same_timeline_input(written, v1_lines, tmp_path, monkeypatch):
    led, recs = written
    drawn = []
    monkeypatch.setattr(tracking_lines, "render_timeline", lambda result, path: drawn.append(result))
    (tmp_path / "read").mkdir()
    (tmp_path / "v1").mkdir()
    for i, r in enumerate(led.read()):  # each record read back through its detail file, then the v1 line's
        tracking_lines.write_trial_artifacts(tmp_path / "read", r)
        tracking_lines.write_trial_artifacts(tmp_path / "v1", TrialRecord.from_line(copy.deepcopy(v1_lines[i])))
    # Every measured line but the settling re-run (its config's timeline is on its trial's own child) is drawn.
    drawable = sum(r.result is not None and r.kind != "repeat" for r in led.read())
    assert len(drawn) == 2 * drawable and all(drawn[i] == drawn[i + 1] for i in range(0, len(drawn), 2))
    assert drawn[2]["ranks"][0]["spans"] == v1_lines[1]["result"]["ranks"][0]["spans"]


@pytest.fixture()
def artifacts(tmp_path):
    def write(record: TrialRecord) -> Path:
        out = tmp_path / f"art-{record.trial}-{record.kind}"
        out.mkdir()
        tracking_lines.write_trial_artifacts(out, record)
        return out
    return write


@pytest.mark.parametrize("damage", ["missing", "corrupt", "another line's"])
def test_a_lost_detail_file_costs_the_pictures_only(written, artifacts, damage):
    led, recs = written
    folder = led.path.parent / DETAIL_DIR
    for line in led.lines():
        path = led.path.parent / line["detail"]
        if damage == "missing":
            path.unlink()
        elif damage == "corrupt":
            path.write_bytes(path.read_bytes()[:100])
    if damage == "another line's":
        (folder / "1-trial.json.gz").replace(folder / "keep")
        (folder / "9-trial.json.gz").replace(folder / "1-trial.json.gz")
        (folder / "keep").replace(folder / "9-trial.json.gz")
        (folder / "0-baseline.json.gz").unlink()
        (folder / "4-repeat-1.json.gz").write_bytes(gzip.compress(b"[1, 2]"))
    lean = led.read()
    assert all(r.detail_error for r in lean), [r.detail_error for r in lean]
    assert all(r.result.ranks == [] for r in lean)
    # Every figure the report, the winner rule, export, calibration and the tracking metrics read is in the line.
    for a, b in zip(lean, recs):
        assert (a.metrics, a.parity, a.probe, a.status) == (b.metrics, b.parity, b.probe, b.status)
        assert (a.result.summary, a.result.phases, a.result.memory, a.result.world_size, a.result.config) == \
            (b.result.summary, b.result.phases, b.result.memory, b.result.world_size, b.result.config)
        assert tracking_lines.trial_params(a) == tracking_lines.trial_params(b)
        assert tracking_lines.trial_metrics(a)[0] == tracking_lines.trial_metrics(b)[0]
    target = parse_target({"relative_to_baseline": 0.5})
    assert report.table(lean) == report.table(recs)
    assert report.summarize(lean, target) == report.summarize(recs, target)
    assert ledger_records(lean, CLUSTER)[:2] == ledger_records(recs, CLUSTER)[:2]
    # ... and the parity anchor a resumed sweep takes from the baseline's line.
    assert parity.reference_from_result(lean[0].result) == parity.reference_from_result(recs[0].result)
    # The picture is skipped with a one-line note where a missing picture is looked for.
    out = artifacts(lean[1])
    assert not (out / "timeline.png").exists() and (out / "result.json").is_file()
    note = (out / "timeline_error.txt").read_text()
    assert note.count("\n") == 1 and "detail/1-trial.json.gz" in note and note.startswith("timeline skipped: ")
    assert json.loads((out / "ledger_record.json").read_text()) == led.lines()[1]


def test_a_record_loaded_without_its_folder_says_so(written):
    led, _ = written
    rec = TrialRecord.from_line(led.lines()[1])
    assert rec.result.ranks == [] and "was not read" in rec.detail_error
    assert rec.to_line() == led.lines()[1]  # written back as it was: its detail file stays the one named


def test_a_whole_v0_ledger_appended_again_gets_lean_lines(tmp_path):
    led = Ledger(tmp_path / "trials.jsonl")
    recs = read_records(V0)
    for r in recs:
        led.append(r)
    out = led.lines()
    assert [line.get("detail") for line in out] == ["detail/0-baseline.json.gz", "detail/1-trial.json.gz",
                                                    "detail/2-trial.json.gz", None, None]  # predictions: no result
    assert led.read() == recs
