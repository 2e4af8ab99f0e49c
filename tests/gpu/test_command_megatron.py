"""GPU tier: a Megatron-LM trial through the command backend, where CUDA and a Megatron-LM checkout are present.

    STEPTUNE_MEGATRON_LM=/path/to/Megatron-LM PYTHONPATH=. python3 -m pytest tests/gpu/test_command_megatron.py -q

Skipped without CUDA, without the checkout, or without Ray (the command backend places its node actors with it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
CHECKOUT = os.environ.get("STEPTUNE_MEGATRON_LM")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not CHECKOUT or not (Path(CHECKOUT) / "pretrain_gpt.py").is_file(),
                       reason="needs STEPTUNE_MEGATRON_LM=<a Megatron-LM checkout with pretrain_gpt.py>"),
]


@pytest.mark.timeout(900)
def test_a_megatron_trial_is_measured_from_its_own_log(tmp_path):
    pytest.importorskip("ray")
    import yaml

    from orchestrator import REPO_ROOT
    from orchestrator.sweep.config import check_sweep, from_dict

    data = yaml.safe_load((REPO_ROOT / "search_spaces" / "command-megatron.yaml").read_text())
    gpus = torch.cuda.device_count()
    argv = data["command"]["argv"]
    for flag, value in (("--num-layers", "2"), ("--hidden-size", "256"), ("--num-attention-heads", "4"),
                        ("--seq-length", "256"), ("--max-position-embeddings", "256"), ("--global-batch-size", "8"),
                        ("--train-iters", "12")):
        argv[argv.index(flag) + 1] = value
    data.update(name="gpu-megatron", ray={"address": None}, storage={"results_dir": str(tmp_path)},
                resources={"world_size": gpus, "cpus_per_rank": 1, "gpus_per_rank": 1, "trial_timeout_s": 600},
                trainer={"model": {"n_layers": 2, "d_model": 256, "n_heads": 4, "seq_len": 256},
                         "batch": {"global_batch": 8}, "run": {"steps": 12, "warmup_steps": 4, "device": "cuda",
                                                               "precision": "bf16"}},
                baseline={"batch.micro_batch_size": 1, "recompute.kind": "full"},
                space={"params": {"batch.micro_batch_size": {"type": "categorical", "choices": [1, 2]}}})
    data["command"].update(nodes=1, cwd=CHECKOUT, warmup=4)
    cfg = from_dict(data)
    backend = check_sweep(cfg)
    backend.join()
    runner = backend.runner()
    try:
        runner.submit(0, backend.configs.baseline)
        done = []
        while not done:
            done = runner.poll(5.0)
        out = done[0][1]
        assert out.status == "ok", out.reason
        assert out.parsed.framework == "megatron" and out.parsed.step_time_s > 0
        assert out.parsed.peak_memory_bytes and out.command["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert backend.judge("baseline", out, None, [out]).parity["passed"]
    finally:
        runner.close()
