"""Calibration: measurements turned into the planner's inputs (``orchestrator.planner`` is the model they feed),
and the calibrated planner applied to sweeps and to the CLI.

From measurements to inputs: ``netcal`` (nccl-tests tables -> the cluster's network), ``slices`` (short trainer
configs of the swept model's layer) -> ``profile`` (run them) -> ``stability`` + ``slicefit`` (fit them, each
parameter with its interval) -> a calibration file; ``ledger_fit`` (fit to a sweep's measured trials, and the
calibration file's one writer and reader); ``hardware`` and ``sources`` (what a file measured, and where a
prediction's figures come from). The calibrated planner applied: ``guided`` and ``command_planner`` (the
planner-guided sampler), ``prefilter`` (skip configs that cannot fit in memory), ``interval`` and ``verdict`` (how
far a model-backend answer can be trusted). ``cli`` is ``steptune plan``: it stays here because it is the
calibrated planner answering one "what if" from the files this room writes.

May import: planner, records, search, parity, units
"""
