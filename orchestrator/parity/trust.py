"""The trust chain of the parity gate: canonical layout -> baseline -> trials.

A trial is judged against a reference, and the reference is only as good as the run it came from. So:

1. **Canonical run.** Per maths key (orchestrator.parity.verdict.maths_key) the simplest layout of the same maths
   is run once: pp=1 (every rank a data-parallel replica), no recompute, the project's plain bucketed
   all-reduce without overlap, the baseline's microbatch size where it divides the batch. It has the same
   maths key as the baseline by construction. If the reference store already holds a canonical run for the
   key, it is not run again. It anchors the store.
2. **Baseline.** Compared with the anchor before anything is judged against it. If it does not match, the
   sweep stops and names the baseline's settings that differ from the canonical layout: one of them
   computes something else (a recompute that replays the forward on other inputs, a lost microbatch), and
   a reference taken from it would pass the same bug in every trial and fail every correct one.
3. **Trials.** Compared with the anchor under the same tolerance.

Runs are compared first and stored only when they pass (orchestrator.parity.verdict.ReferenceStore), so the store
never drifts. Only the ray backend runs this: the model backend predicts and has no parity to check.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from orchestrator.parity import verdict as parity
from trainer.config import NoRecompute, PipelineConfig, ReplicateDP, TrainConfig, flatten


class TrustError(RuntimeError):
    """The chain is broken: the canonical run or the baseline does not reproduce its reference."""

    def __init__(self, message: str, verdict: dict[str, Any]) -> None:
        super().__init__(message)
        self.verdict = verdict


def canonical_config(cfg: TrainConfig) -> TrainConfig:
    """The simplest layout of ``cfg``'s maths on the same ranks (same maths key, by construction).

    pp=1 with every rank a data-parallel replica when the global batch divides over them all; otherwise the
    baseline's pp is kept (a worker group always runs world_size ranks) with a balanced split, no virtual
    stages and the plainest schedule (gpipe). Always: no recompute, replicated parameters with a plain
    bucketed all-reduce after backward (no overlap), the largest microbatch size <= the baseline's that
    divides each replica's share, no profiler.
    """
    world, batch = cfg.world_size, cfg.batch
    pp = 1 if batch.global_batch % world == 0 else cfg.parallel.pp
    share = batch.global_batch // (world // pp)
    micro = max(m for m in range(1, min(batch.micro_batch_size, share) + 1) if share % m == 0)
    return dataclasses.replace(
        cfg,
        batch=dataclasses.replace(batch, micro_batch_size=micro),
        parallel=dataclasses.replace(cfg.parallel, pp=pp, dp=world // pp),
        pipeline=PipelineConfig(schedule="1f1b" if pp == 1 else "gpipe"),
        data_parallel=ReplicateDP(overlap_grad_reduce=False,
                                  bucket_mb=getattr(cfg.data_parallel, "bucket_mb", ReplicateDP.bucket_mb)),
        recompute=NoRecompute(),
        run=dataclasses.replace(cfg.run, profile_step=None),
    )


def settings_that_differ(cfg: dict[str, Any], canonical: dict[str, Any]) -> list[str]:
    """``key=value (canonical: value)`` for every setting where the config leaves the canonical layout."""
    a, b = flatten(cfg), flatten(canonical)
    return [f"{k}={a.get(k)!r} (canonical: {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.startswith("run.profile_step")]


class ParityGate:
    """The reference and tolerance every run of one sweep is judged by (orchestrator.sweep.loop asks it)."""

    def __init__(self, root: Path) -> None:
        self.refs = parity.ReferenceStore(root)
        self.reference: dict[str, Any] | None = None
        self.tolerance: parity.Tolerance | None = None

    def path(self, cfg: dict[str, Any]) -> Path:
        return self.refs.path(parity.maths_key(cfg))

    def canonical_to_run(self, baseline: TrainConfig) -> TrainConfig | None:
        """The canonical config to run before the baseline; None when the store holds one already, or when the
        baseline is the canonical layout itself (its own run then anchors the store)."""
        if self.refs.canonical(parity.maths_key(baseline.to_dict())) is not None:
            return None
        canonical = canonical_config(baseline)
        return None if canonical == baseline else canonical

    def needs_repeat(self, result: Any) -> bool:
        """bf16/GPU with no stored repeat of this layout: the baseline runs twice to measure its own spread."""
        layout = parity.layout_key(result.config)
        return parity.needs_repeat(result.config) and not any(
            r.get("layout_key") == layout for r in self.refs.runs(parity.maths_key(result.config)))

    def judge_canonical(self, result: Any) -> dict[str, Any]:
        """Compare the canonical run with a store left by an older version (if any); store it if it passes."""
        ref = parity.reference_from_result(result, role="canonical")
        runs = self.refs.runs(ref["maths_key"])
        verdict = parity.compare(runs[0] if runs else ref, result, tolerance=parity.tolerance_for(runs or [ref]))
        if not verdict["passed"]:
            raise TrustError(
                f"the canonical reference run does not reproduce the stored reference of the same maths: "
                f"{parity.describe_failure(verdict)}. If the software or hardware changed on purpose, delete "
                f"{self.refs.path(ref['maths_key'])} and run again; otherwise the trainer changed what it computes", verdict)
        self.refs.add(ref)
        return verdict

    def judge_baseline(self, result: Any, repeats: list[Any] = ()) -> dict[str, Any]:
        """The baseline (and its repeats) against the anchor; all stored if they pass, else TrustError."""
        new = [parity.reference_from_result(r) for r in (result, *repeats)]
        key = new[0]["maths_key"]
        runs = self.refs.runs(key)
        if not runs:  # the baseline is the canonical layout itself (or the model is unknown to the store)
            new[0]["role"] = "canonical"
        anchor = (runs or new)[0]
        tolerance = parity.tolerance_for([anchor, *runs[1:], *new])
        verdicts = [parity.compare(anchor, r, tolerance=tolerance) for r in (result, *repeats)]
        bad = next((v for v in verdicts if not v["passed"]), None)
        if bad is not None:
            canonical = self.refs.canonical(key)
            differ = settings_that_differ(result.config, canonical_config(TrainConfig.from_dict(result.config))
                                          .to_dict()) if canonical else []
            against = "the canonical run of the same maths" if canonical else "the stored reference of the same maths"
            raise TrustError(
                f"the baseline does not match {against}: {parity.describe_failure(bad)}. "
                + (f"Its settings that differ from the canonical layout: {'; '.join(differ)}. One of them computes "
                   f"something else (a bug in that knob, or a baseline that is not the same training): fix it or "
                   f"choose a baseline without it. " if differ else "")
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
        """A trial's (or confirm's) verdict against the anchor; None before the baseline set one."""
        if self.reference is None:
            return None
        verdict = parity.compare(self.reference, result, tolerance=self.tolerance)
        if parity.maths_key(result.config) != self.reference["maths_key"]:
            verdict.update(passed=False, first_fail_step=0, first_fail_metric="maths settings")
        return verdict
