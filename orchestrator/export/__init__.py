"""What leaves steptune for production: the winner's trainer YAML, Megatron-LM flags and summary.

``bundle`` (the export of a sweep's winner or a chosen trial); the Megatron-LM flags come from the one
mapping in ``frameworks.megatron_flags``, which the ``command`` backend's Megatron adapter uses too.

May import: sweep, review, calibration, planner, records, search, parity, frameworks, units
"""
