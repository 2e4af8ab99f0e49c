"""The model and its data: the GPT on one device, the sequences it trains on, and how its blocks recompute.

``gpt`` (the GPT; any contiguous run of its layers, for a pipeline stage; initialised from (seed, parameter name)),
``data`` (the synthetic corpus and token files, ``python -m trainer.model.data make``; a global step -> the same
sequences for any layout), ``op_checkpoint`` (op-level selective recompute, which the blocks apply themselves,
as they do full recompute). The model builds no process group and no mesh: ``trainer.parallel`` applies
parallelism to it from outside.

May import: no other sub-package
"""
