"""Target step time: absolute, relative to the baseline, from a schedule."""

from __future__ import annotations

import pytest

from orchestrator.search.target import Target, parse_target, schedule_step_time


def test_the_articles_schedule_gives_9_30_s():
    assert round(schedule_step_time(76, 0.9, 635_782), 2) == 9.30
    t = parse_target({"schedule": {"days": 76, "availability": 0.9, "updates": 635782}})
    assert t.kind == "schedule" and round(t.seconds(None), 2) == 9.30
    assert "76 d x 86,400 s x 90% availability / 635,782 updates" in t.describe()


# (mapping, baseline step time, expected seconds)
TABLE = [
    ({"step_time_s": 9.3}, None, 9.3),
    ({"step_time_s": 9.3}, 12.0, 9.3),
    ({"relative_to_baseline": 0.8}, 12.0, 9.6),
    ({"relative_to_baseline": 0.8}, None, None),
    ({"schedule": {"days": 1, "availability": 1.0, "updates": 86400}}, None, 1.0),
    (None, 12.0, None),
    ({}, 12.0, None),
]


@pytest.mark.parametrize("data,baseline,seconds", TABLE)
def test_target_seconds(data, baseline, seconds):
    got = parse_target(data).seconds(baseline)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


BAD = [
    ({"step_time_s": 9.3, "relative_to_baseline": 0.8}, "exactly one"),
    ({"step_time_s": -1}, "target.step_time_s: expected a positive number"),
    ({"step_time_s": "fast"}, "target.step_time_s"),
    ({"relative_to_baseline": 1.5}, "target.relative_to_baseline=1.5 must be <= 1"),
    ({"schedule": {"days": 76, "availability": 90, "updates": 635782}}, "target.schedule.availability=90"),
    ({"schedule": {"days": 76, "availability": 0.9}}, "target.schedule: expected exactly"),
    ({"schedule": {"days": 76, "availability": 0.9, "updates": 1.5}}, "target.schedule.updates"),
    ({"step_s": 9.3}, "unknown field(s) target.step_s"),
    (9.3, "target: expected a mapping"),
]


@pytest.mark.parametrize("data,message", BAD)
def test_bad_targets_name_the_field(data, message):
    with pytest.raises(ValueError) as e:
        parse_target(data)
    assert message in str(e.value)


def test_describe():
    assert Target().describe() == "no target (best within budget)"
    assert parse_target({"relative_to_baseline": 0.5}).describe(2.0) == "1 s/update (0.5 x baseline)"
