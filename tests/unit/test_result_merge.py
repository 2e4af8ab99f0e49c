"""trainer.measure.result.merge with hand-made rank results: the step time, MFU and HFU every sweep ranks by.

The expected numbers are worked out by hand below, so a mutation of the merge (the fastest rank instead of
the slowest, warm-up updates in the median, the world size dropped from MFU) fails here (issue 10, item 17).
"""

from __future__ import annotations

import pytest

from trainer.measure.result import RankResult, StepRecord, merge

TOKENS = 512
# Per-rank update times (s). Update 0 is the warm-up: slow on every rank (allocator, caches).
TIMES = {
    0: [9.0, 0.10, 0.30, 0.20, 0.12],
    1: [8.0, 0.40, 0.25, 0.10, 0.11],
}
PEAK = 1e9  # FLOP/s per rank, as the ranks measured it
MODEL_FLOPS = 1.2e8  # per update
HARDWARE_FLOPS = 1.6e8  # model FLOPs + the forward that recompute repeats


def rank(r: int, peak: float | None = PEAK) -> RankResult:
    steps = [StepRecord(i, t, 5.0 - i * 0.1, 1.0, TOKENS) for i, t in enumerate(TIMES[r])]
    return RankResult(rank=r, pp_rank=r, dp_rank=0, stage_ids=[r], layer_ids=[r], device_name="cpu", steps=steps,
                      phase_s={"forward": 0.01 * (r + 1)}, reduce_start_after_backward_s=None, spans=[],
                      memory={"peak_bytes": 1000 * (r + 1)}, fingerprint={f"w{r}": [4.0, 1.0, 0]},
                      replica_max_abs_diff=0.0, peak_flops=peak, peak_basis="measured matmul")


def merged(ranks=None, warmup: int = 1):
    return merge(ranks or [rank(1), rank(0)], config={}, n_microbatches=4, warmup_steps=warmup,
                 model_flops_per_step=MODEL_FLOPS, hardware_flops_per_step=HARDWARE_FLOPS, peak_memory_basis="test")


def test_each_update_takes_its_slowest_rank():
    # By hand: max over ranks per update = [9.0, 0.40, 0.30, 0.20, 0.12] (the fastest would be 0.10, 0.25, ...).
    assert [s.time_s for s in merged().steps] == [9.0, 0.40, 0.30, 0.20, 0.12]


def test_step_time_is_the_median_of_measured_updates_only():
    s = merged().summary
    # Measured (after 1 warm-up) slowest-rank times: 0.40, 0.30, 0.20, 0.12 -> median (0.30 + 0.20) / 2 = 0.25.
    # With the warm-up counted it would be median(9.0, 0.40, 0.30, 0.20, 0.12) = 0.30.
    assert s.step_time_s == pytest.approx(0.25)
    assert (s.step_time_min_s, s.step_time_max_s, s.n_measured_steps) == (0.12, 0.40, 4)
    assert s.tokens_per_s == pytest.approx(TOKENS / 0.25)  # 2048 tokens/s
    assert merged(warmup=2).summary.step_time_s == pytest.approx(0.20)  # median(0.30, 0.20, 0.12)


def test_mfu_and_hfu_divide_by_every_rank_peak():
    s = merged().summary
    # MFU = model FLOPs / step time / (world x peak) = 1.2e8 / 0.25 / (2 x 1e9) = 0.24
    # HFU = hardware FLOPs / step time / (world x peak) = 1.6e8 / 0.25 / (2 x 1e9) = 0.32
    assert s.mfu == pytest.approx(0.24) and s.hfu == pytest.approx(0.32)
    assert s.peak_flops_per_rank == PEAK and s.peak_basis == "measured matmul"


def test_mfu_never_exceeds_hfu():
    for warmup in (0, 1, 2, 3):
        s = merged(warmup=warmup).summary
        assert s.mfu <= s.hfu <= 1.0, (warmup, s)


def test_the_slowest_peak_bounds_the_group_and_an_unknown_peak_gives_no_mfu():
    s = merged([rank(0, peak=2e9), rank(1, peak=1e9)]).summary
    assert s.peak_flops_per_rank == 1e9 and s.mfu == pytest.approx(0.24)
    s = merged([rank(0, peak=None), rank(1)]).summary
    assert s.mfu is None and s.hfu is None


def test_memory_and_phases_span_the_ranks():
    res = merged()
    assert res.world_size == 2 and [r.rank for r in res.ranks] == [0, 1]
    assert res.summary.peak_memory_bytes == 2000 and res.memory["peak_bytes"] == {"min": 1000, "max": 2000}
    assert res.phases["forward"] == {"min": 0.01, "max": 0.02}
    assert res.fingerprint == {"w0": [2.0, 1.0], "w1": [2.0, 1.0]}
