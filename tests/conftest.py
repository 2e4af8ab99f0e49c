"""Shared test setup: a Ray cluster started once per session, small sweep files in temp dirs (markers: pyproject)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_address():
    """Embedded Ray, started once for the whole session the way the product starts it; yields its address.

    In-process sweeps reuse it (``ray.is_initialized()``); subprocess drivers join it with ``ray.address=``,
    which also exercises the existing-cluster path. A short temp dir keeps Ray's socket paths legal.
    """
    import ray

    from orchestrator.backends.workers import start_local_ray

    temp = tempfile.mkdtemp(prefix="st-ray-")
    address = start_local_ray(num_cpus=max(2, os.cpu_count() or 1), temp_dir=temp)
    yield address
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


# A sweep small enough for CI (2 cores): a 4-layer d_model-32 GPT, 6 updates per trial.
TINY_SWEEP = {
    "name": "t",
    "backend": "ray",
    "trainer": {
        "model": {"vocab_size": 128, "n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 32},
        "batch": {"global_batch": 8},
        "data_parallel": {"kind": "replicate", "bucket_mb": 0.02},
        "run": {"steps": 6, "warmup_steps": 1},
    },
    "baseline": {"parallel.pp": 2, "batch.micro_batch_size": 2},
    "space": {"params": {
        "parallel.pp": {"type": "categorical", "choices": [1, 2]},
        "batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4]},
        "pipeline.schedule": {"type": "categorical", "choices": ["gpipe", "1f1b"], "when": {"parallel.pp": 2},
                              "default": "1f1b"},
        "pipeline.split": {"type": "layer_split", "when": {"parallel.pp": 2}, "first": [1, 3], "last": [1, 3]},
        "data_parallel.overlap_grad_reduce": {"type": "categorical", "choices": [True, False],
                                              "when": {"parallel.pp": 1}},
        "recompute.kind": {"type": "categorical", "choices": ["none", "full"]},
    }},
    "search": {"n_trials": 5, "wall_time_s": None},
    "sampler": {"kind": "tpe", "seed": 0, "n_startup_trials": 2},
    "pruning": {"enabled": False},
    "resources": {"world_size": 2, "cpus_per_rank": 1, "trial_timeout_s": 60},
    "tracking": {"enabled": False},
    "winner": {"max_rounds": 0},  # settling rounds: their own tests turn them on
}


@pytest.fixture
def sweep_file(tmp_path):
    """Write TINY_SWEEP with ``changes`` under tmp_path; results go to tmp_path/results.

    A change to a settings section (resources, pruning, ...) updates its keys; trainer, baseline, space and
    the rest are replaced whole.
    """

    def write(name: str = "sweep.yaml", **changes) -> Path:
        import yaml  # here, not at the top: the GPU tier runs without the project's dependencies

        data = yaml.safe_load(yaml.safe_dump(TINY_SWEEP))
        data["storage"] = {"results_dir": str(tmp_path / "results")}
        for key, value in changes.items():
            if key in ("resources", "pruning", "search", "sampler", "tracking", "ray", "storage", "winner"):
                data[key] = {**data.get(key, {}), **value}
            else:
                data[key] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
