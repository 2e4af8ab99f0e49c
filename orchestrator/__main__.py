"""``python -m orchestrator sweep|report|export``: the command line.

    python -m orchestrator sweep                                  # search_spaces/default.yaml, embedded Ray
    python -m orchestrator sweep --config FILE search.n_trials=30 target.step_time_s=9.3
    python -m orchestrator sweep --dry-run                        # validate the sweep file, launch nothing
    python -m orchestrator report [--sweep NAME]                  # the table again, from the ledger
    python -m orchestrator export [--sweep NAME] [--trial N] [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:  # its own module: orchestrator.plan_cli (add_parser / main)
        from orchestrator import plan_cli

        sub = argparse.ArgumentParser(prog="python -m orchestrator").add_subparsers(dest="command", required=True)
        return plan_cli.main(plan_cli.add_parser(sub).parse_args(argv[1:]))
    if argv[:1] == ["calibrate"]:  # its own parser: orchestrator.calibration.calibrate_main
        from orchestrator.calibration import calibrate_main

        return calibrate_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m orchestrator", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sw = sub.add_parser("sweep", help="run or resume a sweep")
    sw.add_argument("--config", help="sweep YAML (default: search_spaces/default.yaml)")
    sw.add_argument("--dry-run", action="store_true", help="validate everything, launch nothing")
    sw.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. search.n_trials=30")
    rp = sub.add_parser("report", help="print a sweep's table from its ledger")
    sub.add_parser("calibrate", help="fit the planner to a sweep's measured trials (calibrate --help)")
    ex = sub.add_parser("export", help="write a trial's config for the trainer and Megatron-LM")
    for p in (rp, ex):
        p.add_argument("--sweep", default="default", help="sweep name (default: default)")
        p.add_argument("--results", default="results", help="results directory (default: results)")
    ex.add_argument("--trial", type=int, help="Optuna trial number (default: the best)")
    ex.add_argument("--out", help="output directory (default: results/<sweep>/export)")
    ex.add_argument("--force", action="store_true", help="export even a trial that failed parity or the target")
    args = parser.parse_args(argv)
    try:
        return {"sweep": _sweep, "report": _report, "export": _export}[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _sweep(args: argparse.Namespace) -> int:
    from orchestrator.config import load_sweep

    cfg = load_sweep(args.config, args.overrides)
    if args.dry_run:
        print(f"sweep {cfg.name!r} ({cfg.source}) is valid: {cfg.backend} backend, {len(cfg.space.names)} params "
              f"({', '.join(cfg.space.names)}), target {cfg.target.describe()}, budget {cfg.search.n_trials} trials")
        return 0
    from orchestrator import report
    from orchestrator.ledger import LedgerBusy
    from orchestrator.sweep import SweepError, run_sweep
    from orchestrator.workers import GroupStartError

    try:
        summary, records = run_sweep(cfg)
    except (SweepError, GroupStartError, LedgerBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; the ledger has every finished trial. Rerun the same command to resume.", file=sys.stderr)
        return 130
    print()
    print(report.table(records))
    print()
    print(report.summary_text(summary))
    print(f"stopped because {summary['stopped_because']}")
    print(f"ledger: {cfg.results_dir / 'trials.jsonl'}; again: python -m orchestrator report --sweep {cfg.name}"
          + ("" if cfg.storage.results_dir == "results" else f" --results {cfg.storage.results_dir}"))
    if summary["mlflow_ui"]:
        print(f"MLflow: {summary['mlflow_ui']}")
    print(f"export the best: python -m orchestrator export --sweep {cfg.name}"
          + ("" if cfg.storage.results_dir == "results" else f" --results {cfg.storage.results_dir}"))
    return 0


def _report(args: argparse.Namespace) -> int:
    from orchestrator import report
    from orchestrator.ledger import Ledger
    from orchestrator.target import parse_target

    results = Path(args.results) / args.sweep
    records = Ledger(results / "trials.jsonl").read()
    if not records:
        raise ValueError(f"--sweep {args.sweep}: no ledger at {results / 'trials.jsonl'} (or it is empty)")
    saved = results / "sweep.yaml"
    raw = yaml.safe_load(saved.read_text()) if saved.exists() else {}
    target = parse_target(raw.get("target"))
    repeats = (raw.get("confirm") or {}).get("repeats", 1)
    print(report.table(records))
    print()
    print(report.summary_text(report.summarize(records, target, repeats)))
    return 0


def _export(args: argparse.Namespace) -> int:
    from orchestrator.export import export_trial

    results = Path(args.results) / args.sweep
    out = Path(args.out) if args.out else results / "export"
    for path in export_trial(results / "trials.jsonl", args.trial, out, args.force):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
