"""One check shared by the planner tests: the vectorised enumerator and predict() agree, config by config."""

from __future__ import annotations

from typing import Iterable

import pytest

from orchestrator.planner import apply_params, predict


def grid_agrees_with_predict(base, grid, indices: Iterable[int]) -> dict[bool, int]:
    """For each grid index: invalid exactly when apply_params refuses it; otherwise the same step time, peak
    memory and fit as predict() on the config it names. Returns how many were valid / refused."""
    checked = {True: 0, False: 0}
    for i in indices:
        try:
            cfg = apply_params(base, grid.params(i))
        except ValueError:
            assert not grid.valid[i], grid.params(i)
            checked[False] += 1
            continue
        assert grid.valid[i], grid.params(i)
        checked[True] += 1
        p = predict(cfg)
        assert grid.step_time_s[i] == pytest.approx(p.step_time_s, rel=1e-12)
        assert grid.peak_memory_bytes[i] == pytest.approx(p.peak_memory_bytes, rel=1e-12)
        assert bool(grid.fits_memory[i]) == p.fits_memory
    return checked
