"""Parallelism applied to the model: tensor and sequence parallelism, pipeline stages and their schedule, and
data-parallel wrapping with its gradient sync, on the trainer's one DeviceMesh.

``parallelize`` (the layout applied in torchtitan's order: tensor parallelism, recompute, data-parallel
wrapping, pipeline stages and their schedule), ``tensor_parallel`` (Megatron-style plans on torch's DTensor
API), ``grad_sync`` (bucketed data-parallel gradient all-reduce, overlapped or not). The arithmetic of a layout
(degrees, layer splits, microbatches, a rank's coordinates) is ``trainer.layout``, beside the config it
validates. It imports ``measure`` for one thing: the tensor-parallel clock synchronises the device as the phase
clock does.

May import: model, measure
"""
