"""Property: every slice ``derive_slices`` returns is a valid trainer config of the requested size, for any
shrink and rank count it accepts; what it refuses, it refuses with a one-line ValueError (issue 30)."""

from __future__ import annotations

from hypothesis import assume, given, settings, strategies as st

from orchestrator.calibration.slices import derive_slices
from orchestrator.planner.parse import plan_config_from_dict
from trainer.config import TrainConfig


@st.composite
def sweeps(draw) -> dict:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    heads = tp * draw(st.integers(1, 16))
    hidden = heads * draw(st.integers(1, 64))
    sp = tp > 1 and draw(st.booleans())
    mbs = draw(st.sampled_from([1, 2, 4]))
    dp = 64 // tp
    model = {"num_layers": draw(st.integers(1, 96)), "hidden_size": hidden, "num_heads": heads,
             "vocab_size": draw(st.integers(1, 4000)), "position_embeddings": 256}
    if draw(st.booleans()):
        model["ffn_hidden_size"] = tp * draw(st.integers(1, 2000))
    planner = {
        "cluster": {"num_gpus": 64, "gpus_per_node": 8, "peak_tflops": 1.0, "hbm_gb": 80},
        "model": model,
        "job": {"seq_len": tp * draw(st.integers(1, 64)), "precision": draw(st.sampled_from(["mixed", "fp32"]))},
        "parallel": {"pp": 1, "dp": dp},
        "tensor_parallel": {"size": tp, "sequence_parallel": sp, "comm_overlap": sp and draw(st.booleans())},
        "batch": {"global_batch": dp * mbs * draw(st.integers(1, 4)), "micro_batch_size": mbs},
        "recompute": {"kind": draw(st.sampled_from(["none", "selective", "full"]))},
    }
    space = {"batch.micro_batch_size": {"type": "categorical", "choices": draw(st.lists(
        st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=3))},
             "recompute.kind": {"type": "categorical", "choices": draw(st.lists(
                 st.sampled_from(["none", "selective", "full", "op"]), min_size=1, max_size=3))}}
    return {"backend": "model", "planner": planner, "space": {"params": space}}


@settings(max_examples=60, deadline=None)
@given(sweep=sweeps(), ranks=st.integers(1, 8), shrink=st.integers(1, 64), layers=st.integers(1, 3),
       with_tp1=st.booleans())
def test_every_slice_is_a_valid_trainer_config_of_the_requested_size(sweep, ranks, shrink, layers, with_tp1):
    try:
        plan_config_from_dict(sweep["planner"])
    except ValueError:
        assume(False)  # not a valid planner section: derive_slices' own input check, tested elsewhere
    try:
        plan = derive_slices(sweep, ranks=ranks, layers=layers, shrink=shrink, with_tp1=with_tp1)
    except ValueError as e:
        raise AssertionError(f"a valid sweep file, ranks {ranks}, shrink {shrink} was refused: {e}") from None
    assert plan.slices and len({s.name for s in plan.slices}) == len(plan.slices)
    for s in plan.slices:
        c = s.config
        assert TrainConfig.from_dict(c.to_dict()) == c  # validates again, unchanged
        assert c.world_size == ranks and c.model.n_layers == layers and c.n_microbatches == 2
        tp = c.tensor_parallel.size
        assert tp in (1, plan.tp) and ranks % tp == 0
        assert c.model.n_heads % tp == 0 and c.model.ffn_dim % tp == 0 and c.model.vocab_size % tp == 0
        assert (c.model.d_model, c.model.n_heads, c.model.vocab_size) == (
            plan.shape["d_model"], plan.shape["n_heads"], plan.shape["vocab_size"])
        assert not c.tensor_parallel.comm_overlap  # CPU slices never overlap TP communication

