"""What mirroring one ledger line into MLflow costs: ``Tracker.log_trial`` timed over a sweep's ledger.

    PYTHONPATH=. .venv/bin/python bench/mirror_cost.py results/default/trials.jsonl

Each line is logged into a fresh sqlite store (a child run, its artifacts and timeline picture, the parent's
progress point), as the sweep's mirror does; the table prints the median and total seconds by kind. This is the
time the driver waited per line when it mirrored between runs (``tracking.background: false``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.records.ledger import read_records  # noqa: E402
from orchestrator.review.tracking import Tracker  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        raise SystemExit("usage: bench/mirror_cost.py <a sweep's trials.jsonl>")
    records = read_records(Path(sys.argv[1]))
    with tempfile.TemporaryDirectory(prefix="steptune-mirror-cost-") as tmp:
        tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "mirror-cost")
        parent = tracker.start_sweep("cost", {}, None)
        by_kind: dict[str, list[float]] = {}
        for r in records:
            t0 = time.perf_counter()
            tracker.log_trial(parent, r, r.metrics.step_time_s)
            by_kind.setdefault(r.kind.value, []).append(time.perf_counter() - t0)
    every = [t for ts in by_kind.values() for t in ts]
    print(f"{len(records)} ledger lines of {sys.argv[1]}\n")
    print("| kind | lines | median s | total s |\n|---|---:|---:|---:|")
    for kind, ts in sorted(by_kind.items()) + [("all", every)]:
        print(f"| {kind} | {len(ts)} | {statistics.median(ts):.3f} | {sum(ts):.1f} |")


if __name__ == "__main__":
    main()
