"""A GPT decoder (pre-norm, causal SDPA attention, GELU MLP), single-device.

The model may hold any contiguous run of layers, with or without the embedding and the head: that is
what a pipeline stage is, and it is built the same way the whole model is. Parameter names are the
whole model's (``layers.7.mlp.fc.weight`` stays ``layers.7...`` on any stage) and each parameter's
initial value depends only on the seed and that name, so a stage holds exactly the tensors the
single-process model has for its layers, whatever the layout.
"""

from __future__ import annotations

import math
import zlib
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.config import ModelConfig, OpRecompute
from trainer.model.op_checkpoint import op_checkpoint


def _maybe_checkpoint(enabled: bool, fn: Callable, *args: torch.Tensor) -> torch.Tensor:
    if enabled and torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.recompute_core = False

    @staticmethod
    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # Heads are counted from the projection's output width, not the config: a tensor-parallel rank's qkv
        # yields only its own heads (q, k, v of each, in that order), and the same code runs them.
        q, k, v = self.qkv(x).view(b, t, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        y = _maybe_checkpoint(self.recompute_core, self.core, q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.recompute_modules: frozenset[str] = frozenset()
        """Selective recompute: sub-modules whose activations are dropped and recomputed in backward."""
        self.op_recompute: OpRecompute | None = None
        """Op-level recompute (trainer.model.op_checkpoint): the matmuls it names and all non-kept ops; None: off."""

    def set_selective_recompute(self, modules: Iterable[str]) -> None:
        self.recompute_modules = frozenset(modules)
        self.attn.recompute_core = "core_attn" in self.recompute_modules

    def set_op_recompute(self, rc: OpRecompute) -> None:
        self.op_recompute = rc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op_recompute is not None and torch.is_grad_enabled():
            return op_checkpoint(self._forward, x, self.op_recompute)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = "norm" in self.recompute_modules
        x = x + self.attn(_maybe_checkpoint(norm, self.norm1, x))
        h = _maybe_checkpoint(norm, self.norm2, x)
        return x + _maybe_checkpoint("mlp" in self.recompute_modules, self.mlp, h)


class GPT(nn.Module):
    """Layers ``layer_ids`` of the GPT; the embedding and/or head when asked (the whole model by default)."""

    def __init__(self, cfg: ModelConfig, layer_ids: Sequence[int] | None = None,
                 has_embedding: bool = True, has_head: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        ids = list(range(cfg.n_layers)) if layer_ids is None else list(layer_ids)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model) if has_embedding else None
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if has_embedding else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in ids})
        self.norm_f = nn.LayerNorm(cfg.d_model) if has_head else None
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False) if has_head else None
        # Full recompute plan: (layer keys, recomputed?) groups in order; one group per layer by default.
        self.layer_groups: list[tuple[list[str], bool]] = [([k], False) for k in self.layers]

    def set_full_recompute(self, groups: list[tuple[list[int], bool]]) -> None:
        self.layer_groups = [([str(i) for i in ids], on) for ids, on in groups]

    def _run_group(self, keys: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(h: torch.Tensor) -> torch.Tensor:
            for k in keys:
                h = self.layers[k](h)
            return h
        return run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [b, t] (with the embedding) or hidden states [b, t, d]; logits [b, t, vocab] with the head."""
        if self.tok_emb is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            h = self.tok_emb(x) + self.pos_emb(pos)
        else:
            h = x
        for keys, recompute in self.layer_groups:
            h = _maybe_checkpoint(recompute, self._run_group(keys), h)
        if self.lm_head is not None:
            h = self.lm_head(self.norm_f(h))
        return h

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Initialise each parameter from (seed, its name) alone: layout-independent by construction."""
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.startswith("norm_f.weight"):
                p.fill_(1.0)
                continue
            if name.endswith(".bias"):
                p.zero_()
                continue
            std = resid_std if name.endswith("proj.weight") else 0.02
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std))

