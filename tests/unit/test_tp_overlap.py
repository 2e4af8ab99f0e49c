"""Tensor-parallel communication overlap (Megatron --tp-comm-overlap): hand-computed exposure, its bounds,
and the plan knob that turns it on."""

import dataclasses

import numpy as np
import pytest

from orchestrator.planner import (BatchConfig, ClusterSpec, Efficiency, JobSpec, ModelSpec, ParallelConfig,
                                  PlanConfig, TensorParallel, predict)
from orchestrator.planner.comm import bulk_overlap_exposed, pipelined_overlap_exposed, reduce_scatter_time
from orchestrator.planner.knobs import Consts, encode
from orchestrator.planner.timing import layer_costs


def _simulated_pipeline(c: float, g: float, n: int) -> float:
    """Event simulation of n chunks through two stages (exchange, then GEMM), each stage one at a time."""
    comm_done = gemm_done = 0.0
    for _ in range(n):
        comm_done += c / n                                  # exchanges run back to back
        gemm_done = max(gemm_done, comm_done) + g / n       # chunk i multiplies once it has arrived
    return gemm_done - g                                    # what the GEMM alone would not have taken


def test_comm_shorter_than_the_gemm_exposes_one_chunk():
    # 1 ms of all-gather under a 4 ms GEMM in 8 chunks: only the first 0.125 ms chunk waits.
    assert float(pipelined_overlap_exposed(1e-3, 4e-3, 8)) == pytest.approx(1e-3 / 8, rel=1e-12)


def test_comm_longer_than_the_gemm_exposes_one_chunk_plus_the_excess():
    # c = 4, g = 2, n = 4: makespan 1 + 0.5 + 3 * 1 = 4.5, minus the GEMM's 2 = 2.5 = c/n + (n-1)/n (c - g).
    assert float(pipelined_overlap_exposed(4.0, 2.0, 4)) == pytest.approx(2.5, rel=1e-12)
    assert float(pipelined_overlap_exposed(4.0, 2.0, 1)) == pytest.approx(4.0)  # one chunk: nothing overlaps


def test_bulk_overlap_hides_up_to_the_gemm():
    assert float(bulk_overlap_exposed(3.0, 5.0)) == 0.0
    assert float(bulk_overlap_exposed(5.0, 3.0)) == pytest.approx(2.0)


@pytest.mark.parametrize("c,g,n", [(1.0, 4.0, 8), (4.0, 2.0, 4), (3.0, 3.0, 2), (0.2, 9.0, 8), (7.0, 0.1, 8)])
def test_formula_matches_an_event_simulation(c, g, n):
    assert float(pipelined_overlap_exposed(c, g, n)) == pytest.approx(_simulated_pipeline(c, g, n), rel=1e-12)


def test_overlap_never_hides_more_than_the_compute_it_overlaps():
    c, g = np.meshgrid(np.geomspace(1e-5, 1.0, 40), np.geomspace(1e-5, 1.0, 40))
    for n in (1, 2, 4, 8):
        exposed = pipelined_overlap_exposed(c, g, n)
        assert np.all(c - exposed <= g * (n - 1) / n + 1e-15)   # hidden <= the GEMM's overlappable chunks
        assert np.all(exposed >= c / n - 1e-15)                  # one chunk always waits
        assert np.all(exposed <= c + 1e-15)                      # never more than the communication
    bulk = bulk_overlap_exposed(c, g)
    assert np.all((c - bulk <= g + 1e-15) & (bulk >= 0) & (bulk <= c))


def _cfg(overlap: bool, sp: bool = True, hidden: int = 8192, tp: int = 8) -> PlanConfig:
    return PlanConfig(
        cluster=ClusterSpec(num_gpus=tp, gpus_per_node=8, peak_tflops=989.0, intra_node_bw_GBps=450.0,
                            intra_node_latency_us=3.0),
        model=ModelSpec(num_layers=4, hidden_size=hidden, num_heads=64, vocab_size=32000),
        job=JobSpec(seq_len=4096),
        efficiency=Efficiency(matmul_eff=0.7, gemm_tokens_half=0.0, tp_bw_eff=0.8, op_overhead_us=0.0),
        parallel=ParallelConfig(pp=1, dp=1),
        tensor_parallel=TensorParallel(size=tp, sequence_parallel=sp, comm_overlap=overlap),
        batch=BatchConfig(global_batch=2, micro_batch_size=1),
    )


def test_layer_exposure_by_hand():
    cfg = _cfg(True)
    lc = layer_costs(Consts.of(cfg), encode([cfg]))
    T, h, f, t = 4096.0, 8192.0, 4 * 8192.0, 8
    c = float(reduce_scatter_time(t, 2 * T * h, 450e9 * 0.8, 3e-6))      # one all-gather / reduce-scatter
    qkv, proj, fc = (2 * T * w / t / (989e12 * 0.7) for w in (3 * h * h, h * h, h * f))  # one GPU's GEMM share
    pipe = lambda g: c / t + (t - 1) / t * max(0.0, c - g)  # noqa: E731
    bulk = lambda g: max(0.0, c - g)  # noqa: E731
    assert float(lc["f_tp"][0]) == pytest.approx(pipe(qkv) + pipe(proj) + 2 * pipe(fc), rel=1e-12)
    assert float(lc["b_tp"][0]) == pytest.approx(pipe(proj) + pipe(fc) + 2 * bulk(qkv) + 2 * bulk(fc), rel=1e-12)
    off = layer_costs(Consts.of(_cfg(False)), encode([_cfg(False)]))
    assert float(off["f_tp"][0]) == pytest.approx(4 * c) and float(off["b_tp"][0]) == pytest.approx(6 * c)


def test_overlap_is_a_plan_knob_that_only_lowers_exposed_tp_time():
    on, off = predict(_cfg(True)), predict(_cfg(False))
    assert 0.0 < on.tp_comm_s < off.tp_comm_s
    assert on.step_time_s == pytest.approx(off.step_time_s - (off.tp_comm_s - on.tp_comm_s), rel=1e-9)
    assert on.peak_memory_bytes == off.peak_memory_bytes
    one = dataclasses.replace(_cfg(True), cluster=dataclasses.replace(_cfg(True).cluster, num_gpus=1),
                              tensor_parallel=TensorParallel(size=1, comm_overlap=True))
    assert predict(one).tp_comm_s == 0.0                    # a no-op without tensor parallelism


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(ValueError, match="comm_overlap: needs tensor_parallel.sequence_parallel"):
        TensorParallel(size=8, sequence_parallel=False, comm_overlap=True)
