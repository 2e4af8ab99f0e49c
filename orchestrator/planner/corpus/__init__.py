"""The validation corpus (corpus.yaml) as planner configs, and each row's published figure as a step time.

A row's published figure is turned into seconds per iteration on the row's own FLOP basis, so every
comparison is in step time: TFLOP/s per GPU on Narayanan et al.'s eq. 3, or on 6N + 12 L h s per token for
Meta's figures (an ASSUMPTION stated in corpus.yaml), and published step times as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..cluster import Efficiency, eager_llama
from ..config import PlanConfig
from ..parse import plan_config_from_dict

HERE = Path(__file__).resolve().parent
CLUSTERS = HERE.parents[2] / "search_spaces" / "clusters"
GENERATIONS = ("a100-80gb", "h100-sxm", "h200", "b200")


@dataclass(frozen=True)
class Row:
    """One published run."""

    id: str
    source: str
    gpu: str
    split: str
    """fit, heldout or not_modelled, as corpus.yaml declares."""
    raw: Mapping[str, Any]
    published_step_s: float
    """The published figure as seconds per iteration (see the module docstring)."""
    figure: str
    """The figure as published, e.g. 'tflops_eq3 = 137'."""

    def config(self, eff: Efficiency) -> PlanConfig:
        return plan_config_from_dict(row_planner_dict(self.raw, eff), where=f"corpus row {self.id}")


def cluster_dict(gpu: str) -> dict[str, Any]:
    """The ``cluster:`` section of search_spaces/clusters/<gpu>.yaml."""
    path = CLUSTERS / f"{gpu}.yaml"
    if not path.is_file():
        raise ValueError(f"gpu: no cluster file {path}; known: {', '.join(GENERATIONS)}")
    return dict(yaml.safe_load(path.read_text())["cluster"])


def equivalent_ffn(r: Mapping[str, Any]) -> int:
    """Two-matrix MLP width with the GEMM FLOPs and parameters of GQA attention + the row's MLP: a gated
    (SwiGLU) one of width ``gated_ffn``, or a two-matrix one (e.g. squared ReLU) of width ``ffn``."""
    h, heads = r["hidden"], r["heads"]
    if "gated_ffn" in r and "ffn" in r:
        raise ValueError(f"corpus row {r['id']}: give gated_ffn or ffn, not both")
    if "gated_ffn" not in r and "ffn" not in r:
        return 0
    kv = r.get("kv_heads", heads) * (h // heads)
    num = 3 * r["gated_ffn"] + 2 * kv - 2 * h if "gated_ffn" in r else 2 * r["ffn"] + 2 * kv - 2 * h
    if num % 2:
        raise ValueError(f"corpus row {r['id']}: the MLP width gives a non-integer equivalent width")
    return num // 2


MCORE_BUCKET = "mcore_default"
"""A row's ``bucket_params`` when its run left Megatron-Core DDP's bucket size unset (NeMo's
mcore_distributed_optim without ddp_bucket_size): max(40M, 1M x dp) parameters, "larger DP sizes need larger
buckets to ensure collectives do not become latency-bound" (megatron/core/distributed)."""


def bucket_params(r: Mapping[str, Any], dp: int) -> float:
    """Gradient bucket size in parameters: the row's ``bucket_params``, Megatron-Core's dp-scaled default
    (``MCORE_BUCKET``), or 40M (Megatron's fixed default before it scaled with dp)."""
    b = r.get("bucket_params", 40_000_000)
    if b == MCORE_BUCKET:
        return float(max(40_000_000, 1_000_000 * dp))
    if not isinstance(b, (int, float)) or isinstance(b, bool) or b <= 0:
        raise ValueError(f"corpus row {r['id']}: bucket_params must be a positive count or {MCORE_BUCKET!r}")
    return float(b)


def row_planner_dict(r: Mapping[str, Any], eff: Efficiency) -> dict[str, Any]:
    import dataclasses
    tp, pp, gpus = r["tp"], r["pp"], r["gpus"]
    if gpus % (tp * pp):
        raise ValueError(f"corpus row {r['id']}: gpus {gpus} is not a multiple of tp * pp")
    rc = r.get("recompute", "full")
    recompute = rc if isinstance(rc, Mapping) else (
        {"kind": "full", "method": "uniform", "num_layers": 1} if rc == "full" else {"kind": rc})
    sel = recompute.get("kind") == "selective"
    vp = r.get("vp", 1)
    pipeline: dict[str, Any] = {"schedule": "interleaved_1f1b" if vp > 1 else "1f1b", "virtual_stages": vp}
    if "split" in r:
        # `split: {layers: [...]}` lists every model chunk (pipeline order); `{first, last}` sets the end chunks.
        kind = "explicit" if "layers" in r["split"] else "first_last"
        pipeline["split"] = {"kind": kind, **r["split"]}
    model = {"num_layers": r["layers"], "hidden_size": r["hidden"], "num_heads": r["heads"],
             "ffn_hidden_size": equivalent_ffn(r), "vocab_size": r["vocab"], "tied_embeddings": r["tied"],
             "flash_attention": r["flash"], "linear_biases": r["biases"]}
    if "gated_ffn" in r:  # a Llama block: separate q, k, v, o, then SwiGLU's w1, w3 and w2 (op recompute reads the order)
        h, g = r["hidden"], r["gated_ffn"]
        kv = r.get("kv_heads", r["heads"]) * (h // r["heads"])
        model["layer_gemms"] = [[h, h], [h, kv], [h, kv], [h, h], [h, g], [h, g], [g, h]]
    kernels = r.get("kernels", "fused")
    if kernels == "eager":  # torchtitan without torch.compile: one kernel per elementwise op
        if "gated_ffn" not in r:
            raise ValueError(f"corpus row {r['id']}: kernels eager is counted for a Llama block (gated_ffn)")
        kv_width = r.get("kv_heads", r["heads"]) * (r["hidden"] // r["heads"])
        model["elementwise"] = dataclasses.asdict(
            eager_llama(r["hidden"], kv_width, r["gated_ffn"], model["ffn_hidden_size"]))
    elif kernels != "fused":
        raise ValueError(f"corpus row {r['id']}: kernels must be fused or eager, got {kernels!r}")
    return {
        "cluster": {**cluster_dict(r["gpu"]), "num_gpus": gpus},
        "model": model,
        "job": {"seq_len": r["seq"], "precision": r.get("precision", "mixed")},
        "efficiency": dataclasses.asdict(eff),
        "parallel": {"pp": pp, "dp": gpus // (tp * pp)},
        # Rows may state sequence_parallel and tp_comm_overlap (Megatron --tp-comm-overlap); unstated: SP with
        # selective recompute only (Korthikanti et al.'s pairing), no TP overlap.
        "tensor_parallel": {"size": tp, "sequence_parallel": r.get("sequence_parallel", sel) and tp > 1,
                            "comm_overlap": r.get("tp_comm_overlap", False)},
        "batch": {"global_batch": r["gbs"], "micro_batch_size": r["mbs"]},
        "pipeline": pipeline,
        "recompute": recompute,
        # Megatron's default bucket: 40M parameters, in MB of gradients in their reduction dtype (trainer.knobs unit);
        # a row that states `fsdp:` (reshard_after_forward, prefetch) ran FSDP2 instead.
        "data_parallel": {"kind": "fsdp", **r["fsdp"]} if "fsdp" in r else {
            "kind": "replicate", "overlap_grad_reduce": r.get("overlap_grad", False),
            "bucket_mb": bucket_params(r, gpus // (tp * pp)) * (2 if r.get("grad_dtype") == "bf16" else 4) / 1e6},
        # Megatron's overlap_p2p_comm where the source states it (a 2021-22 run had none).
        "pipeline_comm": {"overlap_p2p": r.get("overlap_p2p", False)},
        "optimizer": {"distributed": r.get("dist_opt", False),
                      "overlap_param_gather": r.get("overlap_param", False),
                      "grad_reduce_dtype": r.get("grad_dtype", "fp32")},
    }


def eq3_flops(r: Mapping[str, Any]) -> float:
    """Narayanan et al. 2021 eq. 3: 96 B s l h^2 (1 + s/6h + V/(16 l h)), one recomputed forward included."""
    B, s, l, h, V = r["gbs"], r["seq"], r["layers"], r["hidden"], r["vocab"]
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def model_flops_6n(r: Mapping[str, Any], params: float) -> float:
    """6 N per token plus attention scores 12 L h s per token (the usual MFU count, no recompute)."""
    tokens = r["gbs"] * r["seq"]
    return tokens * (6.0 * params + 12.0 * r["layers"] * r["hidden"] * r["seq"])


def load(path: Path = HERE / "corpus.yaml") -> list[Row]:
    data = yaml.safe_load(path.read_text())
    split = {i: k for k in ("fit", "heldout", "not_modelled") for i in data["split"][k]}
    rows = []
    for r in data["rows"]:
        if r["id"] not in split:
            raise ValueError(f"corpus row {r['id']}: not in split.fit, split.heldout or split.not_modelled")
        if r["source"] not in data["sources"]:
            raise ValueError(f"corpus row {r['id']}: source {r['source']} is not under sources")
        (kind, value), = r["figure"].items()
        if kind == "step_time_s":
            step = float(value)
        elif kind == "tflops_eq3":
            step = eq3_flops(r) / (value * 1e12 * r["gpus"])
        elif kind == "tflops_meta":
            params = row_params(r)
            step = model_flops_6n(r, params) / (value * 1e12 * r["gpus"])
        else:
            raise ValueError(f"corpus row {r['id']}: figure {kind}: unknown; known: step_time_s, tflops_eq3, tflops_meta")
        rows.append(Row(r["id"], r["source"], r["gpu"], split[r["id"]], r, step, f"{kind} = {value}"))
    return rows


def row_params(r: Mapping[str, Any]) -> float:
    """Total parameters of the row's model (the planner's count)."""
    return float(Row(r["id"], r["source"], r["gpu"], "", r, 0.0, "").config(Efficiency()).model.total_params)


def sources(path: Path = HERE / "corpus.yaml") -> dict[str, str]:
    return dict(yaml.safe_load(path.read_text())["sources"])
