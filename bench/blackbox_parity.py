"""How strong the black-box parity gate is: seeded bugs and every legitimate layout, through the command backend.

    PYTHONPATH=. .venv/bin/python bench/blackbox_parity.py [--targets trainer,fixture] [--out bench/results/blackbox_parity.md]

Two black boxes, each through the command backend exactly as a sweep runs them (the framework adapter renders the
trial's knobs, torchrun starts it on a Ray node actor, the adapter reads its log, ``CommandTrials.judge`` compares its
loss curve with the baseline's under the tolerance the baseline's own repeat calibrated):

* ``trainer``: steptune's trainer as a black box (search_spaces/command-cpu.yaml: its full-precision result JSON;
  16 updates, a 4-step learning-rate warm-up and 0.05 MB gradient buckets, so the warm-up and bucket bugs have
  something to act on);
* ``fixture``: tests/fixtures/ddp_train.py, a plain DDP script (search_spaces/command-custom-cpu.yaml: its printed
  lines, loss with 6 decimals, grad norm with 4).

The baseline runs clean, twice (the repeat calibrates the tolerance). Then every layout of the space runs clean (a
failure there is a false alarm), and the layouts again with each bug of bench/seeded_launch.py switched on in the
trial's process (``STEPTUNE_SEEDED_BUG``; the trainer's every layout, the script's every second one): caught or not, at which iteration, by which figure, and the margin (the
largest difference over its tolerance; above 1 fails). Last, the study of steps and digits: the trainer's runs at
full precision, re-read as if the log printed ``d`` decimals and stopped after ``S`` iterations, and
``grad_perturb`` at five sizes: the thinnest perturbation the gate catches for each ``S`` and ``d``.

Every run is appended to ``<out>.runs.jsonl`` as it lands; a rerun measures only what is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from orchestrator.frameworks import blackbox_parity as bp  # noqa: E402
from orchestrator.frameworks.log import Iteration, judge  # noqa: E402
from orchestrator.search.space import enumerate_space  # noqa: E402
from orchestrator.sweep.config import load_sweep  # noqa: E402

LAUNCHER = "bench/seeded_launch.py"
BUGS = ("loss_scale_mbs", "bucket_not_averaged", "lr_warmup_off_by_one", "grad_perturb")
EPS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
TARGETS = {
    "trainer": ("search_spaces/command-cpu.yaml", ["trainer.run.steps=16", "trainer.optim.warmup_steps=4",
                                                   "trainer.data_parallel.kind=replicate",
                                                   "trainer.data_parallel.bucket_mb=0.05"]),
    "fixture": ("search_spaces/command-custom-cpu.yaml", []),
}
DIGITS = (2, 3, 4, 5, 6, 8, None)
"""Decimals the re-read log prints (None: full precision)."""
STEPS = (2, 4, 8, 16)


class Bench:
    """One target's sweep file, its command backend and runner: runs a layout, clean or with a bug, and judges it."""

    def __init__(self, name: str, results: Path):
        path, overrides = TARGETS[name]
        self.name = name
        self.cfg = load_sweep(ROOT / path, overrides + [f"storage.results_dir={results}", "tracking.enabled=false"])
        self.backend = self.cfg.built
        self.configs = self.backend.configs
        self.backend.join()
        self.runner = self.backend.runner()
        self.layouts = [p for p, _ in enumerate_space(self.cfg.space, self.configs.fixed, self.configs.split_context)]
        self.base_params = self.configs.baseline_params(self.cfg.space)

    def run(self, params: dict, bug: str | None, kind: str = "trial") -> dict[str, Any]:
        config = self.configs.build(self.configs.overrides_for(self.cfg.space, params))
        plain = self.backend.launch_for
        if bug:
            def seeded(cfg):
                launch = plain(cfg)
                return dataclasses.replace(launch, argv=[LAUNCHER, *launch.argv],
                                           env={**launch.env, "STEPTUNE_SEEDED_BUG": bug})
            self.backend.launch_for = seeded
        t0 = time.perf_counter()
        try:
            self.runner.submit(0, config)
            done: list = []
            while not done:
                done = self.runner.poll(1.0)
        finally:
            self.backend.launch_for = plain
        out = done[0][1]
        verdict = self.backend.judge(kind, out, None, [out])
        parsed = out.parsed
        rec = {"target": self.name, "params": params, "bug": bug, "kind": kind, "status": out.status,
               "reason": out.reason, "judged": verdict.status, "judged_reason": verdict.reason,
               "parity": verdict.parity, "wall_s": time.perf_counter() - t0,
               "loss": [it.loss for it in parsed.iterations] if parsed else None,
               "grad_norm": [it.grad_norm for it in parsed.iterations] if parsed else None,
               "steps": [it.step for it in parsed.iterations] if parsed else None,
               "repeat_loss": [it.loss for it in out.repeat.iterations] if getattr(out, "repeat", None) else None,
               "repeat_grad_norm": ([it.grad_norm for it in out.repeat.iterations]
                                    if getattr(out, "repeat", None) else None)}
        if kind == "baseline" and self.backend.reference is not None:
            rec["tolerance"] = dataclasses.asdict(self.backend.reference[1])
            rec["resolution"] = dict(parsed.resolution)
        return rec

    def restore(self, base: dict) -> None:
        """A rerun: the reference from the stored baseline run (as a resumed sweep takes it from its ledger)."""
        its = [Iteration(step=s, first_step=s, loss=l, grad_norm=g)
               for s, l, g in zip(base["steps"], base["loss"], base["grad_norm"])]
        self.backend.reference = (judge(self.name, its, 0, None), bp.CurveTolerance(**base["tolerance"]))

    def close(self) -> None:
        self.runner.close()


def key(rec: dict) -> str:
    return json.dumps([rec["target"], rec["params"], rec["bug"], rec["kind"]], sort_keys=True)


def ratio(base: dict, rec: dict, tol: dict, upto: int | None = None) -> tuple[float, int | None, str | None]:
    """The largest |difference| over its tolerance, per metric and iteration (> 1 fails, as
    blackbox_parity.compare judges), and the first iteration and figure beyond 1."""
    worst, first = 0.0, (None, None)
    for m in ("loss", "grad_norm"):
        a, b = dict(zip(base["steps"], base[m])), dict(zip(rec["steps"] or [], rec[m] or []))
        for step in sorted(set(a) & set(b)):
            if upto is not None and step > upto or a[step] is None or b[step] is None:
                continue
            allowed = tol[f"{m}_rel"] * max(abs(a[step]), 1e-12) + tol[f"{m}_abs"]
            r = abs(a[step] - b[step]) / allowed if allowed > 0 else (math.inf if a[step] != b[step] else 0.0)
            worst = max(worst, r)
            if r > 1 and (first[0] is None or step < first[0]):
                first = (step, m)
    return worst, first[0], first[1]


def measure(targets: list[str], out: Path) -> list[dict]:
    log = out.with_suffix(".runs.jsonl")
    done = {key(r): r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
    for name in targets:
        with tempfile.TemporaryDirectory(prefix=f"bbp-{name}-") as tmp:
            b = Bench(name, Path(tmp))
            try:
                plan = [(b.base_params, None, "baseline")] + [(p, None, "trial") for p in b.layouts]
                # The trainer's every layout; the script's, every second one (its runs cost the same, the machine is
                # shared): the baseline's own layout and two with a larger micro-batch.
                bug_layouts = b.layouts if name == "trainer" else b.layouts[1::2]
                plan += [(p, bug, "trial") for bug in BUGS for p in bug_layouts]
                if name == "trainer":
                    plan += [(b.base_params, f"grad_perturb:{e:g}", "trial") for e in EPS]
                for params, bug, kind in plan:
                    rec = {"target": name, "params": params, "bug": bug, "kind": kind}
                    if key(rec) in done:
                        if kind == "baseline":
                            b.restore(done[key(rec)])
                        continue
                    rec = b.run(params, bug, kind)
                    if kind == "baseline" and b.backend.reference is None:
                        raise SystemExit(f"{name}: the baseline did not pass its own repeat: {rec['judged_reason']}")
                    done[key(rec)] = rec
                    with open(log, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print(f"{name} {bug or 'clean'} {params}: {rec['judged']} {rec['judged_reason'] or ''}", flush=True)
            finally:
                b.close()
    return [r for r in done.values() if r["target"] in targets]


# ---- the tables ----------------------------------------------------------------------------------------------

def _layout(p: dict) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in p.items())


def tables(runs: list[dict], targets: list[str], wall_s: float) -> str:
    lines = ["# Black-box parity: seeded bugs and legitimate layouts through the command backend", "",
             "`PYTHONPATH=. .venv/bin/python bench/blackbox_parity.py` (bench/blackbox_parity.py; every run in "
             "bench/results/blackbox_parity.runs.jsonl). Each run is a real torchrun of 2 CPU ranks (gloo) through the "
             "command backend; the baseline runs clean twice and its repeat calibrates the tolerance; each bug is "
             "switched on in the trial's process only (bench/seeded_launch.py). Margin: the largest difference over "
             "its tolerance over every compared iteration and figure (above 1 fails the trial).", ""]
    for name in targets:
        mine = [r for r in runs if r["target"] == name]
        base = next(r for r in mine if r["kind"] == "baseline")
        tol = base["tolerance"]
        lines += [f"## {name} ({TARGETS[name][0]}{', ' + ' '.join(TARGETS[name][1]) if TARGETS[name][1] else ''})", "",
                  f"Tolerance from the baseline and its repeat: loss {tol['loss_rel']:.1e} relative + "
                  f"{tol['loss_abs']:.1e} absolute (print resolution), grad norm {tol['grad_norm_rel']:.1e} + "
                  f"{tol['grad_norm_abs']:.1e}; {len(base['steps'])} iterations compared.", "",
                  "| run | layout | judged | caught at iteration | by | margin |", "|---|---|---|---|---|---|"]
        clean = [r for r in mine if r["kind"] == "trial" and r["bug"] is None]
        false_alarms = 0
        for r in clean:
            m, step, fig = ratio(base, r, tol)
            false_alarms += r["judged"] != "ok"
            lines.append(f"| clean | {_layout(r['params'])} | {r['judged']} | {step or '-'} | {fig or '-'} | {m:.2f} |")
        for bug in BUGS:
            for r in [r for r in mine if r["bug"] == bug]:
                m, step, fig = ratio(base, r, tol)
                lines.append(f"| {bug} | {_layout(r['params'])} | {r['judged']} | {step or '-'} | {fig or '-'} | "
                             f"{m:.3g} |")
        lines += ["", f"False alarms: {false_alarms} of {len(clean)} legitimate layouts (goal 0); worst clean margin "
                      f"{max((ratio(base, r, tol)[0] for r in clean), default=0):.2f}.", ""]
        lines += ["| bug | layouts caught | first iteration caught (fastest layout) | by |", "|---|---|---|---|"]
        for bug in BUGS:
            rs = [r for r in mine if r["bug"] == bug]
            hits = [(ratio(base, r, tol), r) for r in rs if r["judged"] != "ok"]
            first = min(hits, key=lambda h: h[0][1])[0] if hits else None
            lines.append(f"| {bug} | {len(hits)} of {len(rs)} | {first[1] if first else '-'} | "
                         f"{first[2] if first else '-'} |")
        lines.append("")
    if "trainer" in targets:
        lines += study([r for r in runs if r["target"] == "trainer"])
    lines += [f"{len(runs)} runs, {sum(r['wall_s'] for r in runs) / 60:.0f} minutes of runs in all (each a torchrun start "
              f"and its training, on this session's shared 2-core host; {wall_s:.0f} s in this invocation, which "
              f"measures only what the runs file lacks).", ""]
    return "\n".join(lines)


def _round(xs: list, d: int | None) -> list:
    return [x if d is None or x is None else round(x, d) for x in xs]


def reread(base: dict, rec: dict, d: int | None, floor: tuple[float, float]) -> tuple[dict, dict, dict]:
    """The baseline, its repeat and a run as if the log printed ``d`` decimals, and the tolerance the gate would
    calibrate from them: the floor, widened to 10 x the repeat's spread, plus half the last printed digit."""
    def view(r: dict, which: str = "") -> dict:
        return {"steps": r["steps"], "loss": _round(r[which + "loss"], d), "grad_norm": _round(r[which + "grad_norm"], d)}

    b, rep = view(base), view(base, "repeat_")
    half = 0.0 if d is None else 0.5 * 10.0 ** -d
    spread = {m: max((abs(x - y) / max(abs(x), 1e-12) for x, y in zip(b[m], rep[m]) if x is not None and y is not None),
                     default=0.0) for m in ("loss", "grad_norm")}
    tol = {"loss_rel": max(floor[0], bp.SPREAD_FACTOR * spread["loss"]), "loss_abs": half,
           "grad_norm_rel": max(floor[1], bp.SPREAD_FACTOR * spread["grad_norm"]), "grad_norm_abs": half}
    return b, view(rec), tol


def study(runs: list[dict]) -> list[str]:
    base = next(r for r in runs if r["kind"] == "baseline")
    floors = {"default floor (loss 1e-5, grad norm 1e-4)": (1e-5, 1e-4), "floor 1e-7 (a deterministic run)": (1e-7, 1e-7)}
    first_layout = {bug: next((r for r in runs if r["bug"] == bug and r["params"] == base["params"]), None)
                    for bug in BUGS}
    mbs = next((r for r in runs if r["bug"] == "loss_scale_mbs" and r["params"] != base["params"]
                and list(r["params"].values())[0] != base["params"].get("batch.micro_batch_size")), None)
    first_layout["loss_scale_mbs"] = mbs
    out = ["## Steps run and digits printed (trainer, re-read at full precision)", "",
           "The trainer's runs above, read again as if its log printed `d` decimals of the loss and grad norm and "
           "stopped after `S` iterations; the tolerance recalibrated the gate's way (the floor, widened to 10 x the "
           "repeat's spread, plus half the last printed digit). Each bug on the baseline's own layout (loss_scale_mbs "
           "on " + (_layout(mbs["params"]) if mbs else "-") + ", where it acts). Cell: the first iteration that "
           "fails, `-`: not caught within the 16 iterations.", ""]
    for label, floor in floors.items():
        out += [f"### {label}", "", "| bug | " + " | ".join(f"{d} decimals" if d is not None else "full" for d in DIGITS)
                + " |", "|---|" + "---|" * len(DIGITS)]
        rows = [(bug, first_layout[bug]) for bug in BUGS] + \
               [(f"grad_perturb {e:g}", next((r for r in runs if r["bug"] == f"grad_perturb:{e:g}"), None)) for e in EPS]
        for label_row, r in rows:
            if r is None:
                continue
            cells = []
            for d in DIGITS:
                b, v, tol = reread(base, r, d, floor)
                _, step, _ = ratio(b, v, tol)
                cells.append(str(step) if step else "-")
            out.append(f"| {label_row} | " + " | ".join(cells) + " |")
        clean = [r for r in runs if r["kind"] == "trial" and r["bug"] is None]
        alarms = [sum(ratio(*reread(base, r, d, floor))[1] is not None for r in clean) for d in DIGITS]
        worst = [max((ratio(*reread(base, r, d, floor))[0] for r in clean), default=0.0) for d in DIGITS]
        out.append(f"| false alarms (of {len(clean)} clean layouts) | " + " | ".join(map(str, alarms)) + " |")
        out.append("| worst clean margin | " + " | ".join(f"{w:.2f}" for w in worst) + " |")
        out.append("")
        out += ["Thinnest grad_perturb caught (relative size of the added gradient direction) within `S` iterations:",
                "", "| S | " + " | ".join(f"{d} decimals" if d is not None else "full" for d in DIGITS) + " |",
                "|---|" + "---|" * len(DIGITS)]
        for s in STEPS:
            cells = []
            for d in DIGITS:
                caught = []
                for e in EPS:
                    r = next((x for x in runs if x["bug"] == f"grad_perturb:{e:g}"), None)
                    if r is None:
                        continue
                    b, v, tol = reread(base, r, d, floor)
                    if ratio(b, v, tol, upto=s)[1] is not None:
                        caught.append(e)
                cells.append(f"{min(caught):g}" if caught else f"> {max(EPS):g}")
            out.append(f"| {s} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def main(argv: list[str] | None = None) -> None:
    from results_file import write_and_print

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", default=str(ROOT / "bench/results/blackbox_parity.md"))
    ap.add_argument("--tables-only", action="store_true", help="render the tables from the stored runs, run nothing")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    targets = args.targets.split(",")
    out = Path(args.out)
    t0 = time.perf_counter()
    if args.tables_only:
        log = out.with_suffix(".runs.jsonl")
        runs = [r for r in map(json.loads, log.read_text().splitlines()) if r["target"] in targets]
    else:
        runs = measure(targets, out)
    text = tables(runs, targets, time.perf_counter() - t0)
    summary = {t: {"false_alarms": sum(r["judged"] != "ok" for r in runs if r["target"] == t and r["bug"] is None
                                       and r["kind"] == "trial"),
                   "caught": {bug: [r["judged"] != "ok" for r in runs if r["target"] == t and r["bug"] == bug]
                              for bug in BUGS}} for t in targets}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    write_and_print(text, out)


if __name__ == "__main__":
    main()
