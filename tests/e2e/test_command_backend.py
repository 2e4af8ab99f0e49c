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


def test_a_hung_command_is_killed_with_its_process_group(ray_address, tmp_path):
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


def test_a_command_sweep_records_judges_and_exports_what_ran(ray_address, tmp_path):
    """The whole path on the local Ray, steptune's trainer through torchrun as a black box on 2 ranks: the sweep
    loop, ledger, Optuna, MLflow; the loss-curve gate (a legitimate layout passes, a seeded maths change fails);
    the export of the exact command line."""
    import json

    from orchestrator.export.bundle import export_trial
    from orchestrator.records.ledger import read_records
    from orchestrator.sweep.loop import run_sweep

    # No settling rounds (the example's two rounds are four more torchrun starts, over half the sweep's time):
    # nothing below reads a repeat; the rounds' rules are backend-neutral and settled in tests/e2e/test_sweep.py.
    cfg = load_sweep(EXAMPLE, [f"storage.results_dir={tmp_path}", "search.n_trials=2",
                               "target.relative_to_baseline=0.01", "winner.max_rounds=0"])
    summary, records = run_sweep(cfg)
    ledger = cfg.results_dir / "trials.jsonl"
    lines = [json.loads(ln) for ln in ledger.read_text().splitlines()]
    base = next(ln for ln in lines if ln["kind"] == "baseline")
    assert base["status"] == "ok" and base["backend"] == "command"
    assert base["parity"]["gate"] == "loss_curve" and base["parity"]["passed"]
    argv = base["command"]["argv"]
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nnodes" in argv and "--node-rank" in argv
    assert "--rdzv-endpoint" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert base["command"]["env"]["OMP_NUM_THREADS"] == "1"
    assert base["framework_log"]["status"] == "ok" and base["framework_log"]["steady_lines"] == 6
    assert [p["ranks"] for p in base["placement"]] == [[0, 1]] and base["placement"][0]["node_id"]
    assert (cfg.results_dir / "command" / "run-0001" / "node0.stdout.log").read_text().strip()  # trainer's line
    # A legitimate layout (TPE's first pick with seed 0: another micro-batch size, no recompute) passes.
    trial = next(ln for ln in lines if ln["kind"] == "trial")
    assert trial["params"]["batch.micro_batch_size"] != 1 or trial["params"]["recompute.kind"] != "full"
    assert trial["status"] == "ok" and trial["parity"]["passed"], trial["reason"]
    assert trial["parity"]["steps"] == cfg.built.configs.baseline.run.steps
    assert len(read_records(ledger)) == len(lines)

    # A seeded maths change (learning rate + 1%, the smallest bug bench/parity_margins.py seeds) fails the gate
    # calibrated by this sweep's baseline.
    backend = cfg.built
    runner = backend.runner()
    try:
        bug = backend.configs.build({"optim.lr": backend.configs.baseline.optim.lr * 1.01})
        out = _finish(runner, bug)
        assert out.status == "ok" and out.repeat is None, out.reason
        v = backend.judge("trial", out, None, [out])
        assert v.status == "infeasible" and "loss curve" in v.reason and not v.parity["passed"], v
        assert v.parity["first_fail_metric"] in ("loss", "grad_norm")
    finally:
        runner.close()

    paths = export_trial(ledger, base["trial"], tmp_path / "export", force=True)
    script = (tmp_path / "export" / "command.sh").read_text()
    assert any(p.name == "command.sh" for p in paths) and "torch.distributed.run" in script
    assert "export OMP_NUM_THREADS=1" in script
    assert json.loads((tmp_path / "export" / "framework_log.json").read_text())["status"] == "ok"
