"""The records: one typed ``TrialRecord`` per trial, the ledger that holds them, and the questions asked of them.

``record`` (the record, its one writer and loader, its schema versions), ``result_line`` (a result as a line
stores it), ``ledger`` and ``jsonl`` (the append-only, fsynced file), ``detail`` (the file beside each measured
line that holds what only pictures read), ``query`` (baseline, best, overhead, pruning), ``answer`` (the one decision: winner, tie
set, target verdict, noise, from interleaved paired settling rounds). Everything downstream (report, export, MLflow, calibration) reads these.

May import: parity, units
"""
