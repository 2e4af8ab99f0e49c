"""The GPU tier's Megatron-LM check, as one script: a tiny GPT through Megatron-LM's own pretrain_gpt.py, 2 configs
through the command backend (the baseline, run twice to calibrate the loss-curve gate, and a trial with another
micro-batch size), each parsed from Megatron's own log and judged, within 8 minutes on one GPU node.

    STEPTUNE_MEGATRON_LM=/path/to/Megatron-LM .venv/bin/python tests/gpu/megatron_e2e.py [--out DIR]

Without a GPU, without the checkout (or its pretrain_gpt.py), or without Ray it prints one line saying which and
exits 0: nothing to run here is not a failure. tests/gpu/test_command_megatron.py runs it under pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
BUDGET_S = 480
"""The whole run, both configs and the baseline's repeat: 8 minutes."""
TINY = {"--num-layers": "2", "--hidden-size": "256", "--num-attention-heads": "4", "--seq-length": "256",
        "--max-position-embeddings": "256", "--global-batch-size": "8", "--train-iters": "12"}


def why_not() -> str | None:
    """One line saying why this cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return "no GPU (torch.cuda.is_available() is False)"
    checkout = os.environ.get("STEPTUNE_MEGATRON_LM")
    if not checkout:
        return "no Megatron-LM checkout: set STEPTUNE_MEGATRON_LM=/path/to/Megatron-LM"
    if not (Path(checkout) / "pretrain_gpt.py").is_file():
        return f"STEPTUNE_MEGATRON_LM={checkout} has no pretrain_gpt.py"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "no Ray (the command backend places its node actors with it): bash scripts/setup.sh"
    return None


def sweep_config(results: Path):
    """search_spaces/command-megatron.yaml cut to a tiny GPT on this node's GPUs: 2 configs, 12 iterations each."""
    import torch
    import yaml

    from orchestrator.sweep.config import from_dict

    data = yaml.safe_load((ROOT / "search_spaces" / "command-megatron.yaml").read_text())
    argv = data["command"]["argv"]
    for flag, value in TINY.items():
        argv[argv.index(flag) + 1] = value
    gpus = torch.cuda.device_count()
    data.update(name="gpu-megatron", ray={"address": None}, storage={"results_dir": str(results)},
                tracking={"enabled": False},
                resources={"world_size": gpus, "cpus_per_rank": 1, "gpus_per_rank": 1, "trial_timeout_s": 300},
                trainer={"model": {"n_layers": 2, "d_model": 256, "n_heads": 4, "seq_len": 256},
                         "batch": {"global_batch": 8}, "run": {"steps": 12, "warmup_steps": 4, "device": "cuda",
                                                               "precision": "bf16"}},
                baseline={"batch.micro_batch_size": 1, "recompute.kind": "full"},
                space={"params": {"batch.micro_batch_size": {"type": "categorical", "choices": [1, 2]}}},
                enqueue=[{"batch.micro_batch_size": 2}], search={"n_trials": 2, "wall_time_s": BUDGET_S},
                winner={"min_rounds": 1, "max_rounds": 0}, target={"relative_to_baseline": 0.01})
    data["command"].update(nodes=1, cwd=os.environ["STEPTUNE_MEGATRON_LM"], warmup=4)
    return from_dict(data)


def run(results: Path) -> list:
    """Both configs through the sweep; the ledger's lines (AssertionError naming what went wrong)."""
    from orchestrator.sweep.config import check_sweep
    from orchestrator.sweep.loop import run_sweep

    cfg = sweep_config(results)
    object.__setattr__(cfg, "built", check_sweep(cfg))
    t0 = time.monotonic()
    _, records = run_sweep(cfg)
    took = time.monotonic() - t0
    lines = [r for r in records if r.kind.value in ("baseline", "trial")]
    for r in lines:
        print(f"{r.kind.value:8s} trial {r.trial} {r.params}: {r.status.value} "
              f"{(r.metrics.step_time_s or 0) * 1e3:.1f} ms/iteration, parity "
              f"{'passed' if r.parity and r.parity.passed else 'FAILED'} {r.reason or ''}")
    print(f"{len(lines)} configs in {took:.0f} s (budget {BUDGET_S} s)")
    assert [r.kind.value for r in lines] == ["baseline", "trial"], lines
    for r in lines:
        assert r.status.value == "ok" and r.parity is not None and r.parity.passed, (r.status, r.reason)
        fl = r.extra["framework_log"]
        assert fl["status"] == "ok" and fl["steady_lines"] >= 1 and fl["step_time_s"] > 0, fl
        assert r.extra["command"]["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert "--micro-batch-size" in r.extra["command"]["flags"]
    assert took < BUDGET_S, f"{took:.0f} s > {BUDGET_S} s"
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results folder (default: a temporary one)")
    args = ap.parse_args(argv)
    reason = why_not()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    if args.out:
        run(Path(args.out))
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-megatron-") as tmp:
            run(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
