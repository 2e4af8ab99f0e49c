"""The trainer's command line: ``python -m trainer --config FILE [key=value ...] [--out result.json]``.

Under torchrun (RANK/WORLD_SIZE set) this process is one rank of the world; otherwise it spawns
tensor_parallel.size x parallel.pp x parallel.dp local ranks itself. Either way rank results are merged into one result JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from trainer.config import TrainConfig, apply_overrides, parse_dotlist

DESCRIPTION = ("Train a GPT config and measure its updates (step time, memory, MFU), writing one result JSON. "
               "Under torchrun this process is one rank; otherwise it starts the config's "
               "tensor_parallel.size x parallel.pp x parallel.dp local ranks itself. docs/trainer.md has the fields.")
"""``--help``'s text: plain words (argparse prints it as is, so no rst or markdown markup)."""


def read_yaml(path: Path) -> object:
    """A config file's contents; ValueError in one line naming the file for a missing or unreadable file and for
    YAML that does not parse (a user typo, not a crash: no traceback)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"--config {path}: not valid YAML{where}: {problem}") from None


def load_config(path: Path | None, overrides: list[str]) -> TrainConfig:
    base = read_yaml(path) if path else {}
    return TrainConfig.from_dict(apply_overrides(base or {}, parse_dotlist(overrides)))


def _summary_line(result) -> str:
    s = result.summary
    mfu = f"{s.mfu:.1%}" if s.mfu is not None else "n/a"
    return (f"step {s.step_time_s * 1e3:.1f} ms (median of {s.n_measured_steps}), {s.tokens_per_s:,.0f} tokens/s, "
            f"MFU {mfu} [{s.peak_basis}], peak memory {s.peak_memory_bytes / 2**20:.1f} MiB, "
            f"loss {result.steps[0].loss:.4f} -> {result.steps[-1].loss:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=DESCRIPTION)
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="trainer YAML, e.g. examples/tiny.yaml (default: the built-in defaults)")
    parser.add_argument("--out", type=Path, default=Path("results/trainer_result.json"), metavar="FILE",
                        help="result JSON path (default: results/trainer_result.json)")
    parser.add_argument("--trace-dir", type=Path, default=None, metavar="DIR",
                        help="where run.profile_step traces go (default: a traces/ folder beside --out)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides of the file, e.g. parallel.pp=2")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    trace_dir = args.trace_dir or args.out.parent / "traces"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        from trainer.measure.result import finalize
        from trainer.run import init_world, run

        init_world(cfg.run.device, cfg.run.timeout_s)
        mine = run(cfg, trace_dir)  # each rank writes its own trace, on its own node
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        dist.destroy_process_group()
        if gathered is None:
            return 0
        result = finalize(cfg, gathered)
    else:
        from trainer.launch import spawn

        result = spawn(cfg, trace_dir=trace_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(result.to_json())
    print(_summary_line(result))
    print(f"wrote {args.out}")
    traces = [r.trace_file for r in result.ranks if r.trace_file]
    if traces:
        print(f"wrote {len(traces)} torch.profiler trace(s) of update {cfg.run.profile_step}: "
              f"{Path(traces[0]).parent} (open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # A rank under torchrun has written everything and left its process group by now. torch 2.13 (CPU, with
        # run.profile_step) then aborts in about 1 teardown in 10 under load ("terminate called without an active
        # exception": a native thread still joinable when C++ statics are destroyed), which torchrun reports as a
        # failed rank. Nothing is left to clean up, so the rank skips the interpreter's native teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
