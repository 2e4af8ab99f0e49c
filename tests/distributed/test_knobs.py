"""Each knob really changes execution, measured on real gloo ranks."""

from __future__ import annotations

import pytest

from tests.distributed._common import cfg
from trainer.launch import spawn_many

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(120)
def test_full_recompute_lowers_saved_activations_in_proportion_to_layers():
    base = {"batch.micro_batch_size": 8, "run.steps": 2, "run.warmup_steps": 1}
    configs = [cfg(base)] + [cfg({**base, "recompute.kind": "full", "recompute.method": "block",
                                   "recompute.num_layers": k}) for k in (1, 2, 3, 4)]
    configs.append(cfg({**base, "recompute.kind": "selective", "recompute.modules": ["mlp"]}))
    results = spawn_many(configs)
    acts = [r.memory["saved_activation_peak_bytes"]["max"] for r in results]
    full, selective = acts[:5], acts[5]
    assert all(a > b for a, b in zip(full, full[1:])), full
    saved_per_layer = [(full[0] - full[k]) / k for k in (1, 2, 3, 4)]
    assert max(saved_per_layer) / min(saved_per_layer) < 1.05, saved_per_layer
    assert full[4] < full[0] / 3
    assert full[4] < selective < full[0]
    # Recompute is paid for in hardware FLOPs, never in model FLOPs.
    assert results[4].summary.hardware_flops_per_step > results[0].summary.hardware_flops_per_step
    assert results[4].summary.model_flops_per_step == results[0].summary.model_flops_per_step


@pytest.mark.timeout(120)
def test_split_schedule_and_microbatches_are_what_the_config_says():
    layouts = {
        "explicit": {"parallel.pp": 2, "pipeline.split.kind": "explicit", "pipeline.split.layers": [1, 3]},
        "first_last": {"parallel.pp": 2, "pipeline.split.kind": "first_last", "pipeline.split.last": 3},
        "interleaved": {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
        "gpipe mbs1": {"parallel.pp": 2, "pipeline.schedule": "gpipe", "batch.micro_batch_size": 1},
    }
    results = dict(zip(layouts, spawn_many([cfg(v) for v in layouts.values()])))
    ranks = {k: sorted(r.ranks, key=lambda x: x.rank) for k, r in results.items()}
    assert [r.layer_ids for r in ranks["explicit"]] == [[0], [1, 2, 3]]
    assert [r.layer_ids for r in ranks["first_last"]] == [[0], [1, 2, 3]]
    assert [r.stage_ids for r in ranks["interleaved"]] == [[0, 2], [1, 3]]
    assert [r.layer_ids for r in ranks["interleaved"]] == [[0, 2], [1, 3]]
    for name, expected_micro in (("explicit", 4), ("gpipe mbs1", 8)):
        result = results[name]
        assert result.n_microbatches == expected_micro
        for rank in result.ranks:
            kept = rank.spans[0].step
            forwards = [s for s in rank.spans if s.step == kept and s.phase == "forward"]
            assert len(forwards) == expected_micro, (name, rank.rank, len(forwards))
    inter = ranks["interleaved"][0]
    kept = inter.spans[0].step
    assert len([s for s in inter.spans if s.step == kept and s.phase == "forward"]) == 2 * 4


@pytest.mark.timeout(120)
def test_overlap_starts_reduction_before_backward_ends():
    base = {"parallel.dp": 2, "data_parallel.bucket_mb": 0.01, "batch.micro_batch_size": 1, "run.steps": 4}
    on, off = spawn_many([cfg({**base, "data_parallel.overlap_grad_reduce": True}),
                          cfg({**base, "data_parallel.overlap_grad_reduce": False})])
    assert on.reduce_start_after_backward_s < 0 < off.reduce_start_after_backward_s
    # Both reduce the same gradients: the learning is identical.
    assert [s.loss for s in on.steps] == pytest.approx([s.loss for s in off.steps], rel=1e-6)
    reduce_spans = [s for r in on.ranks for s in r.spans if s.phase == "dp_reduce"]
    assert len(reduce_spans) > 2
