"""The sweep's Optuna study: opened locked (one driver per study), fingerprinted, resumed, told.

Every trial is told as COMPLETE or PRUNED, never FAIL: an infeasible or crashed config carries constraint
values > 0 (``Trial.set_constraint``, which replaces the ``constraints_func`` that Optuna 5 deprecates) so
the sampler learns to avoid it; a FAILed trial would just be re-sampled. FAIL is reserved for trials nothing
was measured for (a dead driver's, a lost node's), which are re-queued.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import warnings
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from orchestrator.sweep import lock as studylock
from orchestrator.calibration.prefilter import REASON_PREFIX
from orchestrator.records.record import Kind, Status, TrialRecord

log = logging.getLogger(__name__)

PENALTY_FACTOR = 10.0
"""A run that produced no step time is told as this multiple of the baseline's (plus a constraint)."""


class SweepError(RuntimeError):
    """The sweep cannot go on (its baseline failed, another driver holds it, the study changed)."""


class SweepStudy:
    """The study of one sweep, held under its lock (orchestrator.sweep.lock) until ``release``."""

    def __init__(self, cfg: Any, backend: Any, records: Callable[[], list] = list):
        """``records``: the ledger's records so far (what a guided sampler refits the planner to)."""
        self.cfg, self.backend = cfg, backend
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        st = cfg.storage
        try:  # claimed before anything is read or written: a live driver's trials are not ours to judge
            self.study, self.lock = studylock.open_locked(
                cfg.optuna_url, cfg.name, cfg.results_dir, st.heartbeat_interval_s, st.grace_period_s,
                direction="minimize", sampler=_sampler(cfg, backend, records))
        except studylock.StudyBusy as e:
            raise SweepError(str(e)) from None
        try:
            self._check_fingerprint()
        except SweepError:
            self.lock.release()
            raise

    def release(self) -> None:
        self.lock.release()

    def _check_fingerprint(self) -> None:
        configs = self.backend.configs
        what = [self.backend.name, configs.to_dict(configs.baseline), self.cfg.raw.get("space"),
                self.cfg.resources.world_size]
        fp = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
        known = self.study.user_attrs.get("fingerprint")
        if known is None:
            self.study.set_user_attr("fingerprint", fp)
        elif known != fp:
            raise SweepError(f"study {self.cfg.name!r} in {self.cfg.optuna_url} was made with another backend, "
                             f"baseline, space or world size; use a new name=..., or delete {self.cfg.results_dir} "
                             f"and the study to start over")

    # ---- what the study holds ----------------------------------------------------------------

    def finished(self) -> int:
        """What the budgets count: finished Optuna trials, baseline included (a resumed study counts its own)."""
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))

    def baseline_waiting(self) -> bool:
        return any(t.user_attrs.get("kind") == "baseline"
                   for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def ask(self) -> optuna.trial.Trial:
        return self.study.ask()

    # ---- resume ------------------------------------------------------------------------------

    def recover(self, told: dict[int, TrialRecord], tell: Callable[[optuna.trial.Trial, TrialRecord], None]) -> None:
        """Trials a dead driver left RUNNING: told from their record if it made it (``told``), else FAIL +
        re-queued."""
        for ft in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if ft.number in told:
                tell(optuna.trial.Trial(self.study, ft._trial_id), told[ft.number])
                log.info(f"resumed: trial {ft.number} was measured before the driver stopped; told from the ledger")
            else:
                # A kill can land between ask() and the last suggest (each one a storage write): then only the
                # params drawn so far are queued again, and the sampler draws the rest when the trial is re-asked.
                self.requeue(ft.number, ft.params, ft.user_attrs)
                log.info(f"resumed: trial {ft.number} was interrupted; its params are queued again"
                         + ("" if ft.params else " (it was killed before any was drawn)"))

    def ensure_baseline(self, params: dict[str, Any]) -> None:
        """No baseline measured and none waiting: queue it first."""
        if not self.baseline_waiting():
            self.study.enqueue_trial(params, user_attrs={"kind": "baseline"})

    def enqueue_once(self, entries: list[dict[str, Any]]) -> None:
        """The sweep file's enqueue: entries, once per study (only after the baseline: Optuna pops waiting
        trials in order, and nothing may run before the baseline)."""
        if not self.study.user_attrs.get("enqueued"):
            for params in entries:
                self.study.enqueue_trial(params, user_attrs={"kind": "trial"})
            self.study.set_user_attr("enqueued", True)

    def requeue(self, number: int, params: dict, user_attrs: dict) -> None:
        """A RUNNING trial nothing was measured for: FAIL it (so it is not counted) and queue its params again."""
        self.study.tell(number, state=TrialState.FAIL)
        self.study.enqueue_trial(params, user_attrs={"kind": user_attrs.get("kind", "trial"), "requeued_from": number})

    # ---- tell --------------------------------------------------------------------------------

    def tell(self, trial: optuna.trial.Trial, record: TrialRecord, baseline_s: float | None,
             same: TrialRecord | None = None) -> None:
        """The trial's value and constraints (crash, parity, memory) from its record (or the one it reuses)."""
        src = same or record
        status, m = src.status, src.metrics
        base = baseline_s or m.step_time_s or 1.0
        peak, budget = m.peak_memory_bytes or 0, self.cfg.resources.memory_budget_gb
        # A config the memory pre-filter kept from launching broke the memory constraint by prediction.
        prefiltered = status is Status.SKIPPED and (src.reason or "").startswith(REASON_PREFIX)
        if prefiltered:
            predicted = (src.prediction or {}).get("peak_memory_bytes") or 0
            memory = max(1e-3, predicted / self.backend.prefilter.budget_bytes - 1)
        elif status is Status.OOM:
            memory = 1.0
        else:
            memory = max(0.0, peak / (budget * 2**30) - 1) if budget else 0.0
        crashed = status in (Status.FAILED, Status.TIMEOUT) or (status is Status.SKIPPED and not prefiltered)
        constraints = {
            "crash": 1.0 if crashed else 0.0,
            "parity": 1.0 if status is Status.NAN or (src.parity is not None and not src.parity.passed) else 0.0,
            "memory": memory,
        }
        for k, v in constraints.items():
            trial.set_constraint(k, v)
        for k, v in {"constraints": constraints, "status": record.status.value, "reason": record.reason}.items():
            trial.set_user_attr(k, v)
        value = m.step_time_s if m.step_time_s and status not in (Status.OOM, Status.NAN) else PENALTY_FACTOR * base
        if record.kind is Kind.BASELINE and record.status is not Status.OK:
            # Not a point of the search: not counted against the budget, and the next run measures it again.
            self.requeue(trial.number, trial.params, {"kind": "baseline"})
        elif status is Status.PRUNED:
            trial.report(value, step=self.cfg.pruning.after_steps)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, value)


def _sampler(cfg: Any, backend: Any = None, records: Callable[[], list] = list) -> optuna.samplers.BaseSampler:
    if cfg.sampler.kind == "guided":  # the planner's picks in turn with TPE, where the backend can map them
        tpe = _sampler(dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, kind="tpe")))
        return backend.guided_sampler(tpe, records)
    s, conditional = cfg.sampler, any(p.when or p.type == "layer_split" for p in cfg.space.params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if s.kind == "random":
            return optuna.samplers.RandomSampler(seed=s.seed)
        if s.kind == "cmaes":
            return optuna.samplers.CmaEsSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
        if s.kind == "qmc":
            return optuna.samplers.QMCSampler(seed=s.seed)
        if s.kind == "gp":
            return optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=s.n_startup_trials, multivariate=s.multivariate,
            group=s.multivariate and conditional, constant_liar=cfg.resources.concurrent_trials > 1)
