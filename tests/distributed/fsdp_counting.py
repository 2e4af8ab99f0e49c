"""Count FSDP2's collectives per step inside spawned ranks (``setup`` for ``trainer.launch.spawn_many``).

Test-only instrumentation, applied in each rank's process: every ``dist.all_gather_single`` and
``dist.reduce_scatter_single`` (the calls FSDP2's default all-gather and reduce-scatter make, torch 2.13) is
recorded with the FSDP parameter group that issued it and, for a gather, the pass it was issued for
(FORWARD or PRE_BACKWARD, prefetches included); ``opt.step`` marks the end of a step and each config's
``parallelize`` its start. The records are written to ``<out_dir>/rank<R>.json`` when the rank tears its
process group down.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def count_collectives(out_dir: str) -> None:
    import torch.distributed as dist
    import torch.optim.optimizer as optimizer
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    import trainer.run as run

    events: list[list[str]] = []
    issuer: list[tuple[str, str]] = []

    def labelled(method):
        def wrapper(self, *a, **k):
            issuer.append((self._module_fqn or "root", self._training_state.name))
            try:
                return method(self, *a, **k)
            finally:
                issuer.pop()
        return wrapper

    def counted(kind, fn):
        def wrapper(*a, **k):
            group, phase = issuer[-1] if issuer else ("?", "?")
            events.append([kind, group, phase])
            return fn(*a, **k)
        return wrapper

    FSDPParamGroup.unshard = labelled(FSDPParamGroup.unshard)
    FSDPParamGroup.post_backward = labelled(FSDPParamGroup.post_backward)
    dist.all_gather_single = counted("all_gather", dist.all_gather_single)
    dist.reduce_scatter_single = counted("reduce_scatter", dist.reduce_scatter_single)
    optimizer.register_optimizer_step_post_hook(lambda *a: events.append(["step", "", ""]))
    parallelize = run.parallelize
    run.parallelize = lambda *a, **k: (events.append(["config", "", ""]), parallelize(*a, **k))[1]
    destroy = dist.destroy_process_group

    def dump(*a, **k):
        Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps(events))
        return destroy(*a, **k)
    dist.destroy_process_group = dump


def per_step(out_dir: str | Path, rank: int) -> list[list[dict[tuple[str, str, str], int]]]:
    """Per config, per step: {(kind, group, phase): count} of one rank; kind all_gather or reduce_scatter,
    group the FSDP group's module name ("root" for the chunk's own), phase FORWARD/PRE_BACKWARD for a gather."""
    configs: list[list[dict]] = []
    step: dict = {}
    for kind, group, phase in json.loads(Path(out_dir, f"rank{rank}.json").read_text()):
        if kind == "config":
            configs.append([])
            step = {}
        elif kind == "step":
            configs[-1].append(step)
            step = {}
        else:
            key = (kind, group, phase if kind == "all_gather" else "")
            step[key] = step.get(key, 0) + 1
    return configs
