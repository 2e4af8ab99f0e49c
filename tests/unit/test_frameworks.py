"""Framework adapters: log parsers from tables of lines in each framework's own format (written from Megatron-LM's
training_log/report_memory and torchtitan's metrics processor), and knobs rendered as each framework's flags."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.__main__ import main
from orchestrator.frameworks import megatron, steptune, torchtitan
from orchestrator.frameworks.adapters import FRAMEWORKS, framework
from orchestrator.frameworks.megatron_flags import check_args, flag_values, megatron_args
from trainer.config import TrainConfig, apply_overrides


def meg(step: int, ms: float, loss: str | None = "1.000000E+01", total: int = 40, stamp: bool = True,
        extra: str = "", skipped: int = 0, nan: int = 0, tflops: float | None = 100.0) -> str:
    """One iteration line as training_log prints it (field order and formats of megatron/training/training.py)."""
    s = f" [2025-04-13 23:41:{step % 60:02d}]" if stamp else ""
    s += f" iteration {step:8d}/{total:8d} | consumed samples: {step * 16:12d} |"
    s += f" elapsed time per iteration (ms): {ms:.1f} |"
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += " learning rate: 4.000000E-05 | global batch size:    16 |"
    if loss is not None:
        s += f" lm loss: {loss} |"
    s += extra
    s += " loss scale: 1.0 | grad norm: 3.874 |"
    s += f" number of skipped iterations: {skipped:3d} | number of nan iterations: {nan:3d} |"
    return s


def mem(rank: int, alloc: float, max_alloc: float, reserved: float, max_reserved: float) -> str:
    return (f"[Rank {rank}] (after 10 iterations) memory (MB) | allocated: {alloc} | max allocated: {max_alloc} | "
            f"reserved: {reserved} | max reserved: {max_reserved}")


MEG_OK = "\n".join([meg(10, 900.0), mem(0, 1000.0, 1200.0, 1500.0, 1600.0), mem(1, 1100.0, 1300.0, 1500.0, 1700.0),
                    meg(20, 500.0), meg(30, 510.0), meg(40, 530.0)])


@pytest.mark.parametrize("text,warmup,status,checks", [
    pytest.param(MEG_OK, 10, "ok", {"step_time_s": 0.51, "steady_lines": 3, "tflops_per_gpu": 100.0,
                                    "peak_memory_bytes": 1700 * 2**20}, id="ok-warmup-line-excluded"),
    pytest.param(MEG_OK, 1, "ok", {"steady_lines": 3}, id="first-line-averages-over-warmup"),
    pytest.param(MEG_OK.replace(" [2025-04-13 23:41:", " [skip").replace("[skip", ""), 10, "ok",
                 {"step_time_s": 0.51}, id="stamp-mangled-still-reads"),
    pytest.param("\n".join(meg(s, 500.0, stamp=False) for s in (10, 20, 30, 40)), 10, "ok",
                 {"step_time_s": 0.5}, id="no-timestamps"),
    pytest.param("\n".join([meg(10, 900.0), meg(20, 500.0)]), 10, "truncated", {"last_iteration": 20},
                 id="truncated"),
    pytest.param(MEG_OK + "\nTraceback (most recent call last):\n  File \"pretrain_gpt.py\"", 10, "ok", {},
                 id="traceback-after-last-line"),
    pytest.param("\n".join([meg(10, 900.0), meg(20, 500.0, loss="nan"), meg(30, 500.0), meg(40, 500.0)]), 10, "nan",
                 {}, id="nan-loss"),
    pytest.param("\n".join([meg(10, 900.0), meg(20, 500.0, nan=2), meg(30, 500.0), meg(40, 500.0)]), 10, "nan",
                 {"nan_iterations": 2}, id="nan-iteration-count"),
    pytest.param("\n".join([meg(10, 900.0, loss=None, skipped=10), meg(20, 500.0), meg(30, 500.0), meg(40, 500.0)]),
                 10, "ok", {"skipped_iterations": 10}, id="all-skipped-interval-has-no-loss"),
    pytest.param("building GPT model ...\n> finished creating GPT datasets ...\n", 1, "no_iterations", {},
                 id="no-iteration-lines"),
    pytest.param("", 1, "no_iterations", {}, id="empty"),
    pytest.param("\n".join([meg(10, 900.0, total=10)]), 10, "no_steady_state", {}, id="only-warmup"),
    pytest.param(MEG_OK + "\n" + meg(50, 1.0).replace("(ms): 1.0", "(ms): n/a"), 10, "ok", {"ignored_lines": 1},
                 id="malformed-line-ignored-and-counted"),
    pytest.param(MEG_OK + "\n" + meg(40, 999.0), 10, "ok", {"step_time_s": 0.51}, id="duplicate-line-first-kept"),
    pytest.param(MEG_OK[: MEG_OK.rindex("elapsed")], 10, "truncated", {"last_iteration": 30},
                 id="cut-mid-line"),
])
def test_megatron_log(text, warmup, status, checks):
    parsed = megatron.parse_log(text, warmup)
    summary = parsed.summary()
    assert parsed.status == status, parsed.reason
    assert (parsed.reason is None) == (status == "ok")
    for k, v in checks.items():
        assert summary[k] == pytest.approx(v), (k, summary[k])


def test_megatron_extra_loss_columns_and_memory_per_rank():
    text = "\n".join(meg(s, 500.0, extra=" load_balancing_loss: 1.012000E+00 | mtp_1 loss: 9.500000E+00 |")
                     for s in (10, 20, 30, 40)) + "\n" + mem(3, 10.0, 20.0, 30.0, 4096.0)
    parsed = megatron.parse_log(text, 10)
    it = parsed.iterations[-1]
    assert it.loss == 10.0 and it.grad_norm == pytest.approx(3.874)
    assert set(it.losses) == {"lm loss", "load_balancing_loss", "mtp_1 loss"}
    assert "loss scale" not in it.losses
    assert parsed.memory == {"allocated": 10 * 2**20, "max_allocated": 20 * 2**20, "reserved": 30 * 2**20,
                             "max_reserved": 4096 * 2**20}


def tt(step: int, loss: float | str = 8.0, gn: float | None = 1.5, tps: int = 12345, mfu: str = "3.21%",
       colour: bool = True, key: str = "tps") -> str:
    """One metrics line as torchtitan's MetricsProcessor.log prints it (colour codes between the fields)."""
    red, green, orange, blue, reset = ("\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[34m", "\x1b[39m") if colour else \
        ("",) * 5
    loss_s = f"{loss:8.5f}" if isinstance(loss, float) else loss
    s = f"[titan] 2025-01-01 00:00:{step:02d},000 - root - INFO - {red}step: {step:2}  {green}loss: {loss_s}  "
    if gn is not None:
        s += f"{orange}grad_norm: {gn:7.4f}  "
    return s + f"memory: {1.5 + step / 100:5.2f}GiB(15.20%)  {blue}{key}: {tps:,}  tflops: 12.34  mfu: {mfu}{reset}"


@pytest.mark.parametrize("lines,warmup,expected,status,checks", [
    pytest.param([tt(s) for s in range(1, 11)], 2, 10, "ok",
                 {"tokens_per_s_per_gpu": 12345, "mfu": 0.0321, "tflops_per_gpu": 12.34, "steady_lines": 8,
                  "peak_memory_bytes": int(1.6 * 2**30)}, id="ok"),
    pytest.param([tt(s, colour=False) for s in range(1, 11)], 2, None, "ok", {"steady_lines": 8}, id="no-colour"),
    pytest.param([tt(s, gn=None, key="wps") for s in range(1, 6)], 1, None, "ok", {"tokens_per_s_per_gpu": 12345},
                 id="older-release-wps-no-grad-norm"),
    pytest.param([tt(s, mfu="N/A") for s in range(1, 6)], 1, None, "ok", {"mfu": None}, id="mfu-not-available"),
    pytest.param([tt(s) for s in range(1, 6)], 1, 10, "truncated", {"last_iteration": 5}, id="truncated"),
    pytest.param([tt(1), tt(2, loss="     nan"), tt(3)], 1, None, "nan", {}, id="nan"),
    pytest.param(["[titan] Building llama3 8B", "[titan] Training starts at step 1"], 1, None, "no_iterations", {},
                 id="no-steps"),
    pytest.param([tt(s) for s in range(1, 4)] + ["validate step: 3  loss: 7.0000  memory: 1GiB(1%)"], 1, None, "ok",
                 {"iterations": 3}, id="validation-line-not-a-step"),
    pytest.param([tt(1), tt(2).replace("loss:", "lost:"), tt(3)], 1, None, "ok", {"ignored_lines": 1},
                 id="malformed-line-ignored"),
])
def test_torchtitan_log(lines, warmup, expected, status, checks):
    parsed = torchtitan.parse_log("\n".join(lines), warmup, expected)
    summary = parsed.summary()
    assert parsed.status == status, parsed.reason
    for k, v in checks.items():
        assert summary[k] == (pytest.approx(v) if v is not None else None), (k, summary[k])


def test_torchtitan_step_time_from_tokens_per_device():
    parsed = torchtitan.parse_log("\n".join(tt(s, tps=8192) for s in range(1, 6)), 1, tokens_per_step_per_gpu=4096)
    assert parsed.step_time_s == pytest.approx(0.5)
    assert torchtitan.parse_log(tt(1) + "\n" + tt(2), 1).step_time_s is None  # never guessed


def _result_json(times: list[float], losses: list[float] | None = None, steps: int | None = None) -> str:
    losses = losses or [5.0 - 0.1 * i for i in range(len(times))]
    return json.dumps({"config": {"run": {"warmup_steps": 2, "steps": steps or len(times)}}, "world_size": 2,
                       "steps": [{"step": i, "time_s": t, "loss": lo, "grad_norm": 1.0, "tokens": 1024}
                                 for i, (t, lo) in enumerate(zip(times, losses))],
                       "summary": {"peak_memory_bytes": 123456}}, allow_nan=True)


@pytest.mark.parametrize("text,status,checks", [
    pytest.param(_result_json([0.9, 0.8, 0.1, 0.3, 0.2]), "ok",
                 {"step_time_s": 0.2, "steady_lines": 3, "peak_memory_bytes": 123456,
                  "tokens_per_s_per_gpu": 1024 / 0.2 / 2}, id="ok-warmup-from-config"),
    pytest.param(_result_json([0.9, 0.8, 0.1], steps=5), "truncated", {}, id="fewer-steps-than-config"),
    pytest.param(_result_json([0.9, 0.8, 0.1], [1.0, math.nan, 1.0]), "nan", {}, id="nan"),
    pytest.param(_result_json([0.9, 0.8, 0.1])[:40], "no_iterations", {}, id="cut-off-json"),
    pytest.param("", "no_iterations", {}, id="empty"),
    pytest.param("[1, 2]", "no_iterations", {}, id="not-a-result"),
])
def test_steptune_result(text, status, checks):
    parsed = steptune.parse_result(text)
    summary = parsed.summary()
    assert parsed.status == status, parsed.reason
    for k, v in checks.items():
        assert summary[k] == pytest.approx(v), (k, summary[k])


def test_parse_log_cli(tmp_path, capsys):
    log = tmp_path / "megatron.log"
    log.write_text(MEG_OK)
    assert main(["parse-log", "--framework", "megatron", str(log), "--warmup", "10"]) == 0
    out = capsys.readouterr().out
    assert "megatron: ok" in out and "step time (median): 510.0 ms" in out and "max_reserved" in out
    assert main(["parse-log", "--framework", "megatron", str(log), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["status"] == "ok" and len(d["per_iteration"]) == 4
    log.write_text(meg(10, 900.0))
    assert main(["parse-log", "--framework", "megatron", str(log)]) == 1
    assert "truncated" in capsys.readouterr().out
    assert main(["parse-log", "--framework", "megatron", str(tmp_path / "missing.log")]) == 2


# ---- knobs -> flags ----------------------------------------------------------------------------------

def _cfg(**overrides) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(TrainConfig().to_dict(), overrides))


# For every knob the Megatron adapter accepts: a config that sets it, and the flag it must render.
MEGATRON_KNOBS = {
    "batch.micro_batch_size": ({"batch.micro_batch_size": 2}, "--micro-batch-size", ["2"]),
    "tensor_parallel.size": ({"tensor_parallel.size": 2, "parallel.dp": 1}, "--tensor-model-parallel-size", ["2"]),
    "tensor_parallel.sequence_parallel": ({"tensor_parallel.size": 2, "parallel.dp": 1,
                                           "tensor_parallel.sequence_parallel": True}, "--sequence-parallel", []),
    "parallel.pp": ({"parallel.pp": 2, "parallel.dp": 1}, "--pipeline-model-parallel-size", ["2"]),
    "pipeline.virtual_stages": ({"parallel.pp": 2, "parallel.dp": 1, "model.n_layers": 4,
                                 "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
                                "--num-layers-per-virtual-pipeline-stage", ["1"]),
    "pipeline.split": ({"parallel.pp": 2, "parallel.dp": 1, "pipeline.split.kind": "first_last",
                        "pipeline.split.first": 3}, "--decoder-first-pipeline-num-layers", ["3"]),
    "data_parallel.kind": ({"data_parallel.kind": "fsdp"}, "--use-distributed-optimizer", []),
    "data_parallel.overlap_grad_reduce": ({"data_parallel.overlap_grad_reduce": True}, "--overlap-grad-reduce", []),
    "data_parallel.bucket_mb": ({"data_parallel.bucket_mb": 1.0}, "--ddp-bucket-size", ["250000"]),
    "recompute.kind": ({"recompute.kind": "full"}, "--recompute-granularity", ["full"]),
    "recompute.modules": ({"recompute.kind": "selective", "recompute.modules": ["mlp"]}, "--recompute-modules",
                          ["mlp"]),
    "recompute.method": ({"recompute.kind": "full", "recompute.method": "block"}, "--recompute-method", ["block"]),
    "recompute.num_layers": ({"recompute.kind": "full", "recompute.num_layers": 2}, "--recompute-num-layers", ["2"]),
}


def test_every_megatron_knob_is_tabled():
    assert set(MEGATRON_KNOBS) == set(megatron.KNOB_FLAGS)


@pytest.mark.parametrize("knob", sorted(MEGATRON_KNOBS))
def test_megatron_adapter_renders_each_knob_under_exports_rules(knob):
    overrides, flag, values = MEGATRON_KNOBS[knob]
    cfg = _cfg(**overrides)
    args = megatron.render(cfg, [knob])
    assert flag_values(args, flag) == values, args
    assert check_args(megatron_args(cfg)[0]) == []  # render checks the whole flag set with export's rules
    # only the varied knob's flags: the user's command keeps its own model, data and optimizer flags
    assert not {"--num-layers", "--lr", "--seq-length", "--train-iters"} & set(args)


def test_megatron_adapter_refuses_a_flag_set_megatron_would_refuse(monkeypatch):
    from orchestrator.frameworks import megatron_flags

    bad = ["--recompute-granularity", "selective", "--recompute-method", "uniform"]
    monkeypatch.setattr(megatron, "megatron_args", lambda cfg: (bad, []))
    with pytest.raises(ValueError, match="framework megatron: --recompute-method is refused"):
        megatron.render(_cfg(), ["recompute.kind"])
    assert megatron_flags.check_args(bad)


@pytest.mark.parametrize("name,keys,refused", [
    ("megatron", ["pipeline.schedule"], "pipeline.schedule"),
    ("megatron", ["recompute.matmul_period", "batch.micro_batch_size"], "recompute.matmul_period"),
    ("megatron", ["data_parallel.prefetch"], "data_parallel.prefetch"),
    ("torchtitan", ["data_parallel.bucket_mb"], "data_parallel.bucket_mb"),
    ("torchtitan", ["pipeline.split.first"], "pipeline.split.first"),
])
def test_knobs_a_framework_cannot_express_are_refused(name, keys, refused):
    with pytest.raises(ValueError, match=rf"space.params.{refused}: framework {name} cannot express"):
        FRAMEWORKS[name].refuse(keys)


@pytest.mark.parametrize("name,keys", [("megatron", ["pipeline.split.first", "recompute.kind"]),
                                       ("torchtitan", list(torchtitan.KNOB_KEYS)), ("steptune", ["anything.at_all"])])
def test_knobs_a_framework_can_express_pass(name, keys):
    FRAMEWORKS[name].refuse(keys)


def test_torchtitan_renders_its_current_config_overrides():
    """torchtitan main: the batch in tokens per microbatch per DP rank, the global batch it keeps in tokens per step,
    every microbatch of a replica through the pipeline (num_pp_microbatches), the policy as a typed choice, last."""
    cfg = _cfg(**{"batch.micro_batch_size": 2, "parallel.pp": 2, "parallel.dp": 1, "recompute.kind": "selective",
                  "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "model.n_layers": 4})
    keys = ["batch.micro_batch_size", "parallel.pp", "pipeline.schedule", "recompute.kind"]
    seq, gb = cfg.model.seq_len, cfg.batch.global_batch
    assert torchtitan.render(cfg, keys) == [
        "--training.num_tokens_per_microbatch_per_dp_rank", str(2 * seq), "--training.num_tokens_per_train_step",
        str(gb * seq), "--parallelism.num_pp_microbatches", str(gb // 2), "--parallelism.pipeline_parallel_degree",
        "2", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B", "activation-checkpoint:selective"]
    old = framework("torchtitan", version="0.3.0")
    args, files = old.render(cfg, keys)
    assert args[:6] == ["--training.local_batch_size", str(gb), "--parallelism.pipeline_parallel_microbatch_size", "2",
                        "--training.global_batch_size", str(gb)] and files == {}
    one = _cfg(**{"batch.micro_batch_size": 4, "parallel.dp": 2})
    assert old.render(one, ["batch.micro_batch_size"])[0] == ["--training.local_batch_size", "4",
                                                              "--training.global_batch_size", str(gb)]
    with pytest.raises(ValueError, match=r"command.framework_version='0.2.1': the torchtitan adapter writes for "
                                         r"main, 0.3.0"):
        framework("torchtitan", version="0.2.1")
    with pytest.raises(ValueError, match="command.framework_version='1.0': only torchtitan"):
        framework("megatron", version="1.0")


def test_torchtitan_export_writes_its_overrides_as_toml():
    import tomllib

    from orchestrator.frameworks.adapters import what_ran

    flags = ["--training.num_tokens_per_microbatch_per_dp_rank", "4096", "--parallelism.pipeline_parallel_schedule",
             "1F1B", "activation-checkpoint:full"]
    files = what_ran({"framework": "torchtitan", "flags": flags, "argv": ["python", "-m", "torchtitan.train"],
                      "env": {}}, None)
    text = files[torchtitan.TOML_FILE]
    assert tomllib.loads(text) == {"training": {"num_tokens_per_microbatch_per_dp_rank": 4096},
                                   "parallelism": {"pipeline_parallel_schedule": "1F1B"}}
    assert "activation-checkpoint:full" in text and "command.sh" in files
    assert torchtitan.TOML_FILE not in what_ran({"framework": "megatron", "flags": ["--micro-batch-size", "2"],
                                                 "argv": [], "env": {}}, None)


def test_steptune_writes_its_yaml():
    import yaml

    cfg = _cfg(**{"batch.micro_batch_size": 2})
    args, files = FRAMEWORKS["steptune"].render(cfg, ["batch.micro_batch_size"])
    assert args == ["--config", "{trial_dir}/trainer.yaml", "--out", "{trial_dir}/result.json"]
    assert TrainConfig.from_dict(yaml.safe_load(files["trainer.yaml"])) == cfg


def test_unknown_framework_named():
    with pytest.raises(ValueError, match="command.framework='deepspeed': known frameworks are megatron"):
        framework("deepspeed")


# ---- black-box parity: loss curves from tables ------------------------------------------------------

from orchestrator.frameworks import blackbox_parity as bb  # noqa: E402
from orchestrator.frameworks.log import Iteration, judge  # noqa: E402


def curve(losses: list[float], norms: list[float] | None = None, start: int = 1):
    norms = norms or [1.0] * len(losses)
    return judge("megatron", [Iteration(step=start + i, first_step=start + i, time_s=0.1, loss=lo, grad_norm=g)
                              for i, (lo, g) in enumerate(zip(losses, norms))], 0, None)


FLOOR = bb.CurveTolerance(1e-5, 1e-4)
BASE = [10.0, 9.5, 9.0, 8.7]


@pytest.mark.parametrize("trial,repeat,passed,metric", [
    pytest.param(BASE, BASE, True, None, id="identical"),
    pytest.param([10.0, 9.5, 9.00005, 8.7], BASE, True, None, id="within-floor"),
    pytest.param([10.0, 9.5, 9.001, 8.7], BASE, False, "loss", id="lr-bug-sized-difference"),
    pytest.param([10.0, 9.5, 9.001, 8.7], [10.0, 9.5, 9.0002, 8.7], True, None, id="widened-by-baseline-spread"),
    pytest.param([10.0, float("nan"), 9.0, 8.7], BASE, False, "loss", id="nan-fails"),
])
def test_loss_curve_gate(trial, repeat, passed, metric):
    tol = bb.calibrate(curve(BASE), curve(repeat), FLOOR)
    v = bb.compare(curve(BASE), curve(trial), tol)
    assert v["passed"] is passed, v
    assert v.get("first_fail_metric") == metric
    if not passed:
        assert "differs at iteration" in bb.describe(v)


def test_loss_curve_gate_grad_norm_and_no_common_iterations():
    v = bb.compare(curve(BASE), curve(BASE, [1.0, 1.0, 1.01, 1.0]), FLOOR)
    assert not v["passed"] and v["first_fail_metric"] == "grad_norm" and v["first_fail_step"] == 3
    v = bb.compare(curve(BASE), curve(BASE, start=100), FLOOR)
    assert not v["passed"] and "no logged iteration in common" in bb.describe(v)
    # the print resolution: Megatron's grad norm has 3 decimals, so 1e-4 apart is not resolvable
    v = bb.compare(curve(BASE, [0.123] * 4), curve(BASE, [0.1234] * 4), bb.CurveTolerance(1e-5, 1e-4, 0.0, 5e-4))
    assert v["passed"]


def test_failure_line_is_the_ranks_not_torchruns():
    from orchestrator.backends.command import failure_line

    text = ("boom\nE1202 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3)\nTraceback\n"
            "ChildFailedError:\n====\nRoot Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
            "  exitcode  : 3 (pid: 1)\n====")
    assert failure_line(text) == "boom (root cause: rank 0, exit code 3)"
    assert failure_line("") == "no output"


# ---- the command backend's sweep section, checked at load (no Ray, nothing launched) ------------------

from orchestrator import REPO_ROOT  # noqa: E402
from orchestrator.sweep.config import load_sweep  # noqa: E402

CPU_EXAMPLE = REPO_ROOT / "search_spaces" / "command-cpu.yaml"


@pytest.mark.parametrize("overrides,message", [
    (["command.argv=[]"], "command.argv: required"),
    (["command.nodes=3"], "command.nodes=3: a whole number >= 1 that divides resources.world_size=2"),
    (["command.framework=deepspeed"], "command.framework='deepspeed': known frameworks"),
    (["command.nodes=two"], "command.nodes"),
])
def test_command_section_refused_at_load(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        load_sweep(CPU_EXAMPLE, [f"storage.results_dir={tmp_path}", *overrides])


@pytest.mark.parametrize("framework_name,params,message", [
    ("megatron", {"pipeline.schedule": {"type": "categorical", "choices": ["1f1b"]}},
     "space.params.pipeline.schedule: framework megatron cannot express"),
    ("torchtitan", {"data_parallel.bucket_mb": {"type": "float", "low": 1, "high": 2}},
     "space.params.data_parallel.bucket_mb: framework torchtitan cannot express"),
    ("megatron", {"recompute.kind": {"type": "categorical", "choices": ["full", "op"]}},
     "recompute.kind=op: framework megatron cannot express this value"),
    ("torchtitan", {"recompute.kind": {"type": "categorical", "choices": ["full", "op"]}},
     "recompute.kind=op: framework torchtitan cannot express this value"),
])
def test_a_space_the_framework_cannot_express_is_refused_at_load(tmp_path, framework_name, params, message):
    import yaml

    data = yaml.safe_load(CPU_EXAMPLE.read_text())
    data["command"]["framework"] = framework_name
    data["space"] = {"params": params}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message):
        load_sweep(path, [f"storage.results_dir={tmp_path}"])


def test_the_examples_load(tmp_path):
    for name in ("command-cpu.yaml", "command-megatron.yaml"):
        cfg = load_sweep(REPO_ROOT / "search_spaces" / name, [f"storage.results_dir={tmp_path}"])
        assert cfg.built.name == "command"
    meg = load_sweep(REPO_ROOT / "search_spaces" / "command-megatron.yaml", [f"storage.results_dir={tmp_path}"]).built
    launch = meg.launch_for(meg.configs.build({"batch.micro_batch_size": 2, "tensor_parallel.size": 2,
                                               "data_parallel.kind": "fsdp", "recompute.kind": "selective"}))
    tail = launch.argv[len(meg.cfg.command.argv):]
    assert flag_values(tail, "--micro-batch-size") == ["2"] and flag_values(tail, "--tensor-model-parallel-size") == ["2"]
    assert "--use-distributed-optimizer" in tail and flag_values(tail, "--recompute-granularity") == ["selective"]
    assert launch.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and launch.env["NCCL_DEBUG"] == "WARN"


def test_what_ran_points_the_command_at_the_exported_files():
    from orchestrator.frameworks.adapters import what_ran

    cmd = {"argv": ["python", "-m", "torch.distributed.run", "-m", "trainer", "--config", "/tmp/st-1/trainer.yaml"],
           "env": {"A": "1 2"}, "files": ["trainer.yaml"],
           "per_node_argv": [["python", "--node-rank", "0", "--config", "/tmp/st-1/trainer.yaml"],
                             ["python", "--node-rank", "1", "--config", "/tmp/st-9/trainer.yaml"]],
           "per_node_trial_dir": ["/tmp/st-1", "/tmp/st-9"]}
    out = what_ran(cmd, {"status": "ok"})
    script = out["command.sh"]
    assert "export A='1 2'" in script and "holds trainer.yaml" in script
    assert "python --node-rank 0 --config $DIR/trainer.yaml" in script
    assert "python --node-rank 1 --config $DIR/trainer.yaml" in script and "/tmp/st-" not in script
    assert json.loads(out["framework_log.json"]) == {"status": "ok"}
