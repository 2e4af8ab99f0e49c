"""A run's time limit follows what was measured (orchestrator.sweep.timeouts): pure, from tables."""

from __future__ import annotations

import pytest

from orchestrator.sweep.timeouts import MEASURED_MULTIPLE, load_factor, run_timeout_s


@pytest.mark.parametrize("load, cores, factor", [(None, 2, 1.0), (0.5, 2, 1.0), (2.0, 2, 1.0), (5.0, 2, 2.5),
                                                 (16.0, 2, 8.0), (3.0, None, 1.0)])
def test_the_load_stretches_the_limit_only_above_one_task_per_core(load, cores, factor):
    assert load_factor(load, cores) == pytest.approx(factor)


@pytest.mark.parametrize("floor, walls, load, limit", [
    (10.0, [], None, 10.0),                       # nothing measured yet: the configured floor
    (10.0, [1.0, 3.0], None, 15.0),               # 5 x the slowest ok run beats the floor
    (10.0, [1.0], None, 10.0),                    # ... but never goes under it
    (10.0, [], 5.0, 25.0),                        # a busy machine (load 5 on 2 cores): the floor stretched 2.5x
    (10.0, [3.0, 0.0, None], 4.0, 30.0),          # zero / missing walls ignored; 15 s x 2
    (0.001, [], 16.0, 0.008),                     # a deliberately tiny limit stays tiny: a hang is still caught
])
def test_the_limit_is_a_multiple_of_the_slowest_measured_run_with_the_configured_floor(floor, walls, load, limit):
    assert run_timeout_s(floor, walls, load, 2) == pytest.approx(limit)
    assert MEASURED_MULTIPLE == 5.0
