"""GPU tier: real CUDA runs, each knob family against a single-process reference (skipped without CUDA).

Run with ``PYTHONPATH=. python3 -m pytest tests/gpu`` on any machine whose torch sees a GPU (tests/gpu/conftest.py).
One GPU holds one rank (NCCL refuses two ranks on one device), so on one GPU the families that change the
maths of a single rank are compared (recompute, microbatching); the families that need a second rank
(pipeline split, data-parallel overlap) run when two GPUs are there and skip with that reason otherwise.
"""

from __future__ import annotations

import pytest
import torch

from orchestrator.parity.verdict import DEFAULT_TOLERANCE, compare, reference_from_result
from trainer.config import TrainConfig, apply_overrides
from trainer.launch import spawn, spawn_many

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one rank per GPU under NCCL)")

SMALL = {"model": {"vocab_size": 1024, "n_layers": 4, "d_model": 256, "n_heads": 4, "seq_len": 256},
         "batch": {"global_batch": 8, "micro_batch_size": 2},
         "data_parallel": {"kind": "replicate"},
         "run": {"steps": 6, "warmup_steps": 2, "device": "cuda", "precision": "bf16"}}
FP32 = apply_overrides(SMALL, {"run.precision": "fp32"})
GPU_TOLERANCE = DEFAULT_TOLERANCE["bf16"]
"""fp32 on a GPU is not bit-exact across layouts (cuBLAS picks kernels by shape, TF32 may be on): the bf16
floors, the tolerance the sweep uses for GPU baselines before their own repeats widen it."""


def cfg(base: dict, **over) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(base, {k.replace("__", "."): v for k, v in over.items()}))


def assert_matches(reference, results, names):
    ref = reference_from_result(reference)
    for name, r in zip(names, results):
        assert not isinstance(r, Exception), (name, r)
        verdict = compare(ref, r, tolerance=GPU_TOLERANCE)
        assert verdict["passed"], (name, verdict)


def test_single_gpu_bf16_run_reports_cuda_memory_and_declared_peak():
    result = spawn(TrainConfig.from_dict(SMALL))
    assert result.memory["cuda_peak_allocated_bytes"]["max"] > 0
    assert result.summary.peak_memory_basis.startswith("torch.cuda.max_memory_allocated")
    name = result.ranks[0].device_name
    if any(k in name for k in ("H100", "H200", "A100", "B200")):
        assert result.summary.mfu is not None and "datasheet" in result.summary.peak_basis
        assert result.summary.mfu <= result.summary.hfu
    assert result.steps[-1].loss < result.steps[0].loss


def test_recompute_matches_the_single_process_reference():
    names = ["selective core_attn", "selective mlp+norm", "full uniform", "full block 2", "op every 2nd matmul"]
    ref, *rest = spawn_many([cfg(FP32), cfg(FP32, recompute__kind="selective"),
                             cfg(FP32, recompute__kind="selective", recompute__modules=["mlp", "norm"]),
                             cfg(FP32, recompute__kind="full"),
                             cfg(FP32, recompute__kind="full", recompute__method="block", recompute__num_layers=2),
                             cfg(FP32, recompute__kind="op")])
    assert_matches(ref, rest, names)
    # Full recompute repeats the forward: the hardware FLOPs grow, the model FLOPs do not.
    assert rest[2].summary.hardware_flops_per_step > ref.summary.hardware_flops_per_step
    assert rest[2].summary.model_flops_per_step == ref.summary.model_flops_per_step


def test_microbatching_matches_the_single_process_reference():
    ref, *rest = spawn_many([cfg(FP32), cfg(FP32, batch__micro_batch_size=1), cfg(FP32, batch__micro_batch_size=8)])
    assert [r.n_microbatches for r in (ref, *rest)] == [4, 8, 1]
    assert_matches(ref, rest, ["mbs 1", "mbs 8"])


@two_gpus
def test_pipeline_split_matches_the_single_process_reference():
    (ref,) = spawn_many([cfg(FP32)])
    rest = spawn_many([cfg(FP32, parallel__pp=2, pipeline__schedule="gpipe"),
                       cfg(FP32, parallel__pp=2, pipeline__split__kind="first_last", pipeline__split__first=1,
                           pipeline__split__last=3)])
    assert_matches(ref, rest, ["pp 2 gpipe balanced", "pp 2 1f1b first=1 last=3"])


@two_gpus
def test_data_parallel_overlap_matches_the_single_process_reference():
    (ref,) = spawn_many([cfg(FP32)])
    rest = spawn_many([cfg(FP32, parallel__dp=2, data_parallel__overlap_grad_reduce=True, data_parallel__bucket_mb=1),
                       cfg(FP32, parallel__dp=2, data_parallel__overlap_grad_reduce=False)])
    assert_matches(ref, rest, ["dp 2 overlap", "dp 2 no overlap"])
    assert rest[0].reduce_start_after_backward_s < 0  # reduction started under the backward


@two_gpus
def test_tensor_parallel_matches_the_single_process_reference():
    """TP over NCCL (DTensor column/row-wise linears, sequence-parallel norms) learns what one GPU learns."""
    (ref,) = spawn_many([cfg(FP32)])
    rest = spawn_many([cfg(FP32, tensor_parallel__size=2, tensor_parallel__sequence_parallel=True),
                       cfg(FP32, tensor_parallel__size=2, tensor_parallel__sequence_parallel=False),
                       cfg(FP32, tensor_parallel__size=2, recompute__kind="full")])
    assert_matches(ref, rest, ["tp 2 sp", "tp 2 no sp", "tp 2 sp full recompute"])
    # each rank holds about half the model, and the collectives are measured as their own phase
    assert rest[0].memory["param_bytes"]["max"] < 0.6 * ref.memory["param_bytes"]["max"]
    assert rest[0].phases["tp_comm"]["max"] > 0


@two_gpus
def test_tensor_parallel_comm_overlap_matches_the_single_process_reference():
    """tensor_parallel.comm_overlap: torch's asynchronous TP (compiled blocks, micro-pipelined all-gather and
    reduce-scatter matmuls over symmetric memory) learns what one GPU learns."""
    (ref,) = spawn_many([cfg(FP32)])
    rest = spawn_many([cfg(FP32, tensor_parallel__size=2, tensor_parallel__comm_overlap=True),
                       cfg(FP32, tensor_parallel__size=2, tensor_parallel__comm_overlap=True, recompute__kind="full")])
    assert_matches(ref, rest, ["tp 2 sp comm_overlap", "tp 2 sp comm_overlap full recompute"])
    assert rest[0].config["tensor_parallel"]["comm_overlap"] is True
    assert rest[0].memory["param_bytes"]["max"] < 0.6 * ref.memory["param_bytes"]["max"]


def test_profiled_warmup_update_records_cuda_kernels(tmp_path):
    import gzip
    import json

    result = spawn(cfg(SMALL, run__profile_step=1), trace_dir=tmp_path)
    events = json.loads(gzip.decompress((tmp_path / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"]
    assert result.ranks[0].trace_file and any(e.get("cat") == "kernel" for e in events)
