"""The sweep loop: ask Optuna, run on the backend, write the ledger, tell Optuna, mirror to MLflow. Nothing else.

Order per trial is fixed: the ledger line is flushed first (the source of truth), then Optuna is told, then
MLflow; a failing store after the ledger loses nothing. Every trial is told as COMPLETE or PRUNED, never
FAIL: an infeasible or crashed config carries constraint values > 0 (``Trial.set_constraint``, which
replaces the ``constraints_func`` that Optuna 5 deprecates) so the sampler learns to avoid it; a FAILed
trial would just be re-sampled. FAIL is reserved for trials a dead driver left RUNNING, which are re-queued.

A trial is a generator of runs (a probe, then the full measurement), so several trials can be in flight on
several worker groups while the loop waits on whichever finishes first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

import optuna
import yaml
from optuna.trial import TrialState

from orchestrator import backends, guided, parity, report, studylock, trust
from orchestrator import ledger as L
from orchestrator.config import SweepConfig, prefilter_base_dir
from orchestrator.prefilter import REASON_PREFIX, prefilter_from_settings
from orchestrator.space import suggest
from orchestrator.units import fmt_bytes

log = logging.getLogger(__name__)

PENALTY_FACTOR = 10.0
"""A run that produced no step time is told as this multiple of the baseline's (plus a constraint)."""
MAX_LOST_IN_A_ROW = 3
"""Runs lost to the cluster (a node, an actor) one after another before the sweep stops instead of re-queuing."""
REUSABLE = ("ok", "infeasible", "pruned", "oom", "nan")
"""Statuses a repeated proposal may reuse instead of running again (a crash or timeout may be transient)."""


class SweepError(RuntimeError):
    """The sweep cannot go on (its baseline failed, another driver holds it, the study changed)."""


@dataclass
class Job:
    kind: str
    number: int
    params: dict
    config: Any
    trial: Any = None
    steps: Generator | None = None
    started: float = field(default_factory=time.time)
    runs: list = field(default_factory=list)
    told: bool = False


class Sweep:
    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.configs = backends.configs_for(cfg)
        cfg.results_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = L.Ledger(cfg.results_dir / "trials.jsonl")
        self.progress = report.Progress(cfg.search.n_trials)
        self.records = self.ledger.read()
        self.study = self._open_study()
        self.tracker, self.parent = self._open_tracker()
        self.queue: list[Job] = []
        self.gate = trust.ParityGate(cfg.results_dir.parent / "parity_refs")
        """Canonical -> baseline -> trials (orchestrator.trust); its store is shared by every sweep under the same
        results directory, by maths key."""
        self.lost_in_a_row = 0
        self.stop_reason: str | None = None
        self.target_reason: str | None = None
        """Why the sweep may stop for its target; it does once search.min_trials are finished."""
        self.bookkeeping: list[float] = []
        """Driver seconds per finished trial after its ledger line (Optuna, MLflow): not in any trial's wall."""
        self.prefilter = prefilter_from_settings(cfg.prefilter, prefilter_base_dir(cfg), cfg.resources.memory_budget_gb) \
            if cfg.backend == "ray" else None
        """Skips trials whose predicted peak memory exceeds the budget (orchestrator.prefilter); None: launch all."""

    @property
    def baseline_s(self) -> float | None:
        line = L.baseline_of(self.records)
        return line["metrics"]["step_time_s"] if line and line["status"] == "ok" else None

    @property
    def best_s(self) -> float | None:
        best = L.best_of(self.records)
        return best["metrics"]["step_time_s"] if best else None

    # ---- setup ------------------------------------------------------------------------------

    def _open_study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        st = self.cfg.storage
        try:  # claimed before anything is read or written: a live driver's trials are not ours to judge
            study, self.lock = studylock.open_locked(
                self.cfg.optuna_url, self.cfg.name, self.cfg.results_dir, st.heartbeat_interval_s, st.grace_period_s,
                direction="minimize", sampler=_sampler(self.cfg, lambda: self.records))
        except studylock.StudyBusy as e:
            raise SweepError(str(e)) from None
        try:
            self._check_fingerprint(study)
        except SweepError:
            self.lock.release()
            raise
        return study

    def _check_fingerprint(self, study: optuna.Study) -> None:
        what = [self.cfg.backend, self.configs.to_dict(self.configs.baseline), self.cfg.raw.get("space"),
                self.cfg.resources.world_size]
        fp = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
        known = study.user_attrs.get("fingerprint")
        if known is None:
            study.set_user_attr("fingerprint", fp)
        elif known != fp:
            raise SweepError(f"study {self.cfg.name!r} in {self.cfg.optuna_url} was made with another backend, "
                             f"baseline, space or world size; use a new name=..., or delete {self.cfg.results_dir} "
                             f"and the study to start over")

    def _open_tracker(self) -> tuple[Any, str | None]:
        if not self.cfg.tracking.enabled:
            return None, None
        try:
            from orchestrator.tracking import Tracker

            tracker = Tracker(self.cfg.mlflow_uri, self.cfg.tracking.experiment)
            return tracker, tracker.start_sweep(self.cfg.name, self.cfg.raw, self.cfg.target.seconds(self.baseline_s))
        except Exception as e:  # tracking mirrors the ledger; the sweep does not depend on it
            log.warning("MLflow tracking is off for this sweep: %s: %s", type(e).__name__, e)
            return None, None

    def _track(self, what: str, *args: Any) -> None:
        if self.tracker is not None:
            try:
                getattr(self.tracker, what)(self.parent, *args)
            except Exception as e:
                log.warning("MLflow %s failed (%s: %s); the ledger has it", what, type(e).__name__, e)

    def recover(self) -> None:
        """Trials a dead driver left RUNNING: told from the ledger if their line made it, else failed + re-queued."""
        if self.records:  # lines a killed driver wrote to the ledger but never mirrored to MLflow
            self._track("reconcile", self.records)
        lines = {r["trial"]: r for r in L.measured(self.records)}
        for ft in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if ft.number in lines:
                self._tell(optuna.trial.Trial(self.study, ft._trial_id), lines[ft.number])
                log.info(f"resumed: trial {ft.number} was measured before the driver stopped; told from the ledger")
            else:
                # A kill can land between ask() and the last suggest (each one a storage write): then only the
                # params drawn so far are queued again, and the sampler draws the rest when the trial is re-asked.
                self._requeue(ft.number, ft.params, ft.user_attrs)
                log.info(f"resumed: trial {ft.number} was interrupted; its params are queued again"
                         + ("" if ft.params else " (it was killed before any was drawn)"))
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if self.baseline_s is None and not any(t.user_attrs.get("kind") == "baseline" for t in waiting):
            self.study.enqueue_trial(self.configs.baseline_params(self.cfg.space), user_attrs={"kind": "baseline"})
        base = L.baseline_of(self.records)
        if base and base["status"] == "ok" and base.get("result"):
            from trainer.result import Result

            self.gate.resume(Result.from_dict(base["result"]))
        pending = L.unconfirmed(self.records, self.cfg.confirm.repeats)
        if pending and self.cfg.backend == "ray":
            config = self.configs.load(pending["config"])
            self.queue.append(self._confirm_job(pending["trial"], pending["params"], config))

    def _requeue(self, number: int, params: dict, user_attrs: dict) -> None:
        """A RUNNING trial nothing was measured for: FAIL it (so it is not counted) and queue its params again."""
        self.study.tell(number, state=TrialState.FAIL)
        self.study.enqueue_trial(params, user_attrs={"kind": user_attrs.get("kind", "trial"), "requeued_from": number})

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.recover()
        if (self.cfg.target.seconds(self.baseline_s) is not None
                and L.confirmed_winner(self.records, self.cfg.confirm.repeats)):
            self._target_reached("the target was already met and confirmed")
        runner = None if self.stop_reason else backends.runner_for(self.cfg, self.configs)
        startup = time.perf_counter() - t0
        log.info(f"sweep {self.cfg.name}: {self.cfg.backend} backend on {runner.where if runner else '-'}; "
                 f"target {self.cfg.target.describe(self.baseline_s)}")
        active: dict[int, Job] = {}
        try:
            while True:
                for slot in range(runner.slots if runner else 0):
                    if slot not in active and (job := self._next_job(active, time.perf_counter() - t0)):
                        active[slot] = job
                        runner.submit(slot, next(job.steps))
                if not active:
                    break
                for slot, outcome in runner.poll(timeout_s=0.5):
                    job = active[slot]
                    if outcome.status == "lost":  # the infrastructure's doing: no verdict on the config
                        del active[slot]
                        self._lost(job, outcome)
                        continue
                    self.lost_in_a_row = 0
                    try:
                        runner.submit(slot, job.steps.send(outcome))
                    except StopIteration:
                        del active[slot]
                self.progress.tick()
        except BaseException:  # Ctrl-C, a store or Ray failing: nothing in flight was measured; run it again later
            for job in active.values():
                if job.trial is not None and not job.told:
                    self._requeue(job.number, job.trial.params, job.trial.user_attrs)
            raise
        finally:
            if runner:
                runner.close()
        summary = report.summarize(self.records, self.cfg.target, self.cfg.confirm.repeats)
        summary.update(stopped_because=self.stop_reason or "the trial budget is spent", startup_s=startup,
                       mlflow_ui=self.tracker.open_hint() if self.tracker else None,
                       group_builds=runner.builds if runner else 0,
                       sweep_wall_s=time.perf_counter() - t0,
                       bookkeeping_median_s=statistics.median(self.bookkeeping) if self.bookkeeping else None)
        self._track("finish_sweep", summary, self.study, report.table(self.records))
        return summary

    def _lost(self, job: Job, outcome: Any) -> None:
        """A node or a rank's actor was lost mid-run: nothing was measured and the config is not to blame, so
        the trial is queued again (FAIL in Optuna, as for a dead driver's trial; no ledger line, no constraint)."""
        if job.trial is not None:
            self._requeue(job.number, job.trial.params, job.trial.user_attrs)
            job.told = True
        else:  # a confirm run: run it again (a resume finds it from the ledger too)
            self.queue.append(self._confirm_job(job.number, job.params, job.config))
        self.progress.running.pop(job.number, None)
        log.warning("trial %d (%s): %s; queued again, not held against its config", job.number, job.kind, outcome.reason)
        self.lost_in_a_row += 1
        if self.lost_in_a_row > MAX_LOST_IN_A_ROW:
            raise SweepError(f"{self.lost_in_a_row} runs in a row were lost to the cluster (last: {outcome.reason}); "
                             f"check the cluster's nodes, then rerun the same command to resume")

    def _next_job(self, active: dict[int, Job], elapsed: float) -> Job | None:
        if self.lock.lost.is_set():
            raise SweepError(f"another driver took study {self.cfg.name!r} over (this one's heartbeat had stopped "
                             f"for longer than storage.grace_period_s); stopping")
        if self.queue:
            return self.queue.pop(0)
        if self.stop_reason or any(j.kind == "baseline" for j in active.values()):
            return None  # everything else is measured against the baseline
        walls = [r["wall_s"] for r in self.records if r["wall_s"]]
        wall_budget = self.cfg.search.wall_time_s
        if wall_budget is not None and elapsed + (statistics.median(walls) if walls else 0.0) > wall_budget:
            self.stop_reason = f"the wall-time budget ({wall_budget:.0f} s) is spent"
            return None
        while True:
            self._target_reached(None)  # a skipped trial below counts towards search.min_trials too
            if self.stop_reason:
                return None
            if self._finished_trials() + sum(j.trial is not None for j in active.values()) >= self.cfg.search.n_trials:
                return None
            trial = self.study.ask()
            kind = trial.user_attrs.get("kind", "trial")
            if kind == "trial" and self.baseline_s is None:
                # Not this trial's fault: it goes back to the queue (FAIL is not counted), behind the baseline.
                self._requeue(trial.number, trial.params, trial.user_attrs)
                if not any(t.user_attrs.get("kind") == "baseline"
                           for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
                    raise SweepError("no baseline measurement to compare against (its trial did not finish ok)")
                continue
            job = Job(kind, trial.number, {}, None, trial)
            try:
                job.params, overrides = suggest(trial, self.cfg.space, self.configs.fixed, self.configs.split_context)
                job.config = self.configs.baseline if kind == "baseline" else self.configs.build(overrides)
            except ValueError as e:
                job.params = trial.params
                self._finish(job, backends.RunOutcome("skipped", str(e)))
                continue
            if kind == "trial" and self.prefilter is not None:
                verdict = self.prefilter.verdict(job.config)
                if verdict.skip:  # a prediction, so the sampler sees the memory constraint it broke
                    self._finish(job, backends.RunOutcome(
                        "skipped", verdict.reason, prediction={"peak_memory_bytes": verdict.predicted_bytes}))
                    continue
            same = next((r for r in L.measured(self.records)
                         if r["params"] == job.params and r["status"] in REUSABLE), None)
            if same is None or kind == "baseline":
                break
            self._finish(job, backends.RunOutcome("skipped", f"same params as trial {same['trial']} "
                                                             f"({same['status']}): reused, not run again"), same=same)
        self.progress.started(job.number, kind, job.params)
        job.steps = self._trial_steps(job)
        return job

    def _trial_steps(self, job: Job) -> Generator[Any, Any, None]:
        """Yields the configs to run; each send() brings back the previous run's outcome."""
        probe_cfg = None
        if job.kind == "trial" and self.cfg.pruning.enabled and self.best_s:
            probe_cfg = self.configs.probe(job.config, self.cfg.pruning.after_steps)
        if probe_cfg is not None:
            probe = yield probe_cfg
            job.runs.append(probe)
            if probe.status != "ok":
                self._finish(job, probe)
                return
            # The probe's fastest update, not its median: on a shared machine one slow update must not prune a
            # good config; only one whose every measured update is clearly slower than the best is cut.
            pace, best = probe.result.summary.step_time_min_s, self.best_s
            if pace > self.cfg.pruning.slower_than_best * best:
                probe.status = "pruned"
                probe.reason = (f"probe: fastest of {self.cfg.pruning.after_steps} measured updates {pace * 1e3:.1f} ms"
                                f" > {self.cfg.pruning.slower_than_best:g} x best {best * 1e3:.1f} ms")
                self._finish(job, probe)
                return
        if job.kind == "baseline" and self.cfg.backend == "ray" \
                and (canonical := self.gate.canonical_to_run(job.config)) is not None:
            # The baseline is judged against the simplest layout of its maths before it becomes the reference.
            check = Job("canonical", job.number, {}, canonical)
            check.runs.append((yield canonical))
            self._finish(check, check.runs[0])
        outcome = yield job.config
        job.runs.append(outcome)
        if job.kind == "baseline" and outcome.status == "ok" and outcome.result is not None \
                and self.gate.needs_repeat(outcome.result):
            # bf16/GPU: the baseline's own run-to-run spread sets the parity tolerance, so measure it twice.
            job.runs.append((yield job.config))
        self._finish(job, outcome)

    def _finished_trials(self) -> int:
        """What the budgets count: finished Optuna trials, baseline included (a resumed study counts its own)."""
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))

    def _target_reached(self, reason: str | None) -> None:
        """Stop for a met target (``reason``, or the one already held), once search.min_trials are finished."""
        self.target_reason = self.target_reason or reason
        if self.target_reason and not self.stop_reason:
            n = self.cfg.search.min_trials
            if self._finished_trials() >= n:
                self.stop_reason = self.target_reason + (f" (after search.min_trials={n})" if n else "")

    def _confirm_job(self, number: int, params: dict, config: Any) -> Job:
        job = Job("confirm", number, params, config)

        def steps() -> Generator[Any, Any, None]:
            for repeat in range(1, self.cfg.confirm.repeats + 1):
                job.runs = [(yield config)]
                if not self._finish(job, job.runs[0], repeat=repeat)["meets_target"]:
                    return
            self._target_reached(f"trial {number} met the target, passed parity and was confirmed")

        job.steps = steps()
        self.progress.started(number, "confirm", params)
        return job

    # ---- recording ----------------------------------------------------------------------------

    def _judge(self, job: Job, outcome: Any) -> tuple[str, str | None, dict, dict | None]:
        """Status, reason, metrics and parity verdict of a finished run (parity and memory budget applied)."""
        status, reason, verdict = outcome.status, outcome.reason, None
        metrics = backends.metrics_of(outcome)
        if status == "ok" and outcome.result is not None:
            try:
                if job.kind == "canonical":
                    verdict = self.gate.judge_canonical(outcome.result)
                elif job.kind == "baseline":
                    repeats = [r.result for r in job.runs[1:] if r.status == "ok" and r.result is not None]
                    verdict = self.gate.judge_baseline(outcome.result, repeats)
                else:
                    verdict = self.gate.judge(outcome.result)
            except trust.TrustError as e:
                status, reason, verdict = "infeasible", f"parity: {e}", e.verdict
            if verdict is not None and not verdict["passed"] and status == "ok":
                status, reason = "infeasible", f"parity: {parity.describe_failure(verdict)} (vs the reference)"
        if job.kind == "canonical":
            return status, reason, metrics, verdict  # a reference run: no budget applies to it
        budget = self.cfg.resources.memory_budget_gb
        if status == "ok" and budget and (metrics.get("peak_memory_bytes") or 0) > budget * 2**30:
            status, reason = "infeasible", (f"memory: peak {fmt_bytes(metrics['peak_memory_bytes'])}"
                                            f" > resources.memory_budget_gb={budget:g} GiB")
        return status, reason, metrics, verdict

    def _finish(self, job: Job, outcome: Any, same: dict | None = None, **extra: Any) -> dict:
        status, reason, metrics, verdict = self._judge(job, outcome)
        if same is not None:  # a repeated proposal: what the first measurement said, for the sampler and the table
            metrics, verdict, extra["duplicate_of"] = dict(same["metrics"]), same["parity"], same["trial"]
        base = self.baseline_s or (metrics.get("step_time_s") if job.kind == "baseline" and status == "ok" else None)
        if metrics.get("step_time_s") and base:
            metrics["speedup_vs_baseline"] = base / metrics["step_time_s"]
        target = self.cfg.target.seconds(base)
        meets = (job.kind != "canonical" and status == "ok" and target is not None  # a reference run is no candidate
                 and metrics.get("step_time_s", float("inf")) <= target)
        runs = [r for r in job.runs if r is not None]
        wall = sum(r.wall_s for r in runs)
        run_name = f"trial{job.number}" + ("" if job.kind == "trial" else f"_{job.kind}{extra.get('repeat', '')}")
        if outcome.placement:  # where each rank ran: host, ip, Ray node id, GPU ids (rank order)
            extra["placement"] = outcome.placement
        if traces := outcome.save_traces(self.cfg.results_dir / "traces" / run_name):
            extra["artifacts"] = traces  # tracking logs them under the child run's traces/
        line = L.record(
            sweep=self.cfg.name, trial=job.number, kind=job.kind, backend=self.cfg.backend, params=job.params,
            config=self.configs.to_dict(job.config) if job.config is not None else {}, status=status, reason=reason,
            result=outcome.result.to_dict() if outcome.result is not None else None, prediction=outcome.prediction,
            parity=verdict, metrics=metrics, meets_target=meets, wall_s=wall,
            overhead_s=(wall - sum(r.work_s for r in runs)) if runs and self.cfg.backend == "ray" else None,
            started_at=job.started, finished_at=time.time(), **extra, **_probe_info(job, status),
            **(guided.planner_fields(self.study.sampler, job.params, metrics, job.number) if job.trial else {}))
        self.ledger.append(line)  # first: the source of truth
        self.records.append(line)
        t_book = time.perf_counter()
        if job.trial is not None:
            self._tell(job.trial, line, same)
            job.told = True
        # MLflow synchronously, between trials: in the background it would take CPU from the ranks being measured.
        self._track("log_trial", line)
        if L.best_of(self.records) is line:
            self._track("log_best", line)
        self.bookkeeping.append(time.perf_counter() - t_book)
        best = report.secs(self.best_s, self.cfg.backend == "model")
        self.progress.finished(line, len(L.measured(self.records)), best,
                               self.cfg.target.describe(base))
        if job.kind in ("baseline", "canonical"):
            self._after_baseline(job, status, reason)
        # A prediction costs microseconds and repeats exactly: the model backend searches its whole budget for
        # the best plan instead of stopping at the first one under the target, and has nothing to confirm.
        if meets and job.kind in ("baseline", "trial") and self.cfg.backend == "ray":
            if self.cfg.confirm.repeats == 0:
                self._target_reached(f"trial {job.number} meets the target (confirm.repeats=0)")
            else:
                self.queue.append(self._confirm_job(job.number, job.params, job.config))
        return line

    def _after_baseline(self, job: Job, status: str, reason: str | None) -> None:
        what = "the baseline" if job.kind == "baseline" else "the canonical reference run of the baseline"
        if status == "infeasible" and (reason or "").startswith("parity: "):
            raise SweepError(f"{what} (trial {job.number}) failed parity: {reason[len('parity: '):]}")
        if status != "ok":
            how = "ran but is infeasible" if status == "infeasible" else f"did not run: {status}"
            raise SweepError(f"{what} (trial {job.number}) {how}: {reason}. Fix the baseline config (or "
                             f"resources) first; it is queued again, and rerunning retries it")
        if job.kind == "canonical":
            return
        if not self.study.user_attrs.get("enqueued"):
            # Only now: Optuna pops waiting trials in order, and nothing may run before the baseline.
            for params in self.cfg.enqueue:
                self.study.enqueue_trial(params, user_attrs={"kind": "trial"})
            self.study.set_user_attr("enqueued", True)

    def _tell(self, trial: optuna.trial.Trial, line: dict, same: dict | None = None) -> None:
        src = same or line
        status, m = src["status"], src["metrics"]
        base = self.baseline_s or m.get("step_time_s") or 1.0
        peak, budget = m.get("peak_memory_bytes") or 0, self.cfg.resources.memory_budget_gb
        # A config the memory pre-filter kept from launching broke the memory constraint by prediction.
        prefiltered = status == "skipped" and (src["reason"] or "").startswith(REASON_PREFIX)
        if prefiltered:
            predicted = (src.get("prediction") or {}).get("peak_memory_bytes") or 0
            memory = max(1e-3, predicted / self.prefilter.budget_bytes - 1)
        elif status == "oom":
            memory = 1.0
        else:
            memory = max(0.0, peak / (budget * 2**30) - 1) if budget else 0.0
        constraints = {
            "crash": 1.0 if status in ("failed", "timeout") or (status == "skipped" and not prefiltered) else 0.0,
            "parity": 1.0 if status == "nan" or (src["parity"] and not src["parity"]["passed"]) else 0.0,
            "memory": memory,
        }
        for k, v in constraints.items():
            trial.set_constraint(k, v)
        for k, v in {"constraints": constraints, "status": line["status"], "reason": line["reason"]}.items():
            trial.set_user_attr(k, v)
        value = m.get("step_time_s") if m.get("step_time_s") and status not in ("oom", "nan") else PENALTY_FACTOR * base
        if line["kind"] == "baseline" and line["status"] != "ok":
            # Not a point of the search: not counted against the budget, and the next run measures it again.
            self._requeue(trial.number, trial.params, {"kind": "baseline"})
        elif status == "pruned":
            trial.report(value, step=self.cfg.pruning.after_steps)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, value)


def _probe_info(job: Job, status: str) -> dict:
    if job.kind != "trial":
        return {}
    probe = job.runs[0] if len(job.runs) == 2 or status == "pruned" else None
    if probe is None or probe.result is None:
        return {}
    n = len(probe.result.steps)
    return {"probe": {"steps": n, "step_time_s": probe.result.summary.step_time_s, "wall_s": probe.wall_s,
                      "skipped_steps": job.config.run.steps - n if status == "pruned" else 0}}


def _sampler(cfg: SweepConfig, lines: Callable[[], list] = list) -> optuna.samplers.BaseSampler:
    if cfg.sampler.kind == "guided":  # the planner's picks in turn with TPE (orchestrator/guided.py)
        return guided.sampler_for(cfg, _sampler(dataclasses.replace(cfg, sampler=dataclasses.replace(
            cfg.sampler, kind="tpe"))), lines, log.info)
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


def run_sweep(cfg: SweepConfig) -> tuple[dict, list[dict]]:
    """Run (or resume) the sweep; returns the summary and the ledger lines.

    Nothing is written before Ray is joined (a bad ray.address leaves no store, lock or sweep.yaml behind), and
    sweep.yaml only once the ledger and the study accepted this config, so a refused run keeps the old one.
    """
    backends.join(cfg)
    with L.Ledger(cfg.results_dir / "trials.jsonl").lock():
        sweep = Sweep(cfg)
        # What `report` needs to judge the ledger again (the target, the confirm rule), beside the ledger.
        (cfg.results_dir / "sweep.yaml").write_text(yaml.safe_dump(cfg.raw, sort_keys=False))
        try:
            summary = sweep.run()
        except BaseException as e:  # the MLflow parent must not stay RUNNING: ended FAILED/KILLED with why
            sweep._track("end_sweep", e)
            raise
        finally:
            sweep.lock.release()
        return summary, sweep.records
