"""``trainer.launch.run_here``: one-rank configs in the calling process (a Ray rank before its group forms the world:
the sweep's canonical run and its self-check), measured the same as in a launched world of their own, and the
process left as it was found: no world, torchrun's variables put back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, os
    import torch.distributed as dist
    from tests.distributed._common import cfg
    from trainer.launch import RankFailed, run_here, spawn_many

    os.environ["MASTER_PORT"] = "12345"  # a group's variables, set before: they must come back
    one = [cfg({"parallel.dp": 1, "batch.micro_batch_size": 8}), cfg({"parallel.dp": 1, "batch.micro_batch_size": 1})]
    here = run_here(one)
    after = {"world": dist.is_initialized(), "port": os.environ.get("MASTER_PORT"), "rank": os.environ.get("RANK")}
    again = run_here(one[:1])  # a second world in the same process: the first one was left
    launched = spawn_many(one)
    try:
        run_here([cfg({"parallel.dp": 2})])
        refused = None
    except ValueError as e:
        refused = str(e)
    print(json.dumps({
        "here": [[s.loss for s in r.steps] for r in here], "launched": [[s.loss for s in r.steps] for r in launched],
        "again": [s.loss for s in again[0].steps], "fingerprints_equal": [a.fingerprint == b.fingerprint
                                                                          for a, b in zip(here, launched)],
        "failed": [isinstance(r, RankFailed) for r in here], "after": after, "refused": refused}))
""")


@pytest.mark.timeout(200)
def test_one_rank_configs_run_here_as_in_a_world_of_their_own_and_the_process_is_left_as_found():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed"] == [False, False]
    assert out["here"] == out["launched"] and all(out["fingerprints_equal"]), "not the launched world's numbers"
    assert out["again"] == out["here"][0]
    assert out["after"] == {"world": False, "port": "12345", "rank": None}
    assert "one rank" in out["refused"]
