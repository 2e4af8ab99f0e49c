"""Every layout learns exactly what the single-process run learns (real gloo ranks on CPU).

fp32, >= 5 steps: per-step losses within 1e-5 relative of the single-process run, data-parallel replicas
identical at the end (<= 1e-6), final parameters equal by their layout-independent fingerprint.
"""

from __future__ import annotations

import pytest

from orchestrator.parity.verdict import compare, reference_from_result
from tests.distributed._common import cfg, rel_diff
from trainer.launch import spawn_many
from trainer.measure.result import Result

pytestmark = pytest.mark.distributed

WORLD2 = {
    "dp2 replicate overlap": {"parallel.dp": 2},
    "dp2 replicate no overlap, 1 bucket": {"parallel.dp": 2, "data_parallel.overlap_grad_reduce": False,
                                           "data_parallel.bucket_mb": 100.0},
    "dp2 fsdp": {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
    "dp2 torch_ddp": {"parallel.dp": 2, "data_parallel.kind": "torch_ddp"},
    # torchtitan's pairing: FSDP2 over blocks under op-level selective checkpointing.
    "dp2 fsdp, op recompute": {"parallel.dp": 2, "data_parallel.kind": "fsdp", "recompute.kind": "op"},
    "pp2 1f1b, op recompute every 3rd matmul": {"parallel.pp": 2, "recompute.kind": "op", "recompute.matmul_period": 3},
    "pp2 1f1b": {"parallel.pp": 2},
    "pp2 gpipe full recompute": {"parallel.pp": 2, "pipeline.schedule": "gpipe", "recompute.kind": "full"},
    "pp2 interleaved v2": {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
    "pp2 1f1b first/last split, selective": {"parallel.pp": 2, "pipeline.split.kind": "first_last",
                                             "pipeline.split.first": 1, "recompute.kind": "selective",
                                             "recompute.modules": ["core_attn", "mlp"]},
    "pp2 microbatch 1": {"parallel.pp": 2, "batch.micro_batch_size": 1},
    # Llama 3's layout: an embedding-only first chunk and a head-and-loss-only last chunk.
    "pp2 interleaved v2, empty end chunks": {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b",
                                             "pipeline.virtual_stages": 2, "pipeline.split.kind": "explicit",
                                             "pipeline.split.layers": [0, 2, 2, 0]},
}
WORLD4 = {
    "pp2 dp2 replicate 1f1b": {"parallel.pp": 2, "parallel.dp": 2, "batch.micro_batch_size": 1},
    "pp2 dp2 fsdp gpipe": {"parallel.pp": 2, "parallel.dp": 2, "data_parallel.kind": "fsdp",
                           "pipeline.schedule": "gpipe", "batch.micro_batch_size": 1, "data_parallel.prefetch": 0},
    "pp2 dp2 interleaved block recompute": {"parallel.pp": 2, "parallel.dp": 2, "batch.micro_batch_size": 1,
                                            "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
                                            "recompute.kind": "full", "recompute.method": "block"},
    "pp4 1f1b": {"parallel.pp": 4, "batch.micro_batch_size": 1},
    "pp4 gpipe": {"parallel.pp": 4, "pipeline.schedule": "gpipe"},
    "pp4 interleaved v1x2": {"parallel.pp": 4, "batch.micro_batch_size": 1,
                             "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
                             "model.n_layers": 8},
}


@pytest.fixture(scope="module")
def reference() -> dict[int, Result]:
    # One single-process reference per model depth used below.
    results = spawn_many([cfg({}), cfg({"model.n_layers": 8})])
    return {4: results[0], 8: results[1]}


def _check(name: str, result, ref: Result) -> None:
    assert isinstance(result, Result), f"{name}: {result}"
    assert len(result.steps) == len(ref.steps) >= 5
    for mine, base in zip(result.steps, ref.steps):
        assert rel_diff(mine.loss, base.loss) <= 1e-5, f"{name}: step {mine.step} loss {mine.loss} vs {base.loss}"
        assert rel_diff(mine.grad_norm, base.grad_norm) <= 1e-4, f"{name}: step {mine.step} grad norm"
    assert result.replica_max_abs_diff <= 1e-6, f"{name}: replicas diverged by {result.replica_max_abs_diff}"
    assert set(result.fingerprint) == set(ref.fingerprint), f"{name}: parameter sets differ"
    for pname, (norm, total) in ref.fingerprint.items():
        assert rel_diff(result.fingerprint[pname][0], norm) <= 1e-5, f"{name}: {pname} norm"
    assert result.steps[-1].loss < result.steps[0].loss
    verdict = compare(reference_from_result(ref), result)  # the sweep's parity gate agrees
    assert verdict["passed"], (name, verdict)


@pytest.mark.timeout(240)
def test_world2_layouts_match_single_process(reference):
    names = list(WORLD2)
    results = spawn_many([cfg(WORLD2[n]) for n in names])
    for name, result in zip(names, results):
        _check(name, result, reference[4])


@pytest.mark.timeout(300)
def test_world4_layouts_match_single_process(reference):
    names = list(WORLD4)
    results = spawn_many([cfg(WORLD4[n]) for n in names])
    for name, result in zip(names, results):
        _check(name, result, reference[cfg(WORLD4[name]).model.n_layers])
