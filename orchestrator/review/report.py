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
from orchestrator.calibration.verdict import verdict, verdict_lines
from orchestrator.records import answer as A
from orchestrator.calibration.prefilter import prefilter_summary, prefilter_summary_text
from orchestrator.records.record import Kind, Status, TrialRecord
from orchestrator.commands import subcommand
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


def table(records: list[TrialRecord], answer: A.Answer | None = None, limit: int | None = None) -> str:
    """Ranked as the answer ranks (orchestrator.records.answer): the winner first, then configs by their figure
    (paired with the baseline where settling rounds ran), then every other line by trial number. ``*``: the
    config's figure meets the target; ``=`` after a rank: tied with the winner (cannot be told apart)."""
    answer = answer or A.decide(records, Target())
    rows = Q.measured(records)
    place = {c.key: i for i, c in enumerate(answer.ranked)}
    ties = {c.key for c in answer.ties} if answer.tie else set()
    model = any(r.predicted for r in rows)

    def standing(r: TrialRecord) -> A.ConfigFigure | None:
        i = place.get(A.key_of(r.params)) if r.status is Status.OK else None
        return None if i is None else answer.ranked[i]

    ok = sorted((r for r in rows if standing(r)), key=lambda r: (place[standing(r).key], r.trial))
    rest = sorted((r for r in rows if not standing(r)), key=lambda r: r.trial)
    head = ["rank", "trial", "kind", *(["step time (pred.)"] if model else
                                       ["vs baseline", "median (runs)", "this run"]),
            "speedup", "peak mem", "MFU", "parity", "status", "params / reason"]
    body = []
    for r in ok + rest:
        m, pred, s = r.metrics, r.predicted, standing(r)
        speedup = 1 / s.ratio if s and s.ratio and answer.baseline_s else m.speedup_vs_baseline
        if model:
            cols = [secs(s.step_time_s if s else m.step_time_s, pred)]
        else:
            paired = f"{s.ratio:.3f}" + (f" ({s.rounds}p)" if s.rounds else "") if s else "-"
            cols = [paired, f"{secs(s.step_time_s)} ({len(s.runs)})" if s else "-", secs(m.step_time_s)]
        rank = (str(place[s.key] + 1) + ("=" if s.key in ties else "")) if s else "-"
        body.append([rank, str(r.trial), r.kind.value, *cols,
                     f"{speedup:.2f}x" if speedup else "-",
                     fmt_bytes(m.peak_memory_bytes), f"{m.mfu:.1%}" if m.mfu is not None else "-", _parity(r),
                     r.status.value + (" *" if s and answer.meets(r.params) else ""),
                     short_params(r.params) if r.status in (Status.OK, Status.PRUNED) else one_line(r.reason, 90)])
    if limit is not None:
        body = body[:limit]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    lines.append(("ranked by the prediction; ~ predicted by the planner, not measured" if model else
                  "rank 1 is the answer; then by vs baseline: the config's step time over the baseline's, "
                  "paired in the settling rounds (Np: N paired rounds; without any, its median run over the "
                  "baseline's median); median (runs): its absolute median; this run: the trial's own")
                 + "\n* meets the target by that figure" + ("; = tied with rank 1 (cannot be told apart)"
                                                            if ties else ""))
    return "\n".join(lines)


def by_trial(records: list[TrialRecord], answer: A.Answer) -> dict[str, tuple[bool, int | None]]:
    """Trial number -> (its config's figure meets the target, its config's rank in the answer): what each MLflow
    child is tagged with at the end of the sweep."""
    place = {c.key: i + 1 for i, c in enumerate(answer.ranked)}
    return {str(r.trial): (answer.meets(r.params), place.get(A.key_of(r.params))) for r in Q.measured(records)}


def answer_dict(answer: A.Answer) -> dict[str, Any]:
    """The answer as JSON (summary.json, ``best``): what every reader of a summary dict renders."""
    def one(c: A.ConfigFigure) -> dict[str, Any]:
        return {"trial": c.trial, "kind": c.record.kind.value, "params": c.params, "step_time_s": c.step_time_s,
                "runs": len(c.runs), "interval_s": [min(c.runs), max(c.runs)], "ratio": c.ratio,
                "ratio_interval": list(c.interval), "paired_runs": c.rounds, "predicted": c.predicted,
                "describe": c.describe(), "peak_memory_bytes": c.peak_memory_bytes, "changed": c.changed}
    t, n = answer.target, answer.noise
    return {
        "winner": one(answer.winner) if answer.winner else None,
        "leader_trial": answer.leader.trial if answer.leader else None,
        "ties": [one(c) for c in answer.ties], "tie": answer.tie, "tie_break": A.TIE_BREAK, "band": answer.band,
        "threshold": answer.rule.threshold, "confidence": answer.rule.confidence,
        "target": {"state": t.state, "target_s": t.target_s, "interval_s": list(t.interval_s) if t.interval_s else None,
                   "more_rounds": t.more_rounds, "paired": t.paired, "level": t.level},
        "noise": dataclasses.asdict(n), "rounds": answer.rounds, "settled": answer.settled,
        "why_unsettled": answer.why_unsettled, "baseline_s": answer.baseline_s,
    }


def summarize(records: list[TrialRecord], target: Target, rule: A.SettleRule = A.RULE,
              answer: A.Answer | None = None, where: tuple[str, Any] | None = None) -> dict[str, Any]:
    """The sweep's outcome as a plain, JSON-able dict (MLflow's summary.json and ``summary_text`` read it).

    Every verdict in it is the answer's (orchestrator.records.answer.decide): ``best`` is its winner, the
    target verdict its verdict. ``where``: (the sweep's name, its results directory), for the command that
    settles an undecided verdict further (``settle_command``)."""
    answer = answer or A.decide(records, target, rule)
    base = Q.baseline_of(records)
    base_s = answer.baseline_s
    target_s = answer.target.target_s
    win = answer.winner
    ans = answer_dict(answer)
    best = None
    if win is not None:
        best = {**ans["winner"], "speedup": (1 / win.ratio) if base_s and win.ratio else None,
                "repeats_run": sum(r.kind is Kind.REPEAT for r in records)}
    fastest = min(((t, c) for c in answer.ranked for t in c.runs), key=lambda p: p[0], default=None)
    rows = Q.measured(records)
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    pruning = Q.pruning_stats(rows)
    top_record = win.record if win else None
    return {
        "n_trials": len(rows), "statuses": statuses, "backend": rows[0].backend if rows else None,
        "predicted": bool(rows) and rows[0].predicted,
        "baseline_trial": base.trial if base else None, "baseline_step_time_s": base_s,
        "baseline_runs": answer.noise.baseline_runs,
        "best": best, "answer": ans,
        "fastest_run": None if fastest is None or fastest[1] is win else
        {"trial": fastest[1].trial, "step_time_s": fastest[0], "describe": fastest[1].describe()},
        "target": target.describe(base_s), "target_s": target_s,
        "target_met": answer.target.state == A.MET, "target_verdict": answer.target.state,
        "distance_to_target_s": answer.seconds_of(win) - target_s if win and target_s is not None else None,
        "overhead": dataclasses.asdict(Q.overhead_stats(rows)),
        "pruning": {**dataclasses.asdict(pruning), "net_s": pruning.net_s},
        "trials_wall_s": sum(r.wall_s or 0.0 for r in records),
        "prefilter": prefilter_summary(records),
        "numerics": parity.numerics_note(top_record.params, base.params,
                                         top_record.parity.to_dict() if top_record.parity else None)
        if top_record and base else None,
        "breakdowns": _breakdowns(records, target_s, top_record) if rows and rows[0].predicted else [],
        "verdict": verdict(records, target_s),
        "time_to_answer": time_to_answer(records, answer=answer),
        "settle_command": settle_command(answer, *where) if where else None,
    }


def settle_command(answer: A.Answer, sweep: str, results_dir: Any) -> str | None:
    """``steptune settle --sweep NAME --rounds N``: the rounds an undecided target verdict needs, on the same sweep
    (no new trials); None when the verdict is decided, or when no number of rounds can decide it."""
    t = answer.target
    if t.state != A.UNDECIDED or not t.more_rounds or answer.winner is None or answer.winner.predicted:
        return None
    if t.more_rounds > SETTLE_WORTH:
        return None
    return subcommand("settle", sweep, results_dir, "--rounds", str(t.more_rounds))


SETTLE_WORTH = 100
"""The most rounds the summary offers to run: past it the winner sits within the noise of the target (a verdict
that needs hundreds of rounds is a tie with the target, not a question more rounds on this machine should answer)."""


def time_to_answer(records: list[TrialRecord], sessions: list | None = None, within: float = 0.02,
                   answer: A.Answer | None = None) -> dict[str, Any]:
    """Trials and seconds until the first config whose figure is within ``within`` of the winner's was
    measured. Seconds are the sweep's own running time: inside its sessions (orchestrator.sweep.finished), not
    the time between two commands; without sessions, from the first trial's start. Also the planner's |error|
    per trial where a guided sweep recorded one (ledger order)."""
    rows = Q.measured(records)
    answer = answer or A.decide(records, Target())
    out: dict[str, Any] = {"within": within, "trials": None, "seconds": None, "trial": None}
    if answer.winner is not None:
        limit = answer.winner.ratio * (1 + within)
        for i, r in enumerate(rows, 1):
            c = answer.figure_of(A.key_of(r.params)) if r.status is Status.OK else None
            if c is not None and c.ratio <= limit:
                out.update(trials=i, trial=r.trial,
                           seconds=_running_s(rows[0].started_at.timestamp(), r.finished_at.timestamp(), sessions))
                break
    errs = [abs(r.planner["error_pct"]) for r in rows if (r.planner or {}).get("error_pct") is not None]
    third = max(1, len(errs) // 3)
    out["planner_abs_error_pct"] = errs
    out["planner_error_first_pct"] = sum(errs[:third]) / third if errs else None
    out["planner_error_last_pct"] = sum(errs[-third:]) / third if errs else None
    return out


def _running_s(start: float, end: float, sessions: list | None) -> float:
    """Seconds of [start, end] inside the sessions (all of it without sessions)."""
    if not sessions:
        return end - start
    total = 0.0
    for s0, s1 in sessions:
        s1 = end if s1 is None else s1
        total += max(0.0, min(end, s1) - max(start, s0))
    return total


def time_to_answer_text(t: dict[str, Any]) -> str:
    if t["trials"] is None:
        return "time to answer: no usable trial"
    when = f", {t['seconds']:.0f} s of the sweep's running time" if t["seconds"] is not None else ""
    line = (f"time to answer: trial {t['trial']} ({t['trials']} trials{when}) was the first within "
            f"{t['within']:.0%} of the answer")
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
    """The winner's figure as the summary states it: ``median of 4 runs 40.7 ms [40.0, 50.4]``."""
    lo, hi = best["interval_s"]
    return best["describe"] + (f" [{secs(lo)}, {secs(hi)}]" if interval and best["runs"] > 1 else "")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def answer_lines(s: dict[str, Any]) -> list[str]:
    """The answer's own lines (winner, ties, settling, target verdict, noise): the summary, the MLflow parent's
    description and ``report`` all print these."""
    a, best, pred = s["answer"], s.get("best"), s["predicted"]
    out = []
    if best is None:
        return ["no answer: no config ran ok and passed parity"]
    paired = f", {best['ratio']:.3f} of the baseline paired over {best['paired_runs']} round(s)" \
        if best["paired_runs"] else ""
    out.append(f"best (trial {best['trial']}): {_figure(best)} per update{paired}"
               + (f", {best['speedup']:.2f}x the baseline" if best.get("speedup") else "")
               + f"  [{short_params(best['params'])}]")
    if a["tie"]:
        others = ", ".join(f"trial {t['trial']} ({t['ratio']:.3f})" for t in a["ties"][1:])
        band = f"; all within +{a['band']:.0%} of the fastest of them" if a.get("band") is not None else ""
        out.append(f"  a tie: {others} cannot be told apart from it (the {a['confidence']:.0%} interval of their "
                   f"paired ratio to the leader reaches within {a['threshold']:.0%}){band}; picked by the "
                   f"tie-break: {a['tie_break']}")
    elif a["leader_trial"] is not None and a["leader_trial"] != best["trial"]:
        out.append(f"  (lowest figure: trial {a['leader_trial']})")
    if a["rounds"]:
        out.append(f"  settled in {a['rounds']} interleaved round(s) of the baseline and the contenders"
                   + ("" if a["settled"] else f"; not settled: {a['why_unsettled']}"))
    elif not pred and not a["settled"]:
        out.append(f"  not settled (no settling rounds ran): {a['why_unsettled']}")
    t = a["target"]
    if s["target_s"] is not None:
        tgt = secs(s["target_s"], pred)
        iv = t["interval_s"]
        level = t.get("level") or a["confidence"]
        within = f" ({level:.0%} interval {secs(iv[0], pred)}-{secs(iv[1], pred)}" + \
            (", paired with the baseline)" if t["paired"] else ")") if iv and iv[0] != iv[1] else ""
        if t["state"] == A.MET:
            out.append(f"target met: trial {best['trial']}, {_figure(best, interval=False)} <= {tgt}{within}"
                       + (" (predicted; confirm it with a real run)" if pred else ""))
        elif t["state"] == A.NOT_MET:
            d = s["distance_to_target_s"]
            out.append(f"target not met: trial {best['trial']}, {_figure(best, interval=False)} is "
                       f"{secs(d, pred)} ({d / s['target_s']:.1%}) above {tgt}{within}")
        else:
            more = f"; about {t['more_rounds']} more round(s) would decide it" if t["more_rounds"] else \
                ("; a prediction's interval is the model's uncertainty: measure the config, or calibrate on the "
                 "cluster to narrow it" if pred else "; its figure sits on the target, more rounds cannot decide it")
            out.append(f"target undecided: trial {best['trial']}, {_figure(best, interval=False)} against "
                       f"{tgt}{within}{more}")
            if s.get("settle_command"):
                out.append(f"  to decide it, run those rounds on this sweep (no new trials): {s['settle_command']}")
            elif (t["more_rounds"] or 0) > SETTLE_WORTH:
                out.append(f"  over {SETTLE_WORTH} rounds: the winner is within this machine's noise of the target; "
                           f"treat it as on the target, or measure on quieter or larger hardware")
    n = a["noise"]
    if not pred and n["baseline_runs"]:
        load = f"; load (1 min) while measuring: median {n['load_median']:.1f}, max {n['load_max']:.1f}" \
            if n["load_median"] is not None else ""
        out.append(f"noise: baseline spread {_pct(n['baseline_spread'])} over {n['baseline_runs']} run(s); "
                   f"re-measured configs' median spread {_pct(n['remeasured_spread'])}, "
                   f"{_pct(n['paired_spread'])} paired{load}")
    return out


def stop_line(reason: str, target_stop: int | None, answer: A.Answer) -> str:
    """Why the sweep stopped, rendered from the final answer (so it cannot name another config or verdict)."""
    if not reason.startswith("target"):
        return reason
    win, state = answer.winner, answer.target.state
    tail = reason[len("target"):]
    if state == A.MET and win is not None:
        return (f"settling rounds found the target met{tail}: trial {win.trial}, {win.describe()}, verdict "
                f"{state} (the answer below)")
    return (f"settling rounds found the target met after {target_stop} trials{tail}; after the final rounds "
            f"the verdict is {state} (the answer below)")


def summary_text(s: dict[str, Any]) -> str:
    pred = s["predicted"]
    out = [f"trials: {s['n_trials']} ({', '.join(f'{k} {v}' for k, v in sorted(s['statuses'].items()))}); "
           f"time in trials {s['trials_wall_s']:.1f} s"]
    if s["baseline_step_time_s"] is not None:
        runs = f" (median of {s['baseline_runs']} runs)" if s.get("baseline_runs", 1) > 1 else ""
        out.append(f"baseline (trial {s['baseline_trial']}): {secs(s['baseline_step_time_s'], pred)} per "
                   f"update{runs}")
    out.extend(answer_lines(s))
    if s.get("fastest_run"):
        f = s["fastest_run"]
        out.append(f"fastest single run: trial {f['trial']}, {secs(f['step_time_s'])} (not the answer: that "
                   f"config's {f['describe']})")
    out.append(f"target: {s['target']}")
    out.extend(verdict_lines(s.get("verdict")))  # model backend: the interval's basis, the efficiency set
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
        duty = f"; duty cycle {s['duty_cycle']:.0%} (time in training updates / wall)" \
            if s.get("duty_cycle") is not None else ""
        out.append(f"this run: {s['sweep_wall_s']:.1f} s wall, of which {s['startup_s']:.1f} s starting the backend"
                   + (f"; worker group formed {s['group_builds']}x (warm across trials, rebuilt only after a "
                      f"failure)" if s.get("group_builds") else "")
                   + (f"; driver work between trials (Optuna, handing MLflow its calls) median {book:.2f} s"
                      if book is not None else "")
                   + (f"; MLflow logging in the driver's own time {s['mirror_inline_s']:.1f} s"
                      if s.get("mirror_inline_s") else "")
                   + duty)
        t = s.get("time_parts")
        if t and t.get("wall_s"):
            out.append(f"  where the wall went: start {t['start_s']:.1f} s, training updates {t['search_updates_s']:.1f} s "
                       f"(search) + {t['settling_updates_s']:.1f} s (settling), runs' overhead "
                       f"{t['search_overhead_s'] + t['settling_overhead_s']:.1f} s, driver between runs "
                       f"{t['between_runs_s']:.1f} s, MLflow backlog at the end {t['flush_s']:.1f} s")
    p = s["pruning"]
    if p["pruned"] or p["probe_cost_s"]:
        out.append(f"pruning: {p['pruned']} trial(s) stopped after their probe, "
                   f"saving ~{p['saved_s']:.1f} s of updates "
                   f"(estimated at the probes' pace); probes of kept trials cost {p['probe_cost_s']:.1f} s (measured); "
                   f"net {p['net_s']:+.1f} s")
    return "\n".join(out)


class Progress:
    """One line per started and per finished trial; on a terminal, a ticking status line in between."""

    def __init__(self, budget: int, stream: TextIO | None = None, done: int = 0):
        """``done``: trials the ledger already holds (a resumed sweep counts on from there)."""
        self.budget, self.stream = budget, stream or sys.stdout
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.running: dict[int, str] = {}
        self.best = "-"
        self.target = "-"
        self.done = done

    def _counter(self, kind: str) -> str:
        """``[ 12/20]`` for the search; a settling run shows its round instead of a frozen trial count."""
        return f"[{kind.split(':')[0]}]" if kind.startswith("round") else f"[{self.done:>3}/{self.budget}]"

    def _write(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self.stream.flush()

    def started(self, number: int, kind: str, params: dict) -> None:
        self.running[number] = kind
        label = f"{kind.split(': ')[1]} {number}" if kind.startswith("round") else f"{kind} {number}"
        self._write(f"{self._counter(kind)} {label} started: {short_params(params)}")

    def finished(self, r: TrialRecord, done: int, best: str, target: str) -> None:
        kind = self.running.pop(r.trial, "")
        self.done, self.best, self.target = done, best, target
        m = r.metrics
        what = secs(m.step_time_s, r.predicted)
        if m.speedup_vs_baseline:
            what += f" ({m.speedup_vs_baseline:.2f}x)"
        tail = f" parity {_parity(r)}" if r.parity is not None else ""
        why = f" - {one_line(r.reason)}" if r.reason else ""
        label = (f"trial {r.trial} (run {r.repeat + 1})" if r.kind in (Kind.CONFIRM, Kind.REPEAT)
                 else f"{r.kind.value} {r.trial}")
        counter = self._counter(kind) if r.round is not None else f"[{done:>3}/{self.budget}]"
        self._write(f"{counter} {label} {r.status.value}: {what}{tail}{why} | "
                    f"best {best} | target {target} | {time.perf_counter() - self.t0:.0f} s")

    def tick(self) -> None:
        if self.tty and self.running:
            now = ", ".join(f"{k} {n}" for n, k in self.running.items())
            self.stream.write(f"\r\033[K  running {now} | best {self.best} | target {self.target} | "
                              f"{time.perf_counter() - self.t0:.0f} s")
            self.stream.flush()

