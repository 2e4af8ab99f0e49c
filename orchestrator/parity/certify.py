"""The canonical run certifies itself before it becomes the anchor of the trust chain.

The canonical run (orchestrator.parity.trust.canonical_config) is the simplest layout of the maths, and every
baseline and trial is judged against it. A bug in that layout itself (here: in the whole batch as one microbatch)
would be in the reference: the bug's own layouts would pass and every correct one fail. So the same maths run
once more in a second decomposition that no layout knob may change, the batch as microbatches of one sequence
accumulated on the same one rank, and the two must agree under the precision's tolerance before anything is
stored or judged. What the check found is kept with the stored run (``self_check``); a stored run without it
(left by an older version) is not reused until it is certified again.
"""

from __future__ import annotations

from typing import Any

from orchestrator.parity import verdict as parity
from trainer.config import TrainConfig, apply_overrides

KNOB = "batch.micro_batch_size"
"""What the second decomposition changes: the microbatch size, so gradient accumulation replaces one big batch."""


def self_check_config(canonical: TrainConfig) -> TrainConfig | None:
    """The canonical run's second decomposition of the same maths: the same one-rank layout with the batch as
    microbatches of one sequence, accumulated. None when the canonical microbatch is already one sequence (there
    is nothing to decompose; ``uncheckable`` says so)."""
    if canonical.batch.micro_batch_size == 1:
        return None
    return TrainConfig.from_dict(apply_overrides(canonical.to_dict(), {KNOB: 1}))


def uncheckable(canonical: TrainConfig) -> dict[str, Any]:
    """The ``self_check`` record of a canonical run that has no second decomposition."""
    return {"knob": KNOB, "values": [canonical.batch.micro_batch_size], "passed": True,
            "note": "one sequence per microbatch: no second decomposition to compare"}


def self_check(canonical: Any, second: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ``self_check`` record, the verdict) of the canonical run's Result against its second decomposition's,
    under the precision's floor (the decompositions are one layout apart, like any trial from its reference)."""
    ref = parity.reference_from_result(canonical, role="canonical")
    verdict = parity.compare(ref, second, tolerance=parity.DEFAULT_TOLERANCE[ref["precision"]])
    values = [canonical.config["batch"]["micro_batch_size"], second.config["batch"]["micro_batch_size"]]
    record = {"knob": KNOB, "values": values, "passed": bool(verdict["passed"]),
              **{k: verdict[k] for k in ("max_loss_rel_diff", "max_grad_norm_rel_diff", "max_fingerprint_rel_diff")}}
    return record, {**verdict, "self_check": record}


def disagreement(record: dict[str, Any], verdict: dict[str, Any]) -> str:
    """The stop message when the two decompositions disagree: which decomposition differs, and by how much."""
    whole, small = record["values"]
    return (f"the canonical run does not certify itself: the same maths on one rank as one microbatch of {whole} "
            f"sequences and as {whole} microbatches of {small} (gradient accumulation) disagree: "
            f"{parity.describe_failure(verdict)}. The decomposition that differs is {KNOB} ({whole} vs {small}): no "
            f"layout knob may change what is learned, so the trainer computes something else at one of these "
            f"micro-batch sizes (in the plain forward and backward, or in gradient accumulation). Nothing was stored "
            f"and no baseline or trial is judged: fix the trainer, then run again")
