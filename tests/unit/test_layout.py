"""Layout arithmetic from tables: splits, microbatch counts, schedules, recompute groups."""

from __future__ import annotations

import pytest

from trainer import layout


@pytest.mark.parametrize("n_layers,n_stages,kw,expected", [
    (4, 1, {}, [[0, 1, 2, 3]]),
    (4, 2, {}, [[0, 1], [2, 3]]),
    (5, 2, {}, [[0, 1, 2], [3, 4]]),
    (7, 3, {}, [[0, 1], [2, 3, 4], [5, 6]]),  # the remainder goes to the middle stage
    (10, 4, {}, [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]),
    (4, 2, {"explicit": (1, 3)}, [[0], [1, 2, 3]]),
    (6, 3, {"first": 1, "last": 1}, [[0], [1, 2, 3, 4], [5]]),
    (8, 4, {"first": 2, "last": 0}, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (10, 4, {"first": 2, "last": 2}, [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]),
    (4, 2, {"first": 1, "last": 3}, [[0], [1, 2, 3]]),
    # Llama 3's layout: the first chunk holds only the embedding, the last only the head and loss.
    (4, 6, {"explicit": (0, 1, 1, 1, 1, 0)}, [[], [0], [1], [2], [3], []]),
    (4, 2, {"explicit": (0, 4)}, [[], [0, 1, 2, 3]]),
])
def test_split_layers(n_layers, n_stages, kw, expected):
    stages = layout.layer_ranges(layout.split_counts(n_layers, n_stages, **kw))
    assert stages == expected
    flat = [lid for s in stages for lid in s]
    assert flat == list(range(n_layers))  # every layer exactly once, in order


@pytest.mark.parametrize("n_layers,n_stages,kw,field", [
    (3, 4, {}, "model.n_layers"),
    (4, 2, {"explicit": (1, 2)}, "pipeline.split.layers"),
    (4, 2, {"explicit": (1, 2, 1)}, "pipeline.split.layers"),
    (4, 3, {"explicit": (2, 0, 2)}, "pipeline.split"),  # only the end chunks may hold no layers
    (4, 1, {"explicit": (0,)}, "pipeline.split"),
    (4, 2, {"explicit": (-1, 5)}, "pipeline.split"),
    (9, 4, {"first": 2, "last": 2}, "pipeline.split"),  # 5 layers over 2 middle stages
    (4, 1, {"first": 1}, "pipeline.split.first"),
    (4, 2, {"first": -1}, "pipeline.split.first"),
])
def test_split_errors_name_the_field(n_layers, n_stages, kw, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        layout.split_counts(n_layers, n_stages, **kw)


@pytest.mark.parametrize("gb,mbs,dp,expected", [(8, 1, 1, 8), (8, 2, 2, 2), (1920, 1, 80, 24), (1920, 2, 80, 12)])
def test_microbatch_count(gb, mbs, dp, expected):
    assert layout.num_microbatches(gb, mbs, dp) == expected


@pytest.mark.parametrize("gb,mbs,dp", [(8, 3, 1), (10, 2, 3), (1920, 7, 80)])
def test_indivisible_batch_is_refused(gb, mbs, dp):
    with pytest.raises(ValueError, match="batch.global_batch"):
        layout.num_microbatches(gb, mbs, dp)


@pytest.mark.parametrize("schedule,pp,v,n_micro,field", [
    ("1f1b", 4, 1, 2, "pipeline.schedule=1f1b needs at least"),
    ("interleaved_1f1b", 2, 1, 4, "pipeline.virtual_stages"),
    ("interleaved_1f1b", 2, 2, 3, "multiple"),
    ("1f1b", 2, 2, 4, "pipeline.virtual_stages"),
    ("zb", 2, 1, 4, "pipeline.schedule"),
])
def test_schedule_requirements(schedule, pp, v, n_micro, field):
    with pytest.raises(ValueError, match=field):
        layout.check_schedule(schedule, pp, v, n_micro)
        layout.check_torch_schedule(schedule, pp, n_micro)


def test_gpipe_accepts_fewer_microbatches_than_stages():
    layout.check_schedule("gpipe", 4, 1, 2)


def test_world_size_check():
    layout.check_world_size(1, 2, 2, 4)
    layout.check_world_size(2, 2, 2, 8)
    with pytest.raises(ValueError, match=r"tensor_parallel\.size x parallel\.pp x parallel\.dp = 2 x 2 x 1 = 4"):
        layout.check_world_size(2, 2, 1, 2)


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2), (4, 2, 3)])
def test_rank_coords_put_tensor_parallel_ranks_adjacent(tp, pp, dp):
    """Megatron's order: rank = (pp_rank x dp + dp_rank) x tp + tp_rank; every coordinate exactly once."""
    world = tp * pp * dp
    coords = [layout.rank_coords(r, tp, pp, dp) for r in range(world)]
    assert sorted(coords) == [(p, d, t) for p in range(pp) for d in range(dp) for t in range(tp)]
    for r, (p, d, t) in enumerate(coords):
        assert r == (p * dp + d) * tp + t
    # A TP group is a run of adjacent ranks; a DP group strides by tp; a PP group by dp x tp.
    assert [layout.rank_coords(r, tp, pp, dp)[2] for r in range(tp)] == list(range(tp))


def test_rank_coords_examples():
    assert layout.rank_coords(5, tp=2, pp=2, dp=2) == (1, 0, 1)
    assert layout.rank_coords(3, tp=1, pp=2, dp=2) == (1, 1, 0)  # tp = 1: the pp x dp order of before
    with pytest.raises(ValueError, match="outside"):
        layout.rank_coords(8, tp=2, pp=2, dp=2)


@pytest.mark.parametrize("pp_rank,pp,v,expected", [(0, 2, 1, [0]), (1, 2, 2, [1, 3]), (0, 4, 2, [0, 4])])
def test_stage_ids_loop_placement(pp_rank, pp, v, expected):
    assert layout.stage_ids_for_rank(pp_rank, pp, v) == expected


@pytest.mark.parametrize("ids,method,n,expected", [
    ([0, 1, 2, 3], "uniform", 1, [([0], True), ([1], True), ([2], True), ([3], True)]),
    ([0, 1, 2, 3], "uniform", 2, [([0, 1], True), ([2, 3], True)]),
    ([4, 5, 6], "uniform", 2, [([4, 5], True), ([6], True)]),
    ([0, 1, 2, 3], "block", 1, [([0], True), ([1], False), ([2], False), ([3], False)]),
    ([0, 1], "block", 3, [([0], True), ([1], True)]),
])
def test_recompute_groups(ids, method, n, expected):
    assert layout.recompute_groups(ids, method, n) == expected


# ---- the one split rule (trainer, planner and search space all call layout.split_counts) ------------------

@pytest.mark.parametrize("n_layers,n_chunks,kw,expected", [
    (8, 2, {}, [4, 4]),
    (7, 2, {}, [4, 3]),
    (10, 4, {}, [2, 3, 3, 2]),              # remainder to the middle chunks first
    (11, 4, {}, [3, 3, 3, 2]),
    (96, 8, {}, [12] * 8),
    (96, 8, {"first": 9, "last": 9}, [9] + [13] * 6 + [9]),
    (96, 8, {"first": 12, "last": 12}, [12] * 8),
    (96, 8, {"first": 5}, [5] + [13] * 7),  # last unset: balanced with the middle
    (96, 8, {"last": 5}, [13] * 7 + [5]),
    (6, 2, {"first": 2, "last": 4}, [2, 4]),
    (16, 16, {}, [1] * 16),
    (6, 3, {"explicit": (1, 3, 2)}, [1, 3, 2]),
    (126, 128, {"explicit": (0,) + (1,) * 126 + (0,)}, [0] + [1] * 126 + [0]),
])
def test_split_counts_table(n_layers, n_chunks, kw, expected):
    assert layout.split_counts(n_layers, n_chunks, **kw) == expected
    assert layout.split_counts(n_layers, n_chunks, **kw) == expected


def test_the_split_classes_and_the_space_use_the_rule():
    from orchestrator.search.space import Param, feasible_splits
    from trainer.knobs import BalancedSplit, FirstLastSplit

    assert FirstLastSplit(9, 9).counts(96, 8) == layout.split_counts(96, 8, first=9, last=9)
    assert BalancedSplit().counts(10, 4) == layout.split_counts(10, 4)
    p = Param("pipeline.split", "layer_split", first=(8, 14), last=(6, 12))
    pairs = feasible_splits(p, 96, 8)
    for f in range(8, 15):
        for la in range(6, 13):
            try:
                layout.split_counts(96, 8, first=f, last=la)
                ok = True
            except ValueError:
                ok = False
            assert ((f, la) in pairs) == ok, (f, la)
