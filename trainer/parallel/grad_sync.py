"""Bucketed data-parallel gradient all-reduce, overlapped with backward or run after it.

Megatron-style: gradients live in flat per-bucket buffers (``param.grad`` are views into them; a
tensor-parallel parameter's view is of its local shard, reduced over the dp group only), buckets
follow the reverse order of the layers (the order backward produces gradients) and a bucket is all-reduced
once every parameter in it has received its last microbatch's gradient. With overlap that launch happens
from the gradient hook, under the backward still running; without it, all buckets go after the pipeline
step. Unlike torch DDP this does not depend on the autograd graph of one forward, so it stays correct
under any pipeline schedule.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


class _Bucket:
    def __init__(self, params: list[nn.Parameter], device: torch.device) -> None:
        self.params = params
        self.slices: dict[int, tuple[int, int]] = {}
        offset = 0
        for p in params:
            n = _local(p).numel()
            self.slices[id(p)] = (offset, n)
            offset += n
        self.buffer = torch.zeros(offset, dtype=torch.float32, device=device)
        self.pending = len(params)
        self.work: dist.Work | None = None
        self.launched_at: float | None = None
        self.zero()

    def zero(self) -> None:
        self.buffer.zero_()
        for p in self.params:
            # Plain parameters accumulate straight into the bucket. A DTensor (tensor-parallel) parameter's
            # gradient is autograd's own until its last microbatch (its placement may be Partial, which only
            # autograd knows); then its local shard moves into the bucket (``take``).
            p.grad = None if isinstance(p, DTensor) else self._slice(p)

    def _slice(self, p: torch.Tensor) -> torch.Tensor:
        offset, n = self.slices[id(p)]
        return self.buffer[offset:offset + n].view(_local(p).shape)

    def take(self, p: torch.Tensor) -> None:
        """Move a DTensor parameter's final local gradient into the bucket, keeping its placements."""
        if isinstance(p, DTensor) and p.grad is not None:
            g = p.grad
            if g.placements != p.placements and not any(pl.is_partial() for pl in g.placements):
                # A replicated gradient of a sharded parameter (the vocabulary-parallel embedding's): keep
                # this rank's rows, no communication. A Partial one stays partial for finish_grads.
                g = g.redistribute(placements=p.placements)
            view = self._slice(p)
            view.copy_(g.to_local())
            p.grad = DTensor.from_local(view, g.device_mesh, g.placements, run_check=False)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class GradReducer:
    def __init__(self, modules: list[nn.Module], group: dist.ProcessGroup, *, bucket_bytes: int, overlap: bool,
                 n_microbatches: int, device: torch.device) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.overlap = overlap
        self.n_micro = n_microbatches
        # Later layers finish backward first: bucket parameters in reverse registration order.
        params = [p for m in modules for p in m.parameters() if p.requires_grad][::-1]
        self.buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        size = 0
        for p in params:
            current.append(p)
            size += _local(p).numel() * 4
            if size >= bucket_bytes:
                self.buckets.append(_Bucket(current, device))
                current, size = [], 0
        if current:
            self.buckets.append(_Bucket(current, device))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._count = {id(p): 0 for p in params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]
        self.first_launch: float | None = None

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.zero()
            b.pending = len(b.params)
            b.work, b.launched_at = None, None
        for k in self._count:
            self._count[k] = 0
        self.first_launch = None

    def _on_grad(self, p: torch.Tensor) -> None:
        self._count[id(p)] += 1
        if self._count[id(p)] != self.n_micro:
            return
        bucket = self._bucket_of[id(p)]
        bucket.take(p)
        bucket.pending -= 1
        if self.overlap and bucket.pending == 0:
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.launched_at = time.perf_counter()
        if self.first_launch is None:
            self.first_launch = bucket.launched_at
        bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)

    def finish(self) -> list[tuple[float, float]]:
        """Launch what is left, wait for every bucket, average. Returns (launch, done) times per bucket."""
        for b in self.buckets:
            if b.work is None:
                self._launch(b)
        times = []
        for b in self.buckets:
            b.work.wait()
            times.append((b.launched_at, time.perf_counter()))
        for b in self.buckets:
            b.buffer.div_(self.size)
        return times

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
