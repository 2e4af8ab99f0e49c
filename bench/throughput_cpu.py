"""CPU throughput table for a few layouts of a small GPT (a benchmark, not a test).

    .venv/bin/python bench/throughput_cpu.py [--steps 12] [--out bench/results/throughput_cpu.md]

Each row is a real run on 2 local gloo ranks; step time is the median over measured updates (warm-up
excluded) of the slowest rank; MFU is against the measured CPU matmul peak printed under the table.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from trainer.config import TrainConfig, apply_overrides  # noqa: E402
from trainer.launch import spawn_many  # noqa: E402

BASE = {
    "model": {"vocab_size": 256, "n_layers": 4, "d_model": 128, "n_heads": 4, "seq_len": 128},
    "batch": {"global_batch": 16, "micro_batch_size": 2},
    "data_parallel": {"kind": "replicate", "bucket_mb": 1.0},
}
ROWS = {
    "dp2 replicate, overlap": {"parallel.dp": 2},
    "dp2 replicate, no overlap": {"parallel.dp": 2, "data_parallel.overlap_grad_reduce": False},
    "dp2 replicate, mbs 8": {"parallel.dp": 2, "batch.micro_batch_size": 8},
    "dp2 fsdp": {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
    "dp2 torch_ddp": {"parallel.dp": 2, "data_parallel.kind": "torch_ddp"},
    "dp2 full recompute": {"parallel.dp": 2, "recompute.kind": "full"},
    "pp2 1f1b": {"parallel.pp": 2},
    "pp2 gpipe": {"parallel.pp": 2, "pipeline.schedule": "gpipe"},
    "pp2 interleaved v2": {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("bench/results/throughput_cpu.md"))
    args = parser.parse_args()
    base = apply_overrides(BASE, {"run.steps": args.steps, "run.warmup_steps": 3})
    cfgs = [TrainConfig.from_dict(apply_overrides(base, over)) for over in ROWS.values()]
    t0 = time.time()
    results = spawn_many(cfgs)
    lines = ["| config | step time (ms) | tokens/s | MFU | HFU | peak memory (MiB) | dp comm wait (ms) | pipeline idle (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in zip(ROWS, results):
        if isinstance(r, Exception):
            lines.append(f"| {name} | failed: {r} |||||||")
            continue
        s = r.summary
        lines.append(f"| {name} | {s.step_time_s * 1e3:.1f} | {s.tokens_per_s:,.0f} | {s.mfu:.1%} | {s.hfu:.1%} | "
                     f"{s.peak_memory_bytes / 2**20:.1f} | {r.phases['dp_comm_wait']['max'] * 1e3:.1f} | "
                     f"{r.phases['pipeline_idle']['max'] * 1e3:.1f} |")
    basis = next(r.summary.peak_basis for r in results if not isinstance(r, Exception))
    mem = next(r.summary.peak_memory_basis for r in results if not isinstance(r, Exception))
    text = "\n".join([
        f"# CPU throughput ({platform.processor() or platform.machine()}, 2 gloo ranks, 1 thread each)", "",
        f"Command: `.venv/bin/python bench/throughput_cpu.py --steps {args.steps}`; model "
        f"{BASE['model']}, global batch {BASE['batch']['global_batch']} sequences, fp32.", "",
        *lines, "",
        f"MFU/HFU basis: {basis} per rank.", f"Peak memory: {mem}.",
        f"Wall time of the whole benchmark: {time.time() - t0:.0f} s.", ""])
    write_and_print(text, args.out)


if __name__ == "__main__":
    main()
