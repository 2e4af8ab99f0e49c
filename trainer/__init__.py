"""steptune's distributed GPT trainer: one measured training run per config, on torch.distributed alone.

It never imports Ray, MLflow, OmegaConf or the orchestrator (tests/unit/test_imports.py), so it runs the same on a
laptop, under torchrun, or inside a Ray actor. Its folders are grouped by reason to change, as torchtitan groups
its own (models, distributed, components): ``model/`` (the GPT, its data, how its blocks recompute),
``parallel/`` (tensor, pipeline and data parallelism applied to the model) and ``measure/`` (what a run measures,
and the result it hands back). Each folder's ``__init__`` ends with ``May import: ...``, checked like the
orchestrator's rooms (``orchestrator.rooms.TRAINER``).

Two kinds of module stay at the root. The entry points, where users find them: ``__main__`` (``python -m
trainer``), ``launch`` (N local ranks with torchrun's variables) and ``run`` (one measured run: where model,
parallel and measure meet); they may import every folder. The config every folder reads: ``knobs`` (the tuning
knobs, shared with the planner, the search space and the export), ``config`` (``TrainConfig``), ``layout`` (the
pure arithmetic the config is validated with, which the planner and the search space use without torch) and
``mapping`` (mappings <-> the config's dataclasses); they import no folder.
"""
