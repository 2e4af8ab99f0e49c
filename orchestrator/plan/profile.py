"""The compute, measured: a sweep file -> short real runs of its layer shape -> a calibration file.

The slices and their memory check are ``orchestrator.plan.slices`` (pure; any sweep file: the model backend's
``planner:`` section or the ray backend's ``trainer:`` section, several rank and layer counts). ``fit_slices``
hands the measured results to the planner's calibration, compute side only; the data-parallel slices (bucket
sizes x overlap) are fitted by ``orchestrator.plan.commfit``; the rest of the network stays whatever the cluster
file says (``steptune netcal`` measures it). Every slice runs ``--repeats`` rounds and the fits take medians.
``run`` is ``steptune profile``; the slices run through the trial path a sweep uses, a warm Ray worker group
per rank count (parity off), handed in by the CLI as a ``SliceRunner`` since this room may not import the
backends; only when Ray cannot start do they run on the trainer's local launcher (``trainer.launch.spawn_many``),
with a note.
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from orchestrator.commands import steptune
from orchestrator.plan.slices import Slice, SlicePlan, derive_slices, memory_refusal
from orchestrator.planner import Calibration, ClusterSpec, Efficiency, calibrate

COMPUTE_FIT = ("matmul_eff", "flash_attention_eff", "op_overhead_us", "elementwise_bw_eff", "optimizer_bw_eff",
               "mem_activation_factor")
"""What one node's slices can tell apart. The network efficiencies (tp/dp/pp_bw_eff) are never fitted here:
a slice's collectives run over this node's links, not the production fabric."""
COMPUTE_METRICS = ("step_time_s", "forward_s", "backward_incl_recompute_s", "optimizer_s", "peak_memory_bytes")
"""Measured phases fitted; dp and tp communication waits are network time and left out."""


SliceRunner = Callable[[list[Any], str], "tuple[list[Any], str]"]
"""(trainer configs, device) -> (per config, in order, its trainer Result or the exception that ended it; where
they ran, for the printout). Raises RunnerUnavailable when it cannot start."""


class RunnerUnavailable(RuntimeError):
    """The slice runner could not start (Ray could not be joined or could not place the group)."""


@dataclass(frozen=True)
class SliceFit:
    calibration: Calibration
    rows: tuple[tuple[str, float, float, float], ...]
    """(slice name, measured step time, the same with its TP collectives at the cluster file's price, step time
    predicted with the fitted efficiency)."""
    tp_comm: tuple[tuple[str, float, float], ...] = ()
    """(slice name, measured TP communication, the planner's from the cluster file's network) at tp > 1."""


def fit_slices(slices: SlicePlan, results: Sequence[Any], cluster: ClusterSpec, prior: Efficiency) -> SliceFit:
    """Calibrate the compute-side efficiency to the slices' measured results (trainer Results, in order)."""
    from orchestrator.plan.calibration import measured_metrics
    from orchestrator.plan.prefilter import plan_for_trial
    from orchestrator.planner.calibrate import _evaluate
    from orchestrator.planner.knobs import encode

    if prior.flash_attention_eff is None:  # None reads as attention_eff; the fit needs a number to start from
        prior = dataclasses.replace(prior, flash_attention_eff=prior.attention_eff)
    records, tp_rows = [], []
    for s, result in zip(slices.slices, results):
        plan = plan_for_trial(s.config, cluster, prior)
        tp = s.config.tensor_parallel.size > 1
        measured = {k: v for k, v in measured_metrics(result, tp).items() if k in COMPUTE_METRICS}
        if s.config.parallel.dp > 1:  # its step holds the DP gradient all-reduce: network time, not fitted here
            measured = {k: v for k, v in measured.items() if k != "step_time_s"}
        tp_meas = measured_metrics(result, tp).get("tp_comm_s", 0.0)
        tp_pred = _evaluate(plan, encode([plan]), prior)["tp_comm_s"]
        if "step_time_s" in measured and s.config.tensor_parallel.size > 1:
            # The measured TP collectives are this node's links, priced by the cluster file (netcal), not by
            # the compute efficiencies: swap them for the planner's own figure so the fit cannot soak them up.
            measured["step_time_s"] += tp_pred - tp_meas
        records.append((s.name, plan, measured))
        tp_rows.append((s.name, tp_meas, tp_pred))
    fit = list(COMPUTE_FIT)
    if len({s.config.batch.micro_batch_size for s in slices.slices}) > 2:
        fit.append("gemm_tokens_half")  # trades off against matmul_eff unless the GEMM sizes vary
    cal = calibrate([{"config": p, "measured": m} for _, p, m in records], records[0][1], fit=tuple(fit))
    # The error is of what was fitted: the step with the measured TP collectives priced as the cluster file does.
    rows = tuple((s.name, float(r.summary.step_time_s), m.get("step_time_s", float(r.summary.step_time_s)),
                  _evaluate(p, encode([p]), cal.efficiency)["step_time_s"])
                 for s, r, (_, p, m) in zip(slices.slices, results, records))
    return SliceFit(cal, rows, tuple(r for r, sl in zip(tp_rows, slices.slices) if sl.config.tensor_parallel.size > 1))


def provenance(slices: SlicePlan, fitted: SliceFit, results: Sequence[Any], config: str, cluster_file: str,
               hardware: str, torch_version: str, when: str) -> dict[str, Any]:
    """What the calibration file's figures are: basis measured, on which hardware, of which shapes."""
    cal = fitted.calibration
    return {"basis": "measured", "command": "steptune profile", "sweep_file": config, "cluster_file": cluster_file,
            "date": when, "hardware": hardware, "torch": torch_version,
            "device": results[0].ranks[0].device_name if results and results[0].ranks else "?",
            "shape": dict(slices.shape), "layers": slices.layers, "ranks": slices.ranks, "tp": slices.tp,
            "shrink": slices.shrink,
            "production_gemms": slices.shrink == 1,
            "slices": [{"name": n, "measured_step_s": round(raw, 6), "compared_step_s": round(m, 6),
                        "fitted_step_s": round(p, 6), "error_pct": round(100 * (p - m) / m, 2)}
                       for n, raw, m, p in fitted.rows],
            "fitted": sorted(cal.fitted), "fit_mean_abs_error_pct": {k: round(v["mean_abs_pct"], 2)
                                                                     for k, v in cal.errors_after.items()},
            "network": "not fitted: tp/dp/pp bandwidth efficiencies are the cluster file's (steptune netcal)",
            "tp_comm": [{"name": n, "measured_s": round(m, 6), "predicted_s": round(p, 6)} for n, m, p in fitted.tp_comm],
            "measured": measurements(slices, results),
            "notes": list(slices.notes)}


def measurements(slices: SlicePlan, results: Sequence[Any]) -> list[dict[str, Any]]:
    """What each slice measured, per layer where it is a per-layer quantity (the median update's seconds, the
    slowest rank's).

    Forward and backward are per layer (the slice's whole pass over its ``layers``: embedding and head
    included, which is why the fit, not this division, is what the planner uses); backward includes any
    recompute, whose own time is the backward's excess over the slice with the same micro-batch size and no
    recompute, when the space has both. TP communication sits inside forward and backward. The optimizer
    step is per update. Memory is per rank: parameters and peak saved activations."""
    def phase(r: Any, name: str) -> float:
        v = (r.phases.get(name) or {}).get("max")
        return float(v) if isinstance(v, (int, float)) else 0.0

    def key(c: Any) -> tuple:
        return c.batch.micro_batch_size, c.tensor_parallel.size, c.model.n_layers, c.world_size

    plain = {key(s.config): r for s, r in zip(slices.slices, results) if s.config.recompute.kind == "none"}
    out = []
    for s, r in zip(slices.slices, results):
        def per_layer(v: float) -> float:
            return round(v / s.config.model.n_layers, 6)

        row = {"name": s.name, "forward_s_per_layer": per_layer(phase(r, "forward")),
               "backward_s_per_layer": per_layer(phase(r, "backward")),
               "tp_comm_s_per_layer": per_layer(phase(r, "tp_comm")),
               "optimizer_s_per_update": round(phase(r, "optimizer"), 6),
               "param_bytes_per_rank": (r.memory.get("param_bytes") or {}).get("max"),
               "saved_activation_peak_bytes_per_rank": (r.memory.get("saved_activation_peak_bytes") or {}).get("max")}
        base = plain.get(key(s.config))
        if s.config.recompute.kind != "none" and base is not None:
            row["recompute_s_per_layer"] = per_layer(max(0.0, phase(r, "backward") - phase(base, "backward")))
        out.append(row)
    return out


def hardware_name(results: Sequence[Any]) -> str:
    """The GPU's name from the results, or this host's CPU model for a CPU run (``plan.hardware``)."""
    from orchestrator.plan.hardware import of_results

    return of_results(results)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_table(fitted: SliceFit) -> str:
    w = max(len(r[0]) for r in fitted.rows)
    tp = fitted.tp_comm and "  (TP comm at the cluster file's price)"
    lines = [f"{'slice':<{w}}  {'measured s':>10}  {'compared s':>10}  {'fitted s':>10}  {'error':>7}{tp or ''}"]
    lines += [f"{n:<{w}}  {raw:10.4f}  {m:10.4f}  {p:10.4f}  {100 * (p - m) / m:+6.1f}%" for n, raw, m, p in fitted.rows]
    lines += [f"{n}: tp comm measured {m:.4f} s, the cluster file's network predicts {p:.4f} s (not fitted here: "
              f"steptune netcal measures it)" for n, m, p in fitted.tp_comm]
    return "\n".join(lines)


# ---- the command ----------------------------------------------------------------------------------------

DEFAULT_CLUSTER = "search_spaces/clusters/cpu-local.yaml"


def add_arguments(p: Any) -> None:
    p.add_argument("--config", required=True, metavar="FILE",
                   help="a sweep file: backend model (planner: + space:) or ray (trainer: + space:), e.g. "
                        "search_spaces/tiny-profile.yaml")
    p.add_argument("--ranks", default="2", metavar="N[,N]",
                   help="local ranks to run the slices on, one or several (e.g. 1,2; default: 2)")
    p.add_argument("--layers", default="2", metavar="L[,L]",
                   help="transformer layers per slice, one or several (e.g. 1,2; default: 2)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="FILE",
                   help=f"this machine's cluster file: peak, memory budget, priors (default: {DEFAULT_CLUSTER})")
    p.add_argument("--out", metavar="FILE", help="calibration file to write (default: results/profile/<name>.yaml)")
    p.add_argument("--shrink", type=int, default=1, metavar="F",
                   help="divide hidden, heads, ffn and vocab by F so the slice fits (the fit then does not "
                        "describe the production GEMMs; model-backend files only)")
    p.add_argument("--steps", type=int, default=4, metavar="S", help="updates per slice, the first one a warm-up (default: 4)")
    p.add_argument("--repeats", type=int, default=3, metavar="R",
                   help="runs of every slice, interleaved round by round; the fit takes each slice's median "
                        "(default: 3)")
    p.add_argument("--bootstrap", type=int, default=20, metavar="N",
                   help="refits over resampled runs for each compute parameter's interval; one not pinned down "
                        "refuses the file (default: 20; 0: skip; needs --repeats >= 2)")
    p.add_argument("--no-dp-comm", action="store_true",
                   help="skip the data-parallel communication slices (bucket sizes x overlap on/off at dp >= 2)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="run the slices on an existing Ray cluster (this repository shipped as the working_dir); one "
                        "that cannot be joined is an error (default: an embedded local Ray, as a sweep; if that "
                        "cannot start, the trainer's local launcher, and the output says so)")
    p.add_argument("--slice-timeout-s", type=float, default=600.0, metavar="S",
                   help="seconds one slice may take before its worker group is killed (default: 600)")
    p.add_argument("--parity", action="store_true",
                   help="also check each slice against its one-rank canonical run (the sweep's parity gate); a "
                        "slice that fails is reported and left out of the fit (default: off, like a probe)")


def int_list(flag: str, text: Any) -> list[int]:
    """``--layers 1,2`` -> [1, 2]; ValueError naming the flag."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(v < 1 for v in out):
        raise ValueError(f"{flag}: expected integers >= 1, comma-separated (e.g. {flag} 1,2), got {text!r}")
    return list(dict.fromkeys(out))


def check_parity(slices: Sequence[Slice], results: Sequence[Any]) -> list[dict[str, Any]]:
    """Each slice against the canonical layout of its own maths (``parity.trust.canonical_config``: one rank,
    one microbatch, no recompute, tp 1), run on the trainer's local launcher, under the sweep's tolerances."""
    from orchestrator.parity import trust
    from orchestrator.parity.verdict import compare, describe_failure, reference_from_result
    from trainer.launch import spawn_many

    canon = spawn_many([trust.canonical_config(s.config) for s in slices])
    out = []
    for s, r, c in zip(slices, results, canon):
        if isinstance(c, BaseException):
            out.append({"name": s.name, "passed": None, "why": f"the canonical run failed: {str(c)[:200]}"})
            continue
        v = compare(reference_from_result(c, role="canonical"), r)
        out.append({"name": s.name, "passed": bool(v["passed"]),
                    "why": None if v["passed"] else describe_failure(v)})
    return out


def _by_world(cfgs: list[Any], run: Callable[[list[Any]], "tuple[list[Any], str]"]) -> tuple[list[Any], str]:
    """``run`` once per world size (a worker group or a local world is formed for one rank count), order kept."""
    sizes = list(dict.fromkeys(getattr(c, "world_size", 0) for c in cfgs))
    if len(sizes) <= 1:
        return run(cfgs)
    out: list[Any] = [None] * len(cfgs)
    wheres = []
    for n in sizes:
        idx = [i for i, c in enumerate(cfgs) if c.world_size == n]
        got, where = run([cfgs[i] for i in idx])
        for i, r in zip(idx, got):
            out[i] = r
        wheres.append(where)
    return out, "; ".join(dict.fromkeys(wheres))


def run_slices(cfgs: list[Any], device: str, runner: SliceRunner | None) -> tuple[list[Any], str]:
    """The slices on ``runner`` (the sweep's warm Ray group); on the local launcher only when there is no runner
    or it cannot start, and then the second value says why. One group or world per rank count."""
    if runner is not None:
        try:
            return _by_world(cfgs, lambda c: runner(c, device))
        except RunnerUnavailable as e:
            why = f"Ray could not start ({str(e).splitlines()[0][:200]})"
    else:
        why = "no Ray runner was given"
    from trainer.launch import spawn_many

    return _by_world(cfgs, lambda c: (spawn_many(c), f"the trainer's local launcher (note: {why})"))


def run(args: Any, runner: SliceRunner | None = None) -> int:
    """``steptune profile``: derive, check memory, run (on ``runner``) ``--repeats`` rounds, fit compute and DP
    communication, write; exit 2 before running on bad input, 1 when a fit is refused (nothing written)."""
    import yaml

    from orchestrator.plan import commfit, hardware
    from orchestrator.plan.stability import compute_intervals, median_run, unpinned
    from orchestrator.plan.calibration import load_calibration, write_calibration
    from orchestrator.plan.prefilter import load_cluster, plan_for_trial
    from orchestrator.plan.slices import derive_any
    from orchestrator.plan.sources import resolve

    path = Path(args.config)
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"--config {path}: expected a sweep file (a mapping)")
    ranks, layers = int_list("--ranks", args.ranks), int_list("--layers", args.layers)
    if args.repeats < 1:
        raise ValueError(f"--repeats: must be an integer >= 1, got {args.repeats}")
    cluster, prior = load_cluster(args.cluster)
    if raw.get("backend", "model") == "model" and isinstance(raw.get("planner"), Mapping):
        raw = {**raw, "planner": resolve(raw["planner"], path.parent)[0]}
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if raw.get("backend") == "ray" and device == "cuda":
        raw = {**raw, "trainer": {**raw["trainer"], "run": {**(raw["trainer"].get("run") or {}), "device": "cuda"}}}
    derive = lambda f: derive_any(raw, ranks, layers, f, args.steps, device, not args.no_dp_comm)  # noqa: E731
    slices, comm = derive(args.shrink)
    if device == "cuda" and torch.cuda.device_count() < max(ranks):
        raise ValueError(f"--ranks {max(ranks)}: this node has {torch.cuda.device_count()} GPU(s)")
    whole = dataclasses.replace(slices, slices=slices.slices + comm)
    if refusal := memory_refusal(whole, cluster, prior, args.cluster):
        # Name the smallest power-of-two shrink that fits, so the next command is one edit away.
        shrink = next((f for f in (args.shrink * 2 ** k for k in range(1, 11)) if raw.get("backend", "model") ==
                       "model" and memory_refusal(derive(f)[0], cluster, prior, args.cluster) is None), None)
        raise ValueError(refusal + (f"; --shrink {shrink} fits" if shrink else ""))
    out = Path(args.out) if args.out else Path("results") / "profile" / f"{raw.get('name', path.stem)}.yaml"
    print(f"profiling {len(slices.slices)} compute slice(s) + {len(comm)} data-parallel slice(s) of {path} on "
          f"{'/'.join(map(str, ranks))} {device} rank(s), {'/'.join(map(str, layers))} layer(s), {args.repeats} "
          f"round(s): " + ", ".join(f"{k} {v}" for k, v in slices.shape.items()))
    for note in slices.notes:
        print(f"  note: {note}")
    every = list(whole.slices)
    flat, where = run_slices([s.config for s in every] * args.repeats, device, runner)
    print(f"ran on {where}")
    runs: dict[str, list[Any]] = {s.name: [] for s in every}
    for i, r in enumerate(flat):
        s = every[i % len(every)]
        if isinstance(r, BaseException):
            print(f"slice {s.name} (round {i // len(every) + 1}) failed: {str(r).splitlines()[0][:300]}")
        else:
            runs[s.name].append(r)
    failed = any(isinstance(r, BaseException) for r in flat)
    kept = [(s, median_run(runs[s.name])) for s in slices.slices if runs[s.name]]
    if not kept:
        print("no slice ran to the end: nothing to fit, nothing written")
        return 1
    checked: list[dict[str, Any]] = []
    if args.parity:
        checked = check_parity([s for s, _ in kept], [r for _, r in kept])
        for c, (s, _) in zip(checked, kept):
            print(f"parity {s.name}: " + ("pass" if c["passed"] else f"FAIL ({c['why']}): left out of the fit"
                                          if c["passed"] is False else c["why"]))
        kept = [k for k, c in zip(kept, checked) if c["passed"] is not False]
        if not kept:
            print("every slice failed parity: nothing to fit, nothing written")
            return 1
    ran = dataclasses.replace(slices, slices=tuple(s for s, _ in kept))
    fitted = fit_slices(ran, [r for _, r in kept], cluster, prior)
    eff = dataclasses.replace(fitted.calibration.efficiency, basis="fitted",
                              basis_note=f"steptune profile of {path.name} on this node"
                                         + (f" (shrunk {args.shrink}x: not the production GEMMs)" if args.shrink > 1 else ""))
    intervals: dict[str, tuple[float, float]] = {}
    if args.repeats > 1 and args.bootstrap > 0:
        intervals = compute_intervals(ran, {s.name: runs[s.name] for s in ran.slices},
                                      lambda rs: fit_slices(ran, rs, cluster, prior).calibration.fitted, args.bootstrap)
        print("compute fit, 90% intervals (bootstrap over runs): " + ", ".join(
            f"{k} {lo:.4g}-{hi:.4g}" for k, (lo, hi) in intervals.items()))
        if why := unpinned(fitted.calibration.fitted, intervals, {s.name: runs[s.name] for s in ran.slices}):
            print(f"compute: {why}: nothing written")
            return 1
    comm_fit = None
    if comm:
        obs = [commfit.DPObservation(s.name, plan_for_trial(s.config, cluster, eff), tuple(
            float((r.phases.get("dp_comm_wait") or {}).get("max") or 0.0) for r in runs[s.name]))
            for s in comm if runs[s.name]]
        try:
            comm_fit = commfit.fit_dp_comm(obs, eff)
        except ValueError as e:
            print(f"data-parallel communication: {e}: nothing written")
            return 1
        print()
        print(commfit.format_comm_fit(comm_fit))
        if comm_fit.refusal:
            print(f"data-parallel communication: {comm_fit.refusal}: nothing written")
            return 1
        eff = comm_fit.efficiency(eff)
    cal = dataclasses.replace(fitted.calibration, efficiency=eff, fitted={
        **fitted.calibration.fitted, **(comm_fit.values if comm_fit else {})})
    results = [r for _, r in kept]
    prov = provenance(ran, fitted, results, str(path), args.cluster, hardware_name(results),
                      str(torch.__version__), now())
    prov.update(hardware.identity(results, cluster.peak_tflops))
    prov.update({"ranks": ranks, "layers": layers, "repeats": args.repeats,
                 "compute_interval_90": {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in intervals.items()}
                 or "not estimated (--repeats 1 or --bootstrap 0)",
                 "runs_step_s": {n: [round(float(r.summary.step_time_s), 6) for r in rs] for n, rs in runs.items()},
                 "dp_comm": commfit.provenance(comm_fit) if comm_fit else "not measured (dp 1 or --no-dp-comm): "
                 "dp_latency_us, dp_bw_eff and dp_overlap_eff are the cluster file's"})
    if comm_fit:
        prov["network"] = ("tp/pp bandwidth efficiencies are the cluster file's (steptune netcal); "
                           "dp_latency_us, dp_bw_eff, dp_overlap_eff fitted to the data-parallel slices")
    prov["parity"] = checked or "off (steptune profile --parity checks each slice against its canonical run)"
    write_calibration(cal, out, cluster_file=args.cluster, provenance=prov,
                      header="# Planner efficiency fitted by `steptune profile` to measured slices of the "
                             "production layer shape.\n# Use it as planner.calibration_file=THIS; only the "
                             "efficiency: section is read back.\n")
    load_calibration(out)  # what was written must read back
    print()
    print(format_table(fitted))
    print()
    print("fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in cal.fitted.items()))
    print(f"measured on {prov['hardware']} (torch {prov['torch']}, {prov['backend']})")
    print(f"wrote {out} (basis: measured{', shrunk: not the production GEMMs' if args.shrink > 1 else ''}); use it:")
    print(f"  {steptune()} plan --config {shlex.quote(str(path))} {shlex.quote(f'planner.calibration_file={out}')}")
    return 0 if not failed else 1
