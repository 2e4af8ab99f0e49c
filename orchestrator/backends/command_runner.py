"""The ``command`` backend's runs on Ray: one actor per node in a placement group, each starting ``torchrun``.

The group is placed once (STRICT_SPREAD over ``command.nodes`` bundles, each holding its node's share of the
ranks' CPUs and GPUs) and reused by every trial. A trial: every node actor writes the trial's files into a
node-local folder and starts ``python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node P
--rdzv-backend static --rdzv-endpoint <first actor's ip>:<port> <argv>`` under a guard (``command_guard``) in a
session of its own. A run past ``resources.trial_timeout_s`` is killed (the whole tree, by process ids: guard,
torchrun, every rank) and recorded ``timeout``; a node that fails has the other nodes' trees killed at once; an
actor that dies takes its node's tree with it (its guard's death signal); a node or actor lost is ``lost`` and
the group is placed again. Every node's stdout and stderr come back as the trial's artifacts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "command_guard.py")
"""Started by each node actor in front of torchrun (orchestrator.backends.command_guard)."""
_TAIL = 4 * 2**20
"""Bytes of a node's stdout/stderr that come back (the end: where the last iterations and the error are)."""


def _die_with_parent() -> None:
    """In the guard before exec: its own session, and SIGTERM when the actor goes (the guard then kills the tree)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class NodeAgent:
    """One per node (a Ray actor with max_concurrency 2, so ``kill`` answers while ``run`` waits)."""

    def __init__(self) -> None:
        self.proc = None

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        from trainer.launch import free_port

        ctx = ray.get_runtime_context()
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "actor_pid": os.getpid(), "port": free_port()}

    def run(self, argv: list[str], env: dict[str, str], cwd: str | None, files: dict[str, str], tag: str,
            timeout_s: float, result_file: str | None) -> dict[str, Any]:
        import subprocess
        import tempfile

        folder = tempfile.mkdtemp(prefix=f"steptune-{tag}-")
        for name, text in files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        argv = [a.replace("{trial_dir}", folder) for a in argv]
        out_path, err_path = os.path.join(folder, "stdout.log"), os.path.join(folder, "stderr.log")
        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, GUARD, *argv], env={**os.environ, **env}, cwd=cwd or None,
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            kind = "exit"
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                kind = "timeout"
                self.kill()
                self.proc.wait()
        proc, self.proc = self.proc, None
        result = None
        if result_file and os.path.isfile(os.path.join(folder, result_file)):
            with open(os.path.join(folder, result_file)) as f:
                result = f.read()
        return {"kind": kind, "rc": proc.returncode, "pgid": proc.pid, "wall_s": time.monotonic() - t0,
                "stdout": _tail(out_path), "stderr": _tail(err_path), "result": result, "folder": folder,
                "argv": argv}

    def kill(self) -> bool:
        """SIGKILL the running command's whole tree (its guard, torchrun, every rank: torchrun starts each rank in a
        session of its own, so one process group is not the whole job). False when none runs."""
        from orchestrator.backends.command_guard import kill_tree

        proc = self.proc
        if proc is None or proc.poll() is not None:
            return False
        kill_tree(proc.pid)
        return True


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - _TAIL))
        return f.read().decode(errors="replace")


@dataclass
class NodeRun:
    """What one node's command did."""

    node_rank: int
    kind: str
    """exit | timeout | lost (the actor or its node died)."""
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    wall_s: float = 0.0
    pgid: int | None = None
    argv: list[str] = field(default_factory=list)
    folder: str | None = None
    """The node-local trial folder ({trial_dir}) the command ran with."""
    error: str | None = None


@dataclass(frozen=True)
class Launch:
    """One trial's command as the runner starts it on every node."""

    argv: list[str]
    """What torchrun runs: the user's argv plus the trial's rendered flags."""
    env: dict[str, str]
    files: dict[str, str]
    result_file: str | None
    flags: list[str] = field(default_factory=list)
    """The trial's rendered flags alone (the tail of argv), for the record and export."""


class NodeGroup:
    """``nodes`` NodeAgent actors in one placement group, reused across trials; placed again after a loss."""

    def __init__(self, nodes: int, ranks_per_node: int, cpus_per_rank: float, gpus_per_rank: float, python: str,
                 cwd: str | None, start_timeout_s: float = 120.0):
        self.nodes, self.ranks_per_node = nodes, ranks_per_node
        self.cpus, self.gpus = ranks_per_node * cpus_per_rank, ranks_per_node * gpus_per_rank
        self.python, self.cwd, self.start_timeout_s = python, cwd, start_timeout_s
        self.pg = None
        self.actors: list[Any] = []
        self.places: list[dict[str, Any]] = []
        self.builds = 0
        self._refs: list[Any] = []
        self._runs: dict[int, NodeRun] = {}
        self.ran_on: list[dict[str, Any]] = []
        """The placement of the last launch (per node), for its outcome."""

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from orchestrator.backends.workers import GroupStartError

        self.kill()
        bundle = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
        strategy = "STRICT_SPREAD" if self.nodes > 1 else "PACK"
        self.pg = placement_group([dict(bundle) for _ in range(self.nodes)], strategy=strategy)
        if not self.pg.wait(self.start_timeout_s):
            self.kill()
            raise GroupStartError(f"the cluster cannot place {self.nodes} node actor(s) of {bundle} ({strategy}) "
                                  f"within {self.start_timeout_s:.0f} s: check command.nodes, resources.world_size and "
                                  f"the per-rank CPUs/GPUs against `ray status`")
        agent = ray.remote(max_concurrency=2)(NodeAgent)
        self.actors = [agent.options(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(
                                         placement_group=self.pg, placement_group_bundle_index=i)).remote()
                       for i in range(self.nodes)]
        self.places = ray.get([a.where.remote() for a in self.actors], timeout=self.start_timeout_s)
        self.builds += 1

    @property
    def busy(self) -> bool:
        return bool(self._refs)

    def launch(self, launch: Launch, tag: str, timeout_s: float) -> None:
        """Start ``launch`` on every node (returns at once; ``collect`` hands back the runs)."""
        if not self.actors:
            self.start()
        head = self.places[0]
        self._refs, self._runs = [], {}
        self.ran_on = self.placement()  # kept past a loss, which clears the places
        for i, actor in enumerate(self.actors):
            argv = [self.python, "-m", "torch.distributed.run", "--nnodes", str(self.nodes), "--node-rank", str(i),
                    "--nproc-per-node", str(self.ranks_per_node), "--rdzv-backend", "static",
                    "--rdzv-endpoint", f"{head['ip']}:{head['port']}", "--max-restarts", "0", *launch.argv]
            self._refs.append(actor.run.remote(argv, launch.env, self.cwd, launch.files, tag, timeout_s,
                                               launch.result_file if i == 0 else None))

    def collect(self, wait_s: float) -> list[NodeRun] | None:
        """Every node's run once all are back (None before); the first failure kills the other nodes' groups."""
        import ray

        pending = [r for i, r in enumerate(self._refs) if i not in self._runs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
            if not done:
                return None
            i = self._refs.index(done[0])
            try:
                d = ray.get(done[0])
                self._runs[i] = NodeRun(i, d["kind"], d["rc"], d["stdout"], d["stderr"], d["result"], d["wall_s"],
                                        d["pgid"], d["argv"], d["folder"])
            except ray.exceptions.RayError as e:
                self._runs[i] = NodeRun(i, "lost", error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
            if self._runs[i].kind != "exit" or self._runs[i].rc != 0:
                self._kill_all(except_node=i)
        runs = [self._runs[i] for i in range(len(self._refs))]
        self._refs, self._runs = [], {}
        if any(r.kind == "lost" for r in runs):
            self.kill()  # placed again before the next trial
        return runs

    def _kill_all(self, except_node: int) -> None:
        import ray

        for j, a in enumerate(self.actors):
            if j != except_node:
                try:
                    ray.get(a.kill.remote(), timeout=30)
                except ray.exceptions.RayError:
                    pass

    def placement(self) -> list[dict[str, Any]]:
        """Per node: host, ip, Ray node id, GPU ids, the actor's pid, ranks (ledger's ``placement``)."""
        return [{"node_rank": i, "ranks": list(range(i * self.ranks_per_node, (i + 1) * self.ranks_per_node)),
                 **{k: p[k] for k in ("host", "ip", "node_id", "gpu_ids", "actor_pid")}}
                for i, p in enumerate(self.places)]

    def kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            try:
                ray.get(a.kill.remote(), timeout=10)
            except ray.exceptions.RayError:
                pass
            ray.kill(a)
        self.actors, self.places = [], []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # already gone with its node
                pass
            self.pg = None
