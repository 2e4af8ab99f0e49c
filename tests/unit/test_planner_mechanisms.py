"""Mechanisms of the step-time and memory model against hand-computed cases: Megatron's pipeline
scatter/gather sends and their overlap, the memory-bound elementwise kernels (fused and eager), and model
chunks of unequal size (timing.py, memory.py, knobs.py)."""

import dataclasses

import numpy as np
import pytest

from orchestrator.planner import (BatchConfig, ClusterSpec, Efficiency, JobSpec, ModelSpec, ParallelConfig,
                                  PlanConfig, TensorParallel)
from orchestrator.planner.knobs import Consts, encode
from orchestrator.planner.timing import layer_costs

T, H, F, TP = 2048.0, 12288.0, 4 * 12288.0, 8


def _cfg(sp: bool, ew_eff: float = 0.8) -> PlanConfig:
    return PlanConfig(
        cluster=ClusterSpec(num_gpus=16, gpus_per_node=8, peak_tflops=312.0, hbm_bw_GBps=2039.0,
                            intra_node_bw_GBps=300.0, intra_node_latency_us=3.0, inter_node_bw_GBps=25.0,
                            inter_node_latency_us=6.0),
        model=ModelSpec(num_layers=4, hidden_size=int(H), num_heads=96, vocab_size=51200, flash_attention=False),
        job=JobSpec(seq_len=int(T)),
        efficiency=Efficiency(tp_bw_eff=0.7, pp_bw_eff=0.7, elementwise_bw_eff=ew_eff),
        parallel=ParallelConfig(pp=2, dp=1), tensor_parallel=TensorParallel(size=TP, sequence_parallel=sp),
        batch=BatchConfig(global_batch=4, micro_batch_size=1),
    )


def _lc(cfg: PlanConfig) -> dict:
    return {k: float(v[0]) for k, v in layer_costs(Consts.of(cfg), encode([cfg])).items()}


def test_pipeline_send_is_a_tp_slice_with_or_without_sequence_parallelism():
    # Each of the 8 TP ranks sends 2Th/8 bytes over its own NIC (inter-node: pp stages are 8 GPUs apart).
    slice_s = 2 * T * H / TP / (25e9 * 0.7) + 6e-6
    assert _lc(_cfg(sp=True))["p2p"] == pytest.approx(slice_s, rel=1e-12)
    # Without SP, Megatron's scatter/gather re-assembles the slices with an NVLink all-gather on arrival.
    gather = 7 / 8 * 2 * T * H / (300e9 * 0.7) + 7 * 3e-6
    assert _lc(_cfg(sp=False))["p2p"] == pytest.approx(slice_s + gather, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_elementwise_bytes_by_hand(sp):
    # The elementwise time is the only term that depends on elementwise_bw_eff: the difference between two
    # values isolates its bytes. Forward 22 bytes per h-wide element (replicated over TP without SP) + 4 per
    # ffn-wide element over TP; backward 34 and 6.
    a, b = _lc(_cfg(sp, 0.8)), _lc(_cfg(sp, 0.4))
    rep = 1 / TP if sp else 1.0
    fwd = 22 * T * H * rep + 4 * T * F / TP
    bwd = 34 * T * H * rep + 6 * T * F / TP
    per_byte = 1 / (2039e9 * 0.4) - 1 / (2039e9 * 0.8)
    assert b["f_comp"] - a["f_comp"] == pytest.approx(fwd * per_byte, rel=1e-9)
    assert b["b_comp"] - a["b_comp"] == pytest.approx(bwd * per_byte, rel=1e-9)


def test_sequence_parallelism_splits_the_replicated_elementwise_work():
    off, on = _lc(_cfg(False)), _lc(_cfg(True))
    saved = 22 * T * H * (1 - 1 / TP) / (2039e9 * 0.8)
    assert off["f_comp"] - on["f_comp"] == pytest.approx(saved, rel=1e-9)
    assert dataclasses.replace(Efficiency(), elementwise_bw_eff=0.5).elementwise_bw_eff == 0.5
    with pytest.raises(ValueError, match="elementwise_bw_eff"):
        Efficiency(elementwise_bw_eff=0.0)


def _chunked(layers: tuple[int, ...], **rc) -> PlanConfig:
    from trainer.knobs import ExplicitSplit, FullRecompute, PipelineConfig

    return dataclasses.replace(
        _cfg(sp=True), batch=BatchConfig(global_batch=4, micro_batch_size=1),
        pipeline=PipelineConfig(schedule="interleaved_1f1b", virtual_stages=2, split=ExplicitSplit(layers)),
        **({"recompute": FullRecompute(**rc)} if rc else {}))


def test_activations_follow_the_layers_of_the_chunk_passes_in_flight():
    """pp 2, v 2, m 4, chunks [0, 2, 2, 0] (Llama 3's empty end chunks): rank 0 holds chunks 0 and 2 (0 and 2
    layers), rank 1 chunks 1 and 3 (2 and 0). Passes run chunk (k mod 4) div 2: rank 0 has 2(p-1) + (v-1)p + 1
    = 5 in flight (chunk 0 three times, chunk 1 twice: 4 layers), rank 1 has 3 (chunk 0 twice, chunk 1 once:
    4 layers). Equal chunks [1, 1, 1, 1] hold 5 and 3 layers."""
    from orchestrator.planner.knobs import chunk_passes
    from orchestrator.planner.memory import activation_bytes, stage_memory

    for layers, held in [((0, 2, 2, 0), [4, 4]), ((1, 1, 1, 1), [5, 3])]:
        cfg = _chunked(layers)
        C, K = Consts.of(cfg), encode([cfg])
        if layers[0] == 0:  # the uneven config's passes per chunk; equal chunks take the plain count
            assert K.uneven.tolist() == [0] and chunk_passes(C, K)[0].tolist() == [[3, 2], [2, 1]]
        else:
            assert K.uneven.tolist() == []
        full = activation_bytes(C, K)["full"][0]
        logits = stage_memory(C, K)["activations"][0] - [h * full for h in held]
        assert logits[0] == 0 and logits[1] > 0  # only the last stage adds its fp32 logits
    # Block recompute counts each chunk's own layers: min(1, 0) + min(1, 2) on either rank.
    from orchestrator.planner.knobs import recomputed_layers

    cfg = _chunked((0, 2, 2, 0), method="block", num_layers=1)
    assert recomputed_layers(encode([cfg])).tolist() == [[1, 1]]


def test_eager_llama_elementwise_bytes_by_hand():
    """torchtitan's eager Llama 3 8B block (h 4096, 8 KV heads of 128, SwiGLU 14,336; the planner's equivalent
    MLP width 18,432), per element of h: 2 RMSNorms 2 x 36 forward / 2 x 64 backward, 2 residual adds 6 / 6,
    RoPE on q and k 20 x 1.25, the attention output's copy 4, repeat_kv's k and v 2 x (2 x 0.25 + 2);
    per element of the equivalent width, SwiGLU's 10 / 18 bytes per gated element x 14,336 / 18,432."""
    from orchestrator.planner.cluster import ElementwiseBytes, eager_llama

    ew = eager_llama(4096, 1024, 14336, 18432)
    assert ew.forward_h == pytest.approx(72 + 12 + 25 + 4 + 5)
    assert ew.backward_h == pytest.approx(128 + 12 + 25 + 4 + 5)
    assert ew.forward_ffn == pytest.approx(10 * 14336 / 18432) and ew.backward_ffn == pytest.approx(18 * 14336 / 18432)
    # Without grouped KV heads there is no repeat_kv copy.
    assert eager_llama(4096, 4096, 14336, 20480).forward_h == pytest.approx(72 + 12 + 40 + 4)
    with pytest.raises(ValueError, match="model.elementwise.backward_h"):
        ElementwiseBytes(backward_h=-1.0)


def test_elementwise_bytes_are_what_the_layer_moves():
    """The layer's elementwise time is model.elementwise's bytes at HBM x elementwise_bw_eff: doubling every
    byte count doubles exactly that part of the forward and backward."""
    from orchestrator.planner.cluster import ElementwiseBytes

    base = _cfg(sp=True)
    double = dataclasses.replace(base, model=dataclasses.replace(
        base.model, elementwise=ElementwiseBytes(forward_h=44.0, backward_h=68.0, forward_ffn=8.0, backward_ffn=12.0)))
    a, b = _lc(base), _lc(double)
    per_byte = 1 / (2039e9 * 0.8)
    assert b["f_comp"] - a["f_comp"] == pytest.approx((22 * T * H / TP + 4 * T * F / TP) * per_byte, rel=1e-9)
    assert b["b_comp"] - a["b_comp"] == pytest.approx((34 * T * H / TP + 6 * T * F / TP) * per_byte, rel=1e-9)


@pytest.mark.parametrize("overlap,schedule,chunk_fwd,expected", [
    # pp 2, m 4. Interleaved v 2: 8 chunk passes, stage 0's warm-up 2(p-1) + (v-1)p = 4 of them; the other 4
    # steady-state passes send under the next pass. Sends of 1 s: 2 (8 + 1) = 18 without overlap; with it
    # 2 (4 + 1) exposed + 2 x 4 x the excess over a chunk pass's forward.
    (False, "interleaved_1f1b", 0.25, 18.0),
    (True, "interleaved_1f1b", 0.25, 2 * (5 + 4 * 0.75)),
    (True, "interleaved_1f1b", 2.0, 10.0),
    (True, "1f1b", 0.25, 2 * (4 + 1)),  # Megatron overlaps only the interleaved schedule's sends
])
def test_pipeline_sends_megatron_overlaps_hide_only_the_steady_state(overlap, schedule, chunk_fwd, expected):
    from orchestrator.planner.config import PipelineComm
    from orchestrator.planner.timing import p2p_exposed
    from trainer.knobs import PipelineConfig

    cfg = dataclasses.replace(_cfg(sp=True), pipeline=PipelineConfig(
        schedule=schedule, virtual_stages=2 if schedule == "interleaved_1f1b" else 1),
        pipeline_comm=PipelineComm(overlap_p2p=overlap))
    got = p2p_exposed(Consts.of(cfg), encode([cfg]), np.ones(1), np.full(1, chunk_fwd))
    assert got[0] == pytest.approx(expected)


# ---- op-level recompute (recompute.kind op) ----------------------------------------------------------------

LLAMA = dict(hidden_size=4096, num_heads=32, num_layers=4, vocab_size=1024, flash_attention=True,
             ffn_hidden_size=(3 * 14336 + 2 * 1024 - 2 * 4096) // 2,
             layer_gemms=((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336),
                          (14336, 4096)))


def _op_cfg(recompute: dict, tp: int = 1, sp: bool = False, **model) -> PlanConfig:
    from orchestrator.planner import apply_params
    c = _cfg(sp=sp)
    base = dataclasses.replace(c, model=ModelSpec(**{**LLAMA, **model}),
                               cluster=dataclasses.replace(c.cluster, num_gpus=2 * tp),
                               tensor_parallel=TensorParallel(size=tp, sequence_parallel=sp))
    return apply_params(base, {f"recompute.{k}": v for k, v in recompute.items()})


def test_op_recompute_reruns_every_second_gemm_and_every_elementwise_op():
    # The Llama block's order wq, wk, wv, wo, w1, w3, w2: period 2 reruns wk, wo and w3.
    none, op = _lc(_op_cfg({"kind": "none"})), _lc(_op_cfg({"kind": "op", "matmul_period": 2}))
    weights = [i * o for i, o in LLAMA["layer_gemms"]]
    frac = (weights[1] + weights[3] + weights[5]) / sum(weights)
    assert frac == pytest.approx(0.37, abs=0.005)  # the corpus note's 37% of the 8B's forward GEMM FLOPs
    cfg = _op_cfg({"kind": "none"})
    C = Consts.of(cfg)
    hbm = C.hbm_bw * C.eff.elementwise_bw_eff
    ew_f = (C.ew.forward_h * T * C.h + C.ew.forward_ffn * T * C.ffn) / hbm
    attn_f = 4.0 * T * T * C.h * 0.5 / (C.peak * C.eff.attention_eff)
    gemm = none["f_comp"] - ew_f - C.eff.op_overhead_us * 1e-6 - attn_f
    # Fused attention is kept, so nothing of it reruns.
    assert op["op_comp"] == pytest.approx(frac * gemm + ew_f + C.eff.op_overhead_us * 1e-6, rel=1e-9)
    # Period 0 keeps every GEMM: only the elementwise ops rerun; period 1 reruns every GEMM.
    keep_all = _lc(_op_cfg({"kind": "op", "matmul_period": 0}))["op_comp"]
    assert keep_all == pytest.approx(ew_f + C.eff.op_overhead_us * 1e-6, rel=1e-9)
    assert _lc(_op_cfg({"kind": "op", "matmul_period": 1}))["op_comp"] == pytest.approx(keep_all + gemm, rel=1e-9)


def test_planner_keeps_the_gemms_the_trainer_knob_keeps():
    """knobs.op_kept_gemms (vectorised over configs) is trainer.knobs.OpRecompute.recomputes_matmul's rule."""
    from orchestrator.planner.knobs import op_kept_gemms
    from trainer.knobs import OpRecompute

    periods = (0, 1, 2, 3, 5)
    cfgs = [_op_cfg({"kind": "op", "matmul_period": p}) for p in periods] + [_op_cfg({"kind": "full"})]
    C, K = Consts.of(cfgs[0]), encode(cfgs)
    expected = [[not OpRecompute(matmul_period=p).recomputes_matmul(k) for k in range(1, 8)] for p in periods]
    assert op_kept_gemms(C, K).tolist() == expected + [[True] * 7]


def test_op_recompute_prices_its_rerun_in_the_step():
    from orchestrator.planner.timing import stage_times
    cfg = _op_cfg({"kind": "op"})
    C, K = Consts.of(cfg), encode([cfg])
    st, lc = stage_times(C, K), layer_costs(C, K)
    assert np.allclose(st["rec_comp"], K.layers * lc["op_comp"][0])
    none = _op_cfg({"kind": "none"})
    assert stage_times(Consts.of(none), encode([none]))["rec_comp"].sum() == 0.0


@pytest.mark.parametrize("tp,sp", [(1, False), (8, True)])
def test_op_recompute_keeps_the_input_the_kept_gemm_outputs_and_attention(tp, sp):
    from orchestrator.planner.memory import activation_bytes
    cfg = _op_cfg({"kind": "op", "matmul_period": 2}, tp=tp, sp=sp)
    act = activation_bytes(Consts.of(cfg), encode([cfg]))
    sb, h, a = T * 1, 4096, 32
    # Kept: the layer input (split by SP), wq's h, wv's 1024, w1's 14336 and w2's h outputs (split by TP),
    # and the attention output (2 bytes) with its fp32 log-sum-exp per head.
    kept = 2 * sb * h / (tp if sp else 1) + 2 * sb * (h + 1024 + 14336 + h) / tp + 2 * sb * h / tp + 4 * a * sb / tp
    assert act["op"][0] == pytest.approx(kept, rel=1e-12)
    assert act["op"][0] < act["full"][0]


def test_layer_gemms_must_add_up_to_the_layer():
    with pytest.raises(ValueError, match=r"model\.layer_gemms: .*4h\^2 \+ 2h\*ffn"):
        ModelSpec(**{**LLAMA, "layer_gemms": ((4096, 4096),)})
    with pytest.raises(ValueError, match=r"model\.layer_gemms: .*pairs"):
        ModelSpec(**{**LLAMA, "layer_gemms": ((4096, 4096, 1),)})
    h = 1024
    assert ModelSpec(hidden_size=h, num_heads=8).gemms == ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h))
