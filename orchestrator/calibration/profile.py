"""The compute and the trainer's communication, measured: a sweep file -> short real runs of its layer shape at the
job's density -> a calibration file with each fitted parameter's interval.

The slices are ``orchestrator.calibration.slices`` (pure; any sweep file: the model backend's ``planner:`` section or the
ray backend's ``trainer:`` section): compute slices at one and two layers, data-parallel slices (each bucket size,
overlap off and on) and pipeline slices (each schedule, the fewest and the most microbatches), all on as many
ranks as a node of the job keeps busy (``slices.density``). ``orchestrator.calibration.slicefit`` fits them in one go:
only the parameters the slices pin down (the rest held at the cluster file's priors, named), each with a
bootstrap interval over the rounds, and an ``Uncertainty`` every prediction made with the file inherits. The
network's TP and pipeline bandwidths stay the cluster file's (``steptune netcal`` measures them).

``run`` is ``steptune profile``: ``_inputs`` (the sweep file, the cluster file, the density), ``_derive`` (the
slices, their memory checked before anything runs), ``_measure`` (every slice ``--repeats`` rounds, round by round),
``_settle`` (more rounds of the slices that weigh on a parameter not yet pinned down, up to ``--max-repeats``),
``_parity`` (with ``--parity``) and ``_write``. The slices run through the trial path a sweep uses, a warm Ray
worker group per rank count (parity off), handed in by the CLI as a ``SliceRunner`` since this room may not import
the backends; only when Ray cannot start do they run on the trainer's local launcher
(``trainer.launch.spawn_many``), with a note.
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from orchestrator.commands import steptune
from orchestrator.calibration.slices import Slice, SlicePlan, memory_refusal


SliceRunner = Callable[[list[Any], str], "tuple[list[Any], str]"]
"""(trainer configs, device) -> (per config, in order, its trainer Result or the exception that ended it; where
they ran, for the printout). Raises RunnerUnavailable when it cannot start."""


class RunnerUnavailable(RuntimeError):
    """The slice runner could not start (Ray could not be joined or could not place the group)."""


def provenance(slices: SlicePlan, fitted: Any, results: Sequence[Any], config: str, cluster_file: str,
               hardware: str, torch_version: str, when: str) -> dict[str, Any]:
    """What the calibration file's figures are: basis measured, on which hardware, of which shapes, what was
    fitted with which interval, what was held and why."""
    cal = fitted.calibration
    return {"basis": "measured", "command": "steptune profile", "sweep_file": config, "cluster_file": cluster_file,
            "date": when, "hardware": hardware, "torch": torch_version,
            "device": results[0].ranks[0].device_name if results and getattr(results[0], "ranks", None) else "?",
            "shape": dict(slices.shape), "layers": slices.layers, "ranks": slices.ranks, "tp": slices.tp,
            "shrink": slices.shrink,
            "production_gemms": slices.shrink == 1,
            "slices": [{"name": r.name, "role": r.role, "runs": r.runs, "measured_step_s": round(r.measured_step_s, 6),
                        "fitted_step_s": round(r.fitted_step_s, 6), "error_pct": round(r.error_pct, 2)}
                       for r in fitted.rows],
            "fitted": {k: {"value": round(v, 6), "interval_90": [round(x, 6) for x in fitted.interval(k)]}
                       for k, v in fitted.fitted.items()},
            "held": dict(fitted.identified.held),
            "not_pinned_down": [u.text() for u in fitted.unpinned],
            "fit_mean_abs_error_pct": {k: round(v["mean_abs_pct"], 2) for k, v in cal.errors_after.items()},
            "network": "tp and pp bandwidth efficiencies are the cluster file's (steptune netcal); the data-parallel "
                       "bucket cost and the pipeline send cost are fitted to the slices",
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
    """The GPU's name from the results, or this host's CPU model for a CPU run (``calibration.hardware``)."""
    from orchestrator.calibration.hardware import of_results

    return of_results(results)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the command ----------------------------------------------------------------------------------------

DEFAULT_CLUSTER = "search_spaces/clusters/cpu-local.yaml"


def add_arguments(p: Any) -> None:
    p.add_argument("--config", required=True, metavar="FILE",
                   help="a sweep file: backend model (planner: + space:) or ray (trainer: + space:), e.g. "
                        "search_spaces/tiny-profile.yaml")
    p.add_argument("--ranks", metavar="N",
                   help="local ranks each slice runs on (default: the job's density, every rank of a node busy as in "
                        "the job: min(the job's ranks, the cluster file's gpus_per_node)); any other count is refused")
    p.add_argument("--layers", default="1,2", metavar="L[,L]",
                   help="transformer layers per slice, one or several (default: 1,2; two counts tell the per-layer "
                        "costs from the per-pass ones)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="FILE",
                   help=f"this machine's cluster file: peak, memory budget, priors (default: {DEFAULT_CLUSTER})")
    p.add_argument("--out", metavar="FILE", help="calibration file to write (default: results/profile/<name>.yaml)")
    p.add_argument("--shrink", type=int, default=1, metavar="F",
                   help="divide hidden, heads, ffn and vocab by F so the slice fits (the fit then does not "
                        "describe the production GEMMs; model-backend files only)")
    p.add_argument("--steps", type=int, default=8, metavar="S",
                   help="updates per slice, the first one a warm-up (default: 8)")
    p.add_argument("--repeats", type=int, default=4, metavar="R",
                   help="rounds of every slice, interleaved; the fit takes each slice's median run (default: 4)")
    p.add_argument("--max-repeats", type=int, default=12, metavar="R",
                   help="rounds a slice may get in all: a fitted parameter not pinned down after --repeats gets more "
                        "rounds of the slices that weigh on it, up to this (default: 12)")
    p.add_argument("--bootstrap", type=int, default=40, metavar="N",
                   help="refits over resampled rounds for each fitted parameter's interval and the predictions' "
                        "(default: 40; needs --repeats >= 2)")
    p.add_argument("--no-dp-comm", action="store_true",
                   help="skip the data-parallel communication slices (bucket sizes x overlap on/off at dp >= 2)")
    p.add_argument("--no-pp-comm", action="store_true",
                   help="skip the pipeline slices (each schedule of the space at 2 stages)")
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


@dataclass(frozen=True)
class Inputs:
    """What ``steptune profile`` was asked: the sweep file read, the cluster file's figures, the density."""

    path: Path
    raw: Mapping[str, Any]
    cluster: Any
    prior: Any
    device: str
    ranks: int
    """Ranks per slice: the job's density."""
    world: int
    """The job's ranks (the density's input, stated in the output)."""
    layers: list[int]


def _inputs(args: Any) -> Inputs:
    """Read and check everything before anything runs; ValueError naming the flag or field."""
    import yaml

    from orchestrator.calibration.prefilter import load_cluster
    from orchestrator.calibration.slices import density, job_world
    from orchestrator.calibration.sources import resolve

    path = Path(args.config)
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"--config {path}: expected a sweep file (a mapping)")
    layers = int_list("--layers", args.layers)
    for flag, v, low in (("--repeats", args.repeats, 1), ("--max-repeats", args.max_repeats, args.repeats),
                         ("--bootstrap", args.bootstrap, 0)):
        if not isinstance(v, int) or v < low:
            raise ValueError(f"{flag}: must be an integer >= {low}, got {v!r}")
    cluster, prior = load_cluster(args.cluster)
    if raw.get("backend", "model") == "model" and isinstance(raw.get("planner"), Mapping):
        raw = {**raw, "planner": resolve(raw["planner"], path.parent)[0]}
    import os

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if raw.get("backend") == "ray" and device == "cuda":
        raw = {**raw, "trainer": {**raw["trainer"], "run": {**(raw["trainer"].get("run") or {}), "device": "cuda"}}}
    world = job_world(raw, cluster.num_gpus)
    # The job's node: a model-backend file describes the production cluster; a ray sweep runs on this one.
    per_node = int(((raw.get("planner") or {}).get("cluster") or {}).get("gpus_per_node") or cluster.gpus_per_node)
    here = torch.cuda.device_count() if device == "cuda" else os.cpu_count()
    ranks = density(world, per_node, None)
    if args.ranks is not None:
        asked = int_list("--ranks", args.ranks)
        if asked != [ranks]:
            raise ValueError(f"--ranks {args.ranks}: the job keeps {ranks} rank(s) of a node busy (its {world} "
                             f"rank(s), {per_node} per node); slices must occupy the node as the job does, so they "
                             f"run on {ranks} (drop --ranks, or pass {ranks})")
    density(world, per_node, here)  # refuses a node with fewer devices than the job keeps busy, naming both
    return Inputs(path, raw, cluster, prior, device, ranks, world, layers)


def _derive(inp: Inputs, args: Any) -> tuple[SlicePlan, tuple[Slice, ...]]:
    """The compute slices and the communication slices; memory checked first (ValueError naming a shrink)."""
    from orchestrator.calibration.slices import derive_any

    derive = lambda f: derive_any(inp.raw, [inp.ranks], inp.layers, f, args.steps, inp.device,  # noqa: E731
                                  not args.no_dp_comm, not args.no_pp_comm)
    slices, comm = derive(args.shrink)
    whole = dataclasses.replace(slices, slices=slices.slices + comm)
    if refusal := memory_refusal(whole, inp.cluster, inp.prior, args.cluster):
        # Name the smallest power-of-two shrink that fits, so the next command is one edit away.
        shrink = next((f for f in (args.shrink * 2 ** k for k in range(1, 11)) if inp.raw.get("backend", "model") ==
                       "model" and memory_refusal(derive(f)[0], inp.cluster, inp.prior, args.cluster) is None), None)
        raise ValueError(refusal + (f"; --shrink {shrink} fits" if shrink else ""))
    return slices, comm


def _measure(every: Sequence[Slice], rounds: Sequence[int], device: str, runner: SliceRunner | None,
             runs: dict[str, dict[int, Any]]) -> tuple[str, bool]:
    """Each slice once per round of ``rounds``, round by round, into ``runs`` (name -> round -> Result); (where they
    ran, whether any failed)."""
    flat, where = run_slices([s.config for s in every] * len(rounds), device, runner)
    failed = False
    for i, r in enumerate(flat):
        s, rnd = every[i % len(every)], rounds[i // len(every)]
        if isinstance(r, BaseException):
            failed = True
            print(f"slice {s.name} (round {rnd + 1}) failed: {str(r).splitlines()[0][:300]}")
        else:
            runs.setdefault(s.name, {})[rnd] = r
    return where, failed


def _settle(every: Sequence[Slice], runs: dict[str, dict[int, Any]], fit: Callable[[], Any], max_repeats: int,
            device: str, runner: SliceRunner | None) -> Any:
    """Fit; while a fitted parameter is not pinned down and its slice has fewer than ``max_repeats`` rounds, run
    more rounds of the slices of that slice's role (they are fitted together) and fit again."""
    fitted = fit()
    while fitted.unpinned:
        role = {s.name: s.role for s in every}
        names = {u.slice for u in fitted.unpinned if len(runs.get(u.slice, {})) < max_repeats}
        if not names:
            break
        again = [s for s in every if s.role in {role.get(n) for n in names}]
        have = max(len(v) for v in runs.values())
        more = min(max_repeats - have, max(1, max(u.rounds_needed for u in fitted.unpinned) - have))
        if more <= 0:
            break
        print(f"not pinned down yet: {', '.join(u.name for u in fitted.unpinned)}; {more} more round(s) of "
              f"{len(again)} {'/'.join(sorted({s.role for s in again}))} slice(s)")
        _measure(again, list(range(have, have + more)), device, runner, runs)
        fitted = fit()
    return fitted


def _parity(kept: list[Slice], runs: Mapping[str, Mapping[int, Any]]) -> tuple[list[Slice], list[dict[str, Any]]]:
    """``--parity``: each compute slice's median run against its canonical layout (``check_parity``), printed; the
    slices that failed are left out of the fit. (The slices kept, the checks for the calibration file.)"""
    from orchestrator.calibration.stability import median_run

    compute = [s for s in kept if s.role == "compute"]
    checked = check_parity(compute, [median_run(list(runs[s.name].values())) for s in compute])
    for c, s in zip(checked, compute):
        print(f"parity {s.name}: " + ("pass" if c["passed"] else f"FAIL ({c['why']}): left out of the fit"
                                      if c["passed"] is False else c["why"]))
    bad = {s.name for c, s in zip(checked, compute) if c["passed"] is False}
    return [s for s in kept if s.name not in bad], checked


def run(args: Any, runner: SliceRunner | None = None) -> int:
    """``steptune profile``: ``_inputs``, ``_derive``, ``_measure``, ``_parity``, ``_settle`` (fit), ``_write``; exit
    2 before running on bad input, 1 when a slice failed or a fitted parameter is still not pinned down."""
    from orchestrator.calibration import slicefit

    inp = _inputs(args)
    slices, comm = _derive(inp, args)
    every = list(slices.slices) + list(comm)
    print(f"profiling {len(slices.slices)} compute slice(s) + {len(comm)} communication slice(s) of {inp.path} on "
          f"{inp.ranks} {inp.device} rank(s) each (the job's density: its {inp.world} rank(s), "
          f"{inp.cluster.gpus_per_node} per node), {'/'.join(map(str, inp.layers))} layer(s), {args.repeats} "
          f"round(s): " + ", ".join(f"{k} {v}" for k, v in slices.shape.items()))
    for note in slices.notes:
        print(f"  note: {note}")
    runs: dict[str, dict[int, Any]] = {}
    where, failed = _measure(every, list(range(args.repeats)), inp.device, runner, runs)
    print(f"ran on {where}")
    kept = [s for s in every if runs.get(s.name)]
    if not kept:
        print("no slice ran to the end: nothing to fit, nothing written")
        return 1
    checked: list[dict[str, Any]] = []
    if args.parity:
        kept, checked = _parity(kept, runs)
        if not any(s.role == "compute" for s in kept):
            print("every compute slice failed parity: nothing to fit, nothing written")
            return 1
    n_boot = args.bootstrap if args.repeats > 1 else 0
    fitted = _settle(kept, runs, lambda: slicefit.fit(kept, runs, inp.cluster, inp.prior, n_boot=max(n_boot, 1)),
                     args.max_repeats, inp.device, runner)
    print()
    print(slicefit.format_fit(fitted))
    if fitted.unpinned:
        print("not pinned down after --max-repeats rounds: nothing written (" + "; ".join(u.text() for u in fitted.unpinned)
              + ")")
        return 1
    out = _write(inp, args, slices, kept, runs, fitted, checked)
    print(f"measured on {hardware_name([median_of(runs, s) for s in kept])} at {inp.ranks} rank(s) per slice")
    print(f"wrote {out} (basis: measured{', shrunk: not the production GEMMs' if args.shrink > 1 else ''}); use it:")
    print(f"  {steptune()} plan --config {shlex.quote(str(inp.path))} {shlex.quote(f'planner.calibration_file={out}')}")
    return 0 if not failed else 1


def median_of(runs: Mapping[str, Mapping[int, Any]], s: Slice) -> Any:
    from orchestrator.calibration.stability import median_run

    return median_run(list(runs[s.name].values()))


def _write(inp: Inputs, args: Any, slices: SlicePlan, kept: Sequence[Slice], runs: Mapping[str, Mapping[int, Any]],
           fitted: Any, checked: list[dict[str, Any]]) -> Path:
    import torch

    from orchestrator.calibration import hardware
    from orchestrator.calibration.ledger_fit import load_calibration, write_calibration

    eff = dataclasses.replace(fitted.efficiency, basis="fitted",
                              basis_note=f"steptune profile of {inp.path.name} on this node"
                              + (f" (shrunk {args.shrink}x: not the production GEMMs)" if args.shrink > 1 else ""))
    out = Path(args.out) if args.out else Path("results") / "profile" / f"{inp.raw.get('name', inp.path.stem)}.yaml"
    compute = [s for s in kept if s.role == "compute"]
    ran = dataclasses.replace(slices, slices=tuple(compute))
    results = [median_of(runs, s) for s in compute]
    prov = provenance(ran, fitted, results, str(inp.path), args.cluster, hardware_name(results),
                      str(torch.__version__), now())
    prov.update(hardware.identity(results, inp.cluster.peak_tflops))
    prov.update({"density": {"ranks_per_slice": inp.ranks, "job_ranks": inp.world,
                             "gpus_per_node": inp.cluster.gpus_per_node,
                             "rule": "every rank of a node busy at once, as in the job (slices.density)"},
                 "layers": inp.layers, "repeats": args.repeats, "rounds": {s.name: len(runs[s.name]) for s in kept},
                 "runs_step_s": {s.name: [round(float(r.summary.step_time_s), 6) for r in runs[s.name].values()]
                                 for s in kept},
                 "parity": checked or "off (steptune profile --parity checks each slice against its canonical run)"})
    write_calibration(dataclasses.replace(fitted.calibration, efficiency=eff), out, cluster_file=args.cluster,
                      provenance=prov, uncertainty=fitted.uncertainty,
                      header="# Planner efficiency fitted by `steptune profile` to measured slices of the "
                             "production layer shape.\n# Use it as planner.calibration_file=THIS; the efficiency: "
                             "section and the uncertainty: section are read back.\n")
    load_calibration(out)  # what was written must read back
    return out
