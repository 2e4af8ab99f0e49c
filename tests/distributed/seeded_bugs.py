"""Seeded bugs for the parity gate: test-only injections, applied inside spawned ranks (``setup``).

None of them is an option a user could turn on; each patches a trainer internal in that process only.
"""

from __future__ import annotations

import os
import time

def bug_loss_not_divided_by_microbatches():
    import trainer.run as run

    orig = run.token_loss
    run.token_loss = lambda logits, target, n: orig(logits, target, target.numel())


def bug_drop_one_microbatch():
    import trainer.run as run

    orig, calls = run.token_loss, [0]

    def loss(logits, target, n):
        calls[0] += 1
        out = orig(logits, target, n)
        return out * 0 if calls[0] % 4 == 0 else out  # the last of the 4 microbatches contributes nothing
    run.token_loss = loss


def bug_skip_dp_sync_on_stage1():
    if int(os.environ["RANK"]) < 2:  # pp x dp = 2 x 2: ranks 2 and 3 hold stage 1
        return
    import trainer.parallel.grad_sync as gs

    class _Done:
        def wait(self):
            return None

    def launch(self, bucket):
        bucket.launched_at = time.perf_counter()
        self.first_launch = self.first_launch or bucket.launched_at
        bucket.work = _Done()
        bucket.buffer.mul_(self.size)  # finish() divides by dp: keep the local gradient as is
    gs.GradReducer._launch = launch


def bug_layer_on_two_stages():
    import trainer.layout as layout

    layout.layer_ranges = lambda counts: [[0, 1], [1, 2, 3]]


def bug_layer_on_no_stage():
    import trainer.layout as layout

    layout.layer_ranges = lambda counts: [[0], [2, 3]]


def bug_replicas_diverge():
    import trainer.parallel.grad_sync as gs

    orig = gs.GradReducer.finish

    def finish(self):
        # One replica throws away the reduced gradient of the last bucket (the embedding's) and keeps
        # its own: a DP wrapper that does not synchronise under the schedule.
        import torch.distributed as dist
        last = self.buckets[-1]
        local = last.buffer.clone()
        out = orig(self)
        if dist.get_rank(self.group) == 1:
            last.buffer.copy_(local)
        return out
    gs.GradReducer.finish = finish


def bug_lr_plus_one_percent():
    import trainer.run as run

    orig = run._set_lr

    def set_lr(opt, cfg, step):
        orig(opt, cfg, step)
        for g in opt.param_groups:
            g["lr"] *= 1.01
    run._set_lr = set_lr


def bug_recompute_replays_perturbed_input():
    """Full recompute whose replay in backward runs the layers on slightly different inputs: the forward (and so
    the loss at step 0) is right, every gradient through a recomputed group is wrong. Also a Ray
    ``worker_process_setup_hook`` (tests/e2e/test_faults_parity.py), so a real sweep's ranks carry it."""
    import trainer.model.gpt as model

    orig = model._maybe_checkpoint

    def maybe_checkpoint(enabled, fn, *args):
        if not (enabled and model.torch.is_grad_enabled()):
            return orig(enabled, fn, *args)
        calls = [0]

        def replayed(*xs):
            calls[0] += 1  # the first call is the forward; any later one is the recompute in backward
            return fn(*(x * (1 + 1e-2) if calls[0] > 1 and x.is_floating_point() else x for x in xs))
        return model.checkpoint(replayed, *args, use_reentrant=False)
    model._maybe_checkpoint = maybe_checkpoint


def bug_tp_row_parallel_output_not_reduced():
    """Row-parallel linears (attention and MLP output projections) hand on each rank's partial sum as if it
    were the all-reduced output: Megatron's missing reduce in RowParallelLinear."""
    from torch import nn
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    orig = RowwiseParallel._prepare_output_fn

    def prepare_output(output_layouts, use_local_output, mod, outputs, device_mesh):
        if not isinstance(mod, nn.Linear):  # the vocabulary-parallel embedding stays right
            return orig(output_layouts, use_local_output, mod, outputs, device_mesh)
        outputs = DTensor.from_local(outputs.to_local(), device_mesh, output_layouts, run_check=False)
        return outputs.to_local() if use_local_output else outputs
    RowwiseParallel._prepare_output_fn = staticmethod(prepare_output)


def bug_sp_norm_grads_not_reduced():
    """Sequence-parallel norm weights keep each rank's gradient over its own tokens (no all-reduce over TP):
    Megatron's allreduce_layernorm_grads left out."""
    import trainer.run as run
    from torch.distributed.tensor import DTensor

    orig = run.finish_grads

    def finish(params):
        for p in params:
            g = p.grad
            if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
                p.grad = DTensor.from_local(g.to_local(), g.device_mesh, p.placements, run_check=False)
        orig(params)
    run.finish_grads = finish


def bug_vocab_parallel_loss_local_softmax_normaliser():
    """Vocabulary-parallel cross-entropy whose softmax normaliser is each TP rank's own shard's sum of
    exponentials: Megatron's all-reduce of sum_exp_logits in its vocab-parallel cross-entropy left out. The
    target's logit is still found on its owning rank, so the loss looks plausible, only too small."""
    import torch
    import torch.distributed.tensor.parallel.loss as lp

    lp._log_softmax = lambda x, dim, half_to_float, mesh, mesh_dim: torch.log_softmax(x, dim)


def bug_vocab_parallel_loss_divided_by_tp():
    """A vocabulary-parallel loss normalised by the replica's tokens times tp, as if each TP rank's loss were
    a partial sum that the ranks add up; loss_parallel's loss is already the whole vocabulary's on every rank."""
    import trainer.run as run
    from torch.distributed.tensor import DTensor

    orig = run.token_loss

    def loss(logits, target, replica_tokens):
        tp = logits.device_mesh.size() if isinstance(logits, DTensor) else 1
        return orig(logits, target, replica_tokens * tp)
    run.token_loss = loss


SMALL_BUCKET_BYTES = 100_000
"""bug_bf16_small_buckets: buckets under 0.1 MB are reduced in bf16 (the tiny model's gradients are ~0.25 MB)."""


def bug_bf16_small_buckets():
    """A reducer that reduces small buckets in bf16: every replica's gradient in such a bucket is rounded to bf16
    before the all-reduce. Only with data parallelism and buckets smaller than SMALL_BUCKET_BYTES."""
    import trainer.parallel.grad_sync as gs

    orig = gs.GradReducer._launch

    def launch(self, bucket):
        if bucket.buffer.numel() * 4 < SMALL_BUCKET_BYTES:
            bucket.buffer.copy_(bucket.buffer.bfloat16().float())
        return orig(self, bucket)
    gs.GradReducer._launch = launch


def bug_loss_normaliser_wrong_for_mbs_4():
    """A loss normaliser wrong for microbatches of 4 or more sequences when a replica accumulates several of them:
    it counts one sequence too many. The whole replica batch as one microbatch (the canonical run) is right."""
    import trainer.run as run

    orig = run.token_loss

    def loss(logits, target, replica_tokens):
        if target.shape[0] >= 4 and target.numel() < replica_tokens:
            return orig(logits, target, replica_tokens + target.shape[1])
        return orig(logits, target, replica_tokens)
    run.token_loss = loss


def bug_last_bucket_not_averaged_under_overlap():
    """With overlap, the last bucket's all-reduced gradient is summed, not averaged, over the replicas."""
    import trainer.parallel.grad_sync as gs

    orig = gs.GradReducer.finish

    def finish(self):
        out = orig(self)
        if self.overlap:
            self.buckets[-1].buffer.mul_(self.size)
        return out
    gs.GradReducer.finish = finish



def bug_loss_scaled_for_large_microbatch():
    """For microbatches of >= 4 sequences the loss is scaled by 1/(n+1), n the replica's microbatch count: right for
    small microbatches, wrong for the whole batch as one microbatch (scaled by 1/2), so the bug sits in the canonical
    run itself, and a baseline with one microbatch of >= 4 per replica carries it identically. Only the canonical
    run's self-check (the same maths as microbatches of one sequence, orchestrator.parity.certify) sees it."""
    import trainer.run as run

    orig = run.token_loss

    def loss(logits, target, replica_tokens):
        out = orig(logits, target, replica_tokens)
        n = replica_tokens // target.numel()
        return out / (n + 1) if target.shape[0] >= 4 else out
    run.token_loss = loss


def bug_self_check_raises():
    """A crash keyed on the canonical run's self-check alone (one rank, microbatches of one sequence): the canonical
    run before it in the same world is fine, and the world goes on to it."""
    import trainer.run as run

    orig = run.parallelize

    def parallelize(cfg, groups, device, loss_fn):
        if cfg.world_size == 1 and cfg.batch.micro_batch_size == 1:
            raise RuntimeError("seeded: microbatches of one sequence crash on one rank")
        return orig(cfg, groups, device, loss_fn)
    run.parallelize = parallelize


_SEEN: dict = {}
"""The rank's TrainConfig, for bugs keyed on a layout (set by _remember_config's patched parallelize)."""


def _remember_config():
    import trainer.run as run

    orig = run.parallelize

    def parallelize(cfg, groups, device, loss_fn):
        _SEEN["cfg"] = cfg
        par = orig(cfg, groups, device, loss_fn)
        _SEEN["par"] = par
        return par
    run.parallelize = parallelize


def bug_interleaved_last_norm_bias_grad_zeroed():
    """Under the interleaved schedule (virtual stages > 1) the last stage's final LayerNorm bias gets no gradient:
    a chunk-bookkeeping slip that loses the one parameter only the last chunk has. Thin: that bias starts at zero
    and only moves the loss from step 1 on."""
    import trainer.run as run
    import torch

    _remember_config()
    orig = run.parallelize

    def parallelize(cfg, groups, device, loss_fn):
        par = orig(cfg, groups, device, loss_fn)
        if cfg.pipeline.virtual_stages > 1:
            for chunk in par.chunks:
                for name, p in chunk.named_parameters():
                    if name.endswith("norm_f.bias"):
                        p.register_hook(torch.zeros_like)
        return par
    run.parallelize = parallelize


def bug_selective_recompute_tp_replays_perturbed_attention():
    """Selective recompute under tensor parallelism: the core attention's replay in backward runs on q, k, v
    off by 1e-2 (a TP region's cached input that is not the forward's). The forward and the loss at step 0 are
    right; only the attention gradients are slightly wrong, so the loss moves from step 1 on."""
    import trainer.model.gpt as model

    _remember_config()
    orig = model._maybe_checkpoint

    def maybe_checkpoint(enabled, fn, *args):
        cfg = _SEEN.get("cfg")
        if not (enabled and model.torch.is_grad_enabled() and cfg is not None and cfg.tensor_parallel.size > 1
                and cfg.recompute.kind == "selective"):
            return orig(enabled, fn, *args)
        calls = [0]

        def replayed(*xs):
            calls[0] += 1
            return fn(*(x * (1 + 1e-2) if calls[0] > 1 and x.is_floating_point() else x for x in xs))
        return model.checkpoint(replayed, *args, use_reentrant=False)
    model._maybe_checkpoint = maybe_checkpoint


def bug_sp_norm_grads_averaged_under_dp():
    """Sequence parallelism with data parallelism: the norm weights' gradients are averaged over the TP group
    instead of summed (a reduction op that is right for the DP average, reused for TP). Adam nearly undoes a
    constant factor on a gradient, so what is left is thin: its epsilon and the global grad norm."""
    import trainer.run as run
    from torch.distributed.tensor import DTensor

    _remember_config()
    orig = run.finish_grads

    def finish(params):
        cfg = _SEEN.get("cfg")
        partial = [p for p in params
                   if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)]
        orig(params)
        if cfg is not None and cfg.parallel.dp > 1:
            for p in partial:
                p.grad.mul_(1.0 / cfg.tensor_parallel.size)
    run.finish_grads = finish



def bug_overlap_and_recompute():
    """Two bugs in one baseline: the last bucket summed under overlap, and full recompute replaying perturbed inputs.
    No one family set back makes such a baseline agree; the two set back together do."""
    bug_last_bucket_not_averaged_under_overlap()
    bug_recompute_replays_perturbed_input()

# (bug, layout overrides, first failing step it must be caught at, metric that catches it)
BUGS = [
    (bug_loss_not_divided_by_microbatches, {"parallel.pp": 2}, 0, "loss"),
    (bug_drop_one_microbatch, {"parallel.pp": 2}, 0, "loss"),
    (bug_layer_on_two_stages, {"parallel.pp": 2}, 0, "loss"),
    (bug_layer_on_no_stage, {"parallel.pp": 2}, 0, "loss"),
    (bug_lr_plus_one_percent, {"parallel.pp": 2}, 1, "loss"),
    (bug_replicas_diverge, {"parallel.dp": 2, "batch.micro_batch_size": 1, "data_parallel.bucket_mb": 0.01,
                           "data_parallel.overlap_grad_reduce": False}, 1, "loss"),
    (bug_skip_dp_sync_on_stage1, {"parallel.pp": 2, "parallel.dp": 2, "batch.micro_batch_size": 1}, 0, "grad_norm"),
    (bug_recompute_replays_perturbed_input, {"parallel.pp": 2, "recompute.kind": "full"}, 0, "grad_norm"),
    (bug_tp_row_parallel_output_not_reduced, {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": False},
     0, "loss"),
    (bug_sp_norm_grads_not_reduced, {"tensor_parallel.size": 2}, 0, "grad_norm"),  # 2, loss under issue 21's 1e-4
    (bug_vocab_parallel_loss_local_softmax_normaliser, {"tensor_parallel.size": 2}, 0, "loss"),
    (bug_vocab_parallel_loss_divided_by_tp, {"tensor_parallel.size": 2, "parallel.pp": 2}, 0, "loss"),
]

THIN_BUGS = [
    # (bug, layout overrides): the thinnest margins of issue 27's hand-seeded bugs, measured by bench/parity_margins.py
    (bug_interleaved_last_norm_bias_grad_zeroed, {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b",
                                                  "pipeline.virtual_stages": 2, "batch.micro_batch_size": 1}),
    (bug_selective_recompute_tp_replays_perturbed_attention, {"tensor_parallel.size": 2,
                                                              "recompute.kind": "selective"}),
    (bug_sp_norm_grads_averaged_under_dp, {"tensor_parallel.size": 2, "parallel.dp": 2}),
]
