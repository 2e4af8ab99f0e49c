"""run.profile_step: a torch.profiler trace of one warm-up update per rank, the learning untouched."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from tests.distributed._common import cfg
from trainer.launch import spawn_many

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(120)
def test_a_profiled_warmup_update_writes_a_trace_per_rank_and_changes_nothing_else(tmp_path):
    base = {"parallel.dp": 2, "data_parallel.bucket_mb": 0.01, "run.steps": 3, "run.warmup_steps": 1}
    traced, plain = spawn_many([cfg({**base, "run.profile_step": 0}), cfg(base)], trace_dir=tmp_path)
    # The profiler observes; the maths is the same update for update.
    assert [s.loss for s in traced.steps] == [s.loss for s in plain.steps]
    assert [s.grad_norm for s in traced.steps] == [s.grad_norm for s in plain.steps]
    assert all(r.trace_file is None for r in plain.ranks)
    files = sorted(Path(r.trace_file) for r in traced.ranks)
    assert files == [tmp_path / "cfg0" / "rank0.pt.trace.json.gz", tmp_path / "cfg0" / "rank1.pt.trace.json.gz"]
    for path in files:
        events = Counter(e.get("name") for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])
        # One update: a forward and a backward label per microbatch, one optimizer step, its all-reduces.
        assert events["forward"] == events["backward"] == traced.n_microbatches == 2, events
        assert events["optimizer"] == 1
        assert events["gloo:all_reduce"] >= 2 and events["aten::mm"] > 0
    assert not list(tmp_path.glob("cfg1/*"))
