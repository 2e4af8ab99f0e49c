"""Pure helpers that sat in the e2e tier: the rank environment of a worker group, the Pareto front of a sweep."""

from __future__ import annotations

import pytest


# (each actor's node: ip, free port, its GPU ids) -> the env each rank gets
ENV_TABLE = [
    ([{"ip": "a", "port": 1, "gpu_ids": []}, {"ip": "a", "port": 2, "gpu_ids": []}],
     [{"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
      {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}]),
    ([{"ip": "a", "port": 7, "gpu_ids": ["3"]}, {"ip": "a", "port": 8, "gpu_ids": ["1"]},
      {"ip": "b", "port": 9, "gpu_ids": ["0"]}, {"ip": "b", "port": 5, "gpu_ids": ["10"]}],
     [{"RANK": "0", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "1,3", "MASTER_ADDR": "a", "MASTER_PORT": "7"},
      {"RANK": "1", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1,3", "LOCAL_WORLD_SIZE": "2"},
      {"RANK": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,10", "MASTER_ADDR": "a", "WORLD_SIZE": "4"},
      {"RANK": "3", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,10"}]),
]


@pytest.mark.parametrize("nodes,expected", ENV_TABLE)
def test_rank_environment(nodes, expected):
    """torchrun's variables per actor; on GPU nodes each rank sees its node's group GPUs, LOCAL_RANK its own."""
    from orchestrator.backends.workers import rank_envs

    envs = rank_envs(nodes)
    for env, want in zip(envs, expected):
        assert want.items() <= env.items(), (env, want)


def test_pareto_front_is_the_non_dominated_points():
    from orchestrator.review.plots import pareto_front

    pts = [(4.0, 0.07), (6.0, 0.055), (6.0, 0.056), (5.0, 0.10), (8.0, 0.08), (7.0, 0.05)]
    assert pareto_front(pts) == [(4.0, 0.07), (6.0, 0.055), (7.0, 0.05)]
