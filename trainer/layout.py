"""Pure layout arithmetic: parallel degrees, layer splits, microbatch counts.

Nothing here touches torch or processes, so every rule is unit-tested from tables. Errors are
``ValueError``s that name the config field to change.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


MESH_DIMS = ("pp", "dp", "tp")
"""The trainer's one DeviceMesh, outermost first: tensor-parallel ranks are adjacent (Megatron's order)."""


def check_world_size(tp: int, pp: int, dp: int, world_size: int) -> None:
    """The one check that the parallel degrees multiply to the world size."""
    if tp * pp * dp != world_size:
        rest = world_size // (tp * pp) if world_size % (tp * pp) == 0 else "?"
        raise ValueError(
            f"tensor_parallel.size x parallel.pp x parallel.dp = {tp} x {pp} x {dp} = {tp * pp * dp} but the world "
            f"size is {world_size}: set parallel.dp = {rest} or launch {tp * pp * dp} ranks"
        )


def rank_coords(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(pp_rank, dp_rank, tp_rank) of a global rank: rank = (pp_rank x dp + dp_rank) x tp + tp_rank."""
    if not 0 <= rank < tp * pp * dp:
        raise ValueError(f"rank {rank} is outside a world of {tp} x {pp} x {dp}")
    rest, tp_rank = divmod(rank, tp)
    pp_rank, dp_rank = divmod(rest, dp)
    return pp_rank, dp_rank, tp_rank


def num_microbatches(global_batch: int, micro_batch_size: int, dp: int) -> int:
    """Microbatches per replica per update, derived from the FIXED global batch (Megatron's calculator)."""
    if global_batch <= 0 or micro_batch_size <= 0 or dp <= 0:
        raise ValueError("batch.global_batch, batch.micro_batch_size and parallel.dp must be positive")
    per_step = micro_batch_size * dp
    if global_batch % per_step:
        raise ValueError(
            f"batch.global_batch={global_batch} is not divisible by batch.micro_batch_size x parallel.dp = "
            f"{micro_batch_size} x {dp} = {per_step}: choose a micro_batch_size that divides "
            f"{global_batch // dp if global_batch % dp == 0 else global_batch} (the global batch is fixed; "
            f"changing it changes what the model learns)"
        )
    return global_batch // per_step


def check_schedule(schedule: str, pp: int, virtual_stages: int, n_micro: int) -> None:
    """What every pipeline schedule needs (Megatron's rules), checked before any process starts."""
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline.schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if virtual_stages < 1:
        raise ValueError(f"pipeline.virtual_stages: {virtual_stages} must be >= 1")
    if schedule == "interleaved_1f1b":
        if pp < 2:
            raise ValueError("pipeline.schedule: interleaved_1f1b needs parallel.pp >= 2")
        if virtual_stages < 2:
            raise ValueError(
                "pipeline.virtual_stages: must be >= 2 with pipeline.schedule=interleaved_1f1b "
                "(use 1f1b for one stage per rank)"
            )
        if n_micro % pp:
            raise ValueError(
                f"pipeline.schedule: interleaved_1f1b needs the microbatch count ({n_micro}) to be a multiple "
                f"of parallel.pp={pp} (Megatron's rule): change batch.micro_batch_size"
            )
    elif virtual_stages != 1:
        raise ValueError(
            f"pipeline.virtual_stages: {virtual_stages} needs pipeline.schedule=interleaved_1f1b (got {schedule})"
        )


def check_torch_schedule(schedule: str, pp: int, n_micro: int) -> None:
    """torch.distributed.pipelining's extra rule: its 1F1B schedules need at least pp microbatches."""
    if pp > 1 and schedule in ("1f1b", "interleaved_1f1b") and n_micro < pp:
        raise ValueError(
            f"pipeline.schedule={schedule} needs at least parallel.pp={pp} microbatches, got {n_micro}: "
            f"lower batch.micro_batch_size"
        )


def layer_ranges(counts: list[int]) -> list[list[int]]:
    """Layer indices held by each model chunk, in order, from ``split_counts``'s layers per chunk."""
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [list(range(s, s + c)) for s, c in zip(starts, counts)]


def split_counts(n_layers: int, n_stages: int, *, explicit: tuple[int, ...] | None = None,
                 first: int | None = None, last: int | None = None) -> list[int]:
    """THE layer-split rule: layers per model chunk (pipeline stage), in pipeline order.

    Exactly one of: balanced (no keyword), ``explicit`` counts per chunk, or ``first``/``last`` chunk
    counts (0 or None: balanced with the middle) with the other chunks equal (Megatron's
    decoder_first/last_pipeline_num_layers rule). Every layer lands in exactly one chunk and every chunk
    gets at least one, except that an ``explicit`` split may leave the first chunk with only the embedding
    and the last with only the head and loss (0 layers: Llama 3's layout, Megatron's
    ``--pipeline-model-parallel-layout E|t|...|L``); anything else is an error naming the field, never a
    silent drop. The trainer, the planner and the search space's ``layer_split`` all call this.
    """
    if n_stages < 1:
        raise ValueError("the number of pipeline stages must be >= 1")
    if explicit is not None:
        counts = list(explicit)
        if len(counts) != n_stages:
            raise ValueError(
                f"pipeline.split.layers: has {len(counts)} entries but there are {n_stages} stages "
                f"(parallel.pp x pipeline.virtual_stages)"
            )
    elif first or last:
        counts = _first_last_counts(n_layers, n_stages, first or 0, last or 0)
    else:
        counts = _balanced_counts(n_layers, n_stages)
    ends_may_be_empty = explicit is not None and n_stages >= 2
    inner = counts[1:-1] if ends_may_be_empty else counts
    if any(c < 0 for c in counts) or any(c < 1 for c in inner):
        raise ValueError(
            f"pipeline.split: gives a stage no layers ({counts}); every stage needs >= 1 layer (only an explicit "
            f"pipeline.split.layers may give the first chunk just the embedding, or the last just the head: 0)"
        )
    if sum(counts) != n_layers:
        raise ValueError(
            f"pipeline.split.layers: {counts} sums to {sum(counts)} but model.n_layers={n_layers}: "
            f"every layer must land in exactly one stage"
        )
    return counts


def _balanced_counts(n_layers: int, n_stages: int) -> list[int]:
    if n_layers < n_stages:
        raise ValueError(
            f"model.n_layers: {n_layers} is fewer than the {n_stages} pipeline stages "
            f"(parallel.pp x pipeline.virtual_stages)"
        )
    base, extra = divmod(n_layers, n_stages)
    # Remainder layers go to the middle stages first: the first stage also holds the embedding and
    # the last one the head and loss, so they are the ones to keep light.
    order = list(range(1, n_stages - 1)) + [0, n_stages - 1] if n_stages > 2 else list(range(n_stages))
    counts = [base] * n_stages
    for i in order[:extra]:
        counts[i] += 1
    return counts


def _first_last_counts(n_layers: int, n_stages: int, first: int, last: int) -> list[int]:
    if n_stages < 2:
        raise ValueError("pipeline.split.first: first/last need at least 2 pipeline stages")
    if first < 0 or last < 0:
        raise ValueError("pipeline.split.first: first and last must be >= 1 (0 or unset: balanced)")
    fixed = [s for s in (first, last) if s]
    n_free = n_stages - len(fixed)
    rest = n_layers - sum(fixed)
    if n_free == 0:
        if rest:
            raise ValueError(f"pipeline.split.first: with 2 stages first + last must be model.n_layers "
                             f"({n_layers}); got {first} + {last}")
        return [first, last]
    if rest < n_free or rest % n_free:
        raise ValueError(
            f"pipeline.split.first: after first={first or '-'} and last={last or '-'} layers, {rest} layers do "
            f"not split evenly over the other {n_free} stages (at least 1 each; Megatron's rule); adjust "
            f"pipeline.split.first/last"
        )
    counts = [rest // n_free] * n_stages
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    return counts


def stage_ids_for_rank(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """Model chunks held by a pipeline rank: loop placement (chunk c lives on rank c % pp)."""
    return [pp_rank + v * pp for v in range(virtual_stages)]


def recompute_groups(layer_ids: list[int], method: str, num_layers: int) -> list[tuple[list[int], bool]]:
    """Full recompute on one stage's layers, Megatron's meaning.

    uniform: consecutive groups of ``num_layers`` layers, each group recomputed as one unit (only the
    group's input is kept). block: the first ``num_layers`` layers of the stage recomputed one by one, the
    rest keep their activations. Returns (layer ids, recomputed?) groups in order.
    """
    if method == "uniform":
        return [(layer_ids[i:i + num_layers], True) for i in range(0, len(layer_ids), num_layers)]
    if method == "block":
        n = min(num_layers, len(layer_ids))
        return [([lid], True) for lid in layer_ids[:n]] + [([lid], False) for lid in layer_ids[n:]]
    raise ValueError(f"recompute.method={method!r} must be uniform or block")
