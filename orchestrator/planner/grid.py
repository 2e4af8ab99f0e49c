"""Every config of a search space, evaluated at once with numpy: the space's true optimum, fast.

The space uses the preset's ``space.params`` spec shape: ``categorical`` (choices), ``int`` (low, high,
step), ``float`` (low, high, log; enumerated at ``float_points`` points) and ``layer_split`` (first/last
ranges), each with an optional ``when: {other.param: value | [values]}`` and ``default``. Params linked by
``when`` are expanded together as a tree (so inactive params do not multiply the count); unlinked groups
combine as a product. Validity follows ``PlanConfig``'s rules, vectorised; tests hold the two equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from trainer.knobs import BalancedSplit, FirstLastSplit, FsdpDP, OpRecompute, ReplicateDP

from .config import PlanConfig, rank_chunks
from .knobs import RC_CODE, SCHED_CODE, Consts, Knobs, encode, uneven_configs
from .memory import stage_memory
from .parse import KNOBS, apply_params, knob_values
from .timing import step_times

SPLIT = "pipeline.split"


def _values(name: str, spec: Mapping[str, Any], float_points: int) -> list:
    kind = spec.get("type")
    if kind == "categorical":
        return list(spec["choices"])
    if kind == "int":
        return list(range(spec["low"], spec["high"] + 1, spec.get("step") or 1))
    if kind == "float":
        lo, hi = float(spec["low"]), float(spec["high"])
        pts = np.geomspace(lo, hi, float_points) if spec.get("log") else np.linspace(lo, hi, float_points)
        return [float(x) for x in pts]
    if kind == "layer_split":
        (f0, f1), (l0, l1) = spec["first"], spec["last"]
        return [(f, la) for f in range(f0, f1 + 1) for la in range(l0, l1 + 1)]
    raise ValueError(f"space.params.{name}.type: {kind!r} is not one the planner can enumerate")


def _components(params: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    parent = {n: n for n in params}

    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n
    for name, spec in params.items():
        for key in spec.get("when", {}):
            if key in params:
                parent[root(name)] = root(key)
    groups: dict[str, list[str]] = {}
    for name in params:
        groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def _expand(names: list[str], params: Mapping, fixed: Mapping, float_points: int) -> list[dict[str, Any]]:
    """All assignments of one linked group, in dependency order; inactive params take their default."""
    order, placed = [], set()
    while len(order) < len(names):
        nxt = next(n for n in names if n not in placed and all(k in placed or k not in names
                                                                for k in params[n].get("when", {})))
        order.append(nxt)
        placed.add(nxt)
    out: list[dict[str, Any]] = [{}]
    for name in order:
        spec, grown = params[name], []
        for partial in out:
            active = all((partial[k] if k in partial else fixed.get(k)) in (v if isinstance(v, list) else [v])
                         for k, v in spec.get("when", {}).items())
            if active:
                grown.extend({**partial, name: value} for value in _values(name, spec, float_points))
            else:
                grown.append({**partial, **({name: spec["default"]} if "default" in spec else {})})
        out = grown
    return out


@dataclass
class GridResult:
    """Per enumerated config: validity (PlanConfig's rules), step time, peak memory, fit."""

    n: int
    valid: np.ndarray
    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    fits_memory: np.ndarray
    _groups: list[list[dict[str, Any]]]
    _shape: tuple[int, ...]

    def params(self, i: int) -> dict[str, Any]:
        """The flat knob assignment of config ``i`` (as a trial would send it)."""
        out: dict[str, Any] = {}
        for options, j in zip(self._groups, np.unravel_index(int(i), self._shape)):
            for key, value in options[int(j)].items():
                if key == SPLIT:
                    out.update({"pipeline.split.kind": "first_last", "pipeline.split.first": value[0],
                                "pipeline.split.last": value[1]})
                else:
                    out[key] = value
        return out

    def best(self) -> int:
        """Index of the fastest valid config that fits in memory."""
        return int(np.argmin(self.feasible_times()))

    def feasible_times(self) -> np.ndarray:
        return np.where(self.valid & self.fits_memory, self.step_time_s, np.inf)


def enumerate_space(base: PlanConfig, params: Mapping[str, Mapping[str, Any]], float_points: int = 16,
                    chunk: int = 131072) -> GridResult:
    """Evaluate every config of ``params`` (the preset's ``space.params``) applied on top of ``base``."""
    for name in params:
        if name != SPLIT and name not in KNOBS:
            raise ValueError(f"space.params.{name}: not a planner knob")
        if name.startswith(("parallel.", "tensor_parallel.", "pipeline_comm.")) and name not in SEARCHABLE_COMM:
            raise ValueError(f"space.params.{name}: the enumerator keeps parallel degrees and sequence "
                             f"parallelism fixed; of their communication settings it searches only "
                             f"{', '.join(SEARCHABLE_COMM)}")
    fixed = knob_values(base)
    groups = [_expand(names, params, fixed, float_points) for names in _components(params)]
    shape = tuple(len(g) for g in groups)
    n = int(np.prod(shape)) if shape else 1
    tables = {key: _table(key, groups, fixed) for key in _ENCODE}
    C = Consts.of(base)
    out = {k: np.empty(n, dtype=dt) for k, dt in (("valid", bool), ("step", float), ("peak", float), ("fits", bool))}
    for lo in range(0, n, chunk):
        flat = np.arange(lo, min(n, lo + chunk))
        idx = np.unravel_index(flat, shape) if shape else ()
        cols = {key: (table[idx[g]] if g is not None else np.full(len(flat), table))
                for key, (g, table) in tables.items()}
        knobs, valid = _knobs(base, cols, len(flat))
        mem = stage_memory(C, knobs)
        out["valid"][flat], out["step"][flat] = valid, step_times(C, knobs)["step_time_s"]
        out["peak"][flat], out["fits"][flat] = mem["peak"], mem["fits"]
    return GridResult(n, out["valid"], out["step"], out["peak"], out["fits"], groups, shape)


def best_config(base: PlanConfig, params: Mapping[str, Mapping[str, Any]], float_points: int = 24, top: int = 20,
                refine: int = 400) -> tuple[float, dict[str, Any]]:
    """The space's fastest config that fits in memory: (its step time, its params). The grid (``enumerate_space``
    at ``float_points``) ranks every config; the ``top`` fastest then have each float knob scanned at ``refine``
    points over its range, one knob at a time, so a continuous knob (a bucket size) is not left at a grid point.
    (inf, {}) when nothing fits."""
    grid = enumerate_space(base, params, float_points)
    times = grid.feasible_times()
    floats = [n for n, spec in params.items() if spec.get("type") == "float"]
    best_t, best_p = np.inf, {}
    for i in np.argsort(times)[:top]:
        if not np.isfinite(times[i]):
            break
        chosen = grid.params(int(i))
        if times[i] < best_t:
            best_t, best_p = float(times[i]), chosen
        for name in floats:
            if name not in chosen:  # inactive under its when:
                continue
            spec = params[name]
            lo, hi = float(spec["low"]), float(spec["high"])
            pts = np.geomspace(lo, hi, refine) if spec.get("log") else np.linspace(lo, hi, refine)
            cands = [{**chosen, name: float(x)} for x in pts]
            first = apply_params(base, chosen)  # once; the scan replaces the one field (apply_params costs ms)
            cfgs = [_with(first, name, float(x)) for x in pts]
            knobs = encode(cfgs)
            C = Consts.of(cfgs[0])
            t = np.where(stage_memory(C, knobs)["fits"], step_times(C, knobs)["step_time_s"], np.inf)
            j = int(np.argmin(t))
            if t[j] < best_t:
                best_t, best_p = float(t[j]), cands[j]
    return best_t, best_p


def _with(cfg: Any, name: str, value: Any) -> Any:
    """``cfg`` with the dotted field ``name`` set (each level's dataclass revalidates itself)."""
    head, _, rest = name.partition(".")
    return dataclasses.replace(cfg, **{head: _with(getattr(cfg, head), rest, value) if rest else value})


_MODULE_BITS = {"core_attn": 1, "mlp": 2, "norm": 4}
_ENCODE = {
    "batch.micro_batch_size": lambda x: -1 if x is None else x,
    "pipeline.schedule": lambda x: SCHED_CODE.get(x, -1),
    "pipeline.virtual_stages": lambda x: 1 if x is None else x,
    "pipeline.split.kind": lambda x: {"balanced": 0, "first_last": 1}.get(x, -1),
    "pipeline.split.first": lambda x: 0 if x is None else x,
    "pipeline.split.last": lambda x: 0 if x is None else x,
    "recompute.kind": lambda x: RC_CODE.get(x, -1),
    "recompute.method": lambda x: {"uniform": 0, "block": 1}.get(x, -1),
    "recompute.num_layers": lambda x: 0 if x is None else x,
    "recompute.modules": lambda x: sum(_MODULE_BITS.get(m, 8) for m in (x or ("core_attn",))),
    "recompute.matmul_period": lambda x: OpRecompute.matmul_period if x is None else x,
    "data_parallel.kind": lambda x: {"replicate": 0, "torch_ddp": 1, "fsdp": 2}.get(x, -1),
    # A base without them (fsdp) switched to replicate gets ReplicateDP's defaults, as apply_params builds it.
    "data_parallel.overlap_grad_reduce": lambda x: ReplicateDP.overlap_grad_reduce if x is None else bool(x),
    "data_parallel.bucket_mb": lambda x: ReplicateDP.bucket_mb if x is None else float(x),
    "data_parallel.reshard_after_forward": lambda x: FsdpDP.reshard_after_forward if x is None else bool(x),
    "data_parallel.prefetch": lambda x: FsdpDP.prefetch if x is None else x,
    "optimizer.overlap_param_gather": bool,
    "optimizer.distributed": bool,
    "optimizer.grad_reduce_dtype": lambda x: {"fp32": 4.0, "bf16": 2.0}.get(x, -1.0),
    "tensor_parallel.comm_overlap": bool,
    "pipeline_comm.overlap_p2p": bool,
}
SEARCHABLE_COMM = ("tensor_parallel.comm_overlap", "pipeline_comm.overlap_p2p")
"""The communication settings a space may vary: on/off overlaps over the fixed groups. The degrees
(parallel.*, tensor_parallel.size) and sequence_parallel stay fixed, since they change the constants
(``Consts``) every config of one batch shares."""


def _table(key: str, groups: list, fixed: Mapping[str, Any]) -> tuple[int | None, Any]:
    """(group index, encoded value per option of that group), or (None, the base value) if no group sets it."""
    enc = _ENCODE[key]
    for g, options in enumerate(groups):
        if any(key in o or (key.startswith(SPLIT + ".") and SPLIT in o) for o in options):
            return g, np.array([enc(_lookup(o, key, fixed)) for o in options])
    return None, enc(fixed.get(key))


def _lookup(option: Mapping[str, Any], key: str, fixed: Mapping[str, Any]) -> Any:
    if SPLIT in option:
        f, la = option[SPLIT]
        return {"pipeline.split.kind": "first_last", "pipeline.split.first": f, "pipeline.split.last": la}.get(
            key, option.get(key, fixed.get(key)))
    return option.get(key, fixed.get(key))


def _knobs(base: PlanConfig, cols: dict[str, np.ndarray], n: int) -> tuple[Knobs, np.ndarray]:
    """Knob arrays plus PlanConfig's validity rules, vectorised."""
    p, d, gbs = base.parallel.pp, base.parallel.dp, base.batch.global_batch
    b = cols["batch.micro_batch_size"].astype(np.int64)
    valid = (b >= 1) & (gbs % np.maximum(b * d, 1) == 0)
    m = gbs // np.maximum(b * d, 1)
    sched = cols["pipeline.schedule"].astype(np.int64)
    v = np.where(sched == 2, cols["pipeline.virtual_stages"], 1).astype(np.int64)
    layers, uneven, chunks, ok_split = _rank_chunks(base, cols["pipeline.split.kind"], cols["pipeline.split.first"],
                                                    cols["pipeline.split.last"], v)
    valid &= ok_split & (sched >= 0)
    valid &= np.where(sched == 2, (v >= 2) & (p >= 2) & (m % p == 0), True)
    rc = cols["recompute.kind"].astype(np.int64)
    method = cols["recompute.method"]
    rc_n = np.where(rc == 2, cols["recompute.num_layers"], 0).astype(np.int64)
    valid &= (rc >= 0) & np.where(rc == 2, (rc_n >= 1) & (method >= 0), True)
    mods = cols["recompute.modules"].astype(np.int64)
    valid &= np.where(rc == 1, mods < 8, True)
    period = cols["recompute.matmul_period"].astype(np.int64)
    valid &= np.where(rc == 3, period >= 0, True)
    dist = cols["optimizer.distributed"].astype(bool)
    opg = cols["optimizer.overlap_param_gather"].astype(bool)
    bucket = cols["data_parallel.bucket_mb"].astype(float)
    grad_bytes = cols["optimizer.grad_reduce_dtype"].astype(float)
    dp_kind = cols["data_parallel.kind"].astype(np.int64)
    fsdp = (dp_kind == 2) & (d > 1)
    prefetch = cols["data_parallel.prefetch"].astype(np.int64)
    valid &= (~opg | dist) & (grad_bytes > 0) & (dp_kind >= 0) & ~(fsdp & opg)
    valid &= np.where(dp_kind == 2, prefetch >= 0, bucket > 0)
    tp_overlap = cols["tensor_parallel.comm_overlap"].astype(bool)
    valid &= ~(tp_overlap & (base.tensor_parallel.size > 1) & (not base.tensor_parallel.sequence_parallel))
    knobs = Knobs(b=np.maximum(b, 1), m=np.maximum(m, 1), sched=np.maximum(sched, 0), v=np.maximum(v, 1),
                  layers=np.maximum(layers, 0), rc=np.maximum(rc, 0), rc_block=method == 1, rc_n=rc_n,
                  sel_attn=(rc == 1) & (mods & 1 > 0), sel_mlp=(rc == 1) & (mods & 2 > 0),
                  sel_norm=(rc == 1) & (mods & 4 > 0), op_period=np.where(rc == 3, np.maximum(period, 0), 0),
                  ogr=np.where(dp_kind == 0, cols["data_parallel.overlap_grad_reduce"].astype(bool), dp_kind == 1),
                  opg=opg, dist=dist,
                  bucket_mb=np.maximum(bucket, 1e-9), grad_bytes=np.maximum(grad_bytes, 1.0), fsdp=fsdp,
                  raf=fsdp & cols["data_parallel.reshard_after_forward"].astype(bool),
                  prefetch=np.where(fsdp, np.maximum(prefetch, 0), 0), tp_overlap=tp_overlap,
                  p2p_overlap=cols["pipeline_comm.overlap_p2p"].astype(bool), uneven=uneven, chunks=chunks)
    return knobs, valid


def _rank_chunks(base: PlanConfig, kind: np.ndarray, first: np.ndarray, last: np.ndarray, v: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layers per rank (n, pp), the configs whose ranks hold chunks of unequal size and their layers per
    chunk (``Knobs.uneven``, ``Knobs.chunks``), and whether the split is valid, by the one split rule
    (``config.rank_chunks``) evaluated once per distinct (kind, first, last, virtual_stages)."""
    combos = np.stack([kind, first, last, v], axis=1).astype(np.int64)
    uniq, inverse = np.unique(combos, axis=0, return_inverse=True)
    table = np.zeros((len(uniq), base.parallel.pp, max(1, int(uniq[:, 3].max()) if len(uniq) else 1)), dtype=np.int64)
    ok = np.zeros(len(uniq), dtype=bool)
    for j, (k, f, la, vv) in enumerate(uniq.tolist()):
        if k not in (0, 1) or vv < 1:
            continue
        try:
            split = FirstLastSplit(f, la) if k == 1 else BalancedSplit()
            table[j, :, :vv] = rank_chunks(base.model.num_layers, base.parallel.pp, vv, split)
            ok[j] = True
        except ValueError:
            pass
    inverse = inverse.reshape(-1)
    uneven_combo = np.zeros(len(uniq), dtype=bool)
    uneven_combo[uneven_configs(table, np.maximum(uniq[:, 3], 1))] = True
    uneven = np.flatnonzero(uneven_combo[inverse])
    return table.sum(axis=2)[inverse], uneven, table[inverse[uneven]], ok[inverse]


def space_size(params: Mapping[str, Mapping[str, Any]], base: PlanConfig, float_points: int = 16) -> int:
    fixed = knob_values(base)
    sizes = [len(_expand(names, params, fixed, float_points)) for names in _components(params)]
    return int(np.prod(sizes)) if sizes else 1
