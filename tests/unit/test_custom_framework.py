"""A declared framework (``command.framework: custom``): the declaration's checks at load (each bad input names its
field), knobs rendered as the script's own arguments and environment, and its log read by the declared patterns,
from tables of lines in tests/fixtures/ddp_train.py's own format."""

from __future__ import annotations

import copy

import pytest
import yaml

from orchestrator import REPO_ROOT
from orchestrator.__main__ import main
from orchestrator.frameworks import custom, custom_log
from orchestrator.frameworks.adapters import framework
from orchestrator.sweep.config import from_dict, load_sweep
from tests.unit._nested import set_nested
from trainer.config import TrainConfig, apply_overrides

EXAMPLE = REPO_ROOT / "search_spaces" / "command-custom-cpu.yaml"


def _example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _decl(**changes) -> custom.CustomFramework:
    from trainer.mapping import build

    c = copy.deepcopy(_example()["command"]["custom"])
    return build(custom.CustomFramework, set_nested(c, changes), "command.custom")


def line(step: int, loss: str = "5.704944", gnorm: str = "0.4827", ms: float = 40.0, total: int = 10) -> str:
    """One log line as tests/fixtures/ddp_train.py prints it."""
    return f"step {step}/{total} | loss {loss} | grad_norm {gnorm} | {ms:.1f} ms/step | tok/s 12,800"


LOG = "\n".join(["training 135,808 parameters on 2 ranks: global batch 8 = 1 x 4 x 2, checkpointing off",
                 *(line(s, ms=100.0 if s == 1 else 40.0 + s) for s in range(1, 11)),
                 "done: peak memory 317.4 MiB (max RSS of rank 0)"])


def test_the_example_declaration_reads_the_fixtures_log():
    fw = framework("custom", declared=_decl(), world_size=2)
    parsed = fw.parse(LOG, 2, None)
    assert parsed.status == "ok" and parsed.framework == "ddp_train" and parsed.expected == 10
    assert [it.step for it in parsed.steady] == list(range(3, 11))
    assert parsed.step_time_s == pytest.approx((46.0 + 47.0) / 2 / 1e3)  # median of 43..50 ms
    assert parsed.median("tokens_per_s_per_gpu") == 6400  # the job's 12,800 over 2 ranks
    assert parsed.peak_memory_bytes == int(317.4 * 2**20)
    assert parsed.resolution == {"loss": pytest.approx(5e-7), "grad_norm": pytest.approx(5e-5)}
    assert fw.first_node and fw.result_file is None


@pytest.mark.parametrize("text,status,reason", [
    ("\n".join(line(s) for s in range(1, 6)), "truncated", "stops at iteration 5 of 10"),
    ("\n".join([line(1), line(2, loss="nan"), *(line(s) for s in range(3, 11))]), "nan", "iteration 2"),
    ("Traceback (most recent call last):\nRuntimeError: boom", "no_iterations", "no ddp_train iteration line"),
    (line(1) + "\n" + line(2), "truncated", None),
])
def test_a_bad_log_gets_its_status(text, status, reason):
    parsed = framework("custom", declared=_decl()).parse(text, 2, None)
    assert parsed.status == status
    if reason:
        assert reason in parsed.reason


def test_figures_on_later_lines_belong_to_the_latest_iteration_and_units_convert():
    d = _decl(log__iteration=r"^iter (?P<step>\d+)$", log__loss=r"^  loss=(?P<value>\S+)",
              log__step_time=r"^  took (?P<value>[\d.]+)$", log__step_time_unit="s", log__grad_norm=None,
              log__tokens_per_s=None, log__memory=r"rss (?P<value>[\d.]+)(?P<unit>GiB|MiB)")
    text = "rss 1.5GiB\niter 1\n  loss=2.0\n  took 0.5\niter 2\n  took 0.25\n  loss=1.5\n  loss=9.9\nrss 100MiB"
    parsed = framework("custom", declared=d).parse(text, 1, None)
    assert [(it.step, it.loss, it.time_s) for it in parsed.iterations] == [(1, 2.0, 0.5), (2, 1.5, 0.25)]
    assert parsed.memory == {"peak": int(1.5 * 2**30)} and parsed.status == "ok"


@pytest.mark.parametrize("text,half", [("4.1235", 5e-5), ("1.20e-02", 5e-5), ("12", 0.5), ("1,234.5", 0.05),
                                       ("nan", 0.0)])
def test_print_resolution_read_off_the_number(text, half):
    assert custom_log.half_digit(text) == pytest.approx(half)


@pytest.mark.parametrize("changes,message", [
    ({"log__iteration": None}, r"command.custom.log.iteration: required"),
    ({"log__iteration": r"step (\d+)"}, r"command.custom.log.iteration: .* has no named group \(\?P<step>"),
    ({"log__loss": r"loss (?P<value>[0-9.+"}, r"command.custom.log.loss: .* is not a regular expression"),
    ({"log__loss": r"loss (?P<val>\S+)"}, r"command.custom.log.loss: .* has no named group \(\?P<value>"),
    ({"log__step_time": r"(?P<value>[0-9.]+) ms/step"}, r"command.custom.log.step_time: the pattern has no "
                                                         r"\(\?P<unit>...\) group: add one, or set "
                                                         r"command.custom.log.step_time_unit"),
    ({"log__memory_unit": "bytes"}, r"command.custom.log.memory_unit='bytes': one of B, KB"),
    ({"log__grad_norm": r"g (?P<value>\S+) (?P<step>\d+)"}, r"command.custom.log.grad_norm: named group "
                                                            r"\(\?P<step>...\) is not read here"),
    ({"log__source": {"kind": "file", "path": "../escape.log"}}, r"command.custom.log.source.path='../escape.log'"),
    ({"log__source": "syslog"}, r"command.custom.log.source.kind: 'syslog' must be one of \['file', 'stdout'\]"),
    ({"knobs__batch.micro_batchsize": ["--mbs", "{value}"]}, r"command.custom.knobs.batch.micro_batchsize: not a "
                                                             r"steptune knob \(did you mean batch.micro_batch_size"),
    ({"knobs__recompute.kind": ["--ckpt", "{valeu}"]}, r"command.custom.knobs.recompute.kind.args\[1\]: \{valeu\} "
                                                        r"is not a placeholder"),
    ({"knobs__recompute.kind": {"none": "--no-ckpt"}}, r"command.custom.knobs.recompute.kind.values.none: expected "
                                                        r"a list of arguments"),
    ({"knobs__recompute.kind": {"kind": "values", "values": {"full": ["--ckpt"]}, "env": {"none": {"X": "1"}}}},
     r"command.custom.knobs.recompute.kind.env.none: not one of the values"),
    ({"knobs__recompute.kind": {"kind": "template", "args": ["--ckpt"], "env": {"BAD-NAME": "1"}}},
     r"command.custom.knobs.recompute.kind.env.BAD-NAME: not an environment variable name"),
    ({"name": "my script"}, r"command.custom.name='my script'"),
])
def test_a_bad_declaration_is_refused_naming_its_field(changes, message):
    with pytest.raises(ValueError, match=message):
        _decl(**changes)


def _cfg(**over) -> TrainConfig:
    base = _example()["trainer"]
    return TrainConfig.from_dict(apply_overrides(base, {"parallel.dp": 2, **over}))


def test_knobs_render_as_the_scripts_own_arguments_and_environment():
    d = _decl(**{"knobs__data_parallel.bucket_mb": {"kind": "template", "args": ["--bucket-cap-mb", "{value:.1f}"],
                                                     "env": {"BUCKET": "{value}", "ACCUM": "{n_microbatches}"}},
                 "knobs__recompute.kind": {"kind": "values", "values": {"none": [], "full": ["--activation-ckpt"]},
                                           "env": {"full": {"CKPT": "1"}}}})
    cfg = _cfg(**{"batch.micro_batch_size": 2, "recompute.kind": "full", "data_parallel.bucket_mb": 0.5})
    args, env = d.render(cfg, ["batch.micro_batch_size", "recompute.kind", "data_parallel.bucket_mb"])
    assert args == ["--micro-batch-size", "2", "--grad-accum", "2", "--activation-ckpt", "--bucket-cap-mb", "0.5"]
    assert env == {"BUCKET": "0.5", "ACCUM": "2", "CKPT": "1"}
    args, env = d.render(_cfg(**{"recompute.kind": "none"}), ["recompute.kind"])  # only the varied knobs
    assert args == [] and env == {}
    with pytest.raises(ValueError, match=r"recompute.kind=selective: framework custom \(ddp_train\) cannot express "
                                         r"this value \(command.custom.knobs.recompute.kind lists none, full\)"):
        d.render(_cfg(**{"recompute.kind": "selective"}), ["recompute.kind"])


def test_a_knob_the_declaration_does_not_cover_is_refused_at_load(tmp_path):
    data = _example()
    data["space"]["params"]["pipeline.schedule"] = {"type": "categorical", "choices": ["1f1b", "gpipe"]}
    data["storage"] = {"results_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"space.params.pipeline.schedule: framework custom \(ddp_train\) cannot "
                                         r"express pipeline.schedule: declare its arguments under "
                                         r"command.custom.knobs.pipeline.schedule"):
        from orchestrator.sweep.config import check_sweep

        check_sweep(from_dict(data))


def test_a_value_the_map_does_not_list_is_refused_at_load(tmp_path):
    data = _example()
    data["space"]["params"]["recompute.kind"]["choices"] = ["none", "full", "selective"]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**data, "storage": {"results_dir": str(tmp_path)}}))
    with pytest.raises(ValueError, match=r"recompute.kind=selective: framework custom \(ddp_train\) cannot express"):
        load_sweep(path)


@pytest.mark.parametrize("command,message", [
    ({"framework": "custom", "custom": None}, r"command.custom: required with command.framework=custom"),
    ({"framework": "megatron"}, r"command.custom: only read with command.framework=custom \(it is megatron\)"),
])
def test_the_custom_section_goes_with_the_custom_framework(tmp_path, command, message):
    data = _example()
    data["command"].update(command)
    if data["command"].get("custom", 1) is None:
        del data["command"]["custom"]
    data["storage"] = {"results_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=message):
        from orchestrator.sweep.config import check_sweep

        check_sweep(from_dict(data))


def test_parse_log_cli_reads_a_declared_framework(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    assert main(["parse-log", "--framework", "custom", "--config", str(EXAMPLE), str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ddp_train: ok") and "warm-up 2 excluded, 8 line(s)" in out and "step time (median): 46.5 ms" in out
    assert main(["parse-log", "--framework", "custom", str(log)]) == 2
    assert "--framework custom: give --config SWEEP" in capsys.readouterr().err
    log.write_text("\n".join(line(s) for s in range(1, 5)))
    assert main(["parse-log", "--framework", "custom", "--config", str(EXAMPLE), str(log)]) == 1
    assert "truncated" in capsys.readouterr().out


def test_a_file_source_is_read_from_the_trial_folder_not_stdout():
    fw = framework("custom", declared=_decl(log__source={"kind": "file", "path": "train.log"}))
    assert fw.result_file == "train.log" and not fw.first_node
    assert fw.parse(LOG, 2, None).status == "ok"  # the file holds the same lines the script prints
