"""FLOPs per token, pure functions of the config (no torch): the model FLOPs an MFU counts and the forward FLOPs
activation recompute repeats. The driver merges rank results with them without importing torch."""

from __future__ import annotations

from trainer.config import FullRecompute, ModelConfig, OpRecompute, SelectiveRecompute, TrainConfig
from trainer.layout import recompute_groups


def matmul_params(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters per layer in matmuls, head matmul parameters): the N of the 6N FLOPs rule."""
    d, f = cfg.d_model, cfg.ffn_dim
    return 4 * d * d + 2 * d * f, d * cfg.vocab_size


def model_flops_per_token(cfg: ModelConfig) -> float:
    """6N + 12 L d T per token (Kaplan et al. / PaLM appendix B): N = matmul parameters (embedding lookups
    do no matmul), the second term the attention scores and weighted sum, no causal discount."""
    per_layer, head = matmul_params(cfg)
    n = cfg.n_layers * per_layer + head
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.d_model * cfg.seq_len


def recompute_flops_per_token(cfg: TrainConfig) -> float:
    """Forward FLOPs that recompute repeats per token (hardware FLOPs minus model FLOPs)."""
    m = cfg.model
    per_layer, _ = matmul_params(m)
    attn_fwd = 4.0 * m.d_model * m.seq_len
    rc = cfg.recompute
    if isinstance(rc, FullRecompute):
        layers = sum(len(ids) for stage in cfg.stage_layers()
                     for ids, on in recompute_groups(stage, rc.method, rc.num_layers) if on)
        return layers * (2.0 * per_layer + attn_fwd)
    if isinstance(rc, SelectiveRecompute):
        per = (attn_fwd if "core_attn" in rc.modules else 0.0)
        per += 2.0 * 2 * m.d_model * m.ffn_dim if "mlp" in rc.modules else 0.0
        return m.n_layers * per
    if isinstance(rc, OpRecompute):
        return m.n_layers * 2.0 * sum(i * o for k, (i, o) in enumerate(m.layer_matmuls, 1)
                                      if rc.recomputes_matmul(k))
    return 0.0
