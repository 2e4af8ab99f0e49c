"""``python -m orchestrator plan --config FILE [key=value ...] [--json]``: one "what if", no sweep.

The config is a sweep file with ``backend: model``: its ``planner:`` section and ``baseline:`` knobs make the
planned config, and each ``key=value`` changes it:

* a knob (``data_parallel.overlap_grad_reduce=true``, ``batch.micro_batch_size=2``; see planner KNOBS) is
  applied on top of the baseline;
* ``planner.<section>.<field>=value`` (``planner.efficiency.matmul_eff=0.85``) changes the planner section;
  ``planner.cluster_file=FILE`` / ``planner.calibration_file=FILE`` bring in a measured cluster (``steptune
  netcal``) or a fitted efficiency set (orchestrator/calibration/sources.py).

Values are read as YAML scalars (``true``, ``3``, ``0.5``, ``[mlp, norm]``). Out comes the prediction: the step
time with its interval and where the interval comes from (orchestrator/calibration/interval.py), the breakdown along
the critical path, memory per pipeline stage, MFU with its peak basis, which efficiency set produced it, and
the file's target judged on the interval: met, not met or undecided (``records.answer.interval_state``, the
sweep answer's rule). ``--best`` also searches the file's whole space (``planner.grid.best_config``) and judges
its fastest config the same way. A bad config or key is one line on stderr naming the field, exit status 2,
before anything is predicted.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

DEFAULT_CONFIG = "search_spaces/preset-500b.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE",
                   help=f"sweep file with backend: model (default: {DEFAULT_CONFIG})")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument("--best", action="store_true",
                   help="also search the file's space (every config, float knobs refined; seconds to a minute for "
                        "the 500B preset) and print its fastest config's interval and verdict")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="knobs on top of the baseline, or planner.<section>.<field>=value")


def main(args: argparse.Namespace) -> int:
    try:
        out = plan(args.config, args.overrides, best=args.best)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; known: {', '.join(known)}"


def _flat(d: Mapping[str, Any], prefix: str) -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}.{k}") if isinstance(v, Mapping) else [f"{prefix}.{k}"]
    return out


def _split_overrides(items: list[str], planner: dict, known_planner: list[str]) -> dict[str, Any]:
    """Apply planner.* overrides to ``planner`` in place; return the knob overrides."""
    from orchestrator.planner import KNOBS

    knobs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} must look like key=value (e.g. data_parallel.overlap_grad_reduce=true)")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        if key.startswith("planner."):
            if key not in known_planner:
                section = ".".join(key.split(".")[:2])
                fields = [k for k in known_planner if k.startswith(section + ".")]
                what = "field" if fields else "section"
                raise ValueError(f"{key}: unknown planner {what}{_did_you_mean(key, fields or known_planner)}")
            node = planner
            parts = key.split(".")[1:]
            for part in parts[:-1]:
                if isinstance(node.get(part), str):  # shorthand ``recompute: none`` -> a mapping
                    node[part] = {"kind": node[part]}
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        elif key in KNOBS:
            knobs[key] = value
        else:
            raise ValueError(f"{key}: unknown knob{_did_you_mean(key, list(KNOBS) + ['planner.<section>.<field>'])}")
    return knobs


def plan(path: str | Path, overrides: list[str], best: bool = False) -> dict[str, Any]:
    """The prediction for the sweep file's baseline with ``overrides`` applied, as a JSON-able mapping; with
    ``best``, also the fastest config of the file's space."""
    from orchestrator import planner as pl
    from orchestrator.calibration.interval import step_intervals
    from orchestrator.calibration.sources import FILE_KEYS, UNCERTAINTY_KEY, resolve
    from orchestrator.search.target import parse_target

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("planner"), Mapping):
        raise ValueError(f"{path}: planner: section missing (plan reads a sweep file with backend: model)")
    if raw.get("backend", "model") != "model":
        raise ValueError(f"{path}: backend: is {raw.get('backend')!r}; plan needs backend: model")
    planner = json.loads(json.dumps(raw["planner"]))  # a deep copy
    # Every field a planner section has (the file's, and the defaults of those it leaves out).
    defaults = pl.plan_config_to_dict(pl.PlanConfig(cluster=pl.ClusterSpec(num_gpus=1)))
    options = [f"planner.recompute.{f}" for f in ("kind", "method", "num_layers", "modules")] + [
        f"planner.pipeline.split.{f}" for f in ("kind", "first", "last")]
    files = [f"planner.{k}" for k in FILE_KEYS] + [f"planner.{UNCERTAINTY_KEY}.corpus"]
    known = sorted(set(_flat(defaults, "planner")) | set(_flat(planner, "planner")) | set(options) | set(files))
    knobs = _split_overrides(list(overrides), planner, known)
    planner, sources = resolve(planner, path.parent)
    base_knobs = dict(raw.get("baseline") or {})
    try:
        base = pl.plan_config_from_dict(planner)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    try:
        baseline = pl.apply_params(base, base_knobs)
    except ValueError as e:
        raise ValueError(f"{path}: baseline.{e}") from None
    cfg = pl.apply_params(baseline, knobs) if knobs else baseline
    pred, base_pred = pl.predict(cfg), pl.predict(baseline)
    target = parse_target(raw.get("target")) if raw.get("target") is not None else None
    target_s = target.seconds(base_pred.step_time_s) if target else None
    best_out = None
    if best:
        space = (raw.get("space") or {}).get("params")
        if not isinstance(space, Mapping) or not space:
            raise ValueError(f"--best: {path} has no space.params to search")
        t, params = _best(baseline, space)
        if not params:
            raise ValueError(f"--best: no config of {path}'s space fits in memory")
        best_cfg = pl.apply_params(baseline, params)
        best_out = {"params": params, "step_time_s": t}
    cfgs = [cfg] + ([best_cfg] if best_out else [])
    ivs = step_intervals(cfgs, sources)
    if best_out:
        best_out.update(interval=ivs[1].to_dict(),
                        target_verdict=ivs[1].verdict(target_s) if target_s is not None else None)
    return {
        "source": str(path), "overrides": list(overrides), "predicted": True,
        "efficiency_basis": cfg.efficiency.basis, "efficiency_note": cfg.efficiency.basis_note,
        "sources": {"network": sources.network, "compute": sources.compute, "warnings": list(sources.warnings)},
        "peak_tflops_per_gpu": cfg.cluster.peak_tflops, "num_gpus": cfg.cluster.num_gpus,
        "knobs": pl.knob_values(cfg), "baseline_step_time_s": base_pred.step_time_s,
        "target": target.describe(base_pred.step_time_s) if target else None, "target_s": target_s,
        "interval": ivs[0].to_dict(), "target_verdict": ivs[0].verdict(target_s) if target_s is not None else None,
        "best": best_out, "prediction": pred.to_dict(), "config": pl.plan_config_to_dict(cfg),
    }


def _best(baseline: Any, space: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    from orchestrator.planner.grid import best_config

    try:
        return best_config(baseline, space)
    except ValueError as e:
        raise ValueError(f"--best: {e}") from None


_PARTS = (("forward", "forward_s"), ("backward", "backward_s"), ("recompute", "recompute_s"),
          ("exposed dp comm", "dp_exposed_s"), ("pp bubble", "pp_bubble_s"), ("pp p2p", "pp_p2p_s"),
          ("tp comm", "tp_comm_s"), ("optimizer", "optimizer_s"))


def _dp_text(k: Mapping[str, Any]) -> str:
    if k["data_parallel.kind"] == "fsdp":
        return (f"fsdp (reshard_after_forward {k['data_parallel.reshard_after_forward']}, "
                f"prefetch {k['data_parallel.prefetch']})")
    return (f"overlap grad-reduce {k.get('data_parallel.overlap_grad_reduce', True)}, "
            f"param-gather {k['optimizer.overlap_param_gather']}")


def render(out: Mapping[str, Any]) -> str:
    p, k = out["prediction"], out["knobs"]
    gb = 1e9
    parts = [n for n in p["memory_per_stage"][0] if n != "total"]
    lines = [f"plan: {out['source']}" + (f" + {' '.join(out['overrides'])}" if out["overrides"] else "")
             + "  (PREDICTED by the planner, not measured)",
             f"layout: tp {k['tensor_parallel.size']} x pp {k['parallel.pp']} x dp {k['parallel.dp']} on {out['num_gpus']} "
             f"GPUs; micro_batch_size {k['batch.micro_batch_size']} ({p['microbatches']} microbatches), "
             f"{k['pipeline.schedule']}, recompute {k['recompute.kind']}, {_dp_text(k)}",
             f"efficiency set: {out['efficiency_basis']}" + (f" ({out['efficiency_note']})" if out["efficiency_note"] else ""),
             f"network: {out['sources']['network']}",
             *out["sources"].get("warnings", []),
             f"step time: {_interval_text(out['interval'])} per update",
             f"interval: {out['interval']['basis']}",
             "breakdown (critical path, s" + (f"; {out['interval']['level']:.0%} intervals" if out["interval"].get("phases")
                                               else "") + "): " + ", ".join(
                 f"{n} {p[key]:.3f}" + _phase_span(out["interval"], key) for n, key in _PARTS)
             + f"; data-parallel traffic before overlap {p['dp_total_s']:.3f}; critical stage {p['critical_stage']}",
             f"throughput: {p['tokens_per_s']:,.0f} tokens/s; MFU {p['mfu']:.1%} of {out['peak_tflops_per_gpu']:g} "
             f"TFLOP/s per GPU ({p['mfu_basis']})",
             "memory per pipeline stage (GB): " + " / ".join(n.replace("_", " ") for n in parts) + " = total"]
    for i, m in enumerate(p["memory_per_stage"]):
        lines.append(f"  stage {i}: " + " / ".join(f"{m[n] / gb:.1f}" for n in parts) + f" = {m['total'] / gb:.1f}")
    hbm = out["config"]["cluster"]["hbm_gb"]
    lines.append(f"peak {p['peak_memory_bytes'] / gb:.1f} GB of {hbm:g} GB per GPU: "
                 + ("fits" if p["fits_memory"] else "DOES NOT FIT"))
    if out["target_s"] is not None:
        lines.append(f"target {out['target']}: {_verdict_text(out['interval'], out['target_s'], out['target_verdict'])}")
    if out.get("best"):
        b = out["best"]
        lines += [f"best config of the file's space: {_interval_text(b['interval'])}  [{_params_text(b['params'])}]"]
        if out["target_s"] is not None:
            lines.append(f"  target {out['target']}: {_verdict_text(b['interval'], out['target_s'], b['target_verdict'])}")
    return "\n".join(lines)


def _phase_span(iv: Mapping[str, Any], key: str) -> str:
    """`` (2.41-2.90)`` for a phase whose interval the fit's replicates give, else nothing."""
    ph = (iv.get("phases") or {}).get(key)
    return f" ({ph['low']:.3f}-{ph['high']:.3f})" if ph and ph["high"] > ph["low"] else ""


def _interval_text(iv: Mapping[str, Any]) -> str:
    """``9.12 s (90%: 8.93-11.91 s)``: planner.uncertainty.Interval.text()."""
    from orchestrator.planner.uncertainty import Interval

    return Interval(iv["low"], iv["point"], iv["high"], iv["level"]).text()


def _verdict_text(iv: Mapping[str, Any], target_s: float, state: str) -> str:
    """The interval against the target, in the words of the sweep's answer (met / not met / undecided)."""
    span = f"{iv['level']:.0%} interval {iv['low']:.2f}-{iv['high']:.2f} s"
    return {"met": f"met (the whole {span} is at or under {target_s:.2f} s)",
            "not met": f"not met (the whole {span} is above {target_s:.2f} s)",
            "undecided": f"undecided (the {span} straddles {target_s:.2f} s; the point estimate "
                         f"{iv['point']:.2f} s is {'under' if iv['point'] <= target_s else 'over'} it)"}[state]


def _params_text(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
