"""FSDP at dp > 1 (orchestrator/planner/fsdp.py): memory from a hand-computed table, collective times for known
sizes and bandwidths, exposure against an event simulation of FSDP2's two streams, the knobs' directions,
the enumerator agreeing with ``predict``, and the ``plan`` command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.__main__ import main
from orchestrator.planner import (BatchConfig, ClusterSpec, Efficiency, FsdpDP, JobSpec, ModelSpec, ParallelConfig,
                                  PipelineConfig, PlanConfig, ReplicateDP, TensorParallel,
                                  enumerate_space, predict)
from orchestrator.planner.config import OptimizerSharding
from orchestrator.planner.fsdp import gather_passes, pass_exposed
from orchestrator.planner.knobs import Consts, encode
from orchestrator.planner.memory import stage_memory
from tests.unit._grid_check import grid_agrees_with_predict

PRESET = Path(__file__).resolve().parents[2] / "search_spaces" / "preset-500b.yaml"

# The hand-computed model: 4 layers, h = 1024, f = 4h, no biases, V = 32,000 untied, on 8 GPUs of one node.
BLOCK = 12 * 1024 ** 2 + 4 * 1024            # 12h^2 GEMM weights + two LayerNorms (4h) = 12,587,008
ROOT = 2 * 32_000 * 1024 + 2 * 1024          # embedding + LM head + final LayerNorm = 65,538,048
P = 4 * BLOCK + ROOT                         # 115,886,080 parameters
BUS = 100e9 * 0.5                            # NVLink 100 GB/s x dp_bw_eff 0.5, the group inside one node
LAT = 5e-6


def cfg(raf: bool = True, prefetch: int = 1, global_batch: int = 8, peak_tflops: float = 10.0,
        hbm_GBps: float = 1e12, **over) -> PlanConfig:
    """The collectives' tests run at an unbounded HBM bandwidth, so FSDP's copies on the compute stream are ~0
    there; ``test_copies_on_the_compute_stream`` prices them at a real one."""
    base = PlanConfig(
        cluster=ClusterSpec(num_gpus=8, gpus_per_node=8, peak_tflops=peak_tflops, hbm_gb=80.0, hbm_bw_GBps=hbm_GBps,
                            intra_node_bw_GBps=100.0, intra_node_latency_us=5.0),
        model=ModelSpec(num_layers=4, hidden_size=1024, num_heads=16, vocab_size=32_000, tied_embeddings=False,
                        linear_biases=False, flash_attention=True),
        job=JobSpec(seq_len=1024), efficiency=Efficiency(dp_bw_eff=0.5, mem_reserved_gb=0.0),
        parallel=ParallelConfig(pp=1, dp=8), tensor_parallel=TensorParallel(size=1),
        batch=BatchConfig(global_batch=global_batch, micro_batch_size=1),
        data_parallel=FsdpDP(reshard_after_forward=raf, prefetch=prefetch),
        optimizer=OptimizerSharding(distributed=False))
    return dataclasses.replace(base, **over)


def memory(c: PlanConfig) -> dict[str, float]:
    mem = stage_memory(Consts.of(c), encode([c]))
    return {k: float(mem[k][0, 0]) for k in ("params", "grads", "optimizer", "fsdp_buffers")}


# ---- memory ------------------------------------------------------------------------------------------------

MEMORY_TABLE = [
    # (knobs, params, grads, optimizer, fsdp_buffers), bytes per GPU: state 2 + 4 + 12 bytes per parameter over
    # dp = 8; buffers = bf16 root + gathered blocks, one fp32 block reduce-scatter input, and with m > 1 the
    # fp32 unsharded gradients of every parameter.
    ({}, 28_971_520, 57_943_040, 173_829_120,
     2 * (ROOT + 2 * BLOCK) + 4 * BLOCK),                      # 231,772,160: 1 + one-ahead blocks
    ({"prefetch": 0}, 28_971_520, 57_943_040, 173_829_120, 231_772_160),   # implicit one-ahead: the same
    ({"prefetch": 2}, 28_971_520, 57_943_040, 173_829_120,
     2 * (ROOT + 3 * BLOCK) + 4 * BLOCK),                      # 256,946,176
    ({"prefetch": 9}, 28_971_520, 57_943_040, 173_829_120,
     2 * (ROOT + 4 * BLOCK) + 4 * BLOCK),                      # capped at the stage's 4 blocks
    ({"raf": False}, 28_971_520, 57_943_040, 173_829_120,
     2 * (ROOT + 4 * BLOCK) + 4 * BLOCK),                      # 282,120,192: every block kept to backward
    ({"global_batch": 16}, 28_971_520, 57_943_040, 173_829_120,
     2 * (ROOT + 2 * BLOCK) + 4 * BLOCK + 4 * P),              # m = 2: + 463,544,320 accumulated gradients
]


@pytest.mark.parametrize("knobs, params, grads, optimizer, buffers", MEMORY_TABLE)
def test_memory_matches_the_hand_computed_table(knobs, params, grads, optimizer, buffers):
    assert P == 115_886_080 and 2 * P / 8 == 28_971_520
    assert memory(cfg(**knobs)) == {"params": params, "grads": grads, "optimizer": optimizer, "fsdp_buffers": buffers}


def test_fsdp_shards_what_replication_and_the_distributed_optimizer_keep_whole():
    fsdp = memory(cfg())
    zero1 = memory(cfg(data_parallel=ReplicateDP(), optimizer=OptimizerSharding(distributed=True)))
    assert zero1 == {"params": 2 * P, "grads": 4 * P, "optimizer": 12 * P / 8, "fsdp_buffers": 0.0}
    assert fsdp["optimizer"] == zero1["optimizer"] and fsdp["params"] == zero1["params"] / 8
    # dp = 1: the trainer does not apply FSDP, nor does the planner
    one = cfg(cluster=dataclasses.replace(cfg().cluster, num_gpus=1), parallel=ParallelConfig(pp=1, dp=1))
    assert memory(one) == {"params": 2 * P, "grads": 4 * P, "optimizer": 12 * P, "fsdp_buffers": 0.0}


# ---- collective times --------------------------------------------------------------------------------------

G = 7 / 8 * 2 * BLOCK / BUS + 7 * LAT        # a block's bf16 all-gather: 475.545 us
R = 7 / 8 * 4 * BLOCK / BUS + 7 * LAT        # its fp32 reduce-scatter: 916.091 us
G0 = 7 / 8 * 2 * ROOT / BUS + 7 * LAT        # the root's all-gather: 2,328.832 us
R0 = 7 / 8 * 4 * ROOT / BUS + 7 * LAT        # the root's reduce-scatter: 4,622.663 us


def test_all_gather_and_reduce_scatter_times_for_known_sizes_and_bandwidth():
    assert G == pytest.approx(475.54528e-6, rel=1e-12) and R0 == pytest.approx(4622.66336e-6, rel=1e-12)
    p = predict(cfg())
    # reshard_after_forward: every block gathered twice, reduced once; the root gathered and reduced once.
    assert p.dp_total_s == pytest.approx(4 * 2 * G + G0 + 4 * R + R0, rel=1e-12)
    assert predict(cfg(raf=False)).dp_total_s == pytest.approx(4 * G + G0 + 4 * R + R0, rel=1e-12)
    assert predict(cfg(global_batch=16)).dp_total_s == pytest.approx(2 * (4 * 2 * G + G0) + 4 * R + R0, rel=1e-12)


def test_compute_bound_exposes_the_first_gathers_and_the_last_reduce_scatters():
    p = predict(cfg())        # 10 TFLOP/s: a block computes for ~100 ms, far longer than any collective
    assert p.dp_exposed_s == pytest.approx(G0 + G + G + R + R0, rel=1e-9)
    # without resharding, backward gathers nothing
    assert predict(cfg(raf=False)).dp_exposed_s == pytest.approx(G0 + G + R + R0, rel=1e-9)


# ---- copies on the compute stream ----------------------------------------------------------------------------

HBM = 2000e9 * 0.8                            # 2,000 GB/s x elementwise_bw_eff 0.8
CO, CO0 = 2 * 2 * BLOCK / HBM, 2 * 2 * ROOT / HBM          # copy-out after a gather: read + write bf16
CI, CI0 = (2 + 4) * BLOCK / HBM, (2 + 4) * ROOT / HBM      # copy-in before a reduce-scatter: bf16 in, fp32 out


@pytest.mark.parametrize("knobs,copies", [
    ({}, 4 * 2 * CO + CO0 + 4 * CI + CI0),                                # every block gathered twice
    ({"raf": False}, 4 * CO + CO0 + 4 * CI + CI0),                        # once
    ({"global_batch": 16}, 2 * (4 * 2 * CO + CO0) + 4 * CI + CI0),       # m = 2: gathers per microbatch
])
def test_copies_on_the_compute_stream(knobs, copies):
    # Compute-bound (10 TFLOP/s), so the collectives' exposure does not depend on HBM: the difference between a
    # real and an unbounded HBM bandwidth is the copies FSDP2 runs on the compute stream.
    real, free = predict(cfg(hbm_GBps=2000.0, **knobs)), predict(cfg(**knobs))
    assert real.dp_exposed_s - free.dp_exposed_s == pytest.approx(copies, rel=1e-6)
    assert real.dp_total_s == free.dp_total_s  # copies are not traffic


# ---- exposure against an event simulation of FSDP2's streams ---------------------------------------------

def simulate(g_f, g_b, r, f, b, n):
    """One microbatch of n blocks on two streams. Forward: block j's gather is issued when block j-1 starts and
    queues behind the earlier gathers. Backward: the comm stream runs AG(n-1), AG(n-2), RS(n-1), AG(n-3),
    RS(n-2), ... (FSDP2: post-backward of block i issues RS(i) after waiting for RS(i+1), then pre-backward of
    i-1 prefetches AG(i-2)). Returns the forward and backward stalls."""
    comm = t = prev_start = 0.0
    for j in range(n):
        comm = max(comm, 0.0 if j == 0 else prev_start) + g_f
        prev_start = max(t, comm)
        t = prev_start + f
    forward = t - n * f
    t0 = t
    comm = max(comm, t0)
    ag = {n - 1: comm + g_b}
    comm = ag[n - 1]
    if n >= 2:
        comm = ag[n - 2] = comm + g_b
    rs, tc = {}, t0
    for i in range(n - 1, -1, -1):
        end = max(max(tc, ag[i]) + b, rs.get(i + 1, 0.0))
        comm = rs[i] = max(comm, end) + r
        if i >= 2:
            comm = ag[i - 2] = comm + g_b
        tc = end
    return forward, tc - t0 - n * b


def test_closed_form_equals_the_event_simulation():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 9))
        g, r, f, b = rng.exponential(1.0, 4)
        g_b = g if rng.random() < 0.7 else 0.0
        e = pass_exposed(g, g_b, r, f, b, n)
        assert (float(e["forward"]), float(e["backward"])) == pytest.approx(simulate(g, g_b, r, f, b, n), abs=1e-9)


def test_exposure_never_exceeds_the_collectives_nor_hides_more_than_the_compute_it_runs_under():
    rng = np.random.default_rng(1)
    n = rng.integers(1, 40, size=5000).astype(float)
    g, r, f, b = (rng.exponential(1.0, 5000) for _ in range(4))
    e = pass_exposed(g, g, r, f, b, n)
    fwd_comm, bwd_comm = n * g, n * g + np.maximum(n - 1, 0) * r   # block 0's reduce-scatter is the tail
    assert np.all(e["forward"] >= 0) and np.all(e["forward"] <= fwd_comm + 1e-12)
    assert np.all(e["backward"] >= 0) and np.all(e["backward"] <= bwd_comm + 1e-12)
    # the first gather of each pass has nothing to hide under; the rest at most one block's compute per block
    # it runs under: n - 1 blocks in forward, all n in backward (the last one hides the reduce-scatter before it)
    assert np.all(e["forward"] >= g) and np.all(e["forward"] >= fwd_comm - (n - 1) * f - 1e-12)
    assert np.all(e["backward"] >= g) and np.all(e["backward"] >= bwd_comm - n * b - 1e-12)


def test_slow_network_exposes_the_excess_over_compute():
    slow = predict(cfg(peak_tflops=1e6))    # compute ~1 us per block: the collectives are the step
    assert slow.dp_exposed_s == pytest.approx(slow.dp_total_s, rel=0.02)
    assert slow.dp_exposed_s <= slow.dp_total_s


# ---- knobs -------------------------------------------------------------------------------------------------

def test_prefetch_ordering():
    """prefetch 0 is FSDP2's implicit one-ahead: the same as 1. Deeper prefetch issues gathers earlier, but they
    queue on the same stream, so it hides nothing more and holds one more block per step ahead."""
    for peak in (10.0, 1e4, 1e6):
        p0, p1, p2 = (predict(cfg(prefetch=k, peak_tflops=peak)) for k in (0, 1, 2))
        assert p2.step_time_s == p1.step_time_s == p0.step_time_s
        assert p2.peak_memory_bytes - p1.peak_memory_bytes == 2 * BLOCK and p1.peak_memory_bytes == p0.peak_memory_bytes


def test_keeping_parameters_after_forward_costs_memory_and_saves_traffic():
    for peak in (10.0, 1e4, 1e6):
        keep, reshard = predict(cfg(raf=False, peak_tflops=peak)), predict(cfg(raf=True, peak_tflops=peak))
        assert keep.peak_memory_bytes - reshard.peak_memory_bytes == 2 * 2 * BLOCK
        assert reshard.dp_total_s - keep.dp_total_s == pytest.approx(4 * G, rel=1e-12)
        assert keep.dp_exposed_s <= reshard.dp_exposed_s and keep.step_time_s <= reshard.step_time_s


def test_fsdp_with_the_distributed_optimizers_gather_overlap_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="^optimizer.overlap_param_gather: .*fsdp"):
        cfg(optimizer=OptimizerSharding(distributed=True, overlap_param_gather=True))


def test_pipeline_stages_each_shard_their_own_layers():
    c = cfg(cluster=dataclasses.replace(cfg().cluster, num_gpus=16, gpus_per_node=16),
            parallel=ParallelConfig(pp=2, dp=8), batch=BatchConfig(global_batch=16))
    p = predict(c)
    first, last = p.memory_per_stage
    assert first["params"] == 2 * (2 * BLOCK + 32_000 * 1024) / 8
    assert last["params"] == 2 * (2 * BLOCK + 32_000 * 1024 + 2 * 1024) / 8
    assert p.dp_exposed_s > 0 and p.step_time_s == pytest.approx(
        p.compute_track_s + p.dp_exposed_s + p.optimizer_s, rel=1e-12)


# ---- the enumerator and the plan command -----------------------------------------------------------------

FSDP_SPACE = {
    "batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4]},
    "data_parallel.kind": {"type": "categorical", "choices": ["replicate", "fsdp"]},
    "data_parallel.reshard_after_forward": {"type": "categorical", "choices": [True, False],
                                            "when": {"data_parallel.kind": "fsdp"}},
    "data_parallel.prefetch": {"type": "int", "low": 0, "high": 2, "when": {"data_parallel.kind": "fsdp"}},
    "recompute.kind": {"type": "categorical", "choices": ["none", "selective", "full"]},
    "recompute.method": {"type": "categorical", "choices": ["uniform", "block"], "when": {"recompute.kind": "full"}},
    "recompute.num_layers": {"type": "int", "low": 1, "high": 2, "when": {"recompute.kind": "full"}},
    "optimizer.overlap_param_gather": {"type": "categorical", "choices": [False, True]},
}


@pytest.mark.parametrize("pp", [1, 2])
def test_enumerator_matches_planconfig_and_predict(pp):
    base = cfg(peak_tflops=300.0, cluster=dataclasses.replace(cfg().cluster, num_gpus=8 * pp, gpus_per_node=8),
               parallel=ParallelConfig(pp=pp, dp=8), batch=BatchConfig(global_batch=32),
               optimizer=OptimizerSharding(distributed=True))
    grid = enumerate_space(base, FSDP_SPACE)
    assert grid.n == 3 * (1 + 2 * 3) * (2 + 2 * 2) * 2
    checked = grid_agrees_with_predict(base, grid, range(grid.n))
    assert checked[True] > 50 and checked[False] > 10


def test_plan_command_predicts_fsdp(capsys):
    rc = main(["plan", "--config", str(PRESET), "--json", "data_parallel.kind=fsdp",
               "optimizer.overlap_param_gather=false"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    d = json.loads(out.out)
    p = d["prediction"]
    assert d["knobs"]["data_parallel.kind"] == "fsdp" and d["knobs"]["parallel.dp"] > 1
    assert p["dp_total_s"] > 0 and p["step_time_s"] > 0
    assert all(s["fsdp_buffers"] > 0 for s in p["memory_per_stage"])
    rc = main(["plan", "--config", str(PRESET), "data_parallel.kind=fsdp", "data_parallel.reshard_after_forward=false",
               "optimizer.overlap_param_gather=false"])
    out = capsys.readouterr()
    assert rc == 0 and "fsdp (reshard_after_forward False, prefetch 1)" in out.out and "fsdp buffers" in out.out
    rc = main(["plan", "--config", str(PRESET), "data_parallel.kind=fsdp", "optimizer.overlap_param_gather=true"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "optimizer.overlap_param_gather" in err


# ---- under a pipeline (pp > 1): torch pipelining keeps groups gathered and reduces once per step -------------

EMB = 32_000 * 1024                          # stage 0's root: the input embedding
HEAD = 32_000 * 1024 + 2 * 1024              # the last stage's root: LM head + final LayerNorm
G0_FIRST = 7 / 8 * 2 * EMB / BUS + 7 * LAT
G0_LAST = 7 / 8 * 2 * HEAD / BUS + 7 * LAT
R0_FIRST = 7 / 8 * 4 * EMB / BUS + 7 * LAT
R0_LAST = 7 / 8 * 4 * HEAD / BUS + 7 * LAT


def piped(schedule: str = "1f1b", raf: bool = True, global_batch: int = 32, layers: int = 4, **over) -> PlanConfig:
    """pp 2 x dp 8 on one 16-GPU node; global batch 32 = m 4 microbatches per replica."""
    base = cfg(raf=raf, prefetch=0, cluster=dataclasses.replace(cfg().cluster, num_gpus=16, gpus_per_node=16),
               parallel=ParallelConfig(pp=2, dp=8), batch=BatchConfig(global_batch=global_batch),
               pipeline=PipelineConfig(schedule=schedule, virtual_stages=2 if schedule == "interleaved_1f1b" else 1))
    return dataclasses.replace(base, model=dataclasses.replace(base.model, num_layers=layers), **over)


def passes(c: PlanConfig) -> list[tuple[int, int, int]]:
    gp = gather_passes(Consts.of(c), encode([c]))
    return [tuple(int(gp[k][0, s]) for k in ("up_front", "forward", "backward")) for s in range(c.parallel.pp)]


GATHER_TABLE = [
    # (config, per stage (up front, forward passes, backward passes) in which each group is gathered per step).
    # pp 2, m 4. 1F1B stage s runs min(p - s, m) forwards before its first backward; the rest of its passes
    # alternate B F ... B, and only a backward that follows a forward gathers: m + 1 = 5 in all.
    (lambda: piped("1f1b", True), [(0, 2, 3), (0, 1, 4)]),
    (lambda: piped("1f1b", False), [(0, 1, 0), (0, 1, 0)]),       # once, in the first forward
    (lambda: piped("gpipe", True), [(0, 4, 1), (0, 4, 1)]),       # m forwards, then the first backward
    (lambda: piped("gpipe", False), [(0, 1, 0), (0, 1, 0)]),
    # interleaved, v 2: chunks unsharded up front; warm-up 2(p-s-1) + (v-1)p + 1 = 5 and 3 chunk passes, over
    # v chunks (rounded up) = 3 and 2 forwards before a chunk's first backward, the first of them up front
    (lambda: piped("interleaved_1f1b", True), [(1, 2, 2), (1, 1, 3)]),
    (lambda: piped("interleaved_1f1b", False), [(1, 0, 0), (1, 0, 0)]),
    # pp 1 (m 4): every microbatch gathers again, twice with reshard_after_forward
    (lambda: cfg(raf=True, global_batch=32), [(0, 4, 4)]),
    (lambda: cfg(raf=False, global_batch=32), [(0, 4, 0)]),
]


@pytest.mark.parametrize("make, expected", GATHER_TABLE)
def test_gathers_per_step_match_the_hand_computed_table(make, expected):
    assert passes(make()) == expected


def test_pipeline_traffic_counts_each_gather_once_per_gathering_pass_and_one_reduce_scatter():
    # the last stage (2 blocks + LM head) carries the most traffic
    keep = predict(piped("1f1b", False))
    assert keep.dp_total_s == pytest.approx(2 * G + G0_LAST + 2 * R + R0_LAST, rel=1e-12)
    raf = predict(piped("1f1b", True))
    assert raf.dp_total_s == pytest.approx(5 * (2 * G + G0_LAST) + 2 * R + R0_LAST, rel=1e-12)
    # at pp = 1 the same m = 4 gathers 2m = 8 times
    assert predict(cfg(global_batch=32)).dp_total_s == pytest.approx(4 * (4 * 2 * G + G0) + 4 * R + R0, rel=1e-12)


def test_pipeline_compute_bound_exposes_stage_0s_first_gathers_and_its_reduce_scatters():
    """10 TFLOP/s: compute dwarfs every collective. Stage 0 has no fill to wait through: its root and first
    block gathers are exposed; stage 1's hide under the fill. Every reduce-scatter follows the last backward;
    stage 0 ends last, so its are exposed; stage 1's hide under the drain."""
    once = G0_FIRST + G + 2 * R + R0_FIRST
    for schedule in ("1f1b", "gpipe", "interleaved_1f1b"):   # interleaved: the first chunk (1 block) up front
        assert predict(piped(schedule, False)).dp_exposed_s == pytest.approx(once, rel=1e-9), schedule
    # reshard_after_forward, 1F1B: per stage m more gathering passes, each exposing its first gather and the
    # root's (compute-bound: the rest hides), spread over the m microbatches: G + G0_s per microbatch, paid
    # m times on the slowest stage (the last: the LM head) and once in the fill by stage 0
    raf = predict(piped("1f1b", True))
    assert raf.dp_exposed_s == pytest.approx(once + 4 * (G + G0_LAST) + (G + G0_FIRST), rel=1e-9)


def test_pipeline_copies_on_the_compute_stream():
    """Without resharding each stage gathers once per step: its copy-outs, spread over the m = 4 microbatches,
    are paid m times on the slowest stage (the last) and once, in the fill, on stage 0; stage 0's copy-ins
    follow its last backward, exposed (stage 1's hide under the drain)."""
    co0_first, co0_last, ci0_first = 2 * 2 * EMB / HBM, 2 * 2 * HEAD / HBM, 6 * EMB / HBM
    real = predict(piped("1f1b", False, cluster=dataclasses.replace(piped().cluster, hbm_bw_GBps=2000.0)))
    free = predict(piped("1f1b", False))
    copies = (2 * CO + co0_last) + (2 * CO + co0_first) / 4 + 2 * CI + ci0_first
    assert real.dp_exposed_s - free.dp_exposed_s == pytest.approx(copies, rel=1e-6)


MEMORY_PP_TABLE = [
    # (schedule, raf, global batch, per stage fsdp_buffers): 8 layers, 4 per stage. Under a pipeline every block
    # of the stage is held gathered (bf16) either way, and the stage's fp32 gradients accumulate unsharded
    # until the step's end, even at m = 1; one fp32 block reduce-scatter input.
    ("1f1b", True, 32, [2 * (EMB + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + EMB),
                        2 * (HEAD + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + HEAD)]),
    ("1f1b", False, 32, [2 * (EMB + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + EMB),
                         2 * (HEAD + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + HEAD)]),
    ("1f1b", True, 8, [2 * (EMB + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + EMB),      # m = 1
                       2 * (HEAD + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + HEAD)]),
    ("interleaved_1f1b", True, 32, [2 * (EMB + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + EMB),
                                    2 * (HEAD + 4 * BLOCK) + 4 * BLOCK + 4 * (4 * BLOCK + HEAD)]),
]


@pytest.mark.parametrize("schedule, raf, global_batch, buffers", MEMORY_PP_TABLE)
def test_pipeline_memory_matches_the_hand_computed_table(schedule, raf, global_batch, buffers):
    c = piped(schedule, raf, global_batch, layers=8)
    mem = stage_memory(Consts.of(c), encode([c]))
    assert [float(x) for x in mem["fsdp_buffers"][0]] == buffers
    assert buffers[0] == 2 * 83_116_032 + 50_348_032 + 4 * 83_116_032     # 549,044,224 bytes on stage 0
    # the same 8 layers without a pipeline hold 2 blocks with reshard_after_forward, and no gradients at m = 1
    flat = cfg(raf=True, global_batch=8, model=dataclasses.replace(cfg().model, num_layers=8))
    assert memory(flat)["fsdp_buffers"] == 2 * (ROOT + 2 * BLOCK) + 4 * BLOCK
