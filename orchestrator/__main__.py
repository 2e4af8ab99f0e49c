"""The command line: ``steptune`` (or ``python -m orchestrator``), one subcommand per task.

    steptune sweep                                     # search_spaces/default.yaml, embedded Ray
    steptune sweep --config FILE search.n_trials=30 target.step_time_s=9.3
    steptune sweep --dry-run                           # validate the sweep file, launch nothing
    steptune report [--sweep NAME]                     # the table again, from the ledger (default: most recent)
    steptune settle [--sweep NAME] --rounds N          # N more settling rounds of a sweep's answer, no new trials
    steptune export [--sweep NAME] [--trial N] [--out DIR] [--force]
    steptune calibrate [--sweep NAME] [--cluster FILE]
    steptune profile --config FILE [--ranks N] [--layers L] [--shrink F] [--ray-address ADDR]
    steptune parse-log --framework megatron|torchtitan|steptune|custom FILE [--config SWEEP] [--json]

Exit status: 0 done; 1 the sweep started and stopped (its baseline failed, Ray failed, another driver holds
it); 2 bad input, refused before anything was launched or written; 130 interrupted. docs/cli.md has the rest.
A subcommand is one ``Command`` in ``COMMANDS``: its arguments and the function that runs it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator.commands import subcommand

log = logging.getLogger("orchestrator.cli")

EXIT_OK, EXIT_STOPPED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    """One line, in ``steptune --help``."""
    description: str
    """The paragraph at the top of ``steptune NAME --help``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    """Returns the exit status; a ValueError or OSError it raises is bad input (one line, exit 2)."""


# ---- shared flags: one name and one meaning in every subcommand -------------------------------------

def add_results_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", "--results", dest="results_dir", default="results", metavar="DIR",
                   help="the sweeps' results directory, storage.results_dir of the sweep file "
                        "(default: results; --results is a deprecated alias)")


def add_sweep_name(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", metavar="NAME",
                   help="the sweep's name (results/NAME/); default: the sweep whose ledger was written last")


def pick_ledger(args: argparse.Namespace) -> Path:
    """The ledger ``--sweep`` names, or the most recently written one (and say which)."""
    from orchestrator.export.bundle import find_ledger

    ledger = find_ledger(Path(args.results_dir), args.sweep)
    if not args.sweep:
        log.info("sweep %r: the most recently written ledger under %s/ (--sweep NAME picks another)",
                 ledger.parent.name, args.results_dir)
    return ledger


def next_command(name: str, sweep: str, results_dir: str | Path) -> str:
    """Subcommand ``name`` on sweep ``sweep``, spelled so that the shell this runs in can run it as printed."""
    return subcommand(name, sweep, results_dir)


# ---- the subcommands --------------------------------------------------------------------------------

def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="sweep YAML (default: search_spaces/default.yaml)")
    p.add_argument("--dry-run", action="store_true", help="validate everything, launch and write nothing")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted overrides of the sweep file, e.g. search.n_trials=30 storage.results_dir=/tmp/r")


def _sweep(args: argparse.Namespace) -> int:
    from orchestrator.sweep.config import load_sweep

    cfg = load_sweep(args.config, args.overrides)
    if args.dry_run:
        print(f"sweep {cfg.name!r} ({cfg.source}) is valid: {cfg.backend} backend, {len(cfg.space.names)} params "
              f"({', '.join(cfg.space.names)}), target {cfg.target.describe()}, budget {cfg.search.n_trials} trials")
        return EXIT_OK
    return _run(cfg, None)


def _run(cfg, rounds: int | None) -> int:
    """Run (or settle further) the sweep, then print its table, its summary and the next steps."""
    from orchestrator.review import report
    from orchestrator.records.ledger import LedgerBusy
    from orchestrator.sweep.loop import SweepError, run_sweep
    from orchestrator.backends.workers import GroupStartError

    try:
        summary, records = run_sweep(cfg, rounds)
    except (SweepError, GroupStartError, LedgerBusy) as e:
        log.error("%s", e)
        return EXIT_STOPPED
    except KeyboardInterrupt:
        log.error("interrupted; the ledger has every finished trial. Rerun the same command to resume.")
        return EXIT_INTERRUPTED
    from orchestrator.records.answer import decide

    print()
    print(report.table(records, decide(records, cfg.target, cfg.winner)))
    print()
    print(report.summary_text(summary))
    if summary.get("already_finished") is not None:
        print(f"sweep {cfg.name!r} finished already (search.n_trials={summary['already_finished']}); nothing ran. "
              f"To extend it, rerun with a larger budget, e.g. search.n_trials={summary['already_finished'] + 10}")
    print(f"stopped because {summary['stopped_because']}")
    again = next_command("report", cfg.name, cfg.storage.results_dir)
    print(f"ledger: {cfg.results_dir / 'trials.jsonl'}; again: {again}")
    if summary["mlflow_ui"]:
        print(f"MLflow: {summary['mlflow_ui']}")
    best = f" (trial {summary['best']['trial']})" if summary.get("best") else ""
    print(f"export the best{best}: {next_command('export', cfg.name, cfg.storage.results_dir)}")
    return EXIT_OK


def _settle_args(p: argparse.ArgumentParser) -> None:
    add_sweep_name(p)
    add_results_dir(p)
    p.add_argument("--rounds", type=int, required=True, metavar="N",
                   help="most settling rounds to run (an undecided verdict's summary prints how many it needs)")


def _settle(args: argparse.Namespace) -> int:
    from orchestrator.sweep.config import load_saved_sweep_to_run

    if args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds}: a whole number >= 1")
    ledger = pick_ledger(args)
    return _run(load_saved_sweep_to_run(ledger.parent, args.results_dir), args.rounds)


def _report_args(p: argparse.ArgumentParser) -> None:
    add_sweep_name(p)
    add_results_dir(p)


def _report(args: argparse.Namespace) -> int:
    from orchestrator.review import report
    from orchestrator.sweep.config import load_saved_sweep
    from orchestrator.records.ledger import read_records
    from orchestrator.search.target import parse_target
    from orchestrator.records.answer import RULE, decide

    ledger = pick_ledger(args)
    records = read_records(ledger)
    if not records:
        raise ValueError(f"{ledger} is empty: nothing was measured yet")
    saved = load_saved_sweep(ledger.parent)  # the target and settling rule the sweep ran with
    answer = decide(records, saved.target if saved else parse_target(None), saved.winner if saved else RULE)
    summary = report.summarize(records, saved.target if saved else parse_target(None),
                               saved.winner if saved else RULE, answer, (ledger.parent.name, args.results_dir))
    print(report.table(records, answer))
    print()
    print(report.summary_text(summary))
    return EXIT_OK


def _export_args(p: argparse.ArgumentParser) -> None:
    add_sweep_name(p)
    add_results_dir(p)
    p.add_argument("--trial", type=int, metavar="N",
                   help="Optuna trial number (default: the best, the summary's and the table's rank 1)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: RESULTS_DIR/NAME/export)")
    p.add_argument("--force", action="store_true", help="export even a trial that failed parity or the target")


def _export(args: argparse.Namespace) -> int:
    from orchestrator.export.bundle import export_trial

    ledger = pick_ledger(args)
    out = Path(args.out) if args.out else ledger.parent / "export"
    for path in export_trial(ledger, args.trial, out, args.force):
        print(path)
    return EXIT_OK


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    from orchestrator.calibration.ledger_fit import add_calibrate_arguments

    add_sweep_name(p)
    add_results_dir(p)
    add_calibrate_arguments(p)


def _plan_args(p: argparse.ArgumentParser) -> None:
    from orchestrator.calibration.cli import add_arguments

    add_arguments(p)


def _plan(args: argparse.Namespace) -> int:
    from orchestrator.calibration.cli import main

    return main(args)


def _calibrate(args: argparse.Namespace) -> int:
    from orchestrator.calibration.ledger_fit import run_calibrate

    args.sweep = pick_ledger(args).parent.name
    return run_calibrate(args)


def _netcal_args(p: argparse.ArgumentParser) -> None:
    from orchestrator.calibration.netcal import add_arguments

    add_arguments(p)


def _netcal(args: argparse.Namespace) -> int:
    from orchestrator.calibration.netcal import run

    return run(args)


def _profile_args(p: argparse.ArgumentParser) -> None:
    from orchestrator.calibration.profile import add_arguments

    add_arguments(p)


def _profile(args: argparse.Namespace) -> int:
    from orchestrator.calibration.profile import run

    return run(args, _ray_slices(args.ray_address, args.slice_timeout_s))


def _ray_slices(address: str | None, timeout_s: float):
    """``steptune profile``'s slices on the sweep's trial path: a RayRunner's warm worker group (embedded local
    Ray, or the cluster at ``address``), one slice after the other, parity off (nothing here judges parity).
    Built here because calibration/ may not import backends/."""
    def run_on_ray(cfgs: list, device: str) -> tuple[list, str]:
        from types import SimpleNamespace

        from orchestrator.backends.ray_runner import RayRunner, run_each
        from orchestrator.backends.workers import GroupStartError
        from orchestrator.calibration.profile import RunnerUnavailable
        from orchestrator.sweep.config import RayConfig, ResourcesConfig

        res = ResourcesConfig(world_size=cfgs[0].world_size, cpus_per_rank=1.0,
                              gpus_per_rank=1.0 if device == "cuda" else 0.0, trial_timeout_s=timeout_s)
        try:
            runner = RayRunner(SimpleNamespace(resources=res, ray=RayConfig(address=address)), device)
        except GroupStartError as e:
            if address is not None:  # the user named the machines to measure: slices run here would mislead
                raise ValueError(f"--ray-address: {e}") from None
            raise RunnerUnavailable(str(e)) from None
        try:
            outcomes = run_each(runner, cfgs)
        finally:
            runner.close()
        results = [o.result if o.status == "ok" else RuntimeError(f"{o.status}: {o.reason}") for o in outcomes]
        return results, f"a warm Ray worker group of {res.world_size} rank(s) ({runner.where})"
    return run_on_ray


def _parse_log_args(p: argparse.ArgumentParser) -> None:
    from orchestrator.frameworks.adapters import NAMES

    p.add_argument("--framework", required=True, choices=list(NAMES), help="whose log FILE is (custom: the script "
                   "declared under command.custom of the sweep file named by --config)")
    p.add_argument("file", metavar="FILE", help="the log (megatron, torchtitan, custom) or result JSON (steptune); - "
                   "for stdin")
    p.add_argument("--config", metavar="SWEEP", help="a sweep file: its command section (custom's declaration, "
                   "command.warmup, command.framework_version, resources.world_size) is what the log is read with")
    p.add_argument("--warmup", type=int, metavar="N", help="iterations excluded as warm-up (default: the sweep "
                   "file's command.warmup, else 1; steptune: its config's run.warmup_steps)")
    p.add_argument("--expected", type=int, metavar="N", help="iterations the run was asked for (default: what the "
                   "log says, where it says it); a log that stops earlier is truncated")
    p.add_argument("--json", action="store_true", help="everything read, per iteration too, as JSON")


def _parse_log(args: argparse.Namespace) -> int:
    import json

    from orchestrator.frameworks.adapters import framework

    declared, world, warmup, version = None, 1, args.warmup, None
    if args.config:
        from orchestrator.sweep.config import load_sweep

        cfg = load_sweep(args.config, check=False)  # only its command section is read: nothing is launched
        c = cfg.command
        if c.framework != args.framework:
            raise ValueError(f"--framework {args.framework}: {args.config} says command.framework={c.framework}")
        declared, world, version = c.custom, cfg.resources.world_size, c.framework_version
        warmup = warmup if warmup is not None else c.warmup
    elif args.framework == "custom":
        raise ValueError("--framework custom: give --config SWEEP, the sweep file that declares the script "
                         "(command.custom)")
    fw = framework(args.framework, "--framework", declared=declared, world_size=world, version=version)
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(errors="replace")
    parsed = fw.parse(text, warmup, args.expected)
    if args.json:
        print(json.dumps(parsed.to_dict(), indent=1))
    else:
        print(render_parsed(parsed))
    return EXIT_OK if parsed.status == "ok" else EXIT_STOPPED


def render_parsed(parsed) -> str:
    """What steptune reads from a log, for a person: the status, then the steady-state figures."""
    s = parsed.summary()
    lines = [f"{parsed.framework}: {s['status']}" + (f" ({s['reason']})" if s["reason"] else ""),
             f"iterations logged: {s['iterations']} (last {s['last_iteration']}"
             + (f" of {s['expected']}" if s["expected"] else "") + f"), warm-up {s['warmup']} excluded, "
             f"{s['steady_lines']} line(s) in the steady state"]

    def show(label: str, value, fmt: str) -> None:
        if value is not None:
            lines.append(f"{label}: {fmt.format(value)}")

    show("step time (median)", s["step_time_s"] and s["step_time_s"] * 1e3, "{:.1f} ms")
    show("throughput per GPU (median)", s["tflops_per_gpu"], "{:.1f} TFLOP/s")
    show("tokens/s per GPU (median)", s["tokens_per_s_per_gpu"], "{:,.0f}")
    show("MFU (median, the framework's peak basis)", s["mfu"], "{:.1%}")
    from orchestrator.units import fmt_bytes

    for k, v in sorted(s["memory"].items()):
        lines.append(f"memory {k} (peak over ranks): {fmt_bytes(v)}")
    steady = parsed.steady
    if steady and steady[0].loss is not None:
        lines.append(f"loss: {steady[0].loss:.4f} (iteration {steady[0].step}) -> {steady[-1].loss:.4f} "
                     f"(iteration {steady[-1].step})")
    extra = sorted({k for it in parsed.iterations for k in it.losses} - {"lm loss", "loss"})
    if extra:
        lines.append(f"other loss columns: {', '.join(extra)}")
    if s["skipped_iterations"] or s["nan_iterations"]:
        lines.append(f"skipped iterations: {s['skipped_iterations']}, NaN iterations: {s['nan_iterations']}")
    if s["ignored_lines"]:
        lines.append(f"ignored: {s['ignored_lines']} line(s) that looked like iteration lines but did not read")
    return "\n".join(lines)


COMMANDS: list[Command] = [
    Command("sweep", "run or resume a sweep",
            "Run (or resume) the sweep a file describes: a baseline, then trials until settling rounds find the "
            "target met, the budget is spent or the wall time is up; then the answer is settled in interleaved "
            "rounds. Rerun the same command to resume; a finished sweep prints its answer and runs nothing.",
            _sweep_args, _sweep),
    Command("settle", "run more settling rounds of a sweep's answer (no new trials)",
            "Race a sweep's answer further: up to --rounds more settling rounds of the configs the answer still "
            "cannot tell apart and of the winner against its target, as the sweep's own rounds run them, then the "
            "answer again. Reuses the sweep as it ran (its saved sweep.yaml, ledger and stores); no new trial is "
            "asked, and a finished sweep stays finished. The summary of an undecided verdict prints this command "
            "with the rounds it needs.", _settle_args, _settle),
    Command("report", "print a sweep's table and summary from its ledger",
            "Print the ranked table and the summary of a sweep again, from its ledger alone.", _report_args, _report),
    Command("export", "write a trial's config for the trainer and Megatron-LM",
            "Write a trial's trainer YAML, Megatron-LM flags and summary.md (default: the best trial). A trial that "
            "failed parity or the target is refused unless --force.", _export_args, _export),
    Command("calibrate", "fit the planner to a sweep's measured trials",
            "Fit the planner's efficiency parameters to a sweep's measured trials and write them as YAML, for "
            "the memory pre-filter (prefilter.calibration) or the model backend.", _calibrate_args, _calibrate),
    Command("plan", "predict one config with the planner (no sweep)",
            "One config in, the planner's prediction out: the step time with its interval (the fit's uncertainty, "
            "else the corpus band) and where it comes from, the breakdown along the critical path, memory per "
            "pipeline stage, MFU with its peak basis, and the file's target judged on the interval (met, not met "
            "or undecided). --best also searches the file's space. key=value changes a knob or "
            "planner.<section>.<field>.", _plan_args, _plan),
    Command("netcal", "fit a cluster file's network to nccl-tests output",
            "Read nccl-tests output (all_reduce_perf, reduce_scatter_perf, all_gather_perf, sendrecv_perf), fit "
            "the planner's bandwidth and latency per tier to it, and write a cluster file with basis: measured "
            "and its provenance. --measure N measures N local ranks first (gloo on CPU).", _netcal_args, _netcal),
    Command("profile", "fit the planner's compute to runs of the layer shape",
            "Derive from a model-backend sweep file short trials of its production layer shape (hidden size, heads, "
            "ffn, vocab, sequence length, precision, the space's micro-batch sizes and recompute kinds; --layers "
            "layers on --ranks ranks), refuse in one line if the planner predicts they cannot fit, run them on a warm "
            "Ray worker group as a sweep runs trials (embedded Ray, or --ray-address), "
            "and fit the planner's compute-side efficiencies to them: a calibration file with basis: measured.",
            _profile_args, _profile),
    Command("parse-log", "show what steptune reads from a framework's log",
            "Read a Megatron-LM or torchtitan log, or a steptune result JSON, as the command backend reads its trials: "
            "the steady state (warm-up excluded, medians), peak memory, losses, and a status for a log that ends early, "
            "holds NaN or has no iteration line. Exit 0 when the status is ok, 1 otherwise.",
            _parse_log_args, _parse_log),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="steptune", description="steptune: make distributed LLM training updates "
                                     "faster without changing what the model learns (also: python -m orchestrator)",
                                     epilog="steptune COMMAND --help says more; docs/cli.md has examples.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.description)
        c.add_arguments(p)
        p.set_defaults(run=c.run)
    return parser


# ---- output -----------------------------------------------------------------------------------------

class ConsoleHandler(logging.Handler):
    """Log lines on stderr, one per message; on a terminal the sweep's ticking status line is cleared first.

    stdout carries only what a command produces (the table, the exported paths), so it can be piped.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr  # looked up per line: tests swap it
            prefix = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            if stream.isatty():
                stream.write("\r\033[K")
            stream.write(prefix + self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def setup_logging(level: int = logging.INFO) -> None:
    """The orchestrator's module loggers to the console (once per process, however often main() runs)."""
    logger = logging.getLogger("orchestrator")
    for h in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(h)
    logger.addHandler(ConsoleHandler())
    logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    setup_logging()
    try:
        return args.run(args)
    except (ValueError, OSError) as e:  # bad input: one line naming the field or file, nothing launched
        log.error("%s", e)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
