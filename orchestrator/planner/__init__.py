"""The planner: an analytical step-time and memory model of dense GPT training (the ``model`` backend).

``predict(cfg)`` estimates one update's time, broken down along the critical path, and the peak memory of
every pipeline stage, for a ``PlanConfig`` (cluster, model, job, efficiency parameters, knobs).
``calibrate(records, base_cfg)`` fits the efficiency parameters to measured runs. docs/planner.md lists
every formula and its source.

May import: nothing of the orchestrator
"""

from .calibrate import Calibration, calibrate
from .cluster import ClusterSpec, Efficiency, JobSpec, ModelSpec
from trainer.knobs import (BalancedSplit, BatchConfig, FirstLastSplit, FsdpDP, FullRecompute, NoRecompute,
                           OpRecompute, ParallelConfig, PipelineConfig, ReplicateDP, SelectiveRecompute,
                           TensorParallel, TorchDDP)

from .config import OptimizerSharding, PipelineComm, PlanConfig
from .grid import enumerate_space
from .memory import predicts_oom
from .parse import (KNOBS, apply_params, knob_values, layer_split_context, plan_config_from_dict,
                    plan_config_to_dict)
from .predict import Prediction, predict

__all__ = [
    "BalancedSplit", "BatchConfig", "Calibration", "ClusterSpec", "Efficiency", "OptimizerSharding",
    "FsdpDP", "PipelineComm", "ReplicateDP", "TensorParallel", "TorchDDP",
    "FirstLastSplit", "FullRecompute", "JobSpec", "KNOBS", "ModelSpec", "NoRecompute", "OpRecompute", "ParallelConfig",
    "PipelineConfig", "PlanConfig", "Prediction", "SelectiveRecompute", "apply_params", "calibrate",
    "enumerate_space", "knob_values", "layer_split_context", "plan_config_from_dict", "plan_config_to_dict", "predict", "predicts_oom",
]
