"""The sweep file: YAML + CLI dotlist (OmegaConf, at the edge only) -> plain frozen dataclasses, validated once.

Everything a sweep needs is checked here, before Ray or a store is touched: unknown keys and wrong types
(named by their dotted path), the target, the search space, and that every config the space can produce
is a valid trainer (or planner) config and a throughput-only change (``parity.check_space_is_throughput_only``).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from orchestrator import REPO_ROOT, backends
from orchestrator.frameworks.custom import CustomFramework
from orchestrator.search.space import Space, enumerate_space, parse_space
from orchestrator.search.target import Target, parse_target
from orchestrator.records.answer import SettleRule
from trainer.mapping import build

log = logging.getLogger(__name__)
DEFAULT_SWEEP = REPO_ROOT / "search_spaces" / "default.yaml"
BACKENDS = tuple(backends.BACKENDS)
SAMPLERS = ("tpe", "random", "cmaes", "qmc", "gp", "guided")
PLACEMENTS = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")


@dataclass(frozen=True)
class SearchConfig:
    n_trials: int = 16
    """Finished Optuna trials in the study, baseline included (a resumed study counts what it has)."""
    wall_time_s: Optional[float] = 300.0
    """No new trial starts once this much of this invocation's time is spent (null: no limit)."""
    min_trials: int = 0
    """A target that settling rounds find met ends the search only once this many trials are finished (baseline
    included); until then the search goes on for a faster config. 0: stop at the first one found met."""


@dataclass(frozen=True)
class SamplerConfig:
    kind: str = "tpe"
    """Optuna sampler: tpe, random, cmaes, qmc or gp."""
    seed: Optional[int] = 0
    """Sampler seed (null: a different search each run)."""
    multivariate: bool = True
    """TPE only: model the params jointly (with group decomposition for conditional params)."""
    n_startup_trials: int = 4
    """Random trials before TPE/CMA-ES/GP start modelling (the baseline counts)."""
    guided_first: int = 3
    """guided only: the planner's top picks (spread over the knob families) run first, after the baseline."""
    guided_every: int = 2
    """guided only: then every n-th trial is the recalibrated planner's best unmeasured config, the rest TPE's."""
    calibration: Optional[str] = None
    """guided only: a calibration file (`steptune profile` or `steptune calibrate` writes one; path relative to
    the sweep file or the working directory) whose efficiency the planner ranks with from trial 1, instead of the
    cluster file's priors; the online refit starts from it."""


@dataclass(frozen=True)
class PruningConfig:
    enabled: bool = True
    """Run a short probe of each trial (not the baseline or a settling run) before its full measurement."""
    after_steps: int = 3
    """Measured (post warm-up) steps in the probe run."""
    slower_than_best: float = 1.5
    """Prune when the probe's fastest measured update is slower than this multiple of the best step time so far
    (the fastest, not the median: one slow update on a busy machine must not prune a good config)."""


@dataclass(frozen=True)
class ResourcesConfig:
    world_size: int = 2
    """Ranks per trial; each trial's parallel.dp is world_size / (tensor_parallel.size x parallel.pp)."""
    cpus_per_rank: float = 1.0
    """Ray CPUs reserved by each rank's actor."""
    gpus_per_rank: float = 0.0
    """Ray GPUs reserved by each rank's actor: >= 1 with run.device=cuda, 0 with cpu."""
    trial_timeout_s: float = 120.0
    """The floor of one run's wall-clock limit; past the limit the group is killed and rebuilt. The limit follows
    what was measured (orchestrator.sweep.timeouts): the larger of this and a multiple of the slowest ok run so
    far, stretched by the machine's load, so a busy machine does not turn slow runs into timeouts."""
    concurrent_trials: int = 1
    """Worker groups, each running one trial at a time."""
    placement: str = "STRICT_PACK"
    """Placement-group strategy for one group's ranks (STRICT_PACK: one node)."""
    memory_budget_gb: Optional[float] = None
    """Peak memory per rank above this makes a trial infeasible (a constraint, not a failure)."""


@dataclass(frozen=True)
class RayConfig:
    address: Optional[str] = None
    """null: embedded local Ray; "auto" or "host:6379" (the head's GCS address): an existing cluster."""
    dashboard: bool = False
    """Start the embedded Ray's dashboard."""
    temp_dir: Optional[str] = None
    """Embedded Ray's session directory (default: <system temp>/steptune-ray)."""
    runtime_env: Optional[dict] = None
    """Ray runtime_env for the worker actors (default on an existing cluster: this repository as working_dir)."""

    def __post_init__(self) -> None:
        if isinstance(self.address, str) and self.address.startswith("ray://"):
            raise ValueError(f"ray.address={self.address}: Ray Client addresses (ray://) need the ray[client] extra, "
                             f"which steptune does not install; give the head's GCS address (host:6379) or auto")


@dataclass(frozen=True)
class CommandConfig:
    """backend: command only: trials run the team's own launch command through torchrun on Ray-placed node actors."""

    framework: str = "steptune"
    """megatron, torchtitan, steptune, or custom (your own script, declared under command.custom): how a trial's
    knobs become the command's flags and how its log is read."""
    framework_version: Optional[str] = None
    """torchtitan only: the release the flags are written for (null: its main branch; "0.3.0": the PyPI release)."""
    custom: Optional[CustomFramework] = None
    """framework custom only: your script's knobs as arguments and environment, and how its log is read
    (docs/frameworks.md#your-own-trainer)."""
    argv: list = field(default_factory=list)
    """What torchrun runs, with its fixed arguments: ["-m", "trainer"], or ["pretrain_gpt.py", "--num-layers", "24",
    ...]; the trial's rendered flags are appended. ``{trial_dir}`` is the trial's folder on each node."""
    nodes: int = 1
    """Node actors (one per node, STRICT_SPREAD when more than one); resources.world_size ranks are split evenly."""
    env: dict = field(default_factory=dict)
    """Environment for every rank, over the framework's own (e.g. Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1)."""
    cwd: Optional[str] = None
    """The command's working directory on every node (e.g. a Megatron-LM checkout); default: this repository."""
    warmup: Optional[int] = None
    """Iterations excluded from the steady state (default: the trainer config's run.warmup_steps, at least 1)."""
    parity_loss_rel: float = 1e-5
    """Black-box parity: the floor of the per-iteration loss tolerance (relative), widened to 10 x the baseline's
    own run-to-run spread (the baseline runs twice); a bit-identical repeat would otherwise make it zero."""
    parity_grad_norm_rel: float = 1e-4
    """The same floor for the grad norm, where the log prints it."""


@dataclass(frozen=True)
class StorageConfig:
    results_dir: str = "results"
    """Where the ledgers (<results_dir>/<name>/trials.jsonl) and the default Optuna and MLflow stores live."""
    optuna_url: Optional[str] = None
    """Any SQLAlchemy URL Optuna's RDBStorage takes; null: sqlite:///<results_dir>/optuna.db."""
    mlflow_uri: Optional[str] = None
    """null: sqlite:///<results_dir>/mlflow.db."""
    heartbeat_interval_s: int = 5
    """The driver records its heartbeat (and its running trials') in the Optuna study this often."""
    grace_period_s: int = 60
    """A study whose driver's heartbeat is older than this is taken over (its driver is dead); until then,
    a second driver of the same study is refused, whatever its results_dir."""

    def __post_init__(self) -> None:
        if not (isinstance(self.heartbeat_interval_s, int) and self.heartbeat_interval_s > 0):
            raise ValueError(f"storage.heartbeat_interval_s={self.heartbeat_interval_s!r}: a positive whole "
                             f"number of seconds (Optuna's heartbeat takes whole seconds)")
        if not (isinstance(self.grace_period_s, int) and self.grace_period_s >= 2 * self.heartbeat_interval_s):
            raise ValueError(f"storage.grace_period_s={self.grace_period_s!r}: a whole number of seconds, at least "
                             f"2 x storage.heartbeat_interval_s ({2 * self.heartbeat_interval_s}), so one late "
                             f"heartbeat does not hand a live driver's study to another")


@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = True
    """Mirror the sweep into MLflow (the ledger is written either way)."""
    experiment: str = "steptune"
    """MLflow experiment name."""
    background: bool = True
    """Mirror from a background process at the lowest CPU priority (nice 19), so the next run starts at once instead
    of waiting up to ~0.2 s per ledger line for MLflow; the sweep waits for the mirror before it ends. false: each
    call runs between runs, in the driver's process."""


@dataclass(frozen=True)
class SweepConfig:
    name: str = "default"
    """Study name and results/<name>/ (letters, digits, '_', '-', '.')."""
    backend: str = "ray"
    """ray: real multi-rank trials on Ray; model: the planner's predictions (needs planner:); command: the team's
    own launch command through torchrun on Ray (needs command:)."""
    description: str = ""
    """Free text for the reader, kept with the sweep's record."""
    trainer: dict = field(default_factory=dict)
    """Base trainer config (ray backend), merged over trainer_config's file."""
    trainer_config: Optional[str] = None
    """A trainer YAML file for the base config, relative to the sweep file."""
    planner: dict = field(default_factory=dict)
    """The planner's config (model backend only): cluster, model, job and the knob sections."""
    baseline: dict = field(default_factory=dict)
    """Overrides (dotted or nested) that make the config you run today; measured first, it is the parity
    reference and the speedup basis."""
    space: Space = None  # type: ignore[assignment]
    """The search space, under space.params."""
    target: Target = field(default_factory=Target)
    """Seconds per update to reach: step_time_s, relative_to_baseline or schedule (none: search the budget)."""
    enqueue: list = field(default_factory=list)
    """Param sets to try right after the baseline (flat dotted, in the space's terms)."""
    winner: SettleRule = field(default_factory=SettleRule)
    """How the answer is settled: interleaved rounds of the baseline and the contenders, paired figures, the tie
    threshold (orchestrator.records.answer)."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """The budget: trials and wall time."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """How Optuna proposes the next config."""
    pruning: PruningConfig = field(default_factory=PruningConfig)
    """Stop clearly slow trials after a short probe."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """Ranks, Ray resources and limits of each trial."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Which Ray cluster to use."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Where results and the Optuna and MLflow stores go."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow mirroring."""
    command: CommandConfig = field(default_factory=CommandConfig)
    """backend: command: the launch command, its framework and its nodes (docs/frameworks.md)."""
    prefilter: dict = field(default_factory=dict)
    """Memory pre-filter for real (ray) sweeps: {enabled, cluster, calibration, memory_budget_gb (GiB), margin};
    see orchestrator.backends.ray_trials.prefilter_from_settings."""
    source: Optional[str] = None
    """The sweep file this came from (set by load_sweep, not by the file)."""
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    """The merged mapping as given, for the record (MLflow, the study)."""
    built: Any = field(default=None, init=False, compare=False, repr=False)
    """The backend ``check_sweep`` built and validated the space with (set by load_sweep), reused by the sweep."""

    @property
    def results_dir(self) -> Path:
        return Path(self.storage.results_dir).resolve() / self.name

    @property
    def optuna_url(self) -> str:
        return self.storage.optuna_url or f"sqlite:///{Path(self.storage.results_dir).resolve() / 'optuna.db'}"

    @property
    def mlflow_uri(self) -> str:
        return self.storage.mlflow_uri or f"sqlite:///{Path(self.storage.results_dir).resolve() / 'mlflow.db'}"


# ---- loading ---------------------------------------------------------------------------------

def load_sweep(path: str | Path | None = None, dotlist: list[str] | None = None, check: bool = True) -> SweepConfig:
    """Read a sweep file, apply ``key=value`` overrides, validate; ValueError names the field."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path) if path else DEFAULT_SWEEP
    for item in dotlist or []:
        if "=" not in item or item.startswith("="):
            raise ValueError(f"override {item!r} must look like dotted.key=value (e.g. search.n_trials=30)")
    if not path.is_file():
        raise ValueError(f"--config {path}: no such sweep file")
    try:
        base = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
        cli = OmegaConf.to_container(OmegaConf.from_dotlist(list(dotlist or [])), resolve=True)
    except (OmegaConfBaseException, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    except yaml.YAMLError as e:  # the parser's text spans lines; its position and problem fit in one
        raise ValueError(f"{path}: not valid YAML{_yaml_where(e)}; fix the file (e.g. check its indentation "
                         f"and quoting)") from None
    if not isinstance(base, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    # A target given on the command line replaces the file's target of another kind instead of adding a second.
    if isinstance(cli.get("target"), dict) and isinstance(base.get("target"), dict):
        base["target"] = {k: v for k, v in base["target"].items() if k in cli["target"]}
    merged = OmegaConf.to_container(OmegaConf.merge(base, cli), resolve=True)
    cfg = from_dict(merged, source=path)
    if check:
        object.__setattr__(cfg, "built", check_sweep(cfg))  # built once: the sweep reuses it
    return cfg


def from_dict(data: dict[str, Any], source: Path | None = None) -> SweepConfig:
    from trainer.config import flatten

    data, raw = dict(data), dict(data)
    trainer_file = data.get("trainer_config")
    if trainer_file is not None:
        if not isinstance(trainer_file, str):
            raise ValueError("trainer_config: expected a path to a trainer YAML file")
        from_file = _read_yaml(_relative(trainer_file, source), "trainer_config")
        data["trainer"] = _merge(from_file, data.get("trainer") or {})
    _refuse_legacy(data)
    space = parse_space(data.pop("space", None))
    target = parse_target(data.pop("target", None))
    cfg = build(SweepConfig, data, suggest=_suggestion, skip=("source", "raw", "space", "target", "built"))
    cfg = dataclasses.replace(cfg, space=space, target=target, source=str(source) if source else None, raw=raw,
                              baseline=flatten(cfg.baseline))  # nested or dotted keys both accepted
    _check_fields(cfg)
    return _cap_min_trials(cfg)


def load_saved_sweep(results_dir: str | Path) -> SweepConfig | None:
    """The config a sweep's driver saved beside its ledger (``<results_dir>/sweep.yaml``); None if there is none.

    ``report`` and ``export`` judge a ledger by it (the target, the settling rule, where MLflow is). Loaded like
    any sweep file but not checked against the trainer (nothing is launched from it). A relative
    ``trainer_config:`` pointed beside the original sweep file, which is not saved: where it does not resolve
    from here it is left out, since every trial's full config is in its ledger record anyway.
    """
    path = Path(results_dir) / "sweep.yaml"
    if not path.is_file():
        return None
    data = _read_yaml(path, "sweep.yaml")
    trainer_file = data.get("trainer_config")
    if isinstance(trainer_file, str) and not _relative(trainer_file, path).is_file():
        data.pop("trainer_config")
    sampler = data.get("sampler")
    cal = sampler.get("calibration") if isinstance(sampler, dict) else None
    data.pop("confirm", None)  # sweeps saved before settling rounds: judged by today's rule
    if isinstance(data.get("winner"), dict):
        data["winner"] = {k: v for k, v in data["winner"].items() if k not in LEGACY_WINNER}
    if isinstance(cal, str) and not (Path(cal).is_file() or _relative(cal, path).is_file()):
        # Read by the sampler before trial 1 only: a report or export of the ledger does not need it.
        data["sampler"] = {k: v for k, v in sampler.items() if k != "calibration"}
    try:
        return from_dict(data, source=path)
    except ValueError as e:
        raise ValueError(f"{path}: {e} (the sweep config saved by the driver; was it edited by hand?)") from None


def load_saved_sweep_to_run(sweep_dir: str | Path, results_dir: str | Path) -> SweepConfig:
    """The config a sweep's driver saved, to run again (``steptune settle``): as ``load_saved_sweep``, with
    ``storage.results_dir`` where its ledger was found (the saved one may be relative to another directory), and
    checked against the trainer like a sweep file."""
    cfg = load_saved_sweep(sweep_dir)
    if cfg is None:
        raise ValueError(f"{Path(sweep_dir) / 'sweep.yaml'}: not found; only a sweep run by this version's driver "
                         f"(which saves it beside the ledger) can be settled further")
    cfg = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, results_dir=str(results_dir)))
    object.__setattr__(cfg, "built", check_sweep(cfg))
    return cfg


LEGACY_WINNER = {"min_runs": "winner.min_rounds", "max_repeats": "winner.max_rounds"}
"""Fields of the old re-measurement rule and what replaced them."""


def _refuse_legacy(data: dict[str, Any]) -> None:
    """Fields of the rule settling rounds replaced: one line naming the new field, before anything runs."""
    if "confirm" in data:
        raise ValueError("confirm: removed; a met target now stops the search only once settling rounds (the "
                         "baseline and the contenders, interleaved) find it met: remove confirm: and set "
                         "winner.min_rounds / winner.max_rounds instead (docs/search.md#one-answer)")
    old = data.get("winner")
    for k, new in LEGACY_WINNER.items():
        if isinstance(old, dict) and k in old:
            raise ValueError(f"winner.{k}: replaced by {new} (runs now come in interleaved rounds of the baseline "
                             f"and every contender); rename it (docs/search.md#one-answer)")


def _cap_min_trials(cfg: SweepConfig) -> SweepConfig:
    """A budget smaller than search.min_trials (e.g. ``search.n_trials=4`` on the default file) just works."""
    s = cfg.search
    if s.min_trials <= s.n_trials:
        return cfg
    log.warning("search.min_trials=%d is more than search.n_trials=%d; using search.min_trials=%d",
                s.min_trials, s.n_trials, s.n_trials)
    raw = dict(cfg.raw)
    raw["search"] = {**(raw.get("search") or {}), "min_trials": s.n_trials}
    return dataclasses.replace(cfg, search=dataclasses.replace(s, min_trials=s.n_trials), raw=raw)


def _check_fields(cfg: SweepConfig) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", cfg.name):
        raise ValueError(f"name={cfg.name!r}: use letters, digits, '_', '-', '.' "
                         f"(it names results/<name>/ and the study)")
    _one_of("backend", cfg.backend, BACKENDS)
    _one_of("sampler.kind", cfg.sampler.kind, SAMPLERS)
    _one_of("resources.placement", cfg.resources.placement, PLACEMENTS)
    checks = [
        ("search.n_trials", cfg.search.n_trials >= 1),
        ("search.wall_time_s", cfg.search.wall_time_s is None or cfg.search.wall_time_s > 0),
        ("pruning.after_steps", cfg.pruning.after_steps >= 1),
        ("pruning.slower_than_best", cfg.pruning.slower_than_best > 1),
        ("resources.world_size", cfg.resources.world_size >= 1),
        ("resources.cpus_per_rank", cfg.resources.cpus_per_rank >= 0),
        ("resources.gpus_per_rank", cfg.resources.gpus_per_rank >= 0),
        ("resources.trial_timeout_s", cfg.resources.trial_timeout_s > 0),
        ("resources.concurrent_trials", cfg.resources.concurrent_trials >= 1),
        ("resources.memory_budget_gb", cfg.resources.memory_budget_gb is None or cfg.resources.memory_budget_gb > 0),
        ("sampler.n_startup_trials", cfg.sampler.n_startup_trials >= 0),
        ("sampler.guided_first", cfg.sampler.guided_first >= 0), ("sampler.guided_every", cfg.sampler.guided_every >= 0),
    ]
    for name, ok in checks:
        if not ok:
            raise ValueError(f"{name}={_get(cfg, name)!r} is out of range")
    if cfg.sampler.calibration is not None:
        from orchestrator.calibration.guided import start_efficiency, start_uncertainty

        start_efficiency(cfg.sampler, cfg.source)  # a missing or malformed file fails here, not at trial 1
        start_uncertainty(cfg.sampler, cfg.source)
    if cfg.search.min_trials < 0:
        raise ValueError(f"search.min_trials={cfg.search.min_trials} must be 0 or more")
    for i, entry in enumerate(cfg.enqueue):
        if not isinstance(entry, dict):
            raise ValueError(f"enqueue[{i}]: expected a mapping of space param: value")


def check_sweep(cfg: SweepConfig) -> backends.Backend:
    """Everything that needs the trainer/planner: the baseline, the space's configs, the enqueued params.

    Returns the backend it built (its configs and pre-filter), for the sweep to use as is.
    """
    from orchestrator.parity import verdict as parity

    check_results_dir(cfg)
    backend = backends.build(cfg)
    configs = backend.configs
    parity.check_space_is_throughput_only(cfg.space.override_keys)
    parity.check_numerics_opt_in(cfg.space.names, cfg.space.allow_numerics_change)
    configs.baseline_params(cfg.space)
    bad: list[str] = []
    seen = 0
    for params, overrides in enumerate_space(cfg.space, configs.fixed, configs.split_context):
        seen += 1
        try:
            configs.build(overrides)
        except ValueError as e:
            bad.append(f"  {_show(params)}: {e}")
    if bad:
        raise ValueError(
            f"space: {len(bad)} of the {seen} configs checked are invalid for the {cfg.backend} backend; narrow "
            f"these params or add when: conditions so they cannot be combined:\n" + "\n".join(bad[:8])
            + (f"\n  ... and {len(bad) - 8} more" if len(bad) > 8 else ""))
    for i, entry in enumerate(cfg.enqueue):
        try:
            configs.build(configs.overrides_for(cfg.space, entry))
        except ValueError as e:
            raise ValueError(f"enqueue[{i}] {_show(entry)}: {e}") from None
    return backend


def check_results_dir(cfg: SweepConfig) -> None:
    """storage.results_dir must be (or become) a writable directory; checked without creating anything."""
    where = Path(cfg.storage.results_dir).resolve()
    existing = next(p for p in (where, *where.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"storage.results_dir={cfg.storage.results_dir}: {existing} is not a directory; "
                         f"set storage.results_dir to a writable directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"storage.results_dir={cfg.storage.results_dir}: {existing} is not writable by this user; "
                         f"set storage.results_dir to a writable directory")


def _yaml_where(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    return (f" at line {mark.line + 1}, column {mark.column + 1}" if mark else "") + (f": {problem}" if problem else "")


def _show(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(no params)"


# ---- mapping -> dataclasses, with dotted paths in every error --------------------------------

def _all_paths(cls: type = SweepConfig, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(tp):
            out += _all_paths(tp, f"{prefix}{f.name}.")
    return out + ["target.step_time_s", "target.relative_to_baseline", "target.schedule", "space.params",
                  "space.allow_numerics_change"]


def _suggestion(dotted: str) -> str:
    """'budget.n_trials' -> ' (did you mean search.n_trials?)': match on the last part first, then the whole."""
    paths = _all_paths()
    leaf = [p for p in paths if p.rsplit(".", 1)[-1] == dotted.rsplit(".", 1)[-1] and p != dotted]
    close = leaf or difflib.get_close_matches(dotted, paths, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _one_of(name: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {list(allowed)}")


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _relative(path: str, source: Path | None) -> Path:
    p = Path(path)
    return p if p.is_absolute() or source is None else source.parent / p


def _read_yaml(path: Path, field_name: str) -> dict:
    import yaml

    if not path.is_file():
        raise ValueError(f"{field_name}: {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{field_name}: {path} is not valid YAML{_yaml_where(e)}; fix the file") from None
    if not isinstance(data, dict):
        raise ValueError(f"{field_name}: {path} must hold a mapping")
    return data


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
