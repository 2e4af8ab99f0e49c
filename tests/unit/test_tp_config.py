"""Tensor-parallel config: each field that does not divide by tensor_parallel.size is refused, named."""

from __future__ import annotations

import re

import pytest

from trainer.config import TrainConfig
from trainer.knobs import TensorParallel

BASE = {"model": {"vocab_size": 128, "n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 32},
        "batch": {"global_batch": 8, "micro_batch_size": 2}}


def _cfg(**sections) -> TrainConfig:
    data = {k: dict(v) for k, v in BASE.items()}
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return TrainConfig.from_dict(data)


def test_tp_multiplies_the_world():
    cfg = _cfg(tensor_parallel={"size": 2}, parallel={"pp": 2, "dp": 2}, batch={"micro_batch_size": 1})
    assert cfg.world_size == 8
    assert _cfg().tensor_parallel == TensorParallel(size=1, sequence_parallel=True, comm_overlap=False)
    assert _cfg(tensor_parallel={"size": 4}).world_size == 4


@pytest.mark.parametrize("sections,field", [
    ({"model": {"n_heads": 2, "d_model": 32}, "tensor_parallel": {"size": 4}}, "model.n_heads: 2 is not divisible"),
    ({"model": {"d_ff": 102}, "tensor_parallel": {"size": 4}}, "model.d_ff: 102 is not divisible"),
    ({"model": {"vocab_size": 127}, "tensor_parallel": {"size": 2}}, "model.vocab_size: 127 is not divisible"),
    ({"model": {"seq_len": 30}, "tensor_parallel": {"size": 4}}, "model.seq_len: 30 is not divisible"),
    ({"tensor_parallel": {"size": 0}}, "tensor_parallel.size: must be an integer >= 1"),
    ({"tensor_parallel": {"size": 2.0}}, "tensor_parallel.size: expected an integer"),
    ({"tensor_parallel": {"sequence_parallel": 1}}, "tensor_parallel.sequence_parallel: expected true or false"),
    ({"tensor_parallel": {"size": 2, "comm_overlap": True}},
     "tensor_parallel.comm_overlap: torch's asynchronous TP needs run.device=cuda (CUDA symmetric memory), not cpu"),
    ({"tensor_parallel": {"size": 2, "comm_overlap": True}, "run": {"device": "cuda"}, "recompute": {"kind": "op"}},
     "tensor_parallel.comm_overlap: the blocks it compiles cannot trace recompute.kind=op"),
    ({"tensor_parallel": {"size": 2, "comm_overlap": True}, "run": {"device": "cuda"}, "recompute": {"kind": "selective"}},
     "tensor_parallel.comm_overlap: the blocks it compiles cannot trace recompute.kind=selective"),
    ({"tensor_parallel": {"size": 2, "sequence_parallel": False, "comm_overlap": True}},
     "tensor_parallel.comm_overlap: needs tensor_parallel.sequence_parallel"),
    ({"tensor_parallel": {"size": 2}, "data_parallel": {"kind": "torch_ddp"}}, "data_parallel.kind: torch_ddp cannot"),
    ({"tensor_parallel": {"width": 2}}, "unknown field tensor_parallel.width"),
])
def test_bad_tp_config_names_the_field(sections, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        _cfg(**sections)


def test_undivisible_fields_are_fine_without_tp():
    """The divisibility rules are TP's: at size 1 (and with SP off for seq_len) nothing is refused."""
    _cfg(model={"vocab_size": 127, "d_ff": 100, "seq_len": 30})
    _cfg(model={"seq_len": 30}, tensor_parallel={"size": 2, "sequence_parallel": False})
    _cfg(tensor_parallel={"comm_overlap": True})  # a no-op at size 1, as for the planner


OVERLAP_ON_CUDA = {"tensor_parallel": {"size": 2, "comm_overlap": True}, "run": {"device": "cuda"}}


def test_comm_overlap_on_cuda_is_refused_without_a_gpu_or_symmetric_memory(monkeypatch):
    """The reason names what is missing here: no GPU, or a torch without symmetric memory; with both, it loads."""
    import importlib.util

    import torch

    with pytest.raises(ValueError, match=re.escape("tensor_parallel.comm_overlap: torch's asynchronous TP needs CUDA "
                                                   "and this torch sees no GPU")) as err:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        _cfg(**OVERLAP_ON_CUDA)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch.distributed._symmetric_memory" else find_spec(name, *a))
    with pytest.raises(ValueError, match="has no torch.distributed._symmetric_memory"):
        _cfg(**OVERLAP_ON_CUDA)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    cfg = _cfg(**OVERLAP_ON_CUDA, recompute={"kind": "full"})
    assert cfg.tensor_parallel.comm_overlap and cfg.run.device == "cuda"



def test_cli_refuses_an_undivisible_tp_with_exit_2(tmp_path, capsys):
    from trainer.__main__ import main

    out = tmp_path / "r.json"
    assert main(["tensor_parallel.size=3", "--out", str(out)]) == 2  # the default model has 4 heads
    assert "model.n_heads: 4 is not divisible by tensor_parallel.size=3" in capsys.readouterr().err
    assert not out.exists()
