"""steptune's own trainer as a framework of the ``command`` backend: run as a black box through ``torchrun``
(``python -m torch.distributed.run ... -m trainer --config FILE --out FILE``), read from its result JSON.

Every knob is the trainer's own: the trial's whole config is written as the trainer YAML its command reads.
The result JSON's steps are 0-based; they are read as iterations 1..N like the other frameworks', so
``run.warmup_steps`` warm-up updates are the first ``warmup`` iterations.
"""

from __future__ import annotations

import json
from typing import Iterable

from orchestrator.frameworks.log import Iteration, ParsedLog, judge

NAME = "steptune"
CONFIG_FILE = "trainer.yaml"
RESULT_FILE = "result.json"


def parse_result(text: str, warmup: int | None = None, expected: int | None = None) -> ParsedLog:
    """A trainer result JSON -> ParsedLog; warm-up and expected iterations default to the config it holds.
    Text that is not a result (empty, cut off, another file) is a ``no_iterations`` log, not a crash."""
    try:
        d = json.loads(text) if text.strip() else {}
        run = (d.get("config") or {}).get("run") or {}
        world = d.get("world_size") or 1
        its = [Iteration(step=s["step"] + 1, first_step=s["step"] + 1, time_s=s["time_s"], loss=s["loss"],
                         grad_norm=s["grad_norm"], losses={"loss": s["loss"]},
                         tokens_per_s_per_gpu=s["tokens"] / s["time_s"] / world if s["time_s"] else None)
               for s in d.get("steps") or []]
        peak = (d.get("summary") or {}).get("peak_memory_bytes")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return ParsedLog(NAME, "no_iterations", f"not a steptune result JSON ({type(e).__name__}: {e})", [],
                         warmup or 0, expected)
    return judge(NAME, its, run.get("warmup_steps", 0) if warmup is None else warmup,
                 run.get("steps") if expected is None else expected, {"peak": int(peak)} if peak else {})


def refuse(keys: Iterable[str]) -> None:
    """Every trainer knob is expressible: the trial's config is the trainer's own YAML."""


def render(cfg) -> tuple[list[str], dict[str, str]]:
    """The trial's config as the trainer YAML (a file written into the trial folder on every node), and the
    arguments that point the trainer at it and at its result (``{trial_dir}``: that folder, on each node)."""
    import yaml

    files = {CONFIG_FILE: yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return ["--config", "{trial_dir}/" + CONFIG_FILE, "--out", "{trial_dir}/" + RESULT_FILE], files
