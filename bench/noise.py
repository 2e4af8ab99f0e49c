"""Does the answer hold under noise? The default sweep run several times, quietly and beside a noisy neighbour.

    PYTHONPATH=. .venv/bin/python bench/noise.py [--config search_spaces/default.yaml] [--runs 5]
        [--neighbours 3] [--modes quiet,noisy] [--out bench/results/noise.md] [KEY=VALUE ...]

Each run is a fresh sweep (its own results directory, its own Optuna and MLflow stores) through the real CLI
(``python -m orchestrator sweep``), so what is measured is what a user gets. ``noisy`` runs start
``--neighbours`` CPU-burning processes (a busy loop each) beside the sweep for its whole duration; ``quiet`` runs
start none (the rest of the machine is whatever it is: its load is reported).

Reported per mode:

- **agreement**: how often two runs name the same winner config, how often their tie sets overlap, how often
  their target verdicts agree (over all pairs of runs);
- **contradictions** inside one run (goal 0): the stop line, the summary's winner, the table's rank 1, the
  default export's trial, the MLflow parent's ``steptune.best_trial`` and every child's ``meets_target`` tag
  against the answer: each that names another config or verdict counts one;
- **cost**: the sweep's wall time, the share of it spent in settling rounds, the duty cycle (time in training
  updates / wall time, from the sweep's summary), the machine's load while measuring.

A measurement, not a test: nothing here asserts; the table says what happened.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.export import bundle  # noqa: E402
from orchestrator.records import answer as A  # noqa: E402
from orchestrator.records.ledger import read_records  # noqa: E402
from orchestrator.records.record import Kind  # noqa: E402
from orchestrator.review import report  # noqa: E402
from orchestrator.sweep.config import load_saved_sweep  # noqa: E402


@dataclass
class Run:
    mode: str
    index: int
    wall_s: float
    rc: int
    winner: str | None = None
    winner_trial: int | None = None
    ties: list[str] = field(default_factory=list)
    verdict: str | None = None
    contradictions: list[str] = field(default_factory=list)
    settling_share: float | None = None
    duty_cycle: float | None = None
    load_median: float | None = None
    rounds: int = 0
    trials: int = 0
    baseline_spread: float | None = None
    parts: dict = field(default_factory=dict)
    """Where the sweep's wall time went (its summary's ``time_parts``, orchestrator.sweep.loop.time_parts)."""
    load_before: list = field(default_factory=list)
    """The machine's load averages (1, 5, 15 min, as ``uptime`` prints them) just before the sweep started."""
    load_after: list = field(default_factory=list)
    settling_runs: int = 0
    baseline_settling_runs: int = 0
    time_to_answer_s: float | None = None
    """Seconds of the sweep's running time until the first config within 2% of the answer was measured."""
    mirror_inline_s: float | None = None
    """Seconds the driver spent on MLflow calls itself (the mirror process fell behind and it took over)."""

    @property
    def command_duty(self) -> float | None:
        """Time in training updates over the whole command's wall (Python, Ray and the stores starting, the
        sweep, the summary, the exit): what the sweep's own duty cycle leaves out of its window."""
        updates = self.parts.get("search_updates_s", 0.0) + self.parts.get("settling_updates_s", 0.0)
        return updates / self.wall_s if self.parts and self.wall_s else None


def one_sweep(config: str, overrides: list[str], where: Path, neighbours: int) -> tuple[float, int, str]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(neighbours)]  # a neighbour: one core's worth of busy loop, until killed
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", "--config", config,
                               f"storage.results_dir={where}", *overrides], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return time.perf_counter() - t0, proc.returncode, proc.stdout + proc.stderr


def judge(run: Run, results: Path, output: str) -> None:
    """Read one finished sweep back: its answer, and every output that could contradict it."""
    (ledger,) = results.glob("*/trials.jsonl")
    records = read_records(ledger)
    saved = load_saved_sweep(ledger.parent)
    answer = A.decide(records, saved.target, saved.winner)
    summary = json.loads((ledger.parent / "summary.json").read_text())
    win = answer.winner
    run.winner, run.winner_trial = (win.key, win.trial) if win else (None, None)
    run.ties = [c.key for c in answer.ties]
    run.verdict = answer.target.state
    run.rounds, run.trials = answer.rounds, sum(r.kind in (Kind.BASELINE, Kind.TRIAL) for r in records)
    run.baseline_spread = answer.noise.baseline_spread
    run.load_median = answer.noise.load_median
    run.duty_cycle = summary.get("duty_cycle")
    run.parts = summary.get("time_parts") or {}
    run.mirror_inline_s = summary.get("mirror_inline_s")
    run.settling_runs = sum(r.round is not None for r in records)
    base = next((r.trial for r in records if r.kind is Kind.BASELINE), None)
    run.baseline_settling_runs = sum(r.round is not None and r.trial == base for r in records)
    run.time_to_answer_s = (summary.get("time_to_answer") or {}).get("seconds")
    rounds_s = sum(r.wall_s for r in records if r.round is not None)
    run.settling_share = rounds_s / run.wall_s if run.wall_s else None
    bad = run.contradictions
    best = (summary.get("best") or {}).get("trial")
    if best != run.winner_trial:
        bad.append(f"summary.json best {best} != answer {run.winner_trial}")
    if summary.get("target_verdict") != run.verdict:
        bad.append(f"summary verdict {summary.get('target_verdict')} != answer {run.verdict}")
    stop = summary.get("stopped_because", "")
    if stop.startswith("settling rounds found the target met:") and f"trial {run.winner_trial}," not in stop:
        bad.append(f"stop line names another trial: {stop}")
    if stop.startswith("settling rounds found the target met:") and run.verdict != A.MET:
        bad.append(f"stop line says met, the answer says {run.verdict}")
    rank1 = next((ln for ln in output.splitlines() if ln[:2] in ("1 ", "1=")), None)
    if win is not None and (rank1 is None or rank1.split()[1] != str(run.winner_trial)):
        bad.append(f"table rank 1 is not trial {run.winner_trial}: {rank1}")
    if win is not None:
        picked, _ = bundle.pick(bundle.read_ledger(ledger), None, False, answer)
        if picked.trial != run.winner_trial:
            bad.append(f"export default trial {picked.trial} != answer {run.winner_trial}")
    _mlflow(run, results, saved, answer, records)


def _mlflow(run: Run, results: Path, saved, answer: A.Answer, records) -> None:
    from mlflow.tracking import MlflowClient

    if not saved.tracking.enabled:
        return
    client = MlflowClient(saved.mlflow_uri)
    exp = client.get_experiment_by_name(saved.tracking.experiment)
    parents = client.search_runs([exp.experiment_id], "tags.\"steptune.role\" = 'parent'")
    tags = parents[0].data.tags
    if tags.get("steptune.best_trial") != str(run.winner_trial):
        run.contradictions.append(f"MLflow best_trial {tags.get('steptune.best_trial')} != {run.winner_trial}")
    if tags.get("steptune.target_verdict") != run.verdict:
        run.contradictions.append(f"MLflow verdict {tags.get('steptune.target_verdict')} != {run.verdict}")
    children = client.search_runs([exp.experiment_id], f"tags.\"mlflow.parentRunId\" = '{parents[0].info.run_id}'",
                                  max_results=5000)
    if len(children) != len(records):
        run.contradictions.append(f"MLflow children {len(children)} != ledger lines {len(records)}")
    meets = {str(r.trial): answer.meets(r.params) for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)}
    wrong = [c for c in children if c.data.tags.get("steptune.kind") != "canonical"
             and c.data.tags.get("steptune.meets_target") != ("true" if meets.get(c.data.tags["steptune.trial"])
                                                               else "false")]
    if wrong:
        run.contradictions.append(f"{len(wrong)} MLflow children's meets_target differ from the answer")


def agreement(runs: list[Run]) -> dict[str, float | None]:
    ok = [r for r in runs if r.winner is not None]
    pairs = list(itertools.combinations(ok, 2))
    if not pairs:
        return {"same_winner": None, "ties_overlap": None, "same_verdict": None}
    return {"same_winner": sum(a.winner == b.winner for a, b in pairs) / len(pairs),
            "ties_overlap": sum(bool(set(a.ties) & set(b.ties)) for a, b in pairs) / len(pairs),
            "same_verdict": sum(a.verdict == b.verdict for a, b in pairs) / len(pairs)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def table(runs: list[Run], cmd: str, neighbours: int) -> str:
    out = [f"# The answer under noise (`bench/noise.py`)", "", f"Command: `{cmd}`", "",
           f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores; "
           f"noisy = {neighbours} CPU-burning neighbour process(es) beside the sweep.", "",
           "| mode | runs | same winner (pairs) | tie sets overlap | same verdict | contradictions | wall s (median) "
           "| settling share | duty cycle (median) | whole command's duty (median) | load (median) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in dict.fromkeys(r.mode for r in runs):
        rs = [r for r in runs if r.mode == mode]
        a = agreement(rs)
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out.append(f"| {mode} | {len(rs)} | {_pct(a['same_winner'])} | {_pct(a['ties_overlap'])} | "
                   f"{_pct(a['same_verdict'])} | {sum(len(r.contradictions) for r in rs)} | "
                   f"{med([r.wall_s for r in rs]):.0f} | {_pct(med([r.settling_share for r in rs if r.settling_share is not None]))} | "
                   f"{_pct(med([r.duty_cycle for r in rs if r.duty_cycle is not None]))} | "
                   f"{_pct(med([r.command_duty for r in rs if r.command_duty is not None]))} | "
                   f"{(med([r.load_median for r in rs if r.load_median is not None]) or 0):.1f} |")
    out += ["", "Per run (wall s: the whole command's; sweep s: the sweep's own window, which its duty cycle is "
            "taken over):", "", "| mode | # | rc | trials | rounds | winner (trial) | tie set size | verdict | "
            "baseline spread | wall s | sweep s | duty cycle | MLflow in the driver s | contradictions |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        sweep_s = r.parts.get("wall_s")
        out.append(f"| {r.mode} | {r.index} | {r.rc} | {r.trials} | {r.rounds} | {r.winner_trial} | {len(r.ties)} | "
                   f"{r.verdict} | {_pct(r.baseline_spread)} | {r.wall_s:.0f} | "
                   f"{'-' if sweep_s is None else f'{sweep_s:.0f}'} | {_pct(r.duty_cycle)} | "
                   f"{'-' if r.mirror_inline_s is None else f'{r.mirror_inline_s:.1f}'} | "
                   f"{'; '.join(r.contradictions) or 0} |")
    out += _parts_table(runs)
    winners = {}
    for r in runs:
        if r.winner:
            winners.setdefault(r.winner, []).append(f"{r.mode}{r.index}")
    out += ["", "Winner configs (params) and the runs that named them:", ""]
    out += [f"- `{k}`: {', '.join(v)}" for k, v in winners.items()]
    return "\n".join(out) + "\n"


PARTS = (("start_s", "start (backend, Ray, worker group)"), ("search_updates_s", "search runs: training updates"),
         ("search_overhead_s", "search runs: overhead (dispatch, build, process groups, transfer)"),
         ("settling_updates_s", "settling runs: training updates"), ("settling_overhead_s", "settling runs: overhead"),
         ("between_runs_s", "driver work between runs (judge, ledger, Optuna, sampler, MLflow hand-off)"),
         ("flush_s", "MLflow backlog waited for at the end"))


def _parts_table(runs: list[Run]) -> list[str]:
    """Where the wall time went: the median over the runs of each part, in seconds and as a share of the wall."""
    rs = [r for r in runs if r.parts]
    if not rs:
        return []
    out = ["", "Where the time goes (median over the runs of each part; the sweep's `time_parts`):", "",
           "| mode | part | seconds | share of wall |", "|---|---|---|---|"]
    for mode in dict.fromkeys(r.mode for r in rs):
        ms = [r for r in rs if r.mode == mode]
        for key, label in PARTS:
            secs = statistics.median(r.parts.get(key, 0.0) for r in ms)
            share = statistics.median(r.parts.get(key, 0.0) / r.parts["wall_s"] for r in ms if r.parts.get("wall_s"))
            out.append(f"| {mode} | {label} | {secs:.1f} | {share:.1%} |")
        outside = statistics.median(r.wall_s - r.parts["wall_s"] for r in ms if r.parts.get("wall_s"))
        out.append(f"| {mode} | outside the sweep's window (Python, Ray, the stores, the summary, the exit; not in "
                   f"its wall) | {outside:.1f} | |")
        out.append(f"| {mode} | settling runs (baseline's among them), median | "
                   f"{statistics.median(r.settling_runs for r in ms):.0f} "
                   f"({statistics.median(r.baseline_settling_runs for r in ms):.0f}) | |")
    loads = [f"{r.mode}{r.index}: {' '.join(f'{x:.2f}' for x in r.load_before)} -> "
             f"{' '.join(f'{x:.2f}' for x in r.load_after)}" for r in runs if r.load_before]
    out += ["", "Load averages (1, 5, 15 min) before -> after each sweep: " + "; ".join(loads)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="search_spaces/default.yaml")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--neighbours", type=int, default=3)
    ap.add_argument("--modes", default="quiet,noisy")
    ap.add_argument("--out", default="bench/results/noise.md")
    ap.add_argument("overrides", nargs="*", help="sweep-file settings for every run, as on the sweep command")
    args = ap.parse_args()
    cmd = "PYTHONPATH=. .venv/bin/python bench/noise.py " + " ".join(sys.argv[1:])
    runs: list[Run] = []
    for mode in args.modes.split(","):
        for i in range(1, args.runs + 1):
            where = Path(tempfile.mkdtemp(prefix=f"steptune-noise-{mode}{i}-")) / "results"
            before = list(os.getloadavg())
            wall, rc, output = one_sweep(args.config, args.overrides, where, args.neighbours if mode == "noisy" else 0)
            run = Run(mode, i, wall, rc, load_before=before, load_after=list(os.getloadavg()))
            if rc == 0:
                judge(run, where, output)
            else:
                run.contradictions.append(f"sweep exited {rc}: {output.strip().splitlines()[-1:]}")
            runs.append(run)
            # Each run as it finishes: a long bench stopped early keeps what it measured.
            with open(Path(args.out).with_suffix(".runs.jsonl"), "a") as f:
                f.write(json.dumps(run.__dict__) + "\n")
            print(f"{mode} {i}: rc {rc}, {wall:.0f} s, winner trial {run.winner_trial} {run.winner}, "
                  f"ties {len(run.ties)}, verdict {run.verdict}, duty {_pct(run.duty_cycle)}, "
                  f"contradictions {run.contradictions}", flush=True)
            shutil.rmtree(where.parent, ignore_errors=True)
    text = table(runs, cmd, args.neighbours)
    Path(args.out).write_text(text)
    (Path(args.out).with_suffix(".json")).write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    print(text)


if __name__ == "__main__":
    main()
