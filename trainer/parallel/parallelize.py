"""Apply the layout to the model: tensor parallelism, recompute, data-parallel wrapping, pipeline stages.

The order is torchtitan's: TP first (it replaces parameters with DTensor shards), then activation
checkpointing (which must see the TP hooks it reruns), then FSDP2 or the bucketed reducer (which work on
whatever parameters exist by then), and the pipeline stages last, around the finished chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.config import (FsdpDP, FullRecompute, OpRecompute, ReplicateDP, SelectiveRecompute, TorchDDP,
                            TrainConfig)
from trainer.parallel.grad_sync import GradReducer
from trainer.layout import recompute_groups, stage_ids_for_rank
from trainer.model.gpt import GPT
from trainer.parallel.tensor_parallel import apply_tp, compile_for_async_tp


@dataclass
class Groups:
    """This rank's place in the pp x dp x tp mesh (rank = (pp_rank x dp + dp_rank) x tp + tp_rank) and its groups."""
    pp_rank: int
    dp_rank: int
    pp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None
    tp_rank: int = 0
    tp_group: dist.ProcessGroup | None = None
    mesh: DeviceMesh | None = None
    """The one DeviceMesh, dims ``trainer.layout.MESH_DIMS``; sub-meshes are slices of it."""

    @property
    def coords(self) -> dict[str, int]:
        """Coordinates along the dimensions parameters may be replicated over."""
        return {"dp": self.dp_rank, "tp": self.tp_rank}


@dataclass
class Parallelized:
    chunks: list[nn.Module]
    """Model chunks on this rank (wrapped as the data-parallel mode requires), in stage order."""
    stage_ids: list[int]
    reducer: GradReducer | None
    schedule: object | None
    """A torch.distributed.pipelining schedule when parallel.pp > 1."""
    stages: list[object]


def build_chunks(cfg: TrainConfig, pp_rank: int, device: torch.device) -> tuple[list[GPT], list[int]]:
    """The model chunks a pipeline rank holds, each initialised exactly as in the single-process model."""
    stage_layers = cfg.stage_layers()
    last = cfg.n_stages - 1
    ids = stage_ids_for_rank(pp_rank, cfg.parallel.pp, cfg.pipeline.virtual_stages)
    chunks = []
    for sid in ids:
        chunk = GPT(cfg.model, stage_layers[sid], has_embedding=sid == 0, has_head=sid == last)
        chunk.init_weights(cfg.run.seed)
        chunks.append(chunk.to(device))
    return chunks, ids


def apply_recompute(chunk: GPT, cfg: TrainConfig) -> None:
    rc = cfg.recompute
    if isinstance(rc, FullRecompute):
        chunk.set_full_recompute(recompute_groups([int(k) for k in chunk.layers], rc.method, rc.num_layers))
    elif isinstance(rc, SelectiveRecompute):
        for block in chunk.layers.values():
            block.set_selective_recompute(rc.modules)
    elif isinstance(rc, OpRecompute):
        for block in chunk.layers.values():
            block.set_op_recompute(rc)


def apply_fsdp(chunk: GPT, mesh: DeviceMesh, dp_cfg: FsdpDP) -> None:
    """FSDP2 over the mesh's dp dimension; TP-sharded parameters become 2-D (dp, tp) shards."""
    from torch.distributed.fsdp import fully_shard

    mesh = mesh["dp"]
    blocks = list(chunk.layers.values())
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=dp_cfg.reshard_after_forward)
    fully_shard(chunk, mesh=mesh, reshard_after_forward=dp_cfg.reshard_after_forward)
    if dp_cfg.prefetch:
        for i, block in enumerate(blocks):
            ahead = blocks[i + 1:i + 1 + dp_cfg.prefetch]
            behind = blocks[max(0, i - dp_cfg.prefetch):i][::-1]
            if ahead:
                block.set_modules_to_forward_prefetch(ahead)
            if behind:
                block.set_modules_to_backward_prefetch(behind)


def parallelize(cfg: TrainConfig, groups: Groups, device: torch.device, loss_fn) -> Parallelized:
    chunks, stage_ids = build_chunks(cfg, groups.pp_rank, device)
    if cfg.tensor_parallel.size > 1:
        for chunk in chunks:
            apply_tp(chunk, groups.mesh["tp"], cfg.tensor_parallel.sequence_parallel)
    for chunk in chunks:
        apply_recompute(chunk, cfg)
    if cfg.tensor_parallel.size > 1 and cfg.tensor_parallel.comm_overlap:
        # After recompute (the checkpoint wrappers it sets are traced into the graphs), before FSDP: torchtitan's order.
        for chunk in chunks:
            compile_for_async_tp(chunk, groups.mesh["tp"])

    dpc, reducer = cfg.data_parallel, None
    if cfg.parallel.dp > 1:
        if isinstance(dpc, ReplicateDP):
            reducer = GradReducer(chunks, groups.dp_group, bucket_bytes=int(dpc.bucket_mb * 1e6),
                                  overlap=dpc.overlap_grad_reduce, n_microbatches=cfg.n_microbatches, device=device)
        elif isinstance(dpc, FsdpDP):
            for chunk in chunks:
                apply_fsdp(chunk, groups.mesh, dpc)
        elif isinstance(dpc, TorchDDP):
            from torch.nn.parallel import DistributedDataParallel

            # bucket_mb is MB (10^6 bytes) like every bucket knob; torch's bucket_cap_mb counts MiB.
            chunks = [DistributedDataParallel(chunks[0], process_group=groups.dp_group,
                                              bucket_cap_mb=dpc.bucket_mb * 1e6 / 2**20,
                                              device_ids=[device.index] if device.type == "cuda" else None)]

    schedule, stages = None, []
    if cfg.parallel.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        stages = [PipelineStage(chunk, sid, cfg.n_stages, device, group=groups.pp_group)
                  for chunk, sid in zip(chunks, stage_ids)]
        n_micro = cfg.n_microbatches
        # Losses are normalised by the replica's token count in loss_fn; no extra scaling by the schedule.
        if cfg.pipeline.schedule == "interleaved_1f1b":
            schedule = ScheduleInterleaved1F1B(stages, n_micro, loss_fn=loss_fn, scale_grads=False)
        elif cfg.pipeline.schedule == "gpipe":
            schedule = ScheduleGPipe(stages[0], n_micro, loss_fn=loss_fn, scale_grads=False)
        else:
            schedule = Schedule1F1B(stages[0], n_micro, loss_fn=loss_fn, scale_grads=False)
    return Parallelized(chunks, stage_ids, reducer, schedule, stages)
