"""Measurement: what one run measures, how, and the result it hands back.

``meters`` (the device-synchronised phase clock and NVTX ranges, saved-activation bytes, the peak FLOP/s an MFU is
stated against), ``flops`` (FLOPs per token, torch-free), ``profile`` (``run.profile_step``: one update under
torch.profiler, a Chrome trace per rank), ``result`` (the result dataclasses, their JSON form, merging ranks into
one ``Result`` with ``finalize``: what the orchestrator reads, without torch), ``netbench`` (``python -m
trainer.measure.netbench``: a collective microbenchmark in nccl-tests' format, read by ``steptune netcal``).

May import: model
"""
