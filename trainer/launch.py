"""Local launcher: N ranks as processes on this machine, with torchrun's environment variables.

``spawn_many`` forms the world once and runs several configs in it one after the other, the way a warm
worker group does; each config's result (or the error it raised) comes back in order. ``run_here`` does the same
for one-rank configs in the calling process itself.
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
from unittest import mock

from trainer.config import TrainConfig
from trainer.measure.result import Result, _rank_from_dict, finalize


class RankFailed(RuntimeError):
    """A rank raised or died; the message carries the first failing rank's error."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_in_world(cfgs: list[TrainConfig], trace_dir: str | None = None) -> list[dict]:
    """Join the world torchrun's variables describe, run each config in it one after the other, and leave it.

    Per config: ``{"ok": <its RankResult as a dict>}`` or ``{"error": ..., "traceback": ...}`` (the world goes on
    to the next config; a broken world fails the following ones too).
    """
    from trainer.run import init_world, leave_world, run

    init_world(cfgs[0].run.device, max(c.run.timeout_s for c in cfgs))
    out: list[dict] = []
    try:
        for i, cfg in enumerate(cfgs):
            try:
                traces = None if trace_dir is None else Path(trace_dir) / (f"cfg{i}" if len(cfgs) > 1 else "")
                out.append({"ok": asdict(run(cfg, traces))})
            except Exception as exc:  # recorded per config
                out.append({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    finally:
        leave_world()
    return out


def _worker(rank: int, world: int, port: int, cfg_dicts: list[dict], out_dir: str,
            setup: Callable[[], None] | None, trace_dir: str | None) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if setup is not None:
        setup()
    for i, part in enumerate(run_in_world([TrainConfig.from_dict(d) for d in cfg_dicts], trace_dir)):
        (Path(out_dir) / f"cfg{i}_rank{rank}.json").write_text(json.dumps(part))


def _results(cfgs: list[TrainConfig], per_rank: list[list[dict]]) -> list[Result | RankFailed]:
    """Per config: its ranks' parts (``per_rank[rank][i]``) merged, or the errors they raised."""
    results: list[Result | RankFailed] = []
    for i, cfg in enumerate(cfgs):
        parts = [mine[i] for mine in per_rank]
        errors = [f"rank {r}: {p['error']}" for r, p in enumerate(parts) if "error" in p]
        results.append(RankFailed("; ".join(errors)) if errors else
                       finalize(cfg, [_rank_from_dict(p["ok"]) for p in parts]))
    return results


def run_here(cfgs: list[TrainConfig]) -> list[Result | RankFailed]:
    """Each one-rank config in a world of this process alone, one after the other: no process to start (a long-lived
    worker that has not joined another world yet, and has torch imported). Torchrun's variables are set for that
    world and put back after."""
    if any(c.world_size != 1 for c in cfgs):
        raise ValueError("run_here: every config must be of one rank "
                         "(tensor_parallel.size x parallel.pp x parallel.dp = 1)")
    alone = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    with mock.patch.dict(os.environ, alone):  # the standard library's way to set variables and put them back
        return _results(cfgs, [run_in_world(cfgs)])


def spawn_many(cfgs: list[TrainConfig], setup: Callable[[], None] | None = None,
               trace_dir: str | Path | None = None) -> list[Result | RankFailed]:
    """Run each config on one local world of ``cfgs[0].world_size`` processes (all must share it).

    Profiler traces (``run.profile_step``) go to ``trace_dir`` (``cfg<i>/`` per config when there are several).
    """
    import torch.multiprocessing as mp  # here, not at the top: the driver imports RankFailed and never torch

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
        return _results(cfgs, [[json.loads((Path(out) / f"cfg{i}_rank{r}.json").read_text()) for i in range(len(cfgs))]
                               for r in range(world)])


def spawn(cfg: TrainConfig, setup: Callable[[], None] | None = None, trace_dir: str | Path | None = None) -> Result:
    (result,) = spawn_many([cfg], setup, trace_dir)
    if isinstance(result, RankFailed):
        raise result
    return result
