"""A team's own training script as trials, declared in the sweep file alone (search_spaces/command-custom-cpu.yaml over
tests/fixtures/ddp_train.py, a plain DDP script that imports nothing of steptune): a sweep on the local Ray whose
driver is killed after the baseline and resumed (the loss-curve reference comes back from the ledger), reviewed in
MLflow, its winner exported as the exact command and that command run again; and the same sweep on a 2-node
``ray.cluster_utils.Cluster``, one rank per node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from orchestrator import REPO_ROOT

pytestmark = pytest.mark.e2e
EXAMPLE = REPO_ROOT / "search_spaces" / "command-custom-cpu.yaml"

_KILL_AFTER_BASELINE = textwrap.dedent("""
    import os, signal, sys
    from orchestrator.records import ledger
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep

    append = ledger.Ledger.append
    def append_then_die(self, line):
        append(self, line)
        if '"kind": "baseline"' in open(self.path).read():
            os.kill(os.getpid(), signal.SIGKILL)  # the baseline is on disk; no trial was judged by this driver
    ledger.Ledger.append = append_then_die
    run_sweep(load_sweep(sys.argv[1], sys.argv[2:]))
""")


@pytest.mark.timeout(600)
def test_a_custom_script_sweep_killed_after_its_baseline_resumes_and_exports_the_exact_command(ray_address, tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.export.bundle import export_trial
    from orchestrator.frameworks.log import Iteration, judge
    from orchestrator.backends.base import RunOutcome
    from orchestrator.records.ledger import Ledger
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep

    # No settling rounds: each is a torchrun start of every contender (their rules are backend-neutral, tested in
    # tests/e2e/test_sweep.py); a target no config meets, so the search runs its 2 trials.
    args = [f"storage.results_dir={tmp_path / 'results'}", f"ray.address={ray_address}", "search.n_trials=2",
            "winner.max_rounds=0", "target.relative_to_baseline=0.01"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    first = subprocess.run([sys.executable, "-c", _KILL_AFTER_BASELINE, str(EXAMPLE), *args], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == -signal.SIGKILL, first.stdout[-2000:] + first.stderr[-3000:]
    cfg = load_sweep(EXAMPLE, args)
    ledger = Ledger(cfg.results_dir / "trials.jsonl")
    (base,) = ledger.read()
    assert base.kind.value == "baseline" and base.status.value == "ok", base.reason
    assert base.parity.extra["gate"] == "loss_curve" and base.parity.passed

    summary, records = run_sweep(cfg)  # the resume: same command, same store
    backend = cfg.built
    # The reference came back from the ledger line (the driver that measured it is gone)...
    ref, tol = backend.reference
    assert [it.loss for it in ref.iterations] == [s.loss for s in base.result.steps]
    assert tol.loss_rel == base.parity.extra["curve_tolerance"]["loss_rel"]
    lines = ledger.read()
    assert [r.kind.value for r in lines].count("baseline") == 1, "the baseline ran again on resume"
    trials = [r for r in lines if r.kind.value == "trial"]
    assert len(trials) == 1 and all(r.parity is not None and r.parity.steps == 10 for r in trials), trials
    assert all(r.status.value == "ok" and r.parity.passed for r in trials), [r.reason for r in trials]
    # ...and judges by it: a loss curve that moved by 1e-3 at iteration 5 fails against it.
    moved = judge("ddp_train", [Iteration(step=it.step, first_step=it.first_step, loss=it.loss * (1.001 if it.step == 5
                                                                                                 else 1.0),
                                          grad_norm=it.grad_norm) for it in ref.iterations], 2, 10)
    outcome = RunOutcome("ok", None, base.result)
    outcome.parsed = moved
    verdict = backend.judge("trial", outcome, None, [outcome])
    assert verdict.status == "infeasible" and "loss differs at iteration 5" in verdict.reason, verdict

    # Reviewed in MLflow: the parent run and a child per ledger line.
    client = MlflowClient(cfg.mlflow_uri)
    exp = client.get_experiment_by_name("steptune").experiment_id
    (parent,) = client.search_runs([exp], "tags.\"steptune.role\" = 'parent'")
    children = client.search_runs([exp], f"tags.\"mlflow.parentRunId\" = '{parent.info.run_id}'")
    assert {c.data.tags["steptune.trial"] for c in children} >= {str(r.trial) for r in lines}

    # The winner exported as the exact command it ran, and that command runs as is.
    out = tmp_path / "export"
    export_trial(cfg.results_dir / "trials.jsonl", None, out)  # the answer's winner, as `steptune export` picks it
    import re

    winner = int(re.search(r"trial (\d+) \(", (out / "trainer.yaml").read_text()).group(1))
    record = next(r for r in lines if r.trial == winner and r.kind.value in ("trial", "baseline"))
    script = (out / "command.sh").read_text()
    argv = record.extra["command"]["per_node_argv"][0]
    assert " ".join(a for a in argv if "{" not in a) in script.replace("'", "")
    assert "tests/fixtures/ddp_train.py" in script and f"cd {REPO_ROOT}" in script
    assert json.loads((out / "framework_log.json").read_text())["status"] == "ok"
    again = subprocess.run(["sh", str(out / "command.sh")], capture_output=True, text=True, timeout=180,
                           env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    assert again.returncode == 0, again.stderr[-3000:]
    log = tmp_path / "again.log"
    log.write_text(again.stdout)
    from orchestrator.__main__ import main

    assert main(["parse-log", "--framework", "custom", "--config", str(EXAMPLE), "--json", str(log)]) == 0


_TWO_NODES = textwrap.dedent("""
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep

    # No dashboard: seconds of CPU to start on 2 cores, and nothing here reads it.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    cfg = load_sweep(sys.argv[1], sys.argv[2:] + [f"ray.address={cluster.address}"])
    summary, records = run_sweep(cfg)
    print("RESULT " + json.dumps([{"kind": r.kind.value, "status": r.status.value, "reason": r.reason,
                                   "placement": r.placement, "parity": r.parity.passed if r.parity else None,
                                   "argv": r.extra["command"]["per_node_argv"]} for r in records], default=str))
""")


@pytest.mark.timeout(600)
def test_a_custom_script_sweep_on_two_ray_nodes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own cluster
    env["PYTHONPATH"] = str(REPO_ROOT)
    args = [f"storage.results_dir={tmp_path}", "command.nodes=2", "search.n_trials=2", "winner.max_rounds=0",
            "target.relative_to_baseline=0.01", "tracking.enabled=false"]
    proc = subprocess.run([sys.executable, "-c", _TWO_NODES, str(EXAMPLE), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert [x["kind"] for x in lines] == ["baseline", "trial"], lines
    for x in lines:
        assert x["status"] == "ok" and x["parity"], x
        assert len({p["node_id"] for p in x["placement"]}) == 2 and [p["ranks"] for p in x["placement"]] == [[0], [1]]
        assert [a[a.index("--node-rank") + 1] for a in x["argv"]] == ["0", "1"]
