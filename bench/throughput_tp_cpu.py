"""Tensor parallelism on 2 CPU ranks, side by side with data parallelism (a benchmark, not a test).

    .venv/bin/python bench/throughput_tp_cpu.py [--steps 10] [--out bench/results/throughput_tp_cpu.md]

tp 2 (dp 1, sequence parallelism on and off) against tp 1 (dp 2) at the same global batch, for the default
sweep's model (d_model 64) and a wider one (d_model 512), all runs in one local world of 2 gloo ranks.
Step time is the median over measured updates (warm-up excluded) of the slowest rank; "tp comm" is the time
the slowest rank waited in tensor-parallel collectives (inside its forward/backward, not added to them).
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

MODELS = {
    "default (d_model 64)": {"vocab_size": 256, "n_layers": 6, "d_model": 64, "n_heads": 4, "seq_len": 64},
    "wide (d_model 512)": {"vocab_size": 256, "n_layers": 4, "d_model": 512, "n_heads": 8, "seq_len": 128},
}
LAYOUTS = {
    "tp1 dp2": {"parallel.dp": 2},
    "tp2 sp": {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": True},
    "tp2 no sp": {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": False},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/results/throughput_tp_cpu.md"))
    args = parser.parse_args()
    rows, cfgs = [], []
    for mname, model in MODELS.items():
        base = {"model": model, "batch": {"global_batch": 8, "micro_batch_size": 2},
                "run": {"steps": args.steps, "warmup_steps": 3}}
        for lname, over in LAYOUTS.items():
            rows.append((mname, lname))
            cfgs.append(TrainConfig.from_dict(apply_overrides(base, over)))
    t0 = time.time()
    results = spawn_many(cfgs)
    lines = ["| model | layout | step time (ms) | tokens/s | MFU | peak memory per rank (MiB) | tp comm (ms) | "
             "dp comm wait (ms) |", "|---|---|---|---|---|---|---|---|"]
    for (mname, lname), r in zip(rows, results):
        if isinstance(r, Exception):
            lines.append(f"| {mname} | {lname} | failed: {r} ||||||")
            continue
        s, ph = r.summary, r.phases
        tp = (ph.get("tp_comm") or {}).get("max", 0.0)
        lines.append(f"| {mname} | {lname} | {s.step_time_s * 1e3:.1f} | {s.tokens_per_s:,.0f} | {s.mfu:.1%} | "
                     f"{s.peak_memory_bytes / 2**20:.1f} | {tp * 1e3:.1f} | {ph['dp_comm_wait']['max'] * 1e3:.1f} |")
    ok = [r for r in results if not isinstance(r, Exception)]
    text = "\n".join([
        f"# Tensor parallelism on CPU ({platform.processor() or platform.machine()}, 2 gloo ranks, 1 thread each)", "",
        f"Command: `.venv/bin/python bench/throughput_tp_cpu.py --steps {args.steps}`; global batch 8 sequences, "
        f"micro-batch 2, fp32; every row in one local world, run one after the other.", "",
        *lines, "",
        f"MFU basis: {ok[0].summary.peak_basis} per rank; FLOPs counted once for the whole model." if ok else "",
        f"Peak memory: {ok[0].summary.peak_memory_basis}." if ok else "",
        f"Wall time of the whole benchmark: {time.time() - t0:.0f} s.", "",
        "What these numbers can say: on one CPU host, gloo's per-collective cost (hundreds of microseconds, "
        "bench/results/throughput_cpu.md) is paid four times per layer per microbatch under tensor parallelism "
        "(twice forward, twice backward), against one bucketed gradient all-reduce per update under data "
        "parallelism; with GEMMs this small TP loses on CPU, and the gap narrows as the GEMMs widen. What they "
        "cannot say: anything about NVLink, where a TP all-reduce of these sizes costs microseconds; on GPUs "
        "measure with the GPU tier (bench/gpu_h200.py's TP case) and the planner's tp_comm term.", ""])
    write_and_print(text, args.out)


if __name__ == "__main__":
    main()
