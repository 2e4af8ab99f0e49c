"""The planner bridge: the analytical planner (``orchestrator.planner``) applied to real sweeps and to the CLI.

``prefilter`` (predicted peak memory: skip configs that cannot fit), ``calibration`` (fit the planner to a
ledger), ``guided`` (the planner-guided sampler), ``command_planner`` (the model a command-backend sweep declares,
for its guided sampler), ``verdict`` (how far a model-backend answer can be trusted),
``cli`` (``steptune plan``).

May import: planner, records, search, parity, units
"""
