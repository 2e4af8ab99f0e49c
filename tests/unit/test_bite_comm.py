"""The planner's collective formulas at their boundaries (issue 30: mutants the older tests let through)."""

from __future__ import annotations

import numpy as np

from orchestrator.planner import comm


def test_a_group_of_one_or_none_never_uses_the_network():
    assert comm.bus_bandwidth(1, 0, 300e9, 50e9) == 300e9
    assert comm.bus_bandwidth(0, 0, 300e9, 50e9) == 300e9


def test_one_rank_moves_nothing_for_every_size_given():
    sizes = np.array([1e6, 2e6, 4e6])
    for fn in (comm.reduce_scatter_time, comm.all_gather_time, comm.all_reduce_time):
        got = fn(1, sizes, 100e9, 1e-5)
        assert got.shape == (3,) and not got.any()
