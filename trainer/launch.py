"""Local launcher: N ranks as processes on this machine, with torchrun's environment variables.

``spawn_many`` forms the world once and runs several configs in it one after the other, the way a warm
worker group does; each config's result (or the error it raised) comes back in order.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import tempfile
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch.multiprocessing as mp

from trainer.config import TrainConfig
from trainer.measure.result import Result, _rank_from_dict


class RankFailed(RuntimeError):
    """A rank raised or died; the message carries the first failing rank's error."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cfg_dicts: list[dict], out_dir: str,
            setup: Callable[[], None] | None, trace_dir: str | None) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from trainer.run import init_world, run

    if setup is not None:
        setup()
    cfgs = [TrainConfig.from_dict(d) for d in cfg_dicts]
    init_world(cfgs[0].run.device, max(c.run.timeout_s for c in cfgs))
    import torch.distributed as dist

    for i, cfg in enumerate(cfgs):
        path = Path(out_dir) / f"cfg{i}_rank{rank}.json"
        try:
            traces = None if trace_dir is None else Path(trace_dir) / (f"cfg{i}" if len(cfgs) > 1 else "")
            path.write_text(json.dumps({"ok": asdict(run(cfg, traces))}))
        except Exception as exc:  # recorded per config; a broken world fails the following configs too
            path.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc()}))
    dist.destroy_process_group()


def spawn_many(cfgs: list[TrainConfig], setup: Callable[[], None] | None = None,
               trace_dir: str | Path | None = None) -> list[Result | RankFailed]:
    """Run each config on one local world of ``cfgs[0].world_size`` processes (all must share it).

    Profiler traces (``run.profile_step``) go to ``trace_dir`` (``cfg<i>/`` per config when there are several).
    """
    from trainer.run import finalize

    world = cfgs[0].world_size
    if any(c.world_size != world for c in cfgs):
        raise ValueError("spawn_many: every config must have the same tensor_parallel.size x parallel.pp x parallel.dp")
    # Ranks fork from a server that imported torch and the trainer once (per launching process), instead of
    # each rank importing them afresh (~2 s of CPU per rank); the server holds no threads or process group.
    multiprocessing.set_forkserver_preload(["trainer.run"])
    with tempfile.TemporaryDirectory(prefix="steptune-") as out:
        ctx = mp.start_processes(_worker, args=(world, free_port(), [c.to_dict() for c in cfgs], out, setup,
                                                str(trace_dir) if trace_dir is not None else None),
                                 nprocs=world, join=False, start_method="forkserver")
        try:
            while not ctx.join():
                pass
        except mp.ProcessExitedException as exc:
            raise RankFailed(f"a rank died: {exc}") from exc
        except mp.ProcessRaisedException as exc:
            raise RankFailed(str(exc)) from exc
        results: list[Result | RankFailed] = []
        for i, cfg in enumerate(cfgs):
            per_rank = [json.loads((Path(out) / f"cfg{i}_rank{r}.json").read_text()) for r in range(world)]
            errors = [f"rank {r}: {p['error']}" for r, p in enumerate(per_rank) if "error" in p]
            if errors:
                results.append(RankFailed("; ".join(errors)))
            else:
                results.append(finalize(cfg, [_rank_from_dict(p["ok"]) for p in per_rank]))
        return results


def spawn(cfg: TrainConfig, setup: Callable[[], None] | None = None, trace_dir: str | Path | None = None) -> Result:
    (result,) = spawn_many([cfg], setup, trace_dir)
    if isinstance(result, RankFailed):
        raise result
    return result
