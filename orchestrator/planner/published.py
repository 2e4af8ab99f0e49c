"""Published Megatron-LM runs on A100 clusters, as planner configs: the data the model is validated on.

Sources and what is taken from each (figures not stated there are assumptions, marked):

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Tables 3 and 5:
  22B / 175B / 530B / 1T on 8 / 64 / 280 / 512 A100-80GB, data-parallel size 1, seconds per iteration with
  full recomputation (no sequence parallelism) and with sequence parallelism + selective recomputation.
  Interleaving with 3 virtual stages for 175B and 530B (paper); 1T non-interleaved (ASSUMPTION).
* Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  Table 1 (weak scaling, interleaved schedule, full recomputation, s = 2048, V = 51,200) and Sec. 5.1
  (GPT-3 175B on 1,024 GPUs, batch 1,536, 140 TFLOP/s per GPU; 1T on 3,072 GPUs, 163 TFLOP/s, 52% of
  peak). Throughput there is eq. 3's FLOPs, 96 B s l h^2 (1 + s/6h + V/(16 l h)), per second per GPU.
  Microbatch size 1, the virtual-stage counts and TP8 x PP8 for GPT-3 on 1,024 GPUs are ASSUMPTIONS (not
  listed there); the Table 1 rows other than 175B-on-1,024 and 1T are transcribed from the paper's table (an
  image in the arXiv HTML); the 18.4B, 145.6B, 530B and 1T rows were cross-checked against a third-party
  transcription of Table 1 (same GPU counts and TFLOP/s), the 39.1B, 76.1B and 310.1B rows were not.
* Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B": 280 DGX A100
  nodes, TP8 x PP35 x DP8, batch 1,920, 60.1 s per iteration (126 TFLOP/s per GPU). Non-interleaved 1F1B,
  full recomputation and ZeRO-1 sharding are ASSUMPTIONS about DeepSpeed's configuration.

Hardware (Selene, DGX A100 80GB): 312 TFLOP/s dense BF16, 2,039 GB/s HBM, NVLink 3 at 300 GB/s per
direction, 8 x 200 Gb/s HDR InfiniBand per node (25 GB/s per GPU) - NVIDIA datasheets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cluster import ClusterSpec, Efficiency, JobSpec, ModelSpec
from trainer.knobs import (BatchConfig, FullRecompute, ParallelConfig, PipelineConfig, ReplicateDP,
                           SelectiveRecompute)

from trainer.knobs import TensorParallel

from .config import OptimizerSharding, PlanConfig


def a100_cluster(num_gpus: int) -> ClusterSpec:
    return ClusterSpec(name=f"selene-a100-{num_gpus}", num_gpus=num_gpus, gpus_per_node=8, peak_tflops=312.0,
                       hbm_gb=80.0, hbm_bw_GBps=2039.0, intra_node_bw_GBps=300.0, intra_node_latency_us=3.0,
                       inter_node_bw_GBps=25.0, inter_node_latency_us=6.0)


A100_PRIOR = Efficiency(matmul_eff=0.6, gemm_tokens_half=256.0, attention_eff=0.3, op_overhead_us=50.0,
                        tp_bw_eff=0.7, pp_bw_eff=0.7, dp_bw_eff=0.7,
                        optimizer_bw_eff=0.5, mem_reserved_gb=4.0, mem_activation_factor=1.0)
"""Starting values for the A100 fit: 2021-22 Megatron had no TP overlap and unfused attention."""


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    gpus: int
    batch: int
    virtual_stages: int
    recompute: str
    """full (no sequence parallelism) or selective (with sequence parallelism)."""
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    """Published throughput in Narayanan et al.'s eq. 3 FLOPs."""
    micro_batch: int = 1
    distributed_optimizer: bool = False

    def config(self, eff: Efficiency = A100_PRIOR) -> PlanConfig:
        dp = self.gpus // (self.tp * self.pp)
        interleaved = self.virtual_stages > 1
        return PlanConfig(
            cluster=a100_cluster(self.gpus),
            model=ModelSpec(num_layers=self.layers, hidden_size=self.hidden, num_heads=self.heads,
                            vocab_size=51200, tied_embeddings=True, flash_attention=False),
            job=JobSpec(seq_len=2048), efficiency=eff, parallel=ParallelConfig(pp=self.pp, dp=dp),
            tensor_parallel=TensorParallel(size=self.tp, sequence_parallel=self.recompute == "selective"),
            pipeline=PipelineConfig(schedule="interleaved_1f1b" if interleaved else "1f1b",
                                    virtual_stages=self.virtual_stages),
            batch=BatchConfig(global_batch=self.batch, micro_batch_size=self.micro_batch),
            recompute=SelectiveRecompute() if self.recompute == "selective" else FullRecompute("uniform", 1),
            # 50M-element buckets: 200 MB of fp32 main gradients.
            data_parallel=ReplicateDP(overlap_grad_reduce=False, bucket_mb=200.0),
            optimizer=OptimizerSharding(distributed=self.distributed_optimizer, overlap_param_gather=False),
        )

    def eq3_flops(self) -> float:
        """FLOPs per iteration as Narayanan et al. count them (eq. 3, including one recomputed forward)."""
        B, s, l, h, V = self.batch, 2048, self.layers, self.hidden, 51200
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))

    def published_tflops(self) -> float:
        if self.tflops_per_gpu is not None:
            return self.tflops_per_gpu
        return self.eq3_flops() / (self.step_time_s * self.gpus) / 1e12


K22 = "Korthikanti et al. 2022, Table 5"
N21 = "Narayanan et al. 2021, Table 1"
FIT_RUNS = (
    PublishedRun("22B full", K22, 48, 6144, 64, 8, 1, 8, 4, 1, "full", step_time_s=1.42, micro_batch=4),
    PublishedRun("22B selective+SP", K22, 48, 6144, 64, 8, 1, 8, 4, 1, "selective", step_time_s=1.10, micro_batch=4),
    PublishedRun("175B full", K22, 96, 12288, 96, 8, 8, 64, 64, 3, "full", step_time_s=18.13),
    PublishedRun("175B selective+SP", K22, 96, 12288, 96, 8, 8, 64, 64, 3, "selective", step_time_s=13.75),
    PublishedRun("530B full", K22, 105, 20480, 128, 8, 35, 280, 280, 3, "full", step_time_s=49.05),
    PublishedRun("530B selective+SP", K22, 105, 20480, 128, 8, 35, 280, 280, 3, "selective", step_time_s=37.83),
    PublishedRun("1T full", K22, 128, 25600, 160, 8, 64, 512, 512, 1, "full", step_time_s=94.42),
    PublishedRun("1T selective+SP", K22, 128, 25600, 160, 8, 64, 512, 512, 1, "selective", step_time_s=71.49),
)
"""Calibration set: the A100 efficiency parameters are fitted to these step times."""

VALIDATION_RUNS = (
    PublishedRun("18.4B on 256", N21, 40, 6144, 48, 8, 1, 256, 1024, 1, "full", tflops_per_gpu=135.0),
    PublishedRun("39.1B on 512", N21, 48, 8192, 64, 8, 2, 512, 1536, 2, "full", tflops_per_gpu=138.0),
    PublishedRun("76.1B on 1024", N21, 60, 10240, 80, 8, 4, 1024, 1792, 3, "full", tflops_per_gpu=140.0),
    PublishedRun("145.6B on 1536", N21, 80, 12288, 96, 8, 8, 1536, 2304, 2, "full", tflops_per_gpu=148.0),
    PublishedRun("GPT-3 175B on 1024", "Narayanan et al. 2021, Sec. 5.1", 96, 12288, 96, 8, 8, 1024, 1536, 3, "full",
                 tflops_per_gpu=140.0),
    PublishedRun("310.1B on 1920", N21, 96, 16384, 128, 8, 16, 1920, 2160, 3, "full", tflops_per_gpu=155.0),
    PublishedRun("529.6B on 2520", N21, 105, 20480, 128, 8, 35, 2520, 2520, 3, "full", tflops_per_gpu=163.0),
    PublishedRun("1008B on 3072", N21, 128, 25600, 160, 8, 64, 3072, 3072, 2, "full", tflops_per_gpu=163.0),
    PublishedRun("MT-NLG 530B on 2240", "Smith et al. 2022", 105, 20480, 128, 8, 35, 2240, 1920, 1, "full",
                 step_time_s=60.1, distributed_optimizer=True),
)
"""Held out: predicted with the fitted parameters, compared with the published throughput."""


def fit_records(eff: Efficiency = A100_PRIOR) -> list[dict[str, Any]]:
    """``calibrate`` records for FIT_RUNS."""
    return [{"config": run.config(eff), "step_time_s": run.step_time_s} for run in FIT_RUNS]
