"""The command backend on the local Ray: steptune's trainer launched through torchrun as a black box (2 ranks),
judged by the loss-curve gate; a hung command killed with its whole process group and recorded as a timeout."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from orchestrator import REPO_ROOT
from orchestrator.sweep.config import load_sweep

EXAMPLE = REPO_ROOT / "search_spaces" / "command-cpu.yaml"


def _finish(runner, cfg, timeout_s: float = 300.0):
    runner.submit(0, cfg)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = runner.poll(1.0)
        if done:
            return done[0][1]
    raise AssertionError("no outcome")


def _pids_running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (what an orphan of a killed trial would show)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(int(pid))
    return out


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    cfg = load_sweep(EXAMPLE, [f"storage.results_dir={tmp_path_factory.mktemp('results')}"])
    b = cfg.built
    b.join()
    return b


def test_trainer_through_torchrun_as_a_black_box(backend):
    runner = backend.runner()
    try:
        base = backend.configs.baseline
        out = _finish(runner, base)
        assert out.status == "ok", out.reason
        assert out.repeat is not None and out.repeat.status == "ok"  # the baseline ran twice
        assert out.result.world_size == 2 and len(out.result.steps) == base.run.steps
        assert out.parsed.steady and out.parsed.step_time_s == pytest.approx(out.result.summary.step_time_s)
        argv = out.command["argv"]
        assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nnodes" in argv and "--node-rank" in argv
        assert "--rdzv-endpoint" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"
        assert out.command["env"]["OMP_NUM_THREADS"] == "1"
        assert [p["ranks"] for p in out.placement] == [[0, 1]] and out.placement[0]["node_id"]
        logs = backend.cfg.results_dir / "command" / "run-0001"
        assert (logs / "node0.stdout.log").read_text().strip()  # the trainer's own summary line
        verdict = backend.judge("baseline", out, None, [out])
        assert verdict.status == "ok" and verdict.parity["passed"] and verdict.parity["gate"] == "loss_curve"

        # A legitimate layout (another micro-batch size, no recompute) learns the same: it passes.
        layout = backend.configs.build({"batch.micro_batch_size": 4, "recompute.kind": "none"})
        lo = _finish(runner, layout)
        assert lo.status == "ok" and lo.repeat is None, lo.reason
        v = backend.judge("trial", lo, None, [lo])
        assert v.status == "ok", v.reason
        assert v.parity["steps"] == base.run.steps

        # A seeded maths change (learning rate + 1%, the smallest bug bench/parity_margins.py seeds) fails.
        bug = backend.configs.build({"optim.lr": base.optim.lr * 1.01})
        bo = _finish(runner, bug)
        assert bo.status == "ok", bo.reason
        v = backend.judge("trial", bo, None, [bo])
        assert v.status == "infeasible" and "loss curve" in v.reason and not v.parity["passed"], v
        assert runner.builds == 1  # the placement was reused by every trial
    finally:
        runner.close()


def test_a_hung_command_is_killed_with_its_process_group(tmp_path):
    hang = tmp_path / "hang_forever.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    cfg = load_sweep(EXAMPLE, [f"storage.results_dir={tmp_path / 'results'}", f"command.argv=[{hang}]",
                               "resources.trial_timeout_s=10"])
    b = cfg.built
    b.join()
    runner = b.runner()
    try:
        out = _finish(runner, b.configs.baseline)
        assert out.status == "timeout", out.reason
        assert "process group" in out.reason and "killed" in out.reason
        time.sleep(1.0)
        assert _pids_running(str(hang)) == [], "an orphan of the killed trial is still running"
        # the group is reused: the next trial runs on the same actors
        failing = tmp_path / "exit_3.py"
        failing.write_text("import sys\nprint('boom', file=sys.stderr)\nsys.exit(3)\n")
        b.cfg = dataclasses.replace(b.cfg, command=dataclasses.replace(b.cfg.command, argv=[str(failing)]))
        runner.cfg = dataclasses.replace(runner.cfg, resources=dataclasses.replace(runner.cfg.resources,
                                                                                   trial_timeout_s=120))
        out = _finish(runner, b.configs.baseline)
        assert out.status == "failed" and "exited" in out.reason and "boom" in out.reason, out.reason
        assert runner.builds == 1
    finally:
        runner.close()


def test_a_command_sweep_records_and_exports_what_ran(tmp_path):
    """The whole path: sweep loop, ledger, Optuna, MLflow, then export of the winner's exact command line."""
    import json

    from orchestrator.export.bundle import export_trial
    from orchestrator.records.ledger import read_records
    from orchestrator.sweep.loop import run_sweep

    cfg = load_sweep(EXAMPLE, [f"storage.results_dir={tmp_path}", "search.n_trials=2",
                               "target.relative_to_baseline=0.01"])
    summary, records = run_sweep(cfg)
    ledger = cfg.results_dir / "trials.jsonl"
    lines = [json.loads(ln) for ln in ledger.read_text().splitlines()]
    base = next(ln for ln in lines if ln["kind"] == "baseline")
    assert base["status"] == "ok" and base["backend"] == "command"
    assert base["parity"]["gate"] == "loss_curve" and base["parity"]["passed"]
    assert base["command"]["argv"][1:3] == ["-m", "torch.distributed.run"]
    assert base["framework_log"]["status"] == "ok" and base["placement"][0]["ranks"] == [0, 1]
    trial = next(ln for ln in lines if ln["kind"] == "trial")
    assert trial["status"] in ("ok", "infeasible"), trial["reason"]
    assert trial["parity"]["gate"] == "loss_curve"
    assert len(read_records(ledger)) == len(lines)
    paths = export_trial(ledger, base["trial"], tmp_path / "export", force=True)
    script = (tmp_path / "export" / "command.sh").read_text()
    assert any(p.name == "command.sh" for p in paths) and "torch.distributed.run" in script
    assert "export OMP_NUM_THREADS=1" in script
    assert json.loads((tmp_path / "export" / "framework_log.json").read_text())["status"] == "ok"
