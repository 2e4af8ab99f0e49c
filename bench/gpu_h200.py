"""One-shot GPU benchmark: a ~1.2B GPT in bf16 on one GPU, MFU against the declared datasheet peak.

    PYTHONPATH=. python3 bench/gpu_h200.py       # on a machine with one H200 (or H100/A100/B200)

Like the GPU tier (tests/gpu), it runs on whatever CUDA torch the machine has, without the project's install
step (torch and numpy; PyYAML for the example file). Prepared to run as one command when a GPU is lent (goal:
MFU >= 50% on an H200). Each row is a real run of examples/gpt1b.yaml with the overrides shown; every row is
checked against the first with the sweep's parity gate (bf16 floors, orchestrator.parity.verdict), so a faster row
that learns something else is marked, not reported as a win. Results go to bench/results/gpu_<device>.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.parity.verdict import compare, describe_failure, reference_from_result  # noqa: E402
from trainer.config import TrainConfig, apply_overrides  # noqa: E402
from trainer.launch import spawn_many  # noqa: E402

ROWS = {
    "mbs 4, no recompute": {},
    "mbs 2, no recompute": {"batch.micro_batch_size": 2},
    "mbs 8, no recompute": {"batch.micro_batch_size": 8},
    "mbs 4, selective core_attn": {"recompute.kind": "selective"},
    "mbs 4, full recompute": {"recompute.kind": "full"},
}
TP_ROWS = {
    "tp 2, sequence parallel": {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": True},
    "tp 2, no sequence parallel": {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": False},
}
"""Two GPUs, one rank each over NCCL: run after the one-GPU rows, checked against the first of them."""


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark needs a GPU")
    name = torch.cuda.get_device_name(0)
    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples/gpt1b.yaml").read_text())
    cfgs = [TrainConfig.from_dict(apply_overrides(base, o)) for o in ROWS.values()]
    t0 = time.time()
    results = spawn_many(cfgs)
    rows = dict(ROWS)
    if torch.cuda.device_count() >= 2:
        rows.update(TP_ROWS)
        results += spawn_many([TrainConfig.from_dict(apply_overrides(base, o)) for o in TP_ROWS.values()])
    lines = ["| config | step time (s) | tokens/s | MFU | HFU | peak allocated (GiB) | parity vs first row |",
             "|---|---|---|---|---|---|---|"]
    ref = reference_from_result(results[0]) if not isinstance(results[0], Exception) else None
    for row, r in zip(rows, results):
        if isinstance(r, Exception):
            lines.append(f"| {row} | failed: {str(r)[:200]} ||||||")
            continue
        s = r.summary
        mfu = f"{s.mfu:.1%}" if s.mfu is not None else "n/a"
        hfu = f"{s.hfu:.1%}" if s.hfu is not None else "n/a"
        verdict = compare(ref, r) if ref is not None else None
        parity = "n/a" if verdict is None else ("pass" if verdict["passed"] else f"FAIL: {describe_failure(verdict)}")
        lines.append(f"| {row} | {s.step_time_s:.3f} | {s.tokens_per_s:,.0f} | {mfu} | {hfu} | "
                     f"{s.peak_memory_bytes / 2**30:.1f} | {parity} |")
    ok = [r for r in results if not isinstance(r, Exception)]
    text = "\n".join([f"# GPU benchmark: {name}", "",
                      "Command: `PYTHONPATH=. python3 bench/gpu_h200.py` (examples/gpt1b.yaml, bf16 autocast, 1 GPU)", "",
                      *lines, "",
                      "" if len(rows) > len(ROWS) else f"Tensor-parallel rows ({', '.join(TP_ROWS)}) need 2 GPUs; "
                      f"this machine has {torch.cuda.device_count()}.",
                      f"Peak basis: {ok[0].summary.peak_basis if ok else 'n/a'}.",
                      f"torch {torch.__version__}; wall time {time.time() - t0:.0f} s.", ""])
    write_and_print(text, Path(__file__).resolve().parent / "results" / f"gpu_{name.replace(' ', '_')}.md")


if __name__ == "__main__":
    main()
