"""FSDP's collectives per step on real gloo ranks against the planner's counts (orchestrator/planner/fsdp.py).

At pp > 1 torch pipelining keeps a group gathered after each backward and reduces once after the last, so
a block is gathered once per step without reshard_after_forward and m + 1 times with it (the forwards
before its chunk's first backward, then every backward that follows a forward; torch's interleaved
schedule gathers every chunk up front, in no pass). Counted from the collectives FSDP2 issues
(tests/distributed/fsdp_counting.py), per FSDP group and per pass, in the last step of each run; pp2 dp2,
m = 4, world 4 on gloo.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from orchestrator.planner.fsdp import gather_passes
from orchestrator.planner.knobs import Consts, encode
from orchestrator.calibration.prefilter import plan_for_trial
from tests.distributed._common import cfg
from tests.distributed.fsdp_counting import count_collectives, per_step
from tests.unit.test_prefilter import CPU, EXACT
from trainer.launch import spawn_many

pytestmark = pytest.mark.distributed

BASE = {"parallel.pp": 2, "parallel.dp": 2, "data_parallel.kind": "fsdp", "batch.micro_batch_size": 1,
        "run.steps": 2, "run.warmup_steps": 1}                          # m = 4 microbatches per replica
LAYOUTS = {
    "1f1b raf": {"pipeline.schedule": "1f1b", "data_parallel.reshard_after_forward": True},
    "1f1b keep": {"pipeline.schedule": "1f1b", "data_parallel.reshard_after_forward": False},
    "gpipe raf": {"pipeline.schedule": "gpipe", "data_parallel.reshard_after_forward": True},
    "interleaved raf": {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
                        "data_parallel.prefetch": 0, "data_parallel.reshard_after_forward": True},
    "interleaved keep": {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,   # Llama 3's
                         "data_parallel.prefetch": 0, "data_parallel.reshard_after_forward": False},
}
TOTAL = {"1f1b raf": 5, "1f1b keep": 1, "gpipe raf": 5, "interleaved raf": 5, "interleaved keep": 1}
"""Gathers of each FSDP group per step, by hand: m + 1 = 5 with reshard_after_forward, else 1."""


@pytest.mark.timeout(120)
def test_fsdp_gathers_per_step_match_the_planner(tmp_path):
    configs = [cfg({**BASE, **over}) for over in LAYOUTS.values()]
    results = spawn_many(configs, setup=functools.partial(count_collectives, str(tmp_path)))
    for i, (name, c) in enumerate(zip(LAYOUTS, configs)):
        plan = plan_for_trial(c, dataclasses.replace(CPU, num_gpus=c.world_size), EXACT)
        passes = {k: v[0] for k, v in gather_passes(Consts.of(plan), encode([plan])).items()}
        interleaved = c.pipeline.schedule == "interleaved_1f1b"
        for rank in results[i].ranks:
            s = rank.pp_rank
            counts = per_step(tmp_path, rank.rank)[i][-1]
            groups = {g for _, g, _ in counts}
            assert len(groups - {"root"}) == len(rank.layer_ids) and "root" in groups, (name, s, groups)
            want = {"IDLE": passes["up_front"][s], "FORWARD": passes["forward"][s],
                    "PRE_BACKWARD": passes["backward"][s]}
            assert sum(want.values()) == passes["per_step"][s] == TOTAL[name], (name, s, want)
            for g in groups:    # every block, and the chunk's root, which follows its blocks at pp > 1
                got = {ph: counts.get(("all_gather", g, ph), 0) for ph in want}
                assert sum(got.values()) == TOTAL[name] and got["IDLE"] == want["IDLE"], (name, s, g, got)
                if not interleaved:  # its forward/backward split is a stage average in the planner
                    assert got == want, (name, s, g, got)
                assert counts[("reduce_scatter", g, "")] == 1, (name, s, g)  # once per step, after the last backward
