"""What leaves steptune for production: the winner's trainer YAML, Megatron-LM flags and summary.

``bundle`` (the export of a sweep's winner or a chosen trial), ``megatron`` (a config as Megatron-LM flags,
every gap named).

May import: sweep, review, plan, planner, records, search, parity, units
"""
