"""The Ray worker group: one actor per rank in a placement group, warm across trials, rebuilt after a failure.

Each actor imports torch when it starts and joins the torch.distributed world once, at the first run on the
whole group (``trainer.run.init_world``; rank 0 may run one-rank configs in its own process before); a trial
is then one ``run(cfg)`` call on every actor at once, which builds and tears down that trial's own
pipeline/data-parallel groups. That is what makes a trial cost milliseconds of orchestration instead of
the seconds a process launch or a Ray Train trainer costs. Any failure (an exception on a rank, a dead
rank, a timeout) may leave the world's collectives half-done, so the whole group is killed and rebuilt
before its next run rather than trusted again.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.backends import capacity
from trainer.measure.result import RankResult

log = logging.getLogger(__name__)


PEER_LOST = ("remote worker crashing", "Connection closed by peer", "Connection reset by peer")
"""gloo's words when the other end of a collective went away: a symptom of another rank's loss."""
PEER_WAIT_S = 15.0
"""How long a rank's peer-loss error waits for the lost rank's own outcome (Ray reports an actor's death later)."""


class GroupStartError(RuntimeError):
    """Ray could not be joined, or the worker group could not be placed or could not form its world."""


class ClusterTooSmall(GroupStartError):
    """The alive nodes can never hold the group (too small, or a node was lost): retrying cannot help."""


def start_local_ray(num_cpus: int, num_gpus: int | None = None, temp_dir: str | None = None,
                    dashboard: bool = False) -> str:
    """Embedded Ray that writes only under ``temp_dir``; returns the address other drivers can join.

    Ray >= 2.59 turns token authentication on for a new local cluster and would store a generated token in
    ~/.ray/auth_token. We keep Ray's default (auth on) but put the token inside the session's temp dir,
    so nothing lands outside it; RAY_AUTH_MODE / RAY_AUTH_TOKEN(_PATH) set by the user are respected.
    """
    temp = Path(temp_dir or Path(tempfile.gettempdir()) / "steptune-ray")
    temp.mkdir(parents=True, exist_ok=True)
    if not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
        # Ray itself switches token mode on for a new local cluster; it only needs to find this token first.
        token = temp / "auth_token"
        if not token.exists():
            token.touch(mode=0o600)
            token.write_text(secrets.token_hex(32))
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from an embedded, private Ray
    # Ray starts its workers at nice 15 so they never starve its own daemons; here the workers are the measured
    # ranks, and at nice 15 any other process on the machine preempts them and skews every step time (two
    # nice-0 busy loops made a 1 s trial time out at 15 s). Nice 0: a fair share, like the driver's.
    ctx = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=dashboard, _temp_dir=str(temp),
                   log_to_driver=False, configure_logging=True, logging_level="WARNING",
                   _system_config={"worker_niceness": 0})
    _quiet_raylet_errors()
    return ctx.address_info["gcs_address"]


_joined: str | None = None
"""What connect() joined in this process, to name it again when it is reused."""


def connect(address: str | None, runtime_env: dict | None, *, num_cpus: int, temp_dir: str | None,
            dashboard: bool) -> str:
    """Join ``address`` (an existing cluster) or start an embedded one; a Ray already up in this process is reused."""
    global _joined
    if ray.is_initialized():
        return _joined or "this process's Ray"
    if address is None:
        _joined = "embedded Ray at " + start_local_ray(max(num_cpus, os.cpu_count() or 1), temp_dir=temp_dir,
                                                         dashboard=dashboard)
        if os.environ.get("RAY_AUTH_MODE", "token") == "token" and "RAY_AUTH_TOKEN_PATH" in os.environ:
            _joined += f" (others join with ray.address= and RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']})"
        return _joined
    use_token_auth()
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and "://" not in address:
        # Ray retries an unreachable GCS for many minutes; a plain TCP connect says it in seconds.
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            raise GroupStartError(f"ray.address={address}: nothing answers there ({e}); is the head node up "
                                  f"(ray start --head)?") from None
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="WARNING")
        _quiet_raylet_errors()
    except Exception as e:  # unreachable, refused, wrong token: say so in one line, before any trial
        raise GroupStartError(f"ray.address={address}: could not join the cluster: {type(e).__name__}: {e}") from None
    _joined = f"Ray cluster at {address}"
    return _joined


def _quiet_raylet_errors() -> None:
    """Keep the raylet's error pages ("A worker died or was killed ...") off the terminal: in the debug log.

    Ray's driver prints them to stdout from a background thread whatever ``log_to_driver`` says, in the middle
    of the progress line. The sweep reports each failure itself: one line there, the whole page in the ledger.
    Ray has no setting for this, so its printer (``ray._private.worker.print_to_stdstream``) is wrapped; the
    logs of the workers themselves still follow ``log_to_driver``.
    """
    import ray._private.worker as ray_worker

    printer = ray_worker.print_to_stdstream
    if getattr(printer, "steptune_quiet", False):
        return

    def print_to_stdstream(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            return printer(data, ignore_prefix)
        for line in data.get("lines") or ():
            log.debug("raylet: %s", line)

    print_to_stdstream.steptune_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream


def use_token_auth() -> None:
    """Joining a cluster at an explicit address with a token given: send it.

    Ray (2.60) turns token mode on by itself only for a cluster it starts or finds with address=auto; for an
    explicit address a token in RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH is ignored unless RAY_AUTH_MODE=token,
    and the join fails after ~20 s of retries. A token the user gave means token mode; an explicit
    RAY_AUTH_MODE is left alone.
    """
    if "RAY_AUTH_MODE" not in os.environ and {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
        os.environ["RAY_AUTH_MODE"] = "token"
        # Ray read its config when it was imported; re-read it, as Ray itself does when it turns token mode on.
        # (Private API: should it go, setting RAY_AUTH_MODE=token before starting still works; docs say so.)
        try:
            from ray._raylet import Config

            Config.initialize("")
        except (ImportError, AttributeError):
            pass


@ray.remote
class RankWorker:
    """One rank. Lives as long as its group; torch is imported and the world joined once."""

    def __init__(self) -> None:
        import trainer.run  # noqa: F401  torch and the trainer: at once, every rank beside the others

    def node(self) -> dict[str, Any]:
        with socket.socket() as s:  # a free port on this node, for rank 0's rendezvous
            s.bind(("", 0))
            port = s.getsockname()[1]
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(), "port": port,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def join(self, env: dict[str, str], device: str, timeout_s: float) -> int:
        os.environ.update(env)
        from trainer.run import init_world

        init_world(device, timeout_s)
        return os.getpid()

    def run(self, cfg: dict[str, Any]) -> tuple[RankResult, bytes | None]:
        """This rank's result, and its run.profile_step trace (gzipped bytes): the driver may be on another node."""
        from trainer.config import TrainConfig
        from trainer.run import run

        with tempfile.TemporaryDirectory(prefix="steptune-trace-") as tmp:
            result = run(TrainConfig.from_dict(cfg), trace_dir=tmp)
            trace = Path(result.trace_file).read_bytes() if result.trace_file else None
        return result, trace

    def run_local(self, cfgs: list[dict[str, Any]], here: bool = False) -> list[list[RankResult] | str]:
        """Configs of fewer ranks than the group (the canonical run and its self-check: one rank each), one after
        the other in one world of their own, while the group's other ranks idle: one world instead of one per
        config. Per config, its rank results or the error it raised (the world goes on to the next).

        ``here``: in this process, before it joins the group's world (trainer.launch.run_here): torch is imported
        already, so nothing starts. Otherwise in local processes beside this rank (trainer.launch.spawn_many),
        which run this job's worker setup hook (Ray's ``worker_process_setup_hook``) as every other worker process
        of the job does; this one ran it when Ray started it."""
        from trainer.config import TrainConfig
        from trainer.launch import RankFailed, run_here, spawn_many

        configs = [TrainConfig.from_dict(c) for c in cfgs]
        done = run_here(configs) if here else spawn_many(configs, setup=_setup_hook())
        return [str(r) if isinstance(r, RankFailed) else r.ranks for r in done]


def _setup_hook() -> Any:
    """The job's ``worker_process_setup_hook`` when it is named by module path; None otherwise."""
    import importlib

    name = (ray.get_runtime_context().runtime_env or {}).get("worker_process_setup_hook")
    if not isinstance(name, str) or "." not in name:
        return None
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@dataclass
class RunDone:
    """What came back from one run on the group: rank results (rank order), or the error that ended it."""
    ranks: list[RankResult] | None
    error: BaseException | None
    kind: str
    """ok | raised | lost_rank (the rank's process died on a live node) | lost_node | lost_actor (killed from
    outside, by ray.kill) | timeout (no result by the deadline: the group was killed) | late (every rank answered,
    after the deadline: the group is kept). lost_node and lost_actor are the infrastructure's doing, not the
    config's."""
    wall_s: float
    """From submission (including any group rebuild) to this outcome."""
    traces: list[bytes | None] | None = None
    """Per rank (rank order): the gzipped torch.profiler trace of run.profile_step, if one was asked for."""
    placement: list[dict[str, Any]] | None = None
    """Per rank (rank order): host, ip, Ray node_id, gpu_ids and pid of the actor that ran it."""
    local: list[list[RankResult] | str] | None = None
    """A local run that came back (RankWorker.run_local; ``ranks`` is None): per config, its rank results or the
    error it raised."""

    def each(self, n: int) -> list[RunDone]:
        """The outcome of each of the ``n`` configs of a local run; a run that failed as a whole fails each.

        The world is launched once, so its launch is charged to the first config: each later one's wall is the
        wall of its updates alone (RunOutcome.work_s), set by the caller that knows them; here all of it is the
        first's and the others' is 0.
        """
        if self.local is None:
            return [self] + [replace(self, wall_s=0.0) for _ in range(n - 1)]
        from trainer.launch import RankFailed

        out = []
        for i, part in enumerate(self.local):
            wall = self.wall_s if i == 0 else 0.0
            if isinstance(part, str):  # as a raising run of one config reads (the rank that raised: rank 0)
                error = RankFailed(part)
                error.add_note("rank 0")
                out.append(RunDone(None, error, "raised", wall, placement=self.placement))
            else:
                out.append(RunDone(part, None, "ok", wall, traces=[None] * len(part), placement=self.placement))
        return out


class WorkerGroup:
    def __init__(self, world_size: int, cpus_per_rank: float, gpus_per_rank: float, strategy: str,
                 device: str, start_timeout_s: float = 120.0):
        self.world_size, self.cpus, self.gpus, self.strategy = world_size, cpus_per_rank, gpus_per_rank, strategy
        self.device, self.start_timeout_s = device, start_timeout_s
        self.actors: list[Any] = []
        self._launched: list[Any] = []
        """Actors ``launch`` asked for that ``start`` has not waited for yet."""
        self.placement: list[dict[str, Any]] = []
        """Where each rank of the live group runs (rank order): host, ip, node_id, gpu_ids, pid."""
        self.pg = None
        self.joined = False
        """Whether the actors formed the group's world (the first run on the whole group does: ``join``)."""
        self._envs: list[dict[str, str]] = []
        self.builds = 0
        """Times this group formed its world: 1 for a whole sweep without failures."""
        self._refs: list[Any] = []
        self._got: dict[int, Any] = {}
        """The run's rank results already fetched (by rank): fetched once, and never waited for again."""
        self._local = False
        self._submitted = self._deadline = self._timeout = 0.0

    @property
    def bundle(self) -> dict[str, float]:
        """What one rank holds of its node."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    @property
    def alive(self) -> bool:
        return bool(self.actors)

    @property
    def busy(self) -> bool:
        return bool(self._refs)

    @property
    def pending(self) -> list[Any]:
        """The ranks' results not yet in: what the runner waits on (a rank already answered would wake it at
        once, and the driver would spin beside the ranks still running)."""
        return [r for i, r in enumerate(self._refs) if i not in self._got]

    def launch(self) -> None:
        """Ask Ray for the group's bundles and actors without waiting for them: each actor imports torch meanwhile,
        while the caller does other work (a sweep opens its stores); ``start`` then waits for them."""
        if why := capacity.shortfall(self.world_size, self.bundle, self.strategy):  # at once, not after a timeout
            raise ClusterTooSmall(why)
        self.pg = placement_group([self.bundle] * self.world_size, strategy=self.strategy)
        self._launched = [RankWorker.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=
                                             PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
                                             ).remote() for i in range(self.world_size)]

    def start(self) -> None:
        """Place the actors (``launch``, unless it ran already) and choose rank 0's address (blocking, bounded); the
        world is formed by the first run on the whole group (``join``). Until then rank 0 runs one-rank configs in its
        own process (RankWorker.run_local): the sweep's first job, the canonical run and its self-check, starts no
        process."""
        if not self._launched:
            self.launch()
        actors, self._launched = self._launched, []
        self.actors = actors
        try:
            ray.get(self.pg.ready(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.kill()
            raise GroupStartError(
                f"no room for {self.world_size} ranks x {self.bundle} ({self.strategy}) within "
                f"{self.start_timeout_s:.0f} s; "
                f"the cluster has {ray.available_resources()} free: lower resources.world_size/cpus_per_rank/"
                f"gpus_per_rank or resources.concurrent_trials"
                + (", or use resources.placement=PACK" if self.strategy == "STRICT_PACK" else "")) from None
        try:
            nodes = ray.get([a.node.remote() for a in actors], timeout=self.start_timeout_s)
            # Ranks of one Ray node are contiguous, so a pipeline stage's dp peers (rank = pp_rank * dp + dp_rank)
            # share a node when they can. By node id, not IP: several Ray nodes may share one IP.
            order = sorted(range(len(actors)), key=lambda i: (nodes[i]["node_id"], i))
            self.actors = [actors[i] for i in order]
            nodes = [nodes[i] for i in order]
            self.placement = [{"rank": r, **{k: n[k] for k in ("host", "ip", "node_id", "gpu_ids", "pid")}}
                              for r, n in enumerate(nodes)]
        except Exception as e:
            self.kill()
            raise GroupStartError(f"the worker group could not form its world: {_describe(e)}") from None
        self._envs = rank_envs(nodes)
        self.builds += 1

    def join(self) -> None:
        """Form the group's world (blocking, bounded). A rank's actor gone meanwhile (its node lost, killed from
        outside) is not a failure to form it: the run submitted next meets the dead actor, and is judged as a run
        that lost it (``collect``: lost_node / lost_actor, the trial queued again)."""
        try:
            ray.get([a.join.remote(env, self.device, self.start_timeout_s) for a, env in zip(self.actors, self._envs)],
                    timeout=self.start_timeout_s)
        except ray.exceptions.RayActorError:
            return
        except Exception as e:
            self.kill()
            raise GroupStartError(f"the worker group could not form its world: {_describe(e)}") from None
        self.joined = True

    def submit(self, cfg: dict[str, Any] | list[dict[str, Any]], timeout_s: float) -> None:
        """Run ``cfg`` on every rank; a list of configs (of fewer ranks than the group): on rank 0's node alone,
        one after the other in their own world (RankWorker.run_local)."""
        self._submitted = time.perf_counter()
        if not self.alive:
            self.start()
        self._local = isinstance(cfg, list)
        if self._local:
            # In rank 0's process while it is in no world yet. Not on a GPU: joining later makes the node's GPUs
            # visible to the rank (rank_envs), too late for a process that already initialised CUDA. Not in a
            # one-rank group: its world would make a mesh of the same shape as this run's, and DTensor's caches
            # would answer it with the gone world's groups (trainer.run.mesh_groups).
            from trainer.config import TrainConfig

            here = not self.joined and self.world_size > 1 and self.device == "cpu" and all(
                TrainConfig.from_dict(c).world_size == 1 for c in cfg)
            self._refs = [self.actors[0].run_local.remote(cfg, here)]
        else:
            if not self.joined:
                self.join()
            self._refs = [a.run.remote(cfg) for a in self.actors]
        self._timeout, self._deadline = timeout_s, time.perf_counter() + timeout_s
        self._got = {}

    def collect(self) -> RunDone | None:
        """Non-blocking: the run's outcome once every rank answered, any rank failed, or time ran out."""
        if not self._refs:
            return None
        waiting = self.pending
        ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        for ref in ready:
            try:
                self._got[self._refs.index(ref)] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                return self._lost(e, self._refs.index(ref))
            except ray.exceptions.RayTaskError as e:
                rank = self._refs.index(ref)
                if any(s in str(e) for s in PEER_LOST):  # this rank saw a peer vanish: find out why first
                    if (lost := self._peer_lost(rank)) is not None:
                        return lost
                return self._fail(e, "raised", rank)
        if len(self._got) == len(self._refs):
            got = [self._got[i] for i in range(len(self._refs))]
            self._refs, self._got = [], {}
            now = time.perf_counter()
            wall = now - self._submitted
            if now > self._deadline:
                # Late all the same: a limit that holds only when a poll happens to miss the result would make
                # the verdict depend on the driver's timing. Every rank answered, so the group stays as it is.
                return RunDone(None, TimeoutError(f"the result came after resources.trial_timeout_s="
                                                  f"{self._timeout:g} s (in {wall:.2f} s)"), "late", wall,
                               placement=self.placement)
            if self._local:
                return RunDone(None, None, "ok", wall, placement=self.placement[:1], local=got[0])
            ranks, traces = zip(*got)
            return RunDone(list(ranks), None, "ok", wall, traces=list(traces), placement=self.placement)
        if time.perf_counter() > self._deadline:
            return self._fail(TimeoutError(f"no result within resources.trial_timeout_s={self._timeout:g} s"),
                              "timeout", None)
        return None

    def _peer_lost(self, rank: int) -> RunDone | None:
        """The lost peer's own outcome, when a rank's collective failed because a peer's process went away.

        A killed actor's peers often answer first (gloo sees the closed connection before Ray reports the death):
        their error is the symptom. Wait briefly for the other ranks; an actor among them that is gone is the
        cause (lost node, ray.kill, crashed process), and is judged as such instead of blaming the config.
        """
        others = [r for i, r in enumerate(self._refs) if i != rank]
        ready, _ = ray.wait(others, num_returns=len(others), timeout=PEER_WAIT_S)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                return self._lost(e, self._refs.index(ref))
            except ray.exceptions.RayTaskError:
                continue
        return None

    def _lost(self, error: BaseException, rank: int) -> RunDone:
        """A rank's actor is gone: its node died (infrastructure), someone ray.kill-ed it (infrastructure), or
        its process died on a live node (a crash of the trainer process: segfault, the kernel's OOM killer)."""
        placement = self.placement
        dead = capacity.dead_nodes({p["node_id"] for p in placement})
        if not dead and "its node has died" in str(error):  # Ray has not marked the node dead yet
            dead = {p["node_id"] for p in placement if p["node_id"] in str(error)}
        if dead:
            where = sorted({(p["node_id"], p["host"], p["ip"]) for p in placement if p["node_id"] in dead})
            error.add_note("; ".join(f"node {n} ({h}, {ip}) lost" for n, h, ip in where))
            return self._fail(error, "lost_node", rank, placement)
        if "killed by `ray.kill`" in str(error):  # Ray's only record of who ended it: the death cause's text
            return self._fail(error, "lost_actor", rank, placement)
        return self._fail(error, "lost_rank", rank, placement)

    def _fail(self, error: BaseException, kind: str, rank: int | None,
              placement: list[dict[str, Any]] | None = None) -> RunDone:
        # The other ranks may sit in a collective waiting for the failed one: never wait for them.
        self.kill()
        if rank is not None:
            error.add_note(f"rank {rank}")
        return RunDone(None, error, kind, time.perf_counter() - self._submitted, placement=placement)

    def kill(self) -> None:
        for a in self.actors + self._launched:
            ray.kill(a, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        self.actors, self._launched, self.pg, self._refs, self._got, self.placement = [], [], None, [], {}, []
        self.joined = False


def rank_envs(nodes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """torchrun's variables for each rank, from each actor's node (rank order) and its GPUs.

    Ray gives each GPU actor only its own GPU in CUDA_VISIBLE_DEVICES; NCCL's intra-node paths want every
    rank of the node to see the node's GPUs, so (like Ray Train) each rank sees all of its node's group
    GPUs and LOCAL_RANK indexes its own.
    """
    master = nodes[0]
    envs = []
    for rank, n in enumerate(nodes):
        peers = [m for m in nodes if m["ip"] == n["ip"]]  # one machine (its GPUs), even if several Ray nodes
        local_rank = peers.index(n)
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": str(local_rank),
               "LOCAL_WORLD_SIZE": str(len(peers)), "MASTER_ADDR": master["ip"], "MASTER_PORT": str(master["port"])}
        if n["gpu_ids"]:
            gpus = sorted({g for m in peers for g in m["gpu_ids"]}, key=lambda g: (len(g), g))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            env["LOCAL_RANK"] = str(gpus.index(n["gpu_ids"][0]))
        envs.append(env)
    return envs


def groups_that_fit(world_size: int, cpus_per_rank: float, gpus_per_rank: float, wanted: int) -> int:
    """How many worker groups the cluster's total resources hold, up to ``wanted`` (at least 1)."""
    total = ray.cluster_resources()
    fits = [wanted]
    if cpus_per_rank:
        fits.append(int(total.get("CPU", 0) // (world_size * cpus_per_rank)))
    if gpus_per_rank:
        fits.append(int(total.get("GPU", 0) // (world_size * gpus_per_rank)))
    return max(1, min(fits))


def _describe(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
