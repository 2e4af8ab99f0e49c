"""GPU tier: real CUDA runs (skipped where torch sees no GPU)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import TrainConfig
from trainer.launch import spawn, spawn_many

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SMALL = {"model": {"vocab_size": 1024, "n_layers": 4, "d_model": 256, "n_heads": 4, "seq_len": 256},
         "batch": {"global_batch": 8, "micro_batch_size": 2},
         "run": {"steps": 6, "warmup_steps": 2, "device": "cuda", "precision": "bf16"}}


def test_single_gpu_bf16_run_reports_cuda_memory_and_declared_peak():
    result = spawn(TrainConfig.from_dict(SMALL))
    assert result.memory["cuda_peak_allocated_bytes"]["max"] > 0
    assert result.summary.peak_memory_basis.startswith("torch.cuda.max_memory_allocated")
    name = result.ranks[0].device_name
    if any(k in name for k in ("H100", "H200", "A100", "B200")):
        assert result.summary.mfu is not None and "datasheet" in result.summary.peak_basis
    assert result.steps[-1].loss < result.steps[0].loss


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_layouts_agree_in_fp32():
    fp32 = {**SMALL, "run": {**SMALL["run"], "precision": "fp32"}}
    a, b = spawn_many([TrainConfig.from_dict({**fp32, "parallel": {"dp": 2}}),
                       TrainConfig.from_dict({**fp32, "parallel": {"pp": 2}})])
    for x, y in zip(a.steps, b.steps):
        assert abs(x.loss - y.loss) / y.loss < 1e-4


def test_profiled_warmup_update_records_cuda_kernels(tmp_path):
    import gzip
    import json

    cfg = TrainConfig.from_dict({**SMALL, "run": {**SMALL["run"], "profile_step": 1}})
    result = spawn(cfg, trace_dir=tmp_path)
    events = json.loads(gzip.decompress((tmp_path / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"]
    assert result.ranks[0].trace_file and any(e.get("cat") == "kernel" for e in events)
