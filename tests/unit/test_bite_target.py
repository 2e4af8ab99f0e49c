"""The target parser at its boundaries (issue 30: each case is a mutant the older table let through)."""

from __future__ import annotations

import math

import pytest

from orchestrator.search.target import parse_target

SCHEDULE = {"days": 76, "availability": 0.9, "updates": 635_782}


@pytest.mark.parametrize("data,field", [
    ({"step_time_s": 0}, "target.step_time_s"),
    ({"step_time_s": 0.0}, "target.step_time_s"),
    ({"step_time_s": math.inf}, "target.step_time_s"),
    ({"step_time_s": math.nan}, "target.step_time_s"),
    ({"step_time_s": True}, "target.step_time_s"),
    ({"relative_to_baseline": 0}, "target.relative_to_baseline"),
    ({"schedule": {**SCHEDULE, "days": 0}}, "target.schedule.days"),
    ({"schedule": {**SCHEDULE, "days": math.inf}}, "target.schedule.days"),
    ({"schedule": {**SCHEDULE, "availability": 0}}, "target.schedule.availability"),
    ({"schedule": {**SCHEDULE, "availability": 1.5}}, "target.schedule.availability=1.5 must be a fraction"),
    ({"schedule": {**SCHEDULE, "updates": 0}}, "target.schedule.updates: expected a positive integer, got 0"),
    ({"schedule": {**SCHEDULE, "updates": True}}, "target.schedule.updates"),
])
def test_zero_infinite_and_out_of_range_values_are_refused_naming_the_field(data, field):
    with pytest.raises(ValueError) as e:
        parse_target(data)
    assert str(e.value).startswith(field)


def test_the_edges_of_the_ranges_are_accepted():
    assert parse_target({"relative_to_baseline": 1.0}).seconds(2.0) == 2.0
    assert parse_target({"relative_to_baseline": 1}).seconds(2.0) == 2.0
    assert parse_target({"schedule": {**SCHEDULE, "availability": 1}}).seconds(None) == pytest.approx(
        76 * 86_400 / 635_782)
    assert parse_target({"schedule": {"days": 1, "availability": 1.0, "updates": 1}}).seconds(None) == 86_400.0


def test_a_schedule_with_an_extra_or_a_missing_key_names_the_keys_it_got():
    with pytest.raises(ValueError) as e:
        parse_target({"schedule": {**SCHEDULE, "hours": 3}})
    assert str(e.value) == ("target.schedule: expected exactly days, availability, updates "
                            "(got ['availability', 'days', 'hours', 'updates'])")
    with pytest.raises(ValueError) as e:
        parse_target({"schedule": 76})
    assert str(e.value).endswith("(got 76)")


def test_a_relative_target_without_a_baseline_is_described_without_seconds():
    assert parse_target({"relative_to_baseline": 0.8}).describe() == "? s/update (0.8 x baseline)"
    assert parse_target({"relative_to_baseline": 0.8}).seconds(0.0) is None
    assert parse_target({"step_time_s": 9.3}).describe() == "9.3 s/update"


def test_a_schedule_that_overflows_or_underflows_is_refused_and_the_smallest_normal_number_is_a_target():
    import sys

    for days, availability in ((3e303, 1.0), (1e-307, 1e-300)):  # inf s; 0 s
        with pytest.raises(ValueError) as e:
            parse_target({"schedule": {"days": days, "availability": availability, "updates": 1}})
        assert str(e.value).startswith("target.schedule: ") and " s per update; give the days and updates" in str(e.value)
    assert parse_target({"step_time_s": sys.float_info.min}).seconds(None) == sys.float_info.min
    with pytest.raises(ValueError, match="target.step_time_s: expected a positive number"):
        parse_target({"step_time_s": sys.float_info.min / 2})
