"""Training frameworks as adapters: what differs per framework when a trial runs the team's own launch command.

One adapter per framework (``adapters.FRAMEWORKS``: ``megatron``, ``torchtitan``, ``steptune``; and ``custom``, a
team's own script declared in the sweep file: ``custom`` and ``custom_log``) says which knobs it can express and
renders a trial's knobs as its own flags or config, which environment it needs, and reads its log into a ``log.ParsedLog`` (steady state only, warm-up excluded, medians, a status for a log that ends
early, holds NaN or no iteration at all). ``megatron_flags`` is the one mapping of steptune's knobs to
Megatron-LM flags, shared with ``export``; ``blackbox_parity`` compares per-iteration losses of a run with the
baseline's under a tolerance calibrated from the baseline run twice. ``upstream/`` holds the Megatron-LM flags and
torchtitan keys the adapters are checked against. Pure: nothing here starts a process.

May import: planner, units
"""
