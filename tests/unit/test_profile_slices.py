"""The slice derivation of ``steptune profile`` (orchestrator/calibration/profile.py): from sweep-file tables, no processes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.calibration.prefilter import load_cluster
from orchestrator.calibration.slices import derive_slices, memory_refusal

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "search_spaces" / "clusters" / "cpu-local.yaml"
PRESET = ROOT / "search_spaces" / "preset-500b.yaml"

SWEEP = {
    "name": "small", "backend": "model",
    "planner": {
        "cluster": {"num_gpus": 8, "gpus_per_node": 8, "peak_tflops": 1.0, "hbm_gb": 8},
        "model": {"num_layers": 24, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 1024,
                  "vocab_size": 1000, "linear_biases": False, "position_embeddings": 128},
        "job": {"seq_len": 128, "precision": "mixed"},
        "parallel": {"pp": 2, "dp": 2},
        "tensor_parallel": {"size": 2, "sequence_parallel": True},
        "batch": {"global_batch": 32, "micro_batch_size": 2},
        "recompute": {"kind": "full", "method": "block", "num_layers": 4},
    },
    "baseline": {"batch.micro_batch_size": 1},
    "space": {"params": {"batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4]},
                         "recompute.kind": {"type": "categorical", "choices": ["none", "selective", "full"]},
                         "data_parallel.bucket_mb": {"type": "float", "low": 1, "high": 100}}},
}


def sweep(**planner_changes) -> dict:
    out = copy.deepcopy(SWEEP)
    for section, values in planner_changes.items():
        out["planner"][section] = {**out["planner"].get(section, {}), **values}
    return out


def test_slices_take_the_production_layer_shape_and_each_space_value_once():
    plan = derive_slices(sweep(), ranks=2, layers=2)
    assert plan.tp == 2 and plan.layers == 2
    assert plan.shape == {"d_model": 256, "n_heads": 8, "d_ff": 1024, "vocab_size": 1000, "seq_len": 128,
                          "precision": "bf16"}
    # The baseline first, then each other micro-batch size and recompute kind once: 1 + 2 + 2, not 3 x 3.
    assert [s.name for s in plan.slices] == ["mbs=1 recompute=full", "mbs=2 recompute=full", "mbs=4 recompute=full",
                                             "mbs=1 recompute=none", "mbs=1 recompute=selective"]
    for s in plan.slices:
        c = s.config
        assert (c.model.n_layers, c.model.d_model, c.model.n_heads, c.model.ffn_dim, c.model.vocab_size,
                c.model.seq_len) == (2, 256, 8, 1024, 1000, 128)
        assert (c.tensor_parallel.size, c.parallel.pp, c.parallel.dp, c.world_size) == (2, 1, 1, 2)
        assert c.run.precision == "bf16" and c.n_microbatches == 2
    full = plan.slices[0].config.recompute
    assert (full.kind, full.method, full.num_layers) == ("full", "block", 2)  # the production method, within 2 layers
    assert plan.slices[2].config.batch.micro_batch_size == 4


def test_fp32_job_runs_fp32():
    assert derive_slices(sweep(job={"precision": "fp32"})).shape["precision"] == "fp32"


def test_tp_that_does_not_divide_the_ranks_falls_back_to_1_and_says_so():
    plan = derive_slices(sweep(tensor_parallel={"size": 4}, parallel={"pp": 2, "dp": 1}), ranks=2)
    assert plan.tp == 1 and all(s.config.tensor_parallel.size == 1 and s.config.parallel.dp == 2 for s in plan.slices)
    assert any("tensor_parallel.size=4 does not divide --ranks 2" in n for n in plan.notes)
    assert derive_slices(sweep(tensor_parallel={"size": 4}, parallel={"pp": 2, "dp": 1}), ranks=4).tp == 4


def test_shrink_divides_the_shape_and_keeps_tensor_parallel_divisibility():
    plan = derive_slices(sweep(model={"hidden_size": 384, "num_heads": 12, "ffn_hidden_size": 1536,
                                      "vocab_size": 1002}), ranks=2, shrink=4)
    # 12 heads / 4 = 3 is odd at tp 2: rounded down to 2 heads, hidden to whole heads of the same width.
    assert plan.shape["n_heads"] == 2 and plan.shape["d_model"] % 2 == 0 and plan.shape["d_model"] == 2 * 48
    assert plan.shape["d_ff"] == 384 and plan.shape["vocab_size"] % 2 == 0 and plan.shape["vocab_size"] == 250
    assert plan.shrink == 4 and any("does not describe the production GEMMs" in n for n in plan.notes)
    assert all(s.config.tensor_parallel.size == 2 for s in plan.slices)  # every config validated at tp 2


def test_notes_name_what_the_trainer_cannot_represent():
    # A Llama block: wq, wk, wv, wo, then the gated MLP's w1, w3, w2 (ffn_hidden_size its equivalent width).
    gated = [[256, 256]] * 4 + [[256, 1024], [256, 1024], [1024, 256]]
    plan = derive_slices(sweep(model={"layer_gemms": gated, "ffn_hidden_size": 1536, "linear_biases": True, "position_embeddings": 0,
                                      "flash_attention": False, "tied_embeddings": True}))
    text = " | ".join(plan.notes)
    for fragment in ("model.layer_gemms", "linear_biases", "rotary", "flash_attention=false", "tied_embeddings",
                     "job.precision=mixed"):
        assert fragment in text
    assert not any("layer_gemms" in n for n in derive_slices(sweep()).notes)


@pytest.mark.parametrize("kwargs, flag", [({"ranks": 0}, "--ranks"), ({"layers": 0}, "--layers"),
                                          ({"shrink": 0}, "--shrink"), ({"steps": 1}, "--steps")])
def test_bad_flags_are_named(kwargs, flag):
    with pytest.raises(ValueError, match=f"^{flag}:"):
        derive_slices(sweep(), **kwargs)


def test_bad_space_value_is_named():
    bad = sweep()
    bad["space"]["params"]["recompute.kind"]["choices"] = ["none", "sometimes"]
    with pytest.raises(ValueError, match="space.params.recompute.kind: 'sometimes'"):
        derive_slices(bad)


def test_the_500b_layer_is_refused_on_the_cpu_box_with_the_memory_it_needs():
    cluster, prior = load_cluster(CPU)
    plan = derive_slices(yaml.safe_load(PRESET.read_text()), ranks=2, layers=2)
    assert plan.shape["d_model"] == 20480 and plan.tp == 1  # tp 8 does not divide 2 ranks
    line = memory_refusal(plan, cluster, prior, "cpu-local.yaml")
    assert line is not None and "\n" not in line
    assert line.startswith("slice mbs=1 recompute=full (2 layers, d_model 20480, tp 1) needs ")
    needed = float(line.split(" needs ")[1].split(" GiB")[0])
    assert needed > 100 and "10.2 GiB budget of cpu-local.yaml" in line
    # Shrunk 16x, every slice fits the same budget: the refusal is the prediction, not a size rule.
    assert memory_refusal(derive_slices(yaml.safe_load(PRESET.read_text()), shrink=16), cluster, prior, "x") is None


def test_cli_refuses_in_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    # The 500B job keeps every GPU of an 8-GPU node busy: its slices need 8 ranks, and this host has fewer cores.
    assert main(["profile", "--config", str(PRESET), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    assert "the job runs 8 rank(s) per node (world 5120, gpus_per_node 8)" in err and "device(s)" in err
    # A rank count other than the job's density is refused, naming the density.
    assert main(["profile", "--config", str(ROOT / "search_spaces" / "default.yaml"), "--ranks", "1"]) == 2
    assert "--ranks 1: the job keeps 2 rank(s) of a node busy (its 2 rank(s), 64 per node)" in capsys.readouterr().err
    assert main(["profile", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["profile", "--config", str(PRESET), "--layers", "0"]) == 2
    assert "--layers: expected integers >= 1, comma-separated" in capsys.readouterr().err
    assert main(["profile", "--config", str(ROOT / "search_spaces" / "default.yaml"), "--ranks", "1,x"]) == 2
    assert "--ranks: expected integers" in capsys.readouterr().err


def test_trainer_slices_of_a_ray_sweep_keep_its_shape_and_cover_each_knob_once():
    """``derive_trainer_slices`` of the default (ray) sweep: the trainer section's shape at 1-2 layers, pp 1,
    dp = ranks, the baseline's mbs and recompute first, each other space value once; bad flags name the flag."""
    from orchestrator.calibration.slices import derive_trainer_slices

    sweep = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())
    plan = derive_trainer_slices(sweep, ranks=2, layers=1, steps=6)
    names = [s.name for s in plan.slices]
    assert names == [f"ranks=2 layers=1 mbs={m} recompute={k}" for m, k in
                     [(1, "full"), (2, "full"), (4, "full"), (8, "full"), (1, "none"), (1, "selective")]]
    for s in plan.slices:
        c = s.config
        assert (c.model.n_layers, c.model.d_model, c.model.n_heads, c.model.seq_len) == (1, 64, 4, 64)
        assert (c.parallel.pp, c.parallel.dp, c.world_size) == (1, 2, 2)
        assert c.batch.global_batch == 16  # the job's global batch: its microbatches per replica
        assert (c.run.steps, c.run.warmup_steps, c.run.threads_per_rank) == (6, 2, 1)
    assert plan.slices[0].config.recompute.num_layers == 1  # the baseline's recompute settings, within 1 layer
    assert plan.shape == {"d_model": 64, "n_heads": 4, "d_ff": 256, "vocab_size": 256, "seq_len": 64,
                          "precision": "fp32"}
    with pytest.raises(ValueError, match="--steps: must be an integer >= 3"):
        derive_trainer_slices(sweep, steps=2)
    with pytest.raises(ValueError, match="trainer: section missing"):
        derive_trainer_slices({"space": sweep["space"]})


# (the runner: what it does; whether the local launcher must run; what the printout's "where" must say)
RUNNER_TABLE = [
    pytest.param("ok", False, "ray group", id="ray-runs-them"),
    pytest.param("unavailable", True, "local launcher (note: Ray could not start (no room for 2 ranks))",
                 id="ray-cannot-start"),
    pytest.param(None, True, "local launcher (note: no Ray runner was given)", id="no-runner"),
]


@pytest.mark.parametrize("runner_kind, local, where", RUNNER_TABLE)
def test_slices_run_on_the_runner_and_fall_back_to_the_local_launcher_only_when_it_cannot_start(
        monkeypatch, runner_kind, local, where):
    import trainer.launch
    from orchestrator.calibration.profile import RunnerUnavailable, run_slices

    launched = []
    monkeypatch.setattr(trainer.launch, "spawn_many", lambda cfgs: launched.append(cfgs) or ["local"] * len(cfgs))

    def runner(cfgs, device):
        if runner_kind == "unavailable":
            raise RunnerUnavailable("no room for 2 ranks\nsecond line")
        return ["ray"] * len(cfgs), "ray group"

    results, said = run_slices(["a", "b"], "cpu", runner if runner_kind else None)
    assert results == (["local", "local"] if local else ["ray", "ray"]) and bool(launched) == local
    assert where in said and "second line" not in said


def test_any_sweep_file_several_layer_and_rank_counts_and_the_dp_comm_slices():
    """``derive_any``: a ray-backend file (the default sweep) at --ranks 1,2 --layers 1,2 gives each combination's
    slices, plus the data-parallel slices (each bucket size of the space, overlap off and on) at 2 ranks and the
    most layers; a model-backend file gets the same naming; an unknown backend is named."""
    from orchestrator.calibration.slices import derive_any

    ray = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())
    plan, comm = derive_any(ray, [1, 2], [1, 2], steps=4)
    assert len(plan.slices) == 4 * 6 and len({s.name for s in plan.slices}) == 24
    assert {(s.config.world_size, s.config.model.n_layers) for s in plan.slices} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    dp = [c for c in comm if c.role == "dp"]
    assert [s.name for s in dp] == [f"ranks=2 layers=2 dp bucket_mb={b} overlap={o}"
                                    for b in ("0.05", "0.5", "5") for o in ("off", "on")]
    assert all(c.config.parallel.dp == 2 and c.config.model.n_layers == 2 for c in dp)
    assert [c.config.data_parallel.overlap_grad_reduce for c in dp[:2]] == [False, True]
    assert [s.name for s in comm if s.role == "pp"] == [f"ranks=2 pp=2 {k} mbs={m}" for k in
                                                         ("gpipe", "1f1b", "interleaved_1f1b") for m in (1, 8)]
    _, none = derive_any(ray, [2], [1], steps=4, dp_comm=False, pp_comm=False)
    assert none == ()
    _, pp_only = derive_any(ray, [2], [1], steps=4, dp_comm=False)
    assert {s.role for s in pp_only} == {"pp"}
    m_plan, m_comm = derive_any(sweep(tensor_parallel={"size": 1}, parallel={"pp": 2, "dp": 4}), [2], [1, 2])
    assert [s.name for s in m_plan.slices][:2] == ["ranks=2 layers=1 mbs=1 recompute=full",
                                                   "ranks=2 layers=1 mbs=2 recompute=full"]
    assert [s.name for s in m_comm][0] == "ranks=2 layers=2 dp bucket_mb=1 overlap=off"
    with pytest.raises(ValueError, match="backend: 'local'"):
        derive_any({**ray, "backend": "local"}, [2], [1])
