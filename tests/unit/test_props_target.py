"""Property: every target the parser accepts gives a finite, positive step time (issue 30)."""

from __future__ import annotations

import math

from hypothesis import example, given, settings, strategies as st

from orchestrator.search.target import parse_target

NUMBERS = st.one_of(st.integers(min_value=-10, max_value=10**12), st.floats(allow_nan=True, allow_infinity=True))
VALUES = st.one_of(st.none(), st.booleans(), st.text(max_size=3), NUMBERS)
SCHEDULE = st.one_of(
    st.dictionaries(st.sampled_from(["days", "availability", "updates", "hours"]), VALUES, max_size=4),
    st.fixed_dictionaries({"days": st.floats(min_value=0, allow_infinity=True), "availability": st.floats(0, 1),
                           "updates": st.integers(min_value=0, max_value=10**15)}))
TARGET = st.one_of(VALUES, st.builds(lambda s: {"schedule": s}, SCHEDULE), st.dictionaries(
    st.sampled_from(["step_time_s", "relative_to_baseline", "schedule", "step_s"]),
    st.one_of(VALUES, SCHEDULE), max_size=3))


@settings(max_examples=200, deadline=None)
@example({"schedule": {"days": 3e303, "availability": 1.0, "updates": 1}}, 1.0)  # overflowed to inf s
@example({"schedule": {"days": 5e-324, "availability": 0.5, "updates": 10}}, 1.0)  # underflowed to 0 s
@example({"relative_to_baseline": 5e-324}, 1e-3)  # underflowed to 0 s
@given(data=TARGET, baseline=st.floats(min_value=1e-3, max_value=1e4))
def test_every_accepted_target_gives_a_finite_positive_step_time(data, baseline):
    try:
        target = parse_target(data)
    except ValueError as e:
        assert str(e).startswith(("target", "unknown field(s) target.")) and "\n" not in str(e)
        return
    seconds = target.seconds(baseline)
    if target.kind == "none":
        assert seconds is None
    else:
        assert seconds is not None and math.isfinite(seconds) and seconds > 0, (data, seconds)
        target.describe(baseline)
