"""The trust chain of the parity gate: canonical layout -> baseline -> trials.

A trial is judged against a reference, and the reference is only as good as the run it came from. So:

1. **Canonical run.** Per maths key (orchestrator.parity.verdict.maths_key) the simplest layout of the same
   maths is run once: one rank (no data-parallel reduction, so no bucket and no overlap), one pipeline
   stage, tensor parallelism 1 where it exists, no recompute, and the whole per-step batch as one
   microbatch (or the largest microbatch that fits the device; then the settings it shares with the
   baseline are named). It shares no layout knob with any multi-rank trial, has the same maths key as the
   baseline by construction, and anchors the store once it has certified itself (orchestrator.parity.certify:
   the same maths as microbatches of one sequence must agree); a stored certified one is not run again.
2. **Baseline.** Compared with the anchor before anything is judged against it. If it does not match, its
   active layout families are set back to canonical one at a time (``FAMILIES``, ``suspects``) and the
   family whose reset makes it agree is named (``blame``), or, when none alone does, the pair of families set
   back together that does (``pairs``); the sweep then stops. A reference taken from a
   buggy baseline would pass the same bug in every trial and fail every correct one.
3. **Trials.** Compared with the anchor under the same tolerance; a pruned trial on its probe's steps.

Runs are compared first and stored only when they pass (orchestrator.parity.verdict.ReferenceStore), so the
store never drifts. Only the ray backend runs this: the model backend predicts and has no parity to check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator.parity import blame as blame_sentence
from orchestrator.parity import certify
from orchestrator.parity import verdict as parity
from trainer.config import ReplicateDP, TrainConfig, apply_overrides, flatten
from trainer.knobs import KNOB_SECTIONS, BalancedSplit, TensorParallel

CANONICAL = {"parallel.pp": 1, "parallel.dp": 1, "tensor_parallel.size": 1, "pipeline.virtual_stages": 1,
             "data_parallel.kind": "replicate", "data_parallel.overlap_grad_reduce": False, "recompute.kind": "none"}
"""Settings of the canonical layout where a knob section's default is not already the plainest (a section
absent from this trainer is left out). Every other knob takes its section's default (trainer.knobs), so a new
knob joins the canonical layout without a line here; the microbatch size is the whole batch (canonical_config)."""
PROBE_MIN_UPDATES = 2
"""A pruned trial's probe makes at least this many updates, so its parity verdict covers step 1: a bug that leaves
the first loss alone (a wrong gradient shows in the loss only after the first update) is still judged."""
ONE_BUCKET_MB = 1e6
"""A bucket no model here fills: every gradient in one all-reduce, the nearest a reducer comes to one rank."""


class TrustError(RuntimeError):
    """The chain is broken: the canonical run or the baseline does not reproduce its reference."""

    def __init__(self, message: str, verdict: dict[str, Any]) -> None:
        super().__init__(message)
        self.verdict = verdict


def _with(cfg: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """``cfg`` with dotted overrides (a changed ``kind`` drops the old option's fields), validated."""
    return TrainConfig.from_dict(apply_overrides(cfg.to_dict(), overrides))


def _fits_always(cfg: TrainConfig) -> bool:
    return True


def canonical_config(cfg: TrainConfig, fits: Callable[[TrainConfig], bool] = _fits_always) -> TrainConfig:
    """The simplest layout of ``cfg``'s maths: one rank, every knob section at its default plus ``CANONICAL``,
    and the whole global batch as one microbatch, or the largest microbatch that ``fits`` (the memory
    pre-filter's answer). Same maths key as ``cfg`` (model, data, global batch, optim and run are kept; the
    profiler is off)."""
    plain = TrainConfig()
    sections = {s: getattr(plain, s) for s in KNOB_SECTIONS if hasattr(cfg, s)}
    base = dataclasses.replace(cfg, **sections, run=dataclasses.replace(cfg.run, profile_step=None))
    base = _with(base, {k: v for k, v in CANONICAL.items() if hasattr(cfg, k.split(".")[0])})
    batch = cfg.batch.global_batch
    sizes = [m for m in range(batch, 0, -1) if batch % m == 0]
    tried = [dataclasses.replace(base, batch=dataclasses.replace(cfg.batch, micro_batch_size=m)) for m in sizes]
    return next((c for c in tried if fits(c)), tried[-1])


def one_microbatch_size(cfg: TrainConfig) -> int:
    """The canonical microbatch size for ``cfg``'s layout: the largest that gives a valid config (one microbatch
    per replica where the schedule allows it)."""
    share = cfg.batch.global_batch // cfg.parallel.dp
    for m in range(share, 0, -1):
        if share % m == 0 and _valid(cfg, {"batch.micro_batch_size": m}):
            return m
    return cfg.batch.micro_batch_size


def _valid(cfg: TrainConfig, overrides: dict[str, Any]) -> bool:
    try:
        _with(cfg, overrides)
    except ValueError:
        return False
    return True


def _split_counts(cfg: TrainConfig) -> list[int]:
    return cfg.pipeline.split.counts(cfg.model.n_layers, cfg.n_stages)


def _balanced_counts(cfg: TrainConfig) -> list[int]:
    # From the split alone: the whole config with a balanced split may be invalid (full recompute of more layers
    # than a balanced stage holds), and the split is active all the same.
    return BalancedSplit().counts(cfg.model.n_layers, cfg.n_stages)


def _has_buckets(cfg: TrainConfig) -> bool:
    return cfg.parallel.dp > 1 and getattr(cfg.data_parallel, "bucket_mb", ONE_BUCKET_MB) < ONE_BUCKET_MB


PIPELINE_DEFAULT: dict[str, Any] = {"schedule": "1f1b", "virtual_stages": 1, "split": {"kind": "balanced"}}


@dataclass(frozen=True)
class Family:
    """A layout knob family: settings that act together, when they are active, and how to set them back to
    canonical while every other setting stays the baseline's."""

    name: str
    """What a stop message names: the family's leading knob."""
    knobs: tuple[str, ...]
    """Dotted names (or prefixes ending in '.') of the settings it holds."""
    active: Callable[[TrainConfig], bool]
    """Whether the family computes anything in this config (overlap without a reducer does not)."""
    reset: Callable[[TrainConfig], dict[str, Any]]
    """The dotted overrides that set it back to canonical, the rest of the layout kept."""
    canonical: str | None = None
    """How the canonical run has it, when it has no such setting at all (one rank has no bucket)."""
    within: str | None = None
    """The family whose reset makes this one inert (bucket and overlap live within data parallelism): when
    both resets agree, the narrower one is named."""

    def holds(self, key: str) -> bool:
        return any(key == k or (k.endswith(".") and key.startswith(k)) for k in self.knobs)


FAMILIES: tuple[Family, ...] = (
    Family("parallel.pp", ("parallel.pp", "pipeline."), lambda c: c.parallel.pp > 1,
           lambda c: {"parallel.pp": 1, "pipeline": PIPELINE_DEFAULT}),
    Family("pipeline.schedule", ("pipeline.schedule", "pipeline.virtual_stages"),
           lambda c: c.parallel.pp > 1 and (c.pipeline.schedule, c.pipeline.virtual_stages) != ("gpipe", 1),
           lambda c: {"pipeline.schedule": "gpipe", "pipeline.virtual_stages": 1}, canonical="one stage",
           within="parallel.pp"),
    Family("pipeline.split", ("pipeline.split.",),
           lambda c: c.parallel.pp > 1 and _split_counts(c) != _balanced_counts(c),
           lambda c: {"pipeline.split": {"kind": "balanced"}}, within="parallel.pp"),
    Family("parallel.dp", ("parallel.dp", "data_parallel."), lambda c: c.parallel.dp > 1,
           lambda c: {"parallel.dp": 1, "data_parallel": {"kind": "replicate", "overlap_grad_reduce": False}},
           canonical="one rank"),
    Family("data_parallel.kind", ("data_parallel.kind", "data_parallel.reshard_after_forward",
                                  "data_parallel.prefetch"),
           lambda c: c.parallel.dp > 1 and not isinstance(c.data_parallel, ReplicateDP),
           lambda c: {"data_parallel": {"kind": "replicate", "overlap_grad_reduce": False,
                                        "bucket_mb": ONE_BUCKET_MB}},
           canonical="one rank, no reduction", within="parallel.dp"),
    Family("data_parallel.bucket_mb", ("data_parallel.bucket_mb",), _has_buckets,
           lambda c: {"data_parallel.bucket_mb": ONE_BUCKET_MB}, canonical="one rank, no bucket",
           within="parallel.dp"),
    Family("data_parallel.overlap_grad_reduce", ("data_parallel.overlap_grad_reduce",),
           lambda c: (c.parallel.dp > 1 and isinstance(c.data_parallel, ReplicateDP)
                      and c.data_parallel.overlap_grad_reduce),
           lambda c: {"data_parallel.overlap_grad_reduce": False}, canonical="one rank, no reduction",
           within="parallel.dp"),
    Family("batch.micro_batch_size", ("batch.micro_batch_size",),
           lambda c: c.batch.micro_batch_size != one_microbatch_size(c),
           lambda c: {"batch.micro_batch_size": one_microbatch_size(c)}),
    Family("recompute", ("recompute.",), lambda c: c.recompute.kind != "none", lambda c: {"recompute.kind": "none"}),
    Family("tensor_parallel.size", ("tensor_parallel.",), lambda c: c.tensor_parallel.size > 1,
           lambda c: {"tensor_parallel": dataclasses.asdict(TensorParallel())}, canonical="one rank"),
    # Active whenever tp > 1, on or off: either way it picks the code path (sequence-sharded norms and reduce-scatters,
    # or replicated activations and all-reduces). Its "reset" is the other path, the rest of the TP layout kept.
    Family("tensor_parallel.sequence_parallel", ("tensor_parallel.sequence_parallel", "tensor_parallel.comm_overlap"),
           lambda c: c.tensor_parallel.size > 1,
           lambda c: {"tensor_parallel.sequence_parallel": not c.tensor_parallel.sequence_parallel,
                      "tensor_parallel.comm_overlap": False},
           canonical="no tensor parallelism", within="tensor_parallel.size"),
)
"""The layout families of the trainer's knobs, in the order a stop message lists them. A knob section that
none of them holds (``generic_families``) is a family of its own, set back to its canonical section."""

def generic_families(cfg: TrainConfig) -> tuple[Family, ...]:
    """One family per knob section that FAMILIES does not hold (a new section, e.g. tensor_parallel): active
    when it differs from the canonical layout's, set back to it whole."""
    held = {k.split(".")[0] for f in FAMILIES for k in f.knobs}
    out = []
    for section in KNOB_SECTIONS:
        if section in held or not hasattr(cfg, section):
            continue
        out.append(Family(section, (section + ".",),
                          lambda c, s=section: getattr(c, s) != getattr(canonical_config(c), s),
                          lambda c, s=section: {s: canonical_config(c).to_dict()[s]}))
    return tuple(out)


def families(cfg: TrainConfig) -> tuple[Family, ...]:
    return FAMILIES + generic_families(cfg)


def active_families(cfg: TrainConfig) -> list[Family]:
    """The families that compute something in ``cfg`` and differ from the canonical layout."""
    return [f for f in families(cfg) if f.active(cfg)]


def settings_that_differ(cfg: TrainConfig) -> list[str]:
    """``key=value (canonical: value)`` for every ACTIVE setting where ``cfg`` leaves the canonical layout: those
    its family's reset changes. Inert ones (overlap without a reducer, a split with one stage) are not listed."""
    mine, canon = flatten(cfg.to_dict()), flatten(canonical_config(cfg).to_dict())
    out = []
    for family in active_families(cfg):
        back = flatten(apply_overrides(cfg.to_dict(), family.reset(cfg)))
        narrower = [f for f in FAMILIES if f.within == family.name]  # they list their own settings
        for key in sorted(k for k in mine if family.holds(k) and k in back and back[k] != mine[k]
                          and not any(f.holds(k) for f in narrower)):
            out.append(f"{key}={mine[key]!r} (canonical: {family.canonical or repr(canon.get(key))})")
    return out


def shared_settings(canonical: TrainConfig, baseline: TrainConfig) -> list[str]:
    """The families the canonical run could not set canonical (its microbatch when the whole batch does not
    fit) that the baseline has active too: a bug there is in both runs, and the gate cannot see it."""
    return [f.name for f in active_families(canonical) if f.active(baseline)]


def suspects(baseline: TrainConfig) -> list[tuple[str, TrainConfig | str]]:
    """(family, the baseline with that family set back to canonical) for each active family; a family that cannot
    be set back alone (the result would be no valid config) comes with the reason instead."""
    out: list[tuple[str, TrainConfig | str]] = []
    for family in active_families(baseline):
        try:
            out.append((family.name, _with(baseline, family.reset(baseline))))
        except ValueError as e:
            out.append((family.name, f"cannot be set back alone: {e}"))
    return out


def pairs(baseline: TrainConfig) -> list[tuple[str, TrainConfig | str]]:
    """(pair, the baseline with both families set back) for every two active families, neither within the other
    (that pair is the wider family alone): run when no family alone makes the baseline agree (two bugs, or two
    knobs that interact)."""
    within = {f.name: f.within for f in FAMILIES}
    active = active_families(baseline)
    out: list[tuple[str, TrainConfig | str]] = []
    for i, a in enumerate(active):
        for b in active[i + 1:]:
            if within.get(a.name) == b.name or within.get(b.name) == a.name:
                continue
            name = blame_sentence.pair_name(a.name, b.name)
            out.append((name, _both_back(baseline, a, b)))
    return out


def _both_back(baseline: TrainConfig, a: Family, b: Family) -> TrainConfig | str:
    """The baseline with both families set back, in either order: one alone may leave no valid config (a balanced
    split cannot hold the recompute of an unbalanced one) while both together do."""
    errors = []
    for first, second in ((a, b), (b, a)):
        try:
            half = _with(baseline, first.reset(baseline))
            return _with(half, second.reset(half))
        except ValueError as e:
            errors.append(e)
    return f"cannot be set back together: {errors[0]}"


def blame(tried: Sequence[tuple[str, bool | None, str]]) -> str:
    """One sentence from the suspects' runs (orchestrator.parity.blame.sentence over FAMILIES)."""
    return blame_sentence.sentence(tried, {f.name: f.within for f in FAMILIES})


class ParityGate:
    """The reference and tolerance every run of one sweep is judged by (orchestrator.sweep.loop asks it)."""

    def __init__(self, root: Path) -> None:
        self.refs = parity.ReferenceStore(root)
        self.reference: dict[str, Any] | None = None
        self.tolerance: parity.Tolerance | None = None
        self.shared: list[str] = []
        """What the canonical run shares with the baseline (shared_settings); set by canonical_to_run."""
        self.tried: list[tuple[str, bool | None, str]] = []
        """The baseline's suspects, as run (blame's input); set by the sweep between suspects and judge_baseline."""
        self.broken: str | None = None
        """Why the canonical run failed its self-check: nothing is judged after that (judge_baseline refuses)."""

    def path(self, cfg: dict[str, Any]) -> Path:
        return self.refs.path(parity.maths_key(cfg))

    def canonical_to_run(self, baseline: TrainConfig,
                         fits: Callable[[TrainConfig], bool] = _fits_always) -> TrainConfig | None:
        """The canonical config to run before the baseline (even when the baseline is that layout: it must certify
        itself first); None when the store holds a certified run of that very layout (certify)."""
        canonical = canonical_config(baseline, fits)
        self.shared = shared_settings(canonical, baseline)
        layout = parity.layout_key(canonical.to_dict())
        if any(r.get("layout_key") == layout and r.get("self_check")
               for r in self.refs.runs(parity.maths_key(baseline.to_dict()))):
            return None
        return canonical

    def self_checks(self, canonical: TrainConfig) -> list[TrainConfig]:
        """What runs right after the canonical run, for judge_canonical to certify it with (certify)."""
        second = certify.self_check_config(canonical)
        return [] if second is None else [second]

    def needs_repeat(self, result: Any) -> bool:
        """bf16/GPU with no stored repeat of this layout: the baseline runs twice to measure its own spread."""
        layout = parity.layout_key(result.config)
        return parity.needs_repeat(result.config) and not any(
            r.get("layout_key") == layout for r in self.refs.runs(parity.maths_key(result.config)))

    def judge_canonical(self, result: Any, checks: Sequence[Any] = ()) -> dict[str, Any]:
        """Certify the canonical run against its second decomposition (``checks``: the results of self_checks'
        configs), then compare it with a store left by an older version (if any); store it, or mark the stored run
        of its layout certified, only if both pass. A failed certification stops every later judgement."""
        canonical = TrainConfig.from_dict(result.config)
        if certify.self_check_config(canonical) is not None and not checks:
            raise TrustError("the canonical run was not certified: its self-check run (the batch as microbatches of "
                             "one sequence) is missing", {"passed": False})
        record = certify.uncheckable(canonical)
        for second in checks:
            record, verdict = certify.self_check(result, second)
            if not record["passed"]:
                self.broken = certify.disagreement(record, verdict)
                raise TrustError(self.broken, {**verdict, "shared_with_canonical": list(self.shared)})
        ref = {**parity.reference_from_result(result, role="canonical"), "self_check": record}
        runs = self.refs.runs(ref["maths_key"])
        verdict = parity.compare(runs[0] if runs else ref, result, tolerance=parity.tolerance_for(runs or [ref]))
        verdict["shared_with_canonical"] = list(self.shared)
        verdict["self_check"] = record
        if not verdict["passed"]:
            raise TrustError(
                f"the canonical reference run does not reproduce the stored reference of the same maths: "
                f"{parity.describe_failure(verdict)}. If the software or hardware changed on purpose, delete "
                f"{self.refs.path(ref['maths_key'])} and run again; otherwise the trainer changed what it computes", verdict)
        if runs and runs[0].get("role") == "canonical" and runs[0].get("layout_key") == ref["layout_key"]:
            self.refs.certify(ref["maths_key"], record)  # an anchor left by an older version, certified now
        else:
            self.refs.add(ref)
        return verdict

    def _anchor(self, result: Any, repeats: Sequence[Any] = ()) -> tuple[dict[str, Any], parity.Tolerance]:
        new = [parity.reference_from_result(r) for r in (result, *repeats)]
        runs = self.refs.runs(new[0]["maths_key"])
        anchor = (runs or new)[0]
        return anchor, parity.tolerance_for([anchor, *runs[1:], *new])

    def suspects(self, baseline: TrainConfig, result: Any) -> list[tuple[str, TrainConfig | str]]:
        """When the baseline's run disagrees with a stored canonical run: its active families, each set back to
        canonical alone (``suspects``), for the sweep to run before it stops; else nothing."""
        self.tried = []
        if self.refs.canonical(parity.maths_key(result.config)) is None:
            return []
        anchor, tolerance = self._anchor(result)
        if parity.compare(anchor, result, tolerance=tolerance)["passed"]:
            return []
        return suspects(baseline)

    def pairs(self, baseline: TrainConfig) -> list[tuple[str, TrainConfig | str]]:
        """After the suspects ran: when none of them alone agreed, every two active families set back together
        (``pairs``), for the sweep to run before it stops; else nothing."""
        if not self.tried or any(ok for _, ok, _ in self.tried):
            return []
        return pairs(baseline)

    def try_suspect(self, family: str, result: Any | None, what: str) -> bool | None:
        """Record one suspect's run: does the baseline with ``family`` set back agree with the canonical run?
        None when it did not run (``what`` says why)."""
        agreed = None
        if result is not None:
            anchor, tolerance = self._anchor(result)
            verdict = parity.compare(anchor, result, tolerance=tolerance)
            agreed = bool(verdict["passed"])
            what = "agrees" if agreed else f"still differs ({parity.describe_failure(verdict)})"
        self.tried.append((family, agreed, what))
        return agreed

    def judge_baseline(self, result: Any, repeats: list[Any] = ()) -> dict[str, Any]:
        """The baseline (and its repeats) against the anchor; all stored if they pass, else TrustError."""
        if self.broken is not None:
            raise TrustError(self.broken, {"passed": False})
        new = [parity.reference_from_result(r) for r in (result, *repeats)]
        key = new[0]["maths_key"]
        runs = self.refs.runs(key)
        if not runs:  # the baseline is the canonical layout itself (or the model is unknown to the store)
            new[0]["role"] = "canonical"
        anchor, tolerance = self._anchor(result, repeats)
        verdicts = [parity.compare(anchor, r, tolerance=tolerance) for r in (result, *repeats)]
        for v in verdicts:
            v["shared_with_canonical"] = list(self.shared)
        bad = next((v for v in verdicts if not v["passed"]), None)
        if bad is not None:
            canonical = self.refs.canonical(key)
            differ = settings_that_differ(TrainConfig.from_dict(result.config)) if canonical else []
            against = "the canonical run of the same maths" if canonical else "the stored reference of the same maths"
            raise TrustError(
                f"the baseline does not match {against}: {parity.describe_failure(bad)}. "
                + (f"Its active settings that differ from the canonical layout: {'; '.join(differ)}. " if differ
                   else "")
                + (f"{blame(self.tried)} " if self.tried else
                   "One of them computes something else (a bug in that knob, or a baseline that is not the same "
                   "training). " if differ else "")
                + ("Fix it or choose a baseline without it. " if differ else "")
                + f"The reference is {self.refs.path(key)}: delete it only if the software or hardware changed on "
                  f"purpose", bad)
        for ref in new:
            self.refs.add(ref)
        self.reference, self.tolerance = anchor, tolerance
        return verdicts[0]

    def resume(self, result: Any) -> None:
        """A resumed sweep: the stored anchor if there is one, else the baseline run in the ledger."""
        ref = parity.reference_from_result(result)
        runs = self.refs.runs(ref["maths_key"]) or [ref]
        self.reference, self.tolerance = runs[0], parity.tolerance_for(runs)

    def judge(self, result: Any) -> dict[str, Any] | None:
        """A trial's (or confirm's) verdict against the anchor; None before the baseline set one. A run of fewer
        updates than the anchor's (a pruned trial's probe) is judged on those updates."""
        if self.reference is None:
            return None
        verdict = parity.compare(self.reference, result, tolerance=self.tolerance, prefix=True)
        # A probe is the same training cut short: its maths are the reference's but for run.steps.
        full = {**result.config, "run": {**result.config["run"], "steps": len(self.reference["losses"])}}
        if parity.maths_key(full) != self.reference["maths_key"]:
            verdict.update(passed=False, first_fail_step=0, first_fail_metric="maths settings")
        return verdict
