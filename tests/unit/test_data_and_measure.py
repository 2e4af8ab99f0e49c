"""Data determinism, token files, FLOPs and saved-activation accounting, without processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.config import ModelConfig, OpRecompute, TrainConfig
from trainer.model.data import SyntheticCorpus, TokenFile, make_token_file, replica_batch
from trainer.measure.flops import model_flops_per_token, recompute_flops_per_token
from trainer.measure.meters import SavedActivations, peak_flops
from trainer.model.gpt import GPT


def test_replicas_partition_the_global_batch():
    corpus = SyntheticCorpus(64, seed=3)
    whole_x, whole_y = replica_batch(corpus, step=5, global_batch=8, dp=1, dp_rank=0, seq_len=16)
    parts = [replica_batch(corpus, 5, 8, 4, r, 16) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole_x)
    assert torch.equal(torch.cat([p[1] for p in parts]), whole_y)
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])
    other = replica_batch(corpus, 6, 8, 1, 0, 16)[0]
    assert not torch.equal(other, whole_x)


def test_synthetic_corpus_is_learnable_and_fixed():
    a, b = SyntheticCorpus(256, 1234), SyntheticCorpus(256, 1234)
    assert np.array_equal(a.sequences(10, 3, 32), b.sequences(10, 3, 32))
    assert a.entropy() < 0.5 * np.log(256)  # well below a uniform guess: the loss can fall


def test_token_file_round_trip(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(b"hello steptune " * 20)
    header = make_token_file([text], tmp_path / "tok.bin")
    assert header["n_tokens"] == 300
    tf = TokenFile(tmp_path / "tok.bin", 256)
    seqs = tf.sequences(0, 2, 9)
    assert bytes(seqs[0].astype(np.uint8)) == (b"hello steptune " * 20)[:9]
    with pytest.raises(ValueError, match="data.path"):
        TokenFile(tmp_path / "missing.bin", 256)


def test_model_flops_match_the_6n_rule():
    m = ModelConfig(vocab_size=100, n_layers=2, d_model=8, n_heads=2, seq_len=4)
    n = 2 * (4 * 8 * 8 + 2 * 8 * 32) + 8 * 100
    assert model_flops_per_token(m) == 6 * n + 12 * 2 * 8 * 4


def test_recompute_flops_count_only_repeated_forward_work():
    base = {"model": {"n_layers": 4, "d_model": 16, "n_heads": 2, "seq_len": 8}}
    none = TrainConfig.from_dict(base)
    full = TrainConfig.from_dict({**base, "recompute": {"kind": "full", "method": "block", "num_layers": 2}})
    per_layer_fwd = 2 * (4 * 16 * 16 + 2 * 16 * 64) + 4 * 16 * 8
    assert recompute_flops_per_token(none) == 0
    assert recompute_flops_per_token(full) == 2 * per_layer_fwd
    sel = TrainConfig.from_dict({**base, "recompute": {"kind": "selective", "modules": ["core_attn"]}})
    assert recompute_flops_per_token(sel) == 4 * (4 * 16 * 8)
    # Op-level, period 2: the 2nd and 4th matmul of each layer (attention projection, MLP down) run again.
    op = TrainConfig.from_dict({**base, "recompute": {"kind": "op", "matmul_period": 2}})
    assert recompute_flops_per_token(op) == 4 * 2 * (16 * 16 + 64 * 16)


def test_saved_activation_bytes_follow_the_graph():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, seq_len=8))
    acts = SavedActivations()
    x = torch.randint(0, 32, (2, 8))
    with acts.hooks():
        loss = model(x).sum()
    held = acts.live
    assert held > 0 and acts.peak == held
    loss.backward()
    del loss
    assert acts.live == 0  # everything saved for backward was released
    model.set_full_recompute([([0, 1], True)])
    with acts.hooks():
        loss = model(x).sum()
    assert 0 < acts.live < held / 2
    loss.backward()


@pytest.mark.parametrize("period,kept_matmuls", [(2, (0, 2)), (3, (0, 1, 3)), (0, (0, 1, 2, 3)), (1, ())])
def test_op_recompute_keeps_what_its_policy_names_and_changes_no_number(period, kept_matmuls):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, seq_len=8)
    x = torch.randint(0, 32, (2, 8))
    ref = GPT(cfg)
    ref.init_weights(0)
    ref_loss = ref(x).float().logsumexp(-1).mean()
    ref_loss.backward()
    model = GPT(cfg)
    model.init_weights(0)
    for block in model.layers.values():
        block.set_op_recompute(OpRecompute(matmul_period=period))
    acts = SavedActivations()
    with acts.hooks():
        loss = model(x).float().logsumexp(-1).mean()
    held = acts.live
    loss.backward()
    assert acts.live == 0  # the cached outputs are released when each layer's backward starts
    assert torch.equal(loss, ref_loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad), name
    # Per layer: its fp32 input and the kept outputs (the planner's accounting: memory.activation_bytes).
    widths = [3 * 16, 16, 64, 16]
    per_layer = 4 * 16 * (16 + sum(widths[k] for k in kept_matmuls) + 16) + 4 * 2 * 16
    with acts.hooks():
        h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
        before = acts.live
        out = model.layers["0"](h)
    assert acts.live - before == per_layer and out.requires_grad
    assert held > 0


def test_layer_matmuls_is_the_order_the_block_runs_its_linears_in():
    # Op recompute's period counts matmuls in this order, and the planner prices trainer configs with it.
    cfg = ModelConfig(vocab_size=32, n_layers=1, d_model=16, n_heads=2, seq_len=8, d_ff=40)
    block = GPT(cfg).layers["0"]
    seen = []
    for mod in block.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(lambda m, i, o: seen.append((m.in_features, m.out_features)))
    block(torch.randn(2, 8, 16))
    assert tuple(seen) == cfg.layer_matmuls == ((16, 48), (16, 16), (16, 40), (40, 16))


def test_unknown_gpu_peak_gives_no_mfu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU 9000")
    peak, basis = peak_flops(torch.device("cuda", 0), "bf16")
    assert peak is None and "no declared peak" in basis
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert peak_flops(torch.device("cuda", 0), "bf16")[0] == 989e12
    assert peak_flops(torch.device("cuda", 0), "fp32")[0] is None


def test_cpu_peak_is_measured_and_labelled():
    peak, basis = peak_flops(torch.device("cpu"), "fp32")
    assert peak > 1e8 and basis.startswith("measured CPU peak")


def test_cpu_peak_counts_the_flops_of_the_matmul_it_times(monkeypatch):
    """2 x n^3 FLOPs for an n x n by n x n matmul, over the best time: checked with a clock that ticks 0.25 s per
    read and the matmul's operands recorded (a count halved, or a matmul of other dimensions, fails)."""
    import types

    from trainer.measure import meters

    ticks = iter(0.25 * i for i in range(1000))
    monkeypatch.setattr(meters, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    shapes = []
    real_randn = torch.randn

    def randn(*size, **kw):
        shapes.append(tuple(size))
        return real_randn(*size, **kw)
    monkeypatch.setattr(meters.torch, "randn", randn)
    for n in (64, 128):
        shapes.clear()
        assert meters._measure_cpu_matmul(torch.float32, n=n) == pytest.approx(2 * n ** 3 / 0.25)
        assert shapes == [(n, n), (n, n)]
    assert "512x512x512" in meters.peak_flops(torch.device("cpu"), "fp32")[1]  # the label names what was timed


def test_stage_holds_exactly_the_single_process_tensors():
    cfg = ModelConfig(vocab_size=32, n_layers=4, d_model=16, n_heads=2, seq_len=8)
    whole, stage = GPT(cfg), GPT(cfg, [2, 3], has_embedding=False, has_head=True)
    whole.init_weights(7)
    stage.init_weights(7)
    full = dict(whole.named_parameters())
    for name, p in stage.named_parameters():
        assert torch.equal(p, full[name]), name
