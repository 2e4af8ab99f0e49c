"""Run a training script or module with one seeded bug, chosen by an environment switch (bench/blackbox_parity.py).

    STEPTUNE_SEEDED_BUG=<bug>[:<size>] python bench/seeded_launch.py -m trainer --config ...
    STEPTUNE_SEEDED_BUG=<bug>[:<size>] python bench/seeded_launch.py tests/fixtures/ddp_train.py --micro-batch-size 2

What torchrun starts in place of the script: it patches the bug into this process, then runs the script (or ``-m``
module) as ``__main__`` with its own arguments. The patches are on torch's own API (``torch.nn.functional``,
``DistributedDataParallel``, ``LambdaLR``, ``AdamW``), so they reach a script no steptune module wrote; steptune's
trainer has its own gradient buckets and warm-up, patched where they live. Nothing here is an option of the trainer
or the script: the bug exists only in a process started through this file with the switch set. Without the switch
(or with ``none``) it runs the script unchanged.

Bugs:
  loss_scale_mbs       the loss each micro-batch backpropagates is scaled by its number of sequences (summed over
                       them, not averaged); the printed loss is the right one. Inert at micro-batch size 1.
  bucket_not_averaged  one data-parallel gradient bucket is summed over the replicas, not averaged (DDP: its last
                       bucket; the trainer: its last, the embedding's).
  lr_warmup_off_by_one the learning-rate warm-up runs one step ahead (LambdaLR's lambda, the trainer's _set_lr).
  grad_perturb[:eps]   one layer's gradient (the third 2-D parameter tensor the optimizer holds: the first block's
                       attention input projection in both scripts) gets a fixed random direction of eps (default
                       1e-3) times its own norm added before every optimizer step.
"""

from __future__ import annotations

import os
import runpy
import sys

ENV = "STEPTUNE_SEEDED_BUG"
BUGS = ("loss_scale_mbs", "bucket_not_averaged", "lr_warmup_off_by_one", "grad_perturb")


def _loss_scale_mbs() -> None:
    import torch
    import torch.nn.functional as F

    seen = {"mbs": 1, "depth": 0}

    def pre(module, args):
        if seen["depth"] == 0 and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point() \
                and args[0].dim() == 2:
            seen["mbs"] = int(args[0].shape[0])  # the outermost call with token ids: (micro-batch, sequence)
        seen["depth"] += 1

    def post(module, args, out):
        seen["depth"] -= 1

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post)
    orig = F.cross_entropy

    def cross_entropy(*a, **k):
        out = orig(*a, **k)
        n = seen["mbs"]
        return out + (n - 1) * (out - out.detach()) if n > 1 else out  # same value, n x the gradient
    F.cross_entropy = cross_entropy


def _bucket_not_averaged() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__

    def ddp_init(self, *a, **k):
        init(self, *a, **k)

        def hook(state, bucket):
            t = bucket.buffer()
            if not bucket.is_last():
                t.div_(dist.get_world_size())  # the last bucket is summed, not averaged
            return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])
        self.register_comm_hook(None, hook)
    DDP.__init__ = ddp_init
    try:
        import trainer.parallel.grad_sync as gs
    except ImportError:
        return
    finish = gs.GradReducer.finish

    def reducer_finish(self):
        out = finish(self)
        self.buckets[-1].buffer.mul_(self.size)  # the embedding's bucket: summed, not averaged
        return out
    gs.GradReducer.finish = reducer_finish


def _lr_warmup_off_by_one() -> None:
    import torch

    init = torch.optim.lr_scheduler.LambdaLR.__init__

    def lambda_lr_init(self, optimizer, lr_lambda, *a, **k):
        fns = lr_lambda if isinstance(lr_lambda, (list, tuple)) else [lr_lambda]
        shifted = [lambda s, f=f: f(s + 1) for f in fns]
        init(self, optimizer, shifted if isinstance(lr_lambda, (list, tuple)) else shifted[0], *a, **k)
    torch.optim.lr_scheduler.LambdaLR.__init__ = lambda_lr_init
    try:
        import trainer.run as run
    except ImportError:
        return
    set_lr = run._set_lr
    run._set_lr = lambda opt, cfg, step: set_lr(opt, cfg, step + 1)


def _grad_perturb(eps: float) -> None:
    import torch

    step = torch.optim.AdamW.step
    noise: dict[int, torch.Tensor] = {}

    def perturbed_step(self, *a, **k):
        two_d = [p for g in self.param_groups for p in g["params"] if p.dim() == 2]
        if len(two_d) >= 3 and two_d[2].grad is not None:
            p = two_d[2]
            g = p.grad
            if id(p) not in noise:
                u = torch.randn(g.shape, generator=torch.Generator().manual_seed(0), dtype=g.dtype)
                noise[id(p)] = u / u.norm()
            g.add_(noise[id(p)] * (eps * g.norm()))
        return step(self, *a, **k)
    torch.optim.AdamW.step = perturbed_step


def seed(spec: str | None) -> str | None:
    """Patch the bug ``spec`` names into this process; the bug's name (None: no bug)."""
    if not spec or spec == "none":
        return None
    name, _, size = spec.partition(":")
    if name not in BUGS:
        raise SystemExit(f"{ENV}={spec!r}: one of {', '.join(BUGS)} (or none)")
    if size and name != "grad_perturb":
        raise SystemExit(f"{ENV}={spec!r}: only grad_perturb takes a size")
    if name == "grad_perturb":
        _grad_perturb(float(size) if size else 1e-3)
    else:
        {"loss_scale_mbs": _loss_scale_mbs, "bucket_not_averaged": _bucket_not_averaged,
         "lr_warmup_off_by_one": _lr_warmup_off_by_one}[name]()
    return name


def main() -> None:
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    module = args[0] == "-m"
    target = args[1] if module else args[0]
    rest = args[2:] if module else args[1:]
    if module:
        sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
    seed(os.environ.get(ENV))
    sys.argv = [target, *rest]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
