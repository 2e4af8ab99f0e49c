"""Shared helpers for the multi-process tests (real gloo ranks on CPU)."""

from __future__ import annotations

from trainer.config import TrainConfig, apply_overrides

TINY = {
    "model": {"vocab_size": 128, "n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 32},
    "batch": {"global_batch": 8, "micro_batch_size": 2},
    "data_parallel": {"kind": "replicate", "bucket_mb": 0.02},
    "run": {"steps": 6, "warmup_steps": 1},
}


def tiny(**overrides) -> TrainConfig:
    """The tiny test model with flat dotted overrides (``parallel__pp=2`` style keys use '.' via dict)."""
    return TrainConfig.from_dict(apply_overrides(TINY, overrides))


def cfg(over: dict) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(TINY, over))


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)
