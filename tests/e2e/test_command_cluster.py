"""The command backend on a 2-node ray.cluster_utils.Cluster: torchrun's multi-node rendezvous across the two Ray
nodes (one node actor on each, STRICT_SPREAD), placement recorded per node; then a node removed mid-run is
recorded ``lost`` with no process of it left, and the next trial runs on the group placed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from orchestrator import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import dataclasses, json, os, sys, time
    from pathlib import Path
    import ray
    from ray.cluster_utils import Cluster
    from orchestrator.sweep.config import load_sweep

    results_dir, hang = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()
    took = {}  # seconds per phase, in the result: where a slow or failed run spent its time
    # No dashboard: its server is seconds of CPU to start on 2 cores, and nothing here reads it.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    out = {"took": took}
    took["cluster_up"] = time.monotonic() - t0

    def finish(runner, cfg, timeout=300, during=None):
        runner.submit(0, cfg)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if during is not None and during():
                during = None
            done = runner.poll(0.5)
            if done:
                return done[0][1]
        raise SystemExit("no outcome")

    def procs(marker):
        n = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int(d.name) != os.getpid() and marker.encode() in (d / "cmdline").read_bytes():
                    n.append(int(d.name))
            except OSError:
                pass
        return n

    cfg = load_sweep(sys.argv[3], [f"storage.results_dir={results_dir}", "command.nodes=2"])
    b = cfg.built
    # Not the baseline's own config: the baseline's first run is run twice (its repeat calibrates the loss-curve
    # gate), and a rendezvous needs one run.
    one = b.configs.build({"recompute.kind": "none"})
    assert one != b.configs.baseline
    t0 = time.monotonic()
    runner = b.runner()
    took["group_placed"] = time.monotonic() - t0
    t0 = time.monotonic()
    o = finish(runner, one)
    took["rendezvous_run"] = time.monotonic() - t0
    out["ok"] = {"status": o.status, "reason": o.reason, "placement": o.placement,
                 "argv": o.command["per_node_argv"], "world": o.result.world_size if o.result else None,
                 "nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]]}

    # A node removed while its command runs: lost, and nothing of that trial left running.
    b.cfg = dataclasses.replace(b.cfg, command=dataclasses.replace(b.cfg.command, argv=[hang]))
    # once both nodes' guard, torchrun and rank run, the worker node goes
    def started():
        if len(procs(hang)) < 6:
            return False
        took["hang_started"] = time.monotonic() - t0
        cluster.remove_node(worker)
        took["node_removed"] = time.monotonic() - t0
        return True
    t0 = time.monotonic()
    o = finish(runner, one, during=started)
    took["lost_recorded"] = time.monotonic() - t0
    # The removed node's actor process outlives its raylet until it notices (tens of seconds); when it exits, its
    # guard's death signal kills torchrun and the ranks below it.
    t0 = time.monotonic()
    while procs(hang) and time.monotonic() - t0 < 40:
        time.sleep(0.5)
    def show(pid):
        try:
            stat = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\\0", b" ").decode()[:160]
            return f"{pid} ppid {stat[1]} state {stat[0]}: {cmd}"
        except OSError:
            return f"{pid} gone"
    out["lost"] = {"status": o.status, "reason": o.reason, "left": [show(p) for p in procs(hang)],
                   "removed": worker.node_id,
                   "cleared_after_s": time.monotonic() - t0}

    # Room again: the group is placed again and the next trial runs on both nodes.
    t0 = time.monotonic()
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    took["node_added"] = time.monotonic() - t0
    b.cfg = cfg
    o = finish(runner, one)
    took["run_again"] = time.monotonic() - t0
    out["again"] = {"status": o.status, "reason": o.reason, "builds": runner.builds, "placement": o.placement}
    runner.close()
    print("RESULT " + json.dumps(out, default=str))
""")


@pytest.mark.timeout(600)
def test_two_ray_nodes_rendezvous_and_a_lost_node(tmp_path):
    hang = tmp_path / "hang_on_node.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own cluster, its own token
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "results"), str(hang),
                           str(REPO_ROOT / "search_spaces" / "command-cpu.yaml")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.loads(proc.stdout.split("RESULT ", 1)[1])
    ok = res["ok"]
    assert ok["status"] == "ok" and ok["world"] == 2, ok
    assert len({p["node_id"] for p in ok["placement"]}) == 2 and [p["ranks"] for p in ok["placement"]] == [[0], [1]]
    ranks = [a[a.index("--node-rank") + 1] for a in ok["argv"]]
    endpoints = {a[a.index("--rdzv-endpoint") + 1] for a in ok["argv"]}
    assert ranks == ["0", "1"] and len(endpoints) == 1 and all(a[a.index("--nnodes") + 1] == "2" for a in ok["argv"])
    lost = res["lost"]
    assert lost["status"] == "lost" and f"node {lost['removed']}" in lost["reason"], (lost, res["took"])
    assert lost["left"] == [], f"processes of the lost trial still running: {lost['left']}"
    again = res["again"]
    assert again["status"] == "ok" and again["builds"] == 2, (again, res["took"])
    assert lost["removed"] not in {p["node_id"] for p in again["placement"]}
