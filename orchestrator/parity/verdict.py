"""Loss-parity gate: a trial must learn exactly what the reference learns.

Pure functions. The reference is a run of the same maths (same seed, data, global batch, steps): the
canonical layout's run when there is one (orchestrator.parity.trust): per-step losses, per-step global gradient
norms and a layout-independent fingerprint of the final parameters (per-tensor L2 norm and sum under the
single-process model's names). A run is compared step by step; the first failing step and metric are
reported with their difference and tolerance. Tolerances are per metric and precision: HEADROOM x the largest
difference a legitimate layout makes, measured over a calibration set of layouts (LEGIT_LARGEST,
bench/parity_margins.py, docs/parity.md). Only bf16/GPU tolerances widen, by repeats, and never beyond
MAX_WIDENING x the floor.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer.measure.result import Result

# Settings that change the maths by design. A search over them is a different study (quality, not speed).
MATHS_FIELDS = ("model", "data", "batch.global_batch", "optim", "run.seed", "run.steps", "run.precision")
MATHS_PREFIXES = ("model.", "data.", "batch.global_batch", "optim.", "run.seed", "run.steps", "run.precision")

# Knobs that change the order of floating-point reductions (labelled as numerics risks in summaries).
REDUCTION_ORDER_KNOBS = ("data_parallel.bucket_mb", "data_parallel.overlap_grad_reduce", "data_parallel.kind",
                         "data_parallel.reshard_after_forward", "data_parallel.prefetch", "batch.micro_batch_size",
                         "parallel.dp", "tensor_parallel.size", "tensor_parallel.sequence_parallel")
"""Knobs that change the order of floating-point sums (bucketed or sharded reductions, microbatch accumulation,
row-parallel partial sums and sequence-parallel reduce-scatters): the summary's numerics-risk line names them."""

NUMERICS_CHANGING_KNOBS = {
    "optimizer.grad_reduce_dtype": "gradients are rounded to bf16 before they are summed over data-parallel "
                                   "replicas, not only summed in another order",
}
"""Knobs that change the arithmetic itself, not only its order (what the change does, per knob). Unlike
MATHS_FIELDS they stay throughput knobs a team may trade (Megatron offers bf16 gradient reduction for speed),
so a space may search them, but only when it says so (``space.allow_numerics_change``), and the summary's
numerics line names them whenever the best config uses one."""


@dataclass(frozen=True)
class Tolerance:
    loss_rel: float
    """Per-step loss, relative to the baseline's."""
    grad_norm_rel: float
    """Per-step global gradient norm, relative."""
    param_rel: float
    """Final parameters: per-tensor norm relative diff, and sum diff relative to the tensor's norm."""
    replica_abs: float
    """Largest element difference between data-parallel replicas of the trial itself."""


HEADROOM = 5.0
"""A tolerance is HEADROOM x the largest difference measured between legitimate layouts of the same maths
(bench/parity_margins.py's calibration set), rounded up to one significant digit (derive_tolerance)."""
MIN_TOLERANCE = 1e-7
"""No relative tolerance below a few fp32 roundings, whatever a calibration measured."""


def derive_tolerance(largest: dict[str, float], replica_abs: float) -> Tolerance:
    """The tolerance from the largest legitimate differences per metric (``loss_rel``, ``grad_norm_rel``,
    ``param_rel``): HEADROOM x each, rounded up to one significant digit, at least MIN_TOLERANCE."""
    def up(x: float) -> float:
        x = max(HEADROOM * x, MIN_TOLERANCE)
        mantissa, exp = f"{x:.6e}".split("e")
        return float(f"{math.ceil(float(mantissa) - 1e-9)}e{exp}")

    return Tolerance(loss_rel=up(largest["loss_rel"]), grad_norm_rel=up(largest["grad_norm_rel"]),
                     param_rel=up(largest["param_rel"]), replica_abs=replica_abs)


LEGIT_LARGEST = {
    "fp32": {"loss_rel": 2.3e-7, "grad_norm_rel": 1.5e-5, "param_rel": 3.5e-5},
    "bf16": {"loss_rel": 1.1e-3, "grad_norm_rel": 2.4e-2, "param_rel": 9.1e-2},
}
"""The largest difference between a legitimate layout and the canonical run, per metric and precision, measured
by bench/parity_margins.py over its calibration set (the tiny GPT in every layout family, tp 1 and 2, pp 1 and 2,
FSDP2, every recompute kind and the canonical run's self-check, 20 updates; three layouts each of the default and TP
search spaces' own models), rounded up to two significant digits (bench/results/parity_margins.md;
tests/unit/test_parity_certify.py keeps them in step). fp32's grad norm comes from the TP space (tp 2).
In bf16 (CPU autocast) rounding depends on the layout's shapes: legitimate layouts differ by up to 1e-3 in loss and
9% in the fingerprint, so the bf16 gate catches gross errors only (docs/parity.md, Tolerances)."""
REPLICA_ABS = 1e-6
"""Replicas of one legitimate run are bit-identical (measured 0 over the calibration set): any difference beyond a
rounding is a bug."""
DEFAULT_TOLERANCE = {precision: derive_tolerance(largest, REPLICA_ABS) for precision, largest in LEGIT_LARGEST.items()}
"""Per precision: HEADROOM x LEGIT_LARGEST. fp32 on CPU is exact run to run and never widens; bf16/GPU may widen by
a measured run-to-run spread (REPEAT_FACTOR, capped at MAX_WIDENING)."""
REPEAT_FACTOR = 10.0
"""bf16/GPU only: a tolerance may widen to REPEAT_FACTOR x the run-to-run spread of repeats of one layout."""
MAX_WIDENING = 5.0
"""The widening is capped: a tolerance never exceeds MAX_WIDENING x its precision's floor, whatever the spread.
fp32 on CPU is exact run to run and never widens at all (its floor is the tolerance)."""


def maths_key(train_cfg: dict[str, Any]) -> str:
    """Hash of everything that affects the maths: a reference is reused only under the same key."""
    picked = {}
    for f in MATHS_FIELDS:
        node: Any = train_cfg
        for part in f.split("."):
            node = node[part]
        picked[f] = node
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def check_space_is_throughput_only(param_names: list[str]) -> None:
    bad = [p for p in param_names if p.startswith(MATHS_PREFIXES)]
    if bad:
        raise ValueError(
            f"space.params varies {', '.join(sorted(bad))}: these change what the model learns (global batch, "
            f"learning rate or schedule, seed, data, model, precision, weight decay), so they are not throughput "
            f"knobs and a faster config would not be the same training. Remove them from the search space; a study "
            f"of them needs its own quality comparison."
        )


def check_numerics_opt_in(param_names: list[str], allowed: tuple[str, ...] | list[str]) -> None:
    """A space searching a knob of NUMERICS_CHANGING_KNOBS must list it in space.allow_numerics_change, and
    may list only such knobs there (an opt-in for a knob that only reorders sums would mean nothing)."""
    for name in allowed:
        if name not in NUMERICS_CHANGING_KNOBS:
            raise ValueError(f"space.allow_numerics_change: {name} does not change the arithmetic (only these do: "
                             f"{', '.join(NUMERICS_CHANGING_KNOBS)}); remove it from the list")
    for name in param_names:
        if name in NUMERICS_CHANGING_KNOBS and name not in allowed:
            raise ValueError(f"space.params.{name}: changes the maths ({NUMERICS_CHANGING_KNOBS[name]}); to search "
                             f"it anyway add `allow_numerics_change: [{name}]` under space:, or remove it from the space")


def layout_key(train_cfg: dict[str, Any]) -> str:
    """Hash of the whole config: runs under one layout key are repeats of one run (their spread is noise)."""
    return hashlib.sha256(json.dumps(train_cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reference_from_result(result: Result, precision: str | None = None, role: str = "baseline") -> dict[str, Any]:
    """What the store keeps of one run: per-step numbers, the fingerprint, and what it was (``role``:
    canonical or baseline) under which maths and layout."""
    return {
        "losses": [s.loss for s in result.steps],
        "grad_norms": [s.grad_norm for s in result.steps],
        "fingerprint": result.fingerprint,
        "precision": precision or result.config["run"]["precision"],
        "device": result.config["run"]["device"],
        "maths_key": maths_key(result.config),
        "layout_key": layout_key(result.config),
        "role": role,
    }


def tolerance_from_repeats(ref_a: dict[str, Any], ref_b: dict[str, Any], precision: str) -> Tolerance:
    """The precision's floor widened to REPEAT_FACTOR x the spread of two repeats, capped at MAX_WIDENING x floor."""
    floor = DEFAULT_TOLERANCE[precision]
    spread = _diffs(ref_a, ref_b)

    def widen(floor_value: float, diff: float) -> float:
        return min(max(floor_value, REPEAT_FACTOR * diff), MAX_WIDENING * floor_value)

    return Tolerance(
        loss_rel=widen(floor.loss_rel, spread["loss"]),
        grad_norm_rel=widen(floor.grad_norm_rel, spread["grad_norm"]),
        param_rel=widen(floor.param_rel, spread["param"]),
        replica_abs=floor.replica_abs,
    )


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _diffs(trial: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    loss = [_rel(a, b) for a, b in zip(trial["losses"], ref["losses"])]
    norm = [_rel(a, b) for a, b in zip(trial["grad_norms"], ref["grad_norms"])]
    return {"loss": max(loss, default=0.0), "grad_norm": max(norm, default=0.0),
            "param": _param_diff(trial["fingerprint"], ref["fingerprint"])}


def _param_diff(fp: dict[str, list[float]], ref: dict[str, list[float]]) -> float:
    if set(fp) != set(ref):
        return float("inf")
    worst = 0.0
    for name, (norm, total) in ref.items():
        t_norm, t_total = fp[name][0], fp[name][1]
        worst = max(worst, _rel(t_norm, norm), abs(t_total - total) / max(norm, 1e-12))
    return worst


def _at_failure(trial: dict[str, Any], ref: dict[str, Any], tol: Tolerance, step: int | None, metric: str | None,
                replica: float) -> tuple[float | None, float | None]:
    """(difference, tolerance) of the metric that failed first, at its step; (None, None) when nothing failed."""
    if step is None or metric == "steps":
        return None, None
    if metric == "loss":
        return _rel(trial["losses"][step], ref["losses"][step]), tol.loss_rel
    if metric == "grad_norm":
        return _rel(trial["grad_norms"][step], ref["grad_norms"][step]), tol.grad_norm_rel
    if metric == "replicas":
        return replica, tol.replica_abs
    return _param_diff(trial["fingerprint"], ref["fingerprint"]), tol.param_rel


def describe_failure(verdict: dict[str, Any]) -> str:
    """One line: the metric that failed, at which step, by how much against which tolerance."""
    metric, step = verdict.get("first_fail_metric"), verdict.get("first_fail_step")
    diff, allowed = verdict.get("first_fail_diff"), verdict.get("first_fail_tolerance")
    what = {"loss": "loss", "grad_norm": "grad norm", "replicas": "data-parallel replicas"}.get(metric, metric)
    if diff is None or allowed is None:
        return f"{what} differs at step {step}"
    kind = "absolute" if metric == "replicas" else "relative"
    return f"{what} differs at step {step}: {kind} difference {diff:.2e} > tolerance {allowed:.1e}"


def compare(reference: dict[str, Any], result: Result, precision: str | None = None,
            tolerance: Tolerance | None = None, prefix: bool = False) -> dict[str, Any]:
    """The verdict for one trial: pass/fail, the first failing step and metric, the worst differences.

    ``prefix``: the run made only the first updates of the reference's (a pruned trial's probe, on the same
    global steps and so the same data): those are compared, and the final parameters, which the reference
    only has after all of its updates, are not. The verdict's ``steps`` says how many updates it covers.
    """
    precision = precision or reference["precision"]
    tol = tolerance or DEFAULT_TOLERANCE[precision]
    trial = reference_from_result(result, precision)
    n = len(trial["losses"])
    if prefix and 0 < n < len(reference["losses"]):
        reference = {**reference, "losses": reference["losses"][:n], "grad_norms": reference["grad_norms"][:n],
                     "fingerprint": trial["fingerprint"]}  # not comparable: the reference's are n updates later
    else:
        prefix = False
    first_step, first_metric = None, None
    if len(trial["losses"]) != len(reference["losses"]):
        first_step, first_metric = 0, "steps"
    for step, (tl, rl, tn, rn) in enumerate(zip(trial["losses"], reference["losses"],
                                                trial["grad_norms"], reference["grad_norms"])):
        if first_step is not None:
            break
        if not _rel(tl, rl) <= tol.loss_rel:
            first_step, first_metric = step, "loss"
        elif not _rel(tn, rn) <= tol.grad_norm_rel:
            first_step, first_metric = step, "grad_norm"
    diffs = _diffs(trial, reference)
    final = len(reference["losses"]) - 1
    missing = sorted(set(reference["fingerprint"]) ^ set(trial["fingerprint"]))
    if first_step is None and not diffs["param"] <= tol.param_rel:
        first_step, first_metric = final, "parameters" if not missing else f"parameters ({len(missing)} differ in name)"
    if first_step is None and not result.replica_max_abs_diff <= tol.replica_abs:
        first_step, first_metric = final, "replicas"
    diff, allowed = _at_failure(trial, reference, tol, first_step, first_metric, result.replica_max_abs_diff)
    return {
        "passed": first_step is None,
        "first_fail_step": first_step,
        "first_fail_metric": first_metric,
        "first_fail_diff": diff,
        "first_fail_tolerance": allowed,
        "max_loss_rel_diff": diffs["loss"],
        "max_grad_norm_rel_diff": diffs["grad_norm"],
        "max_fingerprint_rel_diff": None if prefix else diffs["param"],
        "replica_max_abs_diff": result.replica_max_abs_diff,
        "tolerance": asdict(tol),
        "steps": len(reference["losses"]),
    }


class ReferenceStore:
    """Reference runs kept by what affects the maths: ``<root>/<maths_key>.json``.

    The first run stored under a key is the anchor every later run of those maths is compared with: the
    canonical run (the simplest layout of the maths, orchestrator.parity.trust) when it is there. A run is added
    only after it passed against the anchor (orchestrator.parity.trust checks first), so a run with a maths bug
    never enters the store and never widens a tolerance. A change of anything in MATHS_FIELDS is a different
    key, so a reference is never reused across it. Deleting the file starts that key over (needed only when
    the software or hardware changed on purpose and the old numbers are no longer expected).
    """

    KEEP = 8

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def runs(self, key: str) -> list[dict[str, Any]]:
        path = self.path(key)
        return json.loads(path.read_text())["runs"] if path.exists() else []

    def canonical(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.runs(key) if r.get("role") == "canonical"), None)

    def add(self, ref: dict[str, Any]) -> list[dict[str, Any]]:
        """Append a run that passed against the anchor (the caller checked); the anchor is always kept."""
        runs = self.runs(ref["maths_key"]) + [ref]
        runs = runs[:1] + runs[1:][-(self.KEEP - 1):]
        self._write(ref["maths_key"], runs)
        return runs

    def certify(self, key: str, self_check: dict[str, Any]) -> None:
        """Mark the anchor of ``key`` certified (orchestrator.parity.certify): a canonical run stored by an older
        version, reproduced and certified by this one."""
        runs = self.runs(key)
        self._write(key, [{**runs[0], "self_check": self_check}, *runs[1:]])

    def _write(self, key: str, runs: list[dict[str, Any]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.tmp"
        tmp.write_text(json.dumps({"maths_key": key, "runs": runs}))
        tmp.replace(self.path(key))


def needs_repeat(train_cfg: dict[str, Any]) -> bool:
    """bf16 or GPU runs need the baseline's own run-to-run spread for their tolerance; fp32 on CPU is exact."""
    return train_cfg["run"]["precision"] != "fp32" or train_cfg["run"]["device"] != "cpu"


def tolerance_for(runs: list[dict[str, Any]]) -> Tolerance:
    """The tolerance for comparing against ``runs[0]``: the precision's floor, widened only for bf16/GPU by the
    spread between repeats of one layout (never between two layouts: that difference is what is judged),
    and never beyond MAX_WIDENING x the floor."""
    precision = runs[0]["precision"]
    floor = DEFAULT_TOLERANCE[precision]
    if not needs_repeat({"run": {"precision": precision, "device": runs[0].get("device", "cpu")}}):
        return floor
    by_layout: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_layout.setdefault(r.get("layout_key", ""), []).append(r)
    spreads = [tolerance_from_repeats(group[0], other, precision)
               for group in by_layout.values() for other in group[1:]]
    if not spreads:
        return floor
    return Tolerance(*(max(getattr(t, f) for t in spreads) for f in Tolerance.__dataclass_fields__))


def numerics_note(params: dict[str, Any], baseline_params: dict[str, Any], verdict: dict[str, Any] | None) -> str | None:
    """A config's knobs that change the arithmetic (NUMERICS_CHANGING_KNOBS) or the order of floating-point
    reductions (REDUCTION_ORDER_KNOBS) relative to the baseline, with the parity run's measured differences.

    Reordering alone is named only with a measured verdict (a predicted sweep reorders in nearly every config,
    and the parity gate of a real sweep judges it); a change of the arithmetic is always named, and without a
    verdict the line says that no parity run judged it."""
    differs = lambda k: params[k] != baseline_params.get(k)  # noqa: E731
    maths = sorted(k for k in params if k in NUMERICS_CHANGING_KNOBS and differs(k))
    reorder = sorted(k for k in params if k.startswith(REDUCTION_ORDER_KNOBS) and differs(k))
    if not maths and not (reorder and verdict):
        return None
    parts = [f"{k}={params[k]} changes the maths: {NUMERICS_CHANGING_KNOBS[k]}" for k in maths]
    if reorder:
        parts.append(f"{', '.join(reorder)} change the order of floating-point reductions")
    if verdict:
        judged = (f"measured vs the baseline: loss {verdict['max_loss_rel_diff']:.1e}, grad norm "
                  f"{verdict['max_grad_norm_rel_diff']:.1e}, parameters {_e(verdict['max_fingerprint_rel_diff'])} "
                  f"(relative; tolerances {verdict['tolerance']['loss_rel']:.0e} / "
                  f"{verdict['tolerance']['grad_norm_rel']:.0e} / {verdict['tolerance']['param_rel']:.0e})")
    else:
        judged = "no parity run judged it (predicted, not run): check the loss curve on a real run before adopting it"
    return f"numerics risk: {'; '.join(parts)}; {judged}"


def _e(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"
