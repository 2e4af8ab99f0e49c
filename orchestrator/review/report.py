"""What a person reads: the live progress lines, the final table, the summary. All from trial records.

Predicted (model backend) numbers are marked ``~`` and the table says they are predictions.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, TextIO

from orchestrator.parity import verdict as parity
from orchestrator.records import query as Q
from orchestrator.plan.verdict import verdict, verdict_lines
from orchestrator.records import winner as W
from orchestrator.plan.prefilter import prefilter_summary, prefilter_summary_text
from orchestrator.records.record import Kind, Status, TrialRecord
from orchestrator.search.target import Target
from orchestrator.units import fmt_bytes

_SHORT = {"batch.micro_batch_size": "mbs", "parallel.pp": "pp", "pipeline.schedule": "sched",
          "pipeline.virtual_stages": "v", "pipeline.split.first": "first", "pipeline.split.last": "last",
          "data_parallel.overlap_grad_reduce": "overlap", "data_parallel.bucket_mb": "bucket_mb",
          "data_parallel.kind": "dp", "recompute.kind": "recompute", "recompute.num_layers": "rc_layers",
          "recompute.method": "rc_method", "recompute.matmul_period": "rc_mm_period", "pipeline.split.kind": "split",
          "optimizer.overlap_param_gather": "param_gather", "data_parallel.overlap_param_gather": "param_gather",
          "tensor_parallel.size": "tp", "tensor_parallel.sequence_parallel": "sp",
          "tensor_parallel.comm_overlap": "tp_overlap", "pipeline_comm.overlap_p2p": "p2p_overlap",
          "optimizer.grad_reduce_dtype": "grad_dtype"}


def short_params(params: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    return " ".join(f"{_SHORT.get(k, k)}={fmt(v)}" for k, v in params.items())


def secs(v: float | None, predicted: bool = False) -> str:
    if v is None:
        return "-"
    s = f"{v * 1000:.1f} ms" if v < 1 else f"{v:.3f} s"
    return "~" + s if predicted else s


def one_line(reason: str | None, width: int = 120) -> str:
    """A reason as the progress line and the table show it: its first line, cut to ``width``.

    Reasons lead with a one-line summary; what follows (Ray's page on a dead worker, say) stays in the ledger.
    """
    first = next((ln.strip() for ln in (reason or "").splitlines() if ln.strip()), "")
    first = " ".join(first.split())
    return first if len(first) <= width else first[:width - 3] + "..."


def _parity(r: TrialRecord) -> str:
    p = r.parity
    if p is None:
        return "n/a" if r.predicted else "-"
    return "pass" if p.passed else f"FAIL {p.first_fail_metric}@{p.first_fail_step}"


def _ranked(records: list[TrialRecord]) -> tuple[list[W.Standing], dict[str, int]]:
    """The ranking (orchestrator.records.winner.standings) and each config's place in it, by ``key_of`` params."""
    ranked = W.standings(records)
    return ranked, {s.key: i for i, s in enumerate(ranked)}


def table(records: list[TrialRecord], target_s: float | None = None, limit: int | None = None) -> str:
    """Ranked as the answer is chosen (orchestrator.records.winner): configs by the median of their runs (a
    config run once: that run), then every other line by trial number. ``*``: the config meets ``target_s``
    by that same figure."""
    rows = Q.measured(records)
    ranked, place = _ranked(records)
    base_s = Q.baseline_s(records)
    model = any(r.predicted for r in rows)

    def standing(r: TrialRecord) -> W.Standing | None:
        i = place.get(W.key_of(r.params)) if r.status is Status.OK else None
        return None if i is None else ranked[i]

    ok = sorted((r for r in rows if standing(r)), key=lambda r: (place[standing(r).key], r.trial))
    rest = sorted((r for r in rows if not standing(r)), key=lambda r: r.trial)
    # A prediction is its config's one "run": its column is the figure. A measured config's row shows the
    # figure it is ranked by (with its number of runs) and, beside it, the trial's own run.
    head = ["rank", "trial", "kind", *(["step time (pred.)"] if model else ["median (runs)", "this run"]),
            "speedup", "peak mem", "MFU", "parity", "status", "params / reason"]
    body = []
    for r in ok + rest:
        m, pred, s = r.metrics, r.predicted, standing(r)
        figure = f"{secs(s.step_time_s, pred)}" + ("" if model else f" ({len(s.runs)})") if s else "-"
        speedup = base_s / s.step_time_s if s and base_s else m.speedup_vs_baseline
        body.append([str(place[s.key] + 1) if s else "-", str(r.trial), r.kind.value,
                     *([figure if s else secs(m.step_time_s, pred)] if model else [figure, secs(m.step_time_s)]),
                     f"{speedup:.2f}x" if speedup else "-",
                     fmt_bytes(m.peak_memory_bytes), f"{m.mfu:.1%}" if m.mfu is not None else "-", _parity(r),
                     r.status.value + (" *" if s and s.meets(target_s) else ""),
                     short_params(r.params) if r.status in (Status.OK, Status.PRUNED) else one_line(r.reason, 90)])
    if limit is not None:
        body = body[:limit]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    lines.append(("ranked by the prediction; ~ predicted by the planner, not measured" if model else
                  "ranked by median (runs): the median of the config's runs (confirm and re-measurement runs "
                  "included; one run: that run); this run: the trial's own") + "\n* meets the target by that figure")
    return "\n".join(lines)


def summarize(records: list[TrialRecord], target: Target, rule: W.WinnerRule = W.RULE) -> dict[str, Any]:
    """The sweep's outcome as a plain, JSON-able dict (MLflow's summary.json and ``summary_text`` read it).

    ``best`` is the one answer (orchestrator.records.winner.best); the target verdict is judged on its figure.
    """
    base = Q.baseline_of(records)
    base_s = Q.baseline_s(records)
    target_s = target.seconds(base_s)
    ranked, _ = _ranked(records)
    top = ranked[0] if ranked else None
    best = W.summary(records, rule)
    if best is not None:
        best["speedup"] = base_s / best["step_time_s"] if base_s else None
    fastest = min(((t, s) for s in ranked for t in s.runs), key=lambda p: p[0], default=None)
    rows = Q.measured(records)
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    pruning = Q.pruning_stats(rows)
    top_record = top.record if top else None
    return {
        "n_trials": len(rows), "statuses": statuses, "backend": rows[0].backend if rows else None,
        "predicted": bool(rows) and rows[0].predicted,
        "baseline_trial": base.trial if base else None, "baseline_step_time_s": base_s,
        "best": best,
        "fastest_run": None if fastest is None or fastest[1] is top else
        {"trial": fastest[1].trial, "step_time_s": fastest[0], "describe": fastest[1].describe()},
        "target": target.describe(base_s), "target_s": target_s,
        "target_met": bool(top and top.meets(target_s)),
        "distance_to_target_s": top.step_time_s - target_s if top and target_s is not None else None,
        "overhead": dataclasses.asdict(Q.overhead_stats(rows)),
        "pruning": {**dataclasses.asdict(pruning), "net_s": pruning.net_s},
        "trials_wall_s": sum(r.wall_s or 0.0 for r in records),
        "prefilter": prefilter_summary(records),
        "numerics": parity.numerics_note(top_record.params, base.params,
                                         top_record.parity.to_dict() if top_record.parity else None)
        if top_record and base else None,
        "breakdowns": _breakdowns(records, target_s, top_record) if rows and rows[0].predicted else [],
        "verdict": verdict(records, target_s),
        "time_to_answer": time_to_answer(records),
    }


def time_to_answer(records: list[TrialRecord], within: float = 0.02) -> dict[str, Any]:
    """Trials and seconds (from the first trial's start) until the first config whose figure is within ``within``
    of the best config's was measured, and the planner's |error| per trial where a guided sweep recorded one
    (ledger order)."""
    rows = Q.measured(records)
    ranked, place = _ranked(records)
    out: dict[str, Any] = {"within": within, "trials": None, "seconds": None, "trial": None}
    if ranked:
        limit = ranked[0].step_time_s * (1 + within)
        for i, r in enumerate(rows, 1):
            j = place.get(W.key_of(r.params)) if r.status is Status.OK else None
            if j is not None and ranked[j].step_time_s <= limit:
                out.update(trials=i, trial=r.trial, seconds=(r.finished_at - rows[0].started_at).total_seconds())
                break
    errs = [abs(r.planner["error_pct"]) for r in rows if (r.planner or {}).get("error_pct") is not None]
    third = max(1, len(errs) // 3)
    out["planner_abs_error_pct"] = errs
    out["planner_error_first_pct"] = sum(errs[:third]) / third if errs else None
    out["planner_error_last_pct"] = sum(errs[-third:]) / third if errs else None
    return out


def time_to_answer_text(t: dict[str, Any]) -> str:
    if t["trials"] is None:
        return "time to answer: no usable trial"
    when = f", {t['seconds']:.0f} s in" if t["seconds"] is not None else ""
    line = (f"time to answer: trial {t['trial']} ({t['trials']} trials{when}) was the first within "
            f"{t['within']:.0%} of the best found")
    if t.get("planner_error_first_pct") is not None:
        line += (f"; planner |error| {t['planner_error_first_pct']:.0f}% (first third of the trials) -> "
                 f"{t['planner_error_last_pct']:.0f}% (last third)")
    return line


BREAKDOWN = (("forward", "forward_s"), ("backward", "backward_s"), ("recompute", "recompute_s"),
             ("exposed dp comm", "dp_exposed_s"), ("pp bubble", "pp_bubble_s"), ("pp p2p", "pp_p2p_s"),
             ("tp comm", "tp_comm_s"), ("optimizer", "optimizer_s"))


def _breakdowns(records: list[TrialRecord], target_s: float | None, best: TrialRecord | None) -> list[str]:
    """Model backend: where the predicted time goes, for the baseline, the best and every config under target."""
    picked = [r for r in records if r.status is Status.OK and r.prediction and r.metrics.step_time_s is not None
              and (r.kind is Kind.BASELINE or r is best
                   or (target_s is not None and r.metrics.step_time_s <= target_s))]
    picked.sort(key=lambda r: r.metrics.step_time_s)
    base = [r for r in picked if r.kind is Kind.BASELINE]
    shown = picked[:10] + [r for r in base if r not in picked[:10]]
    out = []
    for r in shown:
        p = r.prediction  # the planner's own dict (orchestrator.planner): its keys are the planner's schema
        parts = ", ".join(f"{name} {p[key]:.2f}" for name, key in BREAKDOWN if (p.get(key) or 0) >= 0.005)
        out.append(f"  trial {r.trial} ({r.kind.value}): ~{p['step_time_s']:.2f} s = {parts} s; peak "
                   f"{p['peak_memory_bytes'] / 1e9:.0f} GB/GPU [{short_params(r.params)}]")
    if len(picked) > len(shown):
        out.append(f"  ... and {len(picked) - len(shown)} more under the target (all in the ledger and MLflow)")
    return out


def _figure(best: dict[str, Any], interval: bool = True) -> str:
    """The best config's figure as the summary states it: ``median of 4 runs 40.7 ms [40.0, 50.4]``."""
    lo, hi = best["interval_s"]
    return best["describe"] + (f" [{secs(lo)}, {secs(hi)}]" if interval and best["runs"] > 1 else "")


def summary_text(s: dict[str, Any]) -> str:
    pred = s["predicted"]
    out = [f"trials: {s['n_trials']} ({', '.join(f'{k} {v}' for k, v in sorted(s['statuses'].items()))}); "
           f"time in trials {s['trials_wall_s']:.1f} s"]
    if s["baseline_step_time_s"] is not None:
        out.append(f"baseline (trial {s['baseline_trial']}): {secs(s['baseline_step_time_s'], pred)} per update")
    best = s.get("best")
    if best is not None:
        out.append(f"best (trial {best['trial']}): {_figure(best)} per update"
                   + (f", {best['speedup']:.2f}x the baseline" if best.get("speedup") else "")
                   + f"  [{short_params(best['params'])}]")
        if (settling := W.settling_text(best)) is not None:
            out.append(f"  {settling}")
    if s.get("fastest_run"):
        f = s["fastest_run"]
        out.append(f"fastest single run: trial {f['trial']}, {secs(f['step_time_s'])} (not the best: that config's "
                   f"{f['describe']})")
    out.append(f"target: {s['target']}")
    if best is not None and s["target_s"] is not None:
        # Judged on the best config's figure, the same the table ranks by and `export` exports.
        t = secs(s["target_s"], pred)
        if s["target_met"]:
            out.append(f"target met: trial {best['trial']}, {_figure(best, interval=False)} <= {t}"
                       + (" (predicted; confirm it with a real run)" if pred else ""))
        else:
            d = s["distance_to_target_s"]
            out.append(f"target not met: trial {best['trial']}, {_figure(best, interval=False)} is "
                       f"{secs(d, pred)} ({d / s['target_s']:.1%}) above {t}")
    out.extend(verdict_lines(s.get("verdict")))  # model backend: band, robust or point only, efficiency basis
    if s.get("time_to_answer"):
        out.append(time_to_answer_text(s["time_to_answer"]))
    if s.get("numerics"):
        out.append(s["numerics"])
    if s.get("parity_shared_with_canonical"):  # the canonical run could not set these canonical (memory)
        out.append(f"parity blind spot: the canonical run shares {', '.join(s['parity_shared_with_canonical'])} "
                   f"with the baseline; a bug there is in both and no verdict can see it")
    if s.get("breakdowns"):
        out.append("predicted breakdown (critical path; the parts overlap where the planner says so):")
        out.extend(s["breakdowns"])
    if s.get("prefilter", {}).get("skipped"):
        out.append(prefilter_summary_text(s["prefilter"]))
    o = s["overhead"]
    if o["median_s"] is not None:
        out.append(f"per-trial overhead (trial wall - time in updates): median {o['median_s']:.2f} s, "
                   f"max {o['max_s']:.2f} s over {o['n']} trials")
    if s.get("sweep_wall_s") is not None:
        book = s.get("bookkeeping_median_s")
        out.append(f"this run: {s['sweep_wall_s']:.1f} s wall, of which {s['startup_s']:.1f} s starting the backend"
                   + (f"; worker group formed {s['group_builds']}x (warm across trials, rebuilt only after a "
                      f"failure)" if s.get("group_builds") else "")
                   + (f"; driver work between trials (Optuna, MLflow) median {book:.2f} s" if book is not None else ""))
    p = s["pruning"]
    if p["pruned"] or p["probe_cost_s"]:
        out.append(f"pruning: {p['pruned']} trial(s) stopped after their probe, "
                   f"saving ~{p['saved_s']:.1f} s of updates "
                   f"(estimated at the probes' pace); probes of kept trials cost {p['probe_cost_s']:.1f} s (measured); "
                   f"net {p['net_s']:+.1f} s")
    return "\n".join(out)


class Progress:
    """One line per started and per finished trial; on a terminal, a ticking status line in between."""

    def __init__(self, budget: int, stream: TextIO | None = None):
        self.budget, self.stream = budget, stream or sys.stdout
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.running: dict[int, str] = {}
        self.best = "-"
        self.target = "-"
        self.done = 0

    def _write(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self.stream.flush()

    def started(self, number: int, kind: str, params: dict) -> None:
        self.running[number] = kind
        self._write(f"[{self.done:>3}/{self.budget}] {kind} {number} started: {short_params(params)}")

    def finished(self, r: TrialRecord, done: int, best: str, target: str) -> None:
        self.running.pop(r.trial, None)
        self.done, self.best, self.target = done, best, target
        m = r.metrics
        what = secs(m.step_time_s, r.predicted)
        if m.speedup_vs_baseline:
            what += f" ({m.speedup_vs_baseline:.2f}x)"
        tail = f" parity {_parity(r)}" if r.parity is not None else ""
        why = f" - {one_line(r.reason)}" if r.reason else ""
        label = f"{r.kind.value} {r.trial}" + (f" repeat {r.repeat}" if r.kind is Kind.CONFIRM else "")
        self._write(f"[{done:>3}/{self.budget}] {label} {r.status.value}: {what}{tail}{why} | "
                    f"best {best} | target {target} | {time.perf_counter() - self.t0:.0f} s")

    def tick(self) -> None:
        if self.tty and self.running:
            now = ", ".join(f"{k} {n}" for n, k in self.running.items())
            self.stream.write(f"\r\033[K  running {now} | best {self.best} | target {self.target} | "
                              f"{time.perf_counter() - self.t0:.0f} s")
            self.stream.flush()

