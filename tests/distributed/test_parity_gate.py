"""The parity gate passes every legitimate layout and catches seeded bugs, each at a stated step.

Bugs are injected only here, by patching trainer internals inside the spawned ranks (``setup``): none of
them is an option a user could turn on.
"""

from __future__ import annotations

import pytest

from orchestrator.parity.verdict import compare, reference_from_result
from tests.distributed._common import cfg
from tests.distributed.seeded_bugs import BUGS
from trainer.launch import RankFailed, spawn_many

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def reference():
    (base,) = spawn_many([cfg({})])
    return reference_from_result(base)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bug,layout,step,metric", BUGS, ids=[b[0].__name__ for b in BUGS])
def test_seeded_bug_is_caught(reference, bug, layout, step, metric):
    (result,) = spawn_many([cfg(layout)], setup=bug)
    assert not isinstance(result, RankFailed), result
    verdict = compare(reference, result)
    assert not verdict["passed"], verdict
    assert (verdict["first_fail_step"], verdict["first_fail_metric"]) == (step, metric), verdict


@pytest.mark.timeout(120)
def test_legit_layouts_pass_with_margin(reference):
    layouts = [{"parallel.pp": 2, "pipeline.schedule": "gpipe"}, {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
               {"parallel.dp": 2, "recompute.kind": "full"}]
    for result in spawn_many([cfg(x) for x in layouts]):
        verdict = compare(reference, result)
        assert verdict["passed"], verdict
        assert verdict["max_loss_rel_diff"] < verdict["tolerance"]["loss_rel"] / 5
