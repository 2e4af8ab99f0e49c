"""The sweep-level pictures on the parent run: optimisation history, parameter importances, and step
time vs peak memory with its Pareto front.

Plain matplotlib on the Agg canvas (no pyplot state): Optuna's own matplotlib module is experimental and
draws neither the constraint violations nor the memory axis this tool cares about. Each picture that
cannot be drawn (too few trials, nothing varied) is skipped with a note, never with an exception: the
sweep's results are already in the ledger and the store by the time these are made.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from optuna.trial import TrialState


def write_all(out_dir: Path, study: Any, points: list[dict[str, Any]], target_s: float | None,
              answer: dict[str, Any] | None = None) -> list[str]:
    """Write the three pictures into ``out_dir``; returns notes on any that were skipped. ``answer``: the
    summary's answer (report.answer_dict): the winner and its tie set are marked as the answer, which is not
    necessarily the fastest single run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    if study is None:
        notes.append("optimization history and parameter importances skipped: no Optuna study was given")
    else:
        notes += optimization_history(study, out_dir / "optimization_history.png", target_s, answer)
        notes += param_importances(study, out_dir / "param_importances.png")
    notes += step_time_vs_memory(points, out_dir / "step_time_vs_peak_memory.png", target_s, answer)
    return notes


def _mark_answer(ax: Any, answer: dict[str, Any] | None, x_of: Any) -> None:
    """The answer's winner as a large star at its figure, its tie set as open stars: what the summary names."""
    win = (answer or {}).get("winner")
    if not win:
        return
    for i, c in enumerate(answer.get("ties") or [win]):
        x = x_of(c)
        if x is None:
            continue
        first = i == 0
        ax.scatter([x], [c["step_time_s"]], marker="*", s=320 if first else 200, zorder=5,
                   facecolors="#DD8452" if first else "none", edgecolors="#DD8452",
                   label=(f"the answer: trial {c['trial']} ({c['describe']})" if first else
                          ("tied with the answer" if i == 1 else None)))


def _figure(width: float = 9, height: float = 5.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _feasible(t: optuna.trial.FrozenTrial) -> bool:
    # Any positive constraint value is a violation (crash, parity, memory). Optuna 5 exposes the named
    # values set by Trial.set_constraint as FrozenTrial.constraints; older studies kept constraints_func's
    # sequence under system_attrs["constraints"].
    named = getattr(t, "constraints", None)
    values = list(named.values()) if isinstance(named, dict) else list(t.system_attrs.get("constraints", ()))
    return all(c <= 0 for c in values)


def optimization_history(study: optuna.Study, path: Path, target_s: float | None,
                         answer: dict[str, Any] | None = None) -> list[str]:
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and t.values]
    if not done:
        return ["optimization history skipped: no completed trials"]
    minimize = study.directions[0] == optuna.study.StudyDirection.MINIMIZE
    name = (study.metric_names or ["objective"])[0]
    fig, ax = _figure()
    ok = [t for t in done if _feasible(t)]
    bad = [t for t in done if not _feasible(t)]
    ax.scatter([t.number for t in ok], [t.values[0] for t in ok], color="#4C72B0", label="feasible trial", zorder=3)
    if bad:
        ax.scatter([t.number for t in bad], [t.values[0] for t in bad], color="#C44E52", marker="x",
                   label="infeasible (constraint violated)", zorder=3)
    best, xs, ys = None, [], []
    for t in sorted(ok, key=lambda t: t.number):
        v = t.values[0]
        if best is None or (v < best if minimize else v > best):
            best = v
        xs.append(t.number)
        ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="black", linewidth=1.2,
                label="fastest single run so far" + (" (not the answer's figure)" if answer else ""))
    _mark_answer(ax, answer, lambda c: c["trial"])
    if target_s is not None:
        ax.axhline(target_s, color="#55A868", linestyle="--", label=f"target {target_s:g}")
    other = {s.name.lower(): sum(t.state == s for t in study.trials) for s in (TrialState.PRUNED, TrialState.FAIL)}
    ax.set_title(f"optimization history ({len(done)} complete, {other['pruned']} pruned, {other['fail']} failed)")
    ax.set_xlabel("trial number")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return []


def param_importances(study: optuna.Study, path: Path) -> list[str]:
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and t.values]
    names = sorted({k for t in done for k in t.params})
    varying = [k for k in names if len({repr(t.params.get(k)) for t in done}) > 1]
    if len(done) < 2 or not varying:
        return [f"parameter importances skipped: they need >= 2 completed trials and a parameter that varies "
                f"(have {len(done)} completed, varying: {varying or 'none'})"]
    try:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
            target=(lambda t: t.values[0]) if len(study.directions) > 1 else None)
    except (ValueError, RuntimeError) as exc:  # e.g. no parameter common to every completed trial
        return [f"parameter importances skipped: {exc}"]
    if not imp:
        return ["parameter importances skipped: Optuna found no parameter shared by the completed trials"]
    items = sorted(imp.items(), key=lambda kv: kv[1])
    fig, ax = _figure(9, 1.5 + 0.4 * len(items))
    ax.barh([k for k, _ in items], [v for _, v in items], color="#4C72B0")
    ax.set_xlabel("importance (fANOVA, normalised)")
    ax.set_title(f"parameter importances over {len(done)} completed trials")
    fig.tight_layout()
    fig.savefig(path)
    return []


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated on (memory, time), both minimised; sorted by memory."""
    front, best_time = [], math.inf
    for mem, t in sorted(points):
        if t < best_time:
            front.append((mem, t))
            best_time = t
    return front


def step_time_vs_memory(points: list[dict[str, Any]], path: Path, target_s: float | None,
                        answer: dict[str, Any] | None = None) -> list[str]:
    # Parity failures are recorded as infeasible but were measured: show them (in red), never on the front.
    usable = [p for p in points if (p.get("status") == "ok" or p.get("parity") == "failed")
              and _finite(p.get("step_time_s")) and _finite(p.get("peak_memory_bytes"))]
    if not usable:
        return ["step time vs peak memory skipped: no trial finished with both numbers"]
    fig, ax = _figure()
    mib = 2 ** 20
    groups = (("parity passed", "#4C72B0", lambda p: p["parity"] == "passed" and p["kind"] != "baseline"),
              ("parity not checked", "#8C8C8C", lambda p: p["parity"] not in ("passed", "failed")
               and p["kind"] != "baseline"),
              ("parity failed", "#C44E52", lambda p: p["parity"] == "failed"),
              ("baseline", "black", lambda p: p["kind"] == "baseline"))
    for label, colour, keep in groups:
        for predicted in (False, True):
            sel = [p for p in usable if keep(p) and bool(p.get("prediction")) == predicted]
            if not sel:
                continue
            ax.scatter([p["peak_memory_bytes"] / mib for p in sel], [p["step_time_s"] for p in sel],
                       marker="*" if label == "baseline" else "o", s=120 if label == "baseline" else 40,
                       facecolors="none" if predicted else colour, edgecolors=colour,
                       label=label + (" (predicted)" if predicted else ""), zorder=3)
    for p in usable:
        label = f"{p['trial']}r" if p["kind"] in ("confirm", "repeat") else str(p["trial"])
        ax.annotate(label, (p["peak_memory_bytes"] / mib, p["step_time_s"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    front = pareto_front([(p["peak_memory_bytes"] / mib, p["step_time_s"]) for p in usable
                          if p["status"] == "ok" and p["parity"] != "failed"])
    if len(front) > 1:
        ax.step([m for m, _ in front], [t for _, t in front], where="post", color="#55A868",
                label="Pareto front (parity-clean)")
    _mark_answer(ax, answer, lambda c: c["peak_memory_bytes"] / mib if _finite(c.get("peak_memory_bytes")) else None)
    if target_s is not None:
        ax.axhline(target_s, color="#55A868", linestyle="--", label=f"target {target_s:g} s")
    ax.set_xlabel("peak memory per rank (MiB, largest rank)")
    ax.set_ylabel("step time (s, median of measured updates)")
    ax.set_title("step time vs peak memory (labels: trial numbers, r = a settling re-run)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return []


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
