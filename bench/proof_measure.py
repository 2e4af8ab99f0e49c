"""One run on one machine: the landscapes of several sweep files and their slices, in shared interleaved rounds.

``bench/slice_proof.py --measure-landscape`` calls this. For every sweep file (a model):

* **Landscape**: every config of its space (``landscape.landscape_configs``, the bucket size at the DP slices'
  values), or, when there are more than ``--sample``, a stratified sample (``stratified_sample``): the baseline,
  then configs drawn round-robin over the strata of pipeline layout x micro-batch size x recompute kind, so every
  knob family is in it in proportion.
* **Slices**: ``slices.derive_any`` at the job's density (``slices.density``: every rank of the node busy, as in
  the job), 1 and 2 layers, with the data-parallel and pipeline slices.

All models' landscape runs and slices run in the same rounds on one warm Ray worker group (one actor per rank):
round k holds every landscape config once (for the first ``landscape_repeats`` rounds) and every slice once (for
the first ``slice_repeats``), in a new shuffled order, so load that comes and goes reaches a landscape and its
slices alike. Every run is appended (fsynced) to the samples file as it lands; a rerun resumes there. A landscape
run is checked for parity against its model's first baseline run (``landscape.Measurer``'s rule); a slice is not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import landscape as LS
from orchestrator import backends
from orchestrator.parity import verdict as parity
from orchestrator.calibration.slices import Slice, bucket_sizes, derive_any
from orchestrator.sweep.config import load_sweep


@dataclass
class Model:
    """One sweep file's share of the run."""

    name: str
    source: str
    cfg: Any
    configs: Any
    grid: int
    """Configs in the whole space (the bucket size at its measured values)."""
    params: list[dict[str, Any]]
    """The landscape configs measured, the baseline first."""
    baseline_key: str
    slices: list[Slice]
    buckets: list[float]


def strata_of(params: dict[str, Any]) -> tuple:
    """The stratum of a config: pipeline layout, micro-batch size, recompute kind."""
    pp = params.get("parallel.pp", 1)
    return (pp, params.get("pipeline.schedule", "-") if pp > 1 else "-", params.get("batch.micro_batch_size"),
            params.get("recompute.kind"))


def stratified_sample(params: Sequence[dict[str, Any]], baseline: dict[str, Any], n: int, seed: int = 0
                      ) -> list[dict[str, Any]]:
    """The baseline and ``n - 1`` others drawn round-robin over the strata (each stratum shuffled with ``seed``),
    or every config when there are at most ``n``."""
    base_key = LS.key_of(baseline)
    rest = [p for p in params if LS.key_of(p) != base_key]
    if len(rest) < n:
        return [baseline] + rest
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for p in rest:
        groups[strata_of(p)].append(p)
    rng = random.Random(seed)
    order = sorted(groups)
    rng.shuffle(order)
    for g in order:
        rng.shuffle(groups[g])
    out: list[dict] = []
    while len(out) < n - 1:
        for g in order:
            if groups[g] and len(out) < n - 1:
                out.append(groups[g].pop())
    return [baseline] + out


def plan_model(path: Path, root: Path, sample: int, ranks: int, layers: Sequence[int], steps: int, seed: int) -> Model:
    import yaml

    cfg = load_sweep(str(path), [], check=False)
    configs = backends.build(cfg).configs
    raw = yaml.safe_load(path.read_text())
    buckets = bucket_sizes(raw.get("space"), 1.0)
    every = LS.landscape_configs(cfg, configs, buckets)
    base = configs.baseline_params(cfg.space)
    chosen = stratified_sample(every, base, sample, seed)
    plan, comm = derive_any(raw, [ranks], list(layers), steps=steps)
    src = str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)
    return Model(cfg.name, src, cfg, configs, len(every), chosen, LS.key_of(base), list(plan.slices) + list(comm),
                 buckets)


def compact(result: Any) -> dict[str, Any]:
    """What the fit and the landscape keep of a trainer Result."""
    s = result.summary
    mem = {k: v.get("max") for k, v in (result.memory or {}).items() if isinstance(v, dict)}
    return {"step_time_s": s.step_time_s, "step_time_min_s": s.step_time_min_s,
            "peak_memory_bytes": s.peak_memory_bytes, "phases": {k: v["max"] for k, v in result.phases.items()},
            "memory": mem}


def as_result(rec: dict[str, Any]) -> Any:
    """A compact record back as the parts of a Result the fit reads (summary, phases, memory)."""
    return SimpleNamespace(summary=SimpleNamespace(step_time_s=rec["step_time_s"],
                                                   step_time_min_s=rec.get("step_time_min_s"),
                                                   peak_memory_bytes=rec.get("peak_memory_bytes")),
                           phases={k: {"max": v, "min": v} for k, v in rec["phases"].items()},
                           memory={k: {"max": v} for k, v in (rec.get("memory") or {}).items()})


class Runner:
    """One warm worker group for every model (a 2-rank group runs any 2-rank trainer config)."""

    def __init__(self, first: Model):
        backend = backends.build(first.cfg)
        backend.join()
        self.runner = backend.runner()
        self.reference: dict[str, Any] = {}

    @classmethod
    def warm(cls, models: Sequence["Model"]) -> "Runner":
        """A worker group that has taken each model's parity reference (a fresh run of its baseline, not stored)."""
        runner = cls(models[0])
        try:
            for m in models:
                runner.landscape_run(m, m.params[0])
        except BaseException:
            runner.close()
            raise
        return runner

    def run(self, config: Any) -> Any:
        self.runner.submit(0, config)
        done: list = []
        while not done:
            done = self.runner.poll(timeout_s=1.0)
        return done[0][1]

    def landscape_run(self, model: Model, params: dict[str, Any]) -> dict[str, Any]:
        """One landscape run as ``landscape.Measurer.run`` records it (parity against the model's baseline)."""
        config = model.configs.build(model.configs.overrides_for(model.cfg.space, params))
        load = os.getloadavg()[0]
        out = self.run(config)
        sample: dict[str, Any] = {"status": out.status, "reason": out.reason, "wall_s": out.wall_s, "load_1min": load,
                                  "at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
        if out.result is not None:
            sample.update(compact(out.result))
            if model.name not in self.reference:
                self.reference[model.name] = parity.reference_from_result(out.result)
            v = parity.compare(self.reference[model.name], out.result)
            sample["parity"] = {"passed": v["passed"], "first_fail_metric": v["first_fail_metric"],
                                "first_fail_step": v["first_fail_step"], "max_loss_rel_diff": v["max_loss_rel_diff"]}
        return sample

    def slice_run(self, s: Slice) -> dict[str, Any]:
        load = os.getloadavg()[0]
        out = self.run(s.config)
        rec = {"status": out.status, "reason": out.reason, "load_1min": load}
        if out.result is not None:
            rec.update(compact(out.result))
        return rec

    def close(self) -> None:
        self.runner.close()


def read_samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def measure(models: Sequence[Model], samples: Path, landscape_repeats: int, slice_repeats: int, seed: int = 0,
            say: Callable[[str], None] = print) -> None:
    """Every model's landscape configs and slices in shared rounds (module docstring); resumes from ``samples``."""
    have = {(r["model"], r["kind"], r["key"], r["round"]) for r in read_samples(samples)}
    jobs_of = lambda rnd: ([("landscape", m, LS.key_of(p), p) for m in models for p in m.params]  # noqa: E731
                           if rnd < landscape_repeats else []) + \
                          ([("slice", m, s.name, s) for m in models for s in m.slices] if rnd < slice_repeats else [])
    rounds = max(landscape_repeats, slice_repeats)
    total = sum(len(jobs_of(r)) for r in range(rounds))
    todo = total - sum(1 for r in range(rounds) for kind, m, key, _ in jobs_of(r) if (m.name, kind, key, r) in have)
    say(f"{total} runs in {rounds} rounds ({todo} to do): " + "; ".join(
        f"{m.name}: {len(m.params)} of {m.grid} configs x {landscape_repeats}, {len(m.slices)} slices x "
        f"{slice_repeats}" for m in models))
    if not todo:
        return
    runner = Runner.warm(models)
    try:
        t0, done = time.perf_counter(), 0
        for rnd in range(rounds):
            jobs = jobs_of(rnd)
            random.Random(seed * 1000 + rnd).shuffle(jobs)
            for kind, m, key, obj in jobs:
                if (m.name, kind, key, rnd) in have:
                    continue
                rec = runner.landscape_run(m, obj) if kind == "landscape" else runner.slice_run(obj)
                _append(samples, {"model": m.name, "kind": kind, "key": key, "round": rnd,
                                  **({"params": obj} if kind == "landscape" else {"role": obj.role}), **rec})
                done += 1
                left = (time.perf_counter() - t0) / done * (todo - done)
                if done % 10 == 0 or done == todo:
                    say(f"[{done}/{todo}] round {rnd} load {rec['load_1min']:.1f} (~{left / 60:.0f} min left)")
    finally:
        runner.close()


def refine(models: Sequence[Model], logs: dict[str, Path], picks: dict[str, list[str]], rounds: int, command: str,
           seed: int = 0, say: Callable[[str], None] = print) -> None:
    """The configs the goals turn on, measured again in ``rounds`` paired rounds: per model its baseline and
    ``picks[model]`` (keys), every model's in the same shuffled rounds, each run appended to the model's refinement
    log (``logs[model]``, bench/landscape.py's ``.refine.jsonl`` format, so ``landscape.write`` turns it into the
    landscape's ``refined`` block: each config's paired ratio to its baseline, the truth replay judges by).
    Resumes from the logs."""
    have: set[tuple[str, str, int]] = set()
    for m in models:
        for rec in read_samples(logs[m.name]):
            if "refine_round" in rec:
                have.add((m.name, rec["key"], int(rec["refine_round"])))
    keys = {m.name: [m.baseline_key] + [k for k in picks[m.name] if k != m.baseline_key] for m in models}
    by_key = {m.name: {LS.key_of(p): p for p in m.params} for m in models}
    todo = sum(1 for m in models for k in keys[m.name] for r in range(rounds) if (m.name, k, r) not in have)
    say(f"refinement: {rounds} paired rounds of " + "; ".join(f"{m.name}: the baseline and {len(keys[m.name]) - 1}"
                                                              for m in models) + f" ({todo} runs to do)")
    if not todo:
        return
    for m in models:  # one header per invocation, as bench/landscape.py's refinement writes it
        _append(logs[m.name], {"header": {"command": command, "top": len(keys[m.name]) - 1, "asked_rounds": rounds,
                                          "keys": keys[m.name], "machine": LS.machine(),
                                          "started_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}})
    runner = Runner.warm(models)
    try:
        t0, done = time.perf_counter(), 0
        for rnd in range(rounds):
            jobs = [(m, k) for m in models for k in keys[m.name]]
            random.Random(seed * 1000 + 700 + rnd).shuffle(jobs)
            for m, k in jobs:
                if (m.name, k, rnd) in have:
                    continue
                rec = runner.landscape_run(m, by_key[m.name][k])
                _append(logs[m.name], {"key": k, "refine_round": rnd, **rec})
                done += 1
                if done % 10 == 0 or done == todo:
                    left = (time.perf_counter() - t0) / done * (todo - done)
                    say(f"[refine {done}/{todo}] round {rnd} load {rec['load_1min']:.1f} (~{left / 60:.0f} min left)")
    finally:
        runner.close()


def slice_runs(samples: Sequence[dict[str, Any]], model: str) -> dict[str, dict[int, Any]]:
    """A model's slice runs that ended ok: name -> round -> a Result-like record (``as_result``)."""
    out: dict[str, dict[int, Any]] = defaultdict(dict)
    for r in samples:
        if r["model"] == model and r["kind"] == "slice" and r["status"] == "ok":
            out[r["key"]][int(r["round"])] = as_result(r)
    return dict(out)


def landscape_samples(samples: Sequence[dict[str, Any]], model: str) -> dict[str, list[dict[str, Any]]]:
    """A model's landscape runs by config key, as ``landscape.write`` takes them."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in samples:
        if r["model"] == model and r["kind"] == "landscape":
            out[r["key"]].append(r)
    return dict(out)


def replace_steps(s: Slice, steps: int) -> Slice:
    return dataclasses.replace(s, config=dataclasses.replace(
        s.config, run=dataclasses.replace(s.config.run, steps=steps)))
