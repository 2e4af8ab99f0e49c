"""The network, measured: nccl-tests output -> the planner's bandwidth and latency per tier, with provenance.

nccl-tests (``all_reduce_perf``, ``reduce_scatter_perf``, ``all_gather_perf``, ``sendrecv_perf``) print a
header naming every rank's host and device, then one row per message size: size, count, type, redop, root,
and time / algbw / busbw / #wrong for the out-of-place and the in-place call. ``parse`` reads that text (and
nothing else: any other line inside the table is an error naming the file and line), ``fit`` turns the
tables into the planner's alpha-beta parameters with the planner's own collective formulas
(``orchestrator.planner.comm``), and ``cluster_file`` writes them over a base cluster file with
``provenance: {basis: measured, ...}``.

The fit: every point (size, time) of a table predicts time = hops x alpha + volume / bus bandwidth, where
hops and volume are what ``comm`` charges for that collective over that group; alpha and 1 / bandwidth are
found by least squares on the relative error, so the small sizes (latency) weigh as much as the large ones
(bandwidth). A table whose ranks sit on one host measures the intra-node tier; one spanning hosts measures
the inter-node tier, whose per-GPU bandwidth is the bus bandwidth over the group's members per node
(``comm.bus_bandwidth``: each node pushes the traffic through its members' NICs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "sendrecv")
TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "half": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
              "int32": 4, "uint32": 4, "int": 4, "float": 4, "int64": 8, "uint64": 8, "double": 8}
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\w+?)(?:_perf)?\s*$")
_NCCL_LOG = re.compile(r"\bNCCL (INFO|WARN)\b")


@dataclass(frozen=True)
class Point:
    size_bytes: int
    """The message size nccl-tests prints (the whole buffer: for all-gather / reduce-scatter, all ranks' parts)."""
    time_us: float
    in_place: bool


@dataclass(frozen=True)
class Table:
    """One nccl-tests run: which collective, over which ranks on which hosts, and its measured points."""
    source: str
    collective: str
    hosts: tuple[str, ...]
    """The host of each rank, in rank order."""
    devices: tuple[str, ...]
    """Distinct device names, as printed."""
    points: tuple[Point, ...]
    repeats: int = 1
    """How many runs of the collective the points pool (``pooled``): ``source`` names the first."""

    @property
    def ranks(self) -> int:
        return len(self.hosts)

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    @property
    def tier(self) -> str:
        return "intra_node" if self.nodes == 1 else "inter_node"


def _collective_from(name: str) -> str | None:
    for c in COLLECTIVES:
        if c in name:
            return c
    return None


def parse(text: str, source: str, collective: str | None = None) -> Table:
    """One nccl-tests output -> a ``Table``; ValueError naming ``source:line`` for anything malformed.

    The collective comes from ``collective``, else the output's "Collective test starting" line, else the
    file name (``all_reduce_perf.txt``); nccl-tests' table alone cannot tell all-reduce from reduce-scatter.
    """
    lines = text.splitlines()
    hosts: dict[int, str] = {}
    devices: list[str] = []
    columns: list[str] | None = None
    points: list[Point] = []
    closed = False
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        where = f"{source}:{no}"
        if not line or _NCCL_LOG.search(line):
            continue
        if line.startswith("#"):
            if m := _RANK.match(line):
                hosts[int(m.group(1))] = m.group(2)
                if m.group(3).strip() not in devices:
                    devices.append(m.group(3).strip())
            elif m := _STARTING.match(line):
                collective = collective or _collective_from(m.group(1))
            elif line.lstrip("# ").startswith("size") and "time" in line and "busbw" in line:
                columns = line.lstrip("#").split()
            elif line.startswith("# Avg bus bandwidth"):
                closed = True
            continue
        if columns is None:
            continue  # launcher output before nccl-tests' header
        if closed:
            raise ValueError(f"{where}: a row after the closing '# Avg bus bandwidth' line: {raw.strip()!r}")
        points += _row(line.split(), columns, where)
    where = f"{source}:{len(lines)}"
    if columns is None:
        raise ValueError(f"{where}: no nccl-tests table header ('#  size  count  type ... time  algbw  busbw') "
                         f"found: is this the output of all_reduce_perf / all_gather_perf / reduce_scatter_perf "
                         f"/ sendrecv_perf?")
    if not closed:
        raise ValueError(f"{where}: the output ends before nccl-tests' closing '# Avg bus bandwidth' line "
                         f"(a truncated run?); rerun it to the end")
    if not points:
        raise ValueError(f"{where}: the table has no rows")
    if not hosts or sorted(hosts) != list(range(len(hosts))):
        raise ValueError(f"{source}: the '# Using devices' header must list ranks 0..N-1 with their hosts "
                         f"(found ranks {sorted(hosts)})")
    collective = collective or _collective_from(Path(source).name)
    if collective not in COLLECTIVES:
        raise ValueError(f"{source}: cannot tell which collective this is; name the file after the program "
                         f"(e.g. all_reduce_perf.txt) or write it as COLLECTIVE=FILE, one of {', '.join(COLLECTIVES)}")
    table = Table(source, collective, tuple(hosts[r] for r in range(len(hosts))), tuple(devices), tuple(points))
    counts = {h: table.hosts.count(h) for h in set(table.hosts)}
    if len(set(counts.values())) != 1:
        raise ValueError(f"{source}: ranks are spread unevenly over hosts ({counts}); run one rank per GPU on "
                         f"every node of the group")
    return table


def _row(tokens: list[str], columns: list[str], where: str) -> list[Point]:
    if len(tokens) != len(columns):
        raise ValueError(f"{where}: expected {len(columns)} columns ({' '.join(columns)}), got {len(tokens)}: "
                         f"{' '.join(tokens)!r} (a truncated or interleaved line?)")
    idx = {name: [i for i, c in enumerate(columns) if c == name] for name in ("size", "type", "time", "#wrong", "error")}
    wrong = idx["#wrong"] or idx["error"]
    try:
        size = int(tokens[idx["size"][0]])
        times = [float(tokens[i]) for i in idx["time"]]
    except (ValueError, IndexError):
        raise ValueError(f"{where}: size and time must be numbers: {' '.join(tokens)!r}") from None
    for i in wrong:
        if tokens[i] not in ("0", "N/A") and not _is_zero(tokens[i]):
            raise ValueError(f"{where}: {tokens[i]} wrong values at {size} B: the collective's results are "
                             f"corrupt; fix the fabric before calibrating to it")
    if size <= 0 or any(t <= 0 or not math.isfinite(t) for t in times):
        raise ValueError(f"{where}: size and times must be positive: {' '.join(tokens)!r}")
    return [Point(size, t, in_place=k == 1) for k, t in enumerate(times)]


def _is_zero(token: str) -> bool:
    try:
        return float(token) == 0.0
    except ValueError:
        return False


# ---- the fit -----------------------------------------------------------------------------------------

def hops_and_volume(collective: str, n: int, size_bytes: float) -> tuple[float, float]:
    """Latency hops and bytes over the bus bandwidth that ``orchestrator.planner.comm`` charges."""
    if collective == "sendrecv":
        return 1.0, size_bytes
    if n <= 1:
        return 0.0, 0.0
    if collective == "all_reduce":
        # comm.all_reduce_time takes the faster of ring and tree, which differ in hops only.
        return float(min(2 * (n - 1), 2 * math.ceil(math.log2(n)))), 2.0 * (n - 1) / n * size_bytes
    return float(n - 1), (n - 1) / n * size_bytes


@dataclass(frozen=True)
class TierFit:
    tier: str
    """``intra_node`` or ``inter_node``: which cluster fields it sets."""
    bw_GBps: float
    """Per-GPU bandwidth as the cluster file states it (for inter-node: the bus bandwidth over members per node)."""
    latency_us: float
    rel_rms: float
    """Root-mean-square relative error of the fit over all its points."""
    tables: tuple[Table, ...]
    table_rel_rms: tuple[float, ...] = ()
    """The same error over each table's own points, in ``tables``' order."""


FIT_WARN = 0.20
"""A table whose own fit error (RMS relative) is above this is flagged: the formulas do not describe it, or
the host was too busy to measure it."""
LATENCY_SHARE = 0.1
"""A point belongs to the latency regime when the fitted bandwidth term is under this share of its time."""


def _rows(t: Table) -> list[tuple[float, float, float]]:
    """(hops, bytes over the per-GPU bandwidth, seconds) per point, with the planner's formulas."""
    # A send-receive is one flow per GPU; a collective spanning nodes runs one ring per member's NIC, and bus
    # bandwidth = per-GPU bandwidth x members per node (comm.bus_bandwidth).
    per_node = 1 if t.tier == "intra_node" or t.collective == "sendrecv" else t.ranks_per_node
    n = t.ranks if t.collective != "sendrecv" else 2
    out = []
    for p in t.points:
        hops, vol = hops_and_volume(t.collective, n, p.size_bytes)
        out.append((hops, vol / per_node, p.time_us * 1e-6))
    return out


def _fit_tier(rows: np.ndarray) -> tuple[float, float]:
    """(alpha s per hop, seconds per byte) for rows of (hops, bytes, seconds).

    Two regimes, each fitted where it dominates: a first joint least-squares fit on the relative error says
    which points are latency-bound (bandwidth term under ``LATENCY_SHARE`` of the time); alpha is the median
    of their time per hop (robust to the odd slow repetition of a tiny message), and the bandwidth is then
    fitted, alpha held, on the relative error of the rest. A table with no latency-bound point keeps the
    joint fit's alpha.
    """
    h, v, t = rows[:, 0], rows[:, 1], rows[:, 2]
    a = np.stack([h / t, v / t], axis=1)
    coef, *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    alpha, inv_bw = float(coef[0]), float(coef[1])
    if alpha < 0:  # latency cannot be negative: refit bandwidth alone
        alpha, inv_bw = 0.0, float(np.linalg.lstsq(a[:, 1:], np.ones(len(t)), rcond=None)[0][0])
    if inv_bw <= 0:
        return alpha, inv_bw
    small = (v * inv_bw < LATENCY_SHARE * t) & (h > 0)
    if small.any():
        alpha = float(np.median(t[small] / h[small]))
        big = ~small
        if big.any():
            x, y = v[big] / t[big], 1.0 - alpha * h[big] / t[big]
            inv_bw = float(np.dot(x, y) / np.dot(x, x))
    return alpha, inv_bw


class FlatTimes(ValueError):
    """A tier whose times do not grow with the message size: its bandwidth cannot be fitted. ``sources`` are the
    tier's tables; a table just measured on a busy host can be measured again (``run``)."""

    def __init__(self, sources: tuple[str, ...]):
        super().__init__(f"{', '.join(sources)}: the times do not grow with the size; cannot fit a bandwidth "
                         f"(measure sizes up to at least a few hundred MB)")
        self.sources = sources


def fit(tables: list[Table]) -> dict[str, TierFit]:
    """Alpha-beta per tier, jointly over every table of that tier (see the module docstring and ``_fit_tier``);
    each table's own fit error is kept (``TierFit.table_rel_rms``)."""
    out = {}
    for tier in ("intra_node", "inter_node"):
        mine = [t for t in tables if t.tier == tier]
        if not mine:
            continue
        per_table = [np.array(_rows(t)) for t in mine]
        rows = np.concatenate(per_table)
        alpha, inv_bw = _fit_tier(rows)
        # The bandwidth term must explain a real part of the largest message's time, or it is fitted noise.
        if inv_bw <= 0 or float(np.max(rows[:, 1] / rows[:, 2])) * inv_bw < 0.1:
            raise FlatTimes(tuple(t.source for t in mine))

        def rms(r: np.ndarray) -> float:
            rel = (alpha * r[:, 0] + inv_bw * r[:, 1]) / r[:, 2] - 1.0
            return float(np.sqrt(np.mean(rel ** 2)))

        out[tier] = TierFit(tier, 1e-9 / inv_bw, alpha * 1e6, rms(rows), tuple(mine),
                            tuple(rms(r) for r in per_table))
    return out


def pooled(tables: list[Table]) -> Table:
    """Repeated measurements of one collective over the same ranks as one table: per message size, the median of
    every repeat's out-of-place and in-place times (a preempted call moves one repeat, not the median). The first
    table's source, and the number of repeats. ValueError for tables of different collectives or ranks."""
    first = tables[0]
    if any((t.collective, t.hosts) != (first.collective, first.hosts) for t in tables):
        raise ValueError(f"{first.source}: repeats must measure one collective over the same ranks")
    if len(tables) == 1:
        return first
    by_size: dict[int, list[float]] = {}
    for t in tables:
        for pt in t.points:
            by_size.setdefault(pt.size_bytes, []).append(pt.time_us)
    points = tuple(Point(size, float(np.median(times)), False) for size, times in sorted(by_size.items()))
    return Table(first.source, first.collective, first.hosts, first.devices, points, len(tables))


def bad_tables(fits: dict[str, TierFit]) -> list[tuple[str, float]]:
    """(source, fit error) of every table whose fit error is over ``FIT_WARN``, the worst first."""
    bad = [(t.source, e) for f in fits.values() for t, e in zip(f.tables, f.table_rel_rms) if e > FIT_WARN]
    return sorted(bad, key=lambda x: -x[1])


STABLE = 0.02
"""A repeated table whose pooled fit error moved by less than this over its last two runs has stopped narrowing:
its runs agree, and what is left is the collective's own shape, which more runs will not change."""


def off_the_line(t: Table, f: TierFit, top: int = 2) -> str:
    """The sizes where ``t`` is farthest from its tier's line: ``512 KiB: 549 us measured, 735 us on the line``."""
    rows = np.array(_rows(t))
    line = f.latency_us * 1e-6 * rows[:, 0] + rows[:, 1] / (f.bw_GBps * 1e9)
    rel = line / rows[:, 2] - 1.0
    worst = np.argsort(-np.abs(rel))[:top]
    return "; ".join(f"{t.points[i].size_bytes} B: {rows[i, 2] * 1e6:.0f} us measured, {line[i] * 1e6:.0f} us on "
                     f"the line" for i in sorted(worst))


def fit_warnings(fits: dict[str, TierFit]) -> list[str]:
    """One line per table whose own fit error is over ``FIT_WARN``."""
    return [f"warning: {Path(t.source).name} ({t.collective}, {f.tier}): fit error {e:.0%} > {FIT_WARN:.0%}: the "
            f"latency + bytes/bandwidth line does not describe it (a busy host? measure again, or with more "
            f"iterations)" for f in fits.values() for t, e in zip(f.tables, f.table_rel_rms) if e > FIT_WARN]


# ---- the cluster file ---------------------------------------------------------------------------------

TIER_FIELDS = {"intra_node": ("intra_node_bw_GBps", "intra_node_latency_us"),
               "inter_node": ("inter_node_bw_GBps", "inter_node_latency_us")}
def measured_efficiencies(cluster: dict, tiers: set[str]) -> tuple[str, ...]:
    """The planner's bandwidth efficiencies that become 1 once ``tiers`` are measured: each kind of traffic
    whose every link in this cluster is a measured one (nccl-tests' bus bandwidth is what was achieved).

    Tensor parallelism stays in a node: ``tp_bw_eff`` with the intra-node tier. Data- and pipeline-parallel
    groups stay in a node when the whole job does (``num_gpus <= gpus_per_node``), else they cross nodes:
    ``dp_bw_eff`` and ``pp_bw_eff`` with the inter-node tier, or with the intra-node tier on one node.
    """
    one_node = int(cluster.get("num_gpus", 8)) <= int(cluster.get("gpus_per_node", 8))
    out = ["tp_bw_eff"] if "intra_node" in tiers else []
    if "inter_node" in tiers or (one_node and "intra_node" in tiers):
        out += ["dp_bw_eff", "pp_bw_eff"]
    return tuple(out)


def cluster_file(base: dict, fits: dict[str, TierFit], when: str, command: str) -> dict:
    """``base`` (a cluster file's mapping) with the measured tiers written over it, and their provenance.

    nccl-tests' bus bandwidth is what the collectives achieved, so the bandwidth efficiencies of the traffic
    that runs over measured tiers only become 1 (``measured_efficiencies``; the planner multiplies them onto
    the cluster's bandwidth); a tier not measured keeps the base file's values and is listed as a prior.
    """
    cluster = dict(base.get("cluster") or {})
    efficiency = dict(base.get("efficiency") or {})
    measured, sources = [], []
    for tier, f in fits.items():
        bw, lat = TIER_FIELDS[tier]
        cluster[bw], cluster[lat] = round(f.bw_GBps, 4), round(f.latency_us, 3)
        measured += [bw, lat]
        for t, err in zip(f.tables, f.table_rel_rms):
            sizes = [p.size_bytes for p in t.points]
            sources.append({"file": t.source, "repeats": t.repeats, "collective": t.collective, "tier": tier,
                            "ranks": t.ranks,
                            "nodes": t.nodes, "ranks_per_node": t.ranks_per_node, "devices": list(t.devices),
                            "sizes_bytes": [min(sizes), max(sizes)], "points": len(t.points),
                            "fit_rel_rms": round(err, 4), "tier_fit_rel_rms": round(f.rel_rms, 4)})
    efficiency.update({e: 1.0 for e in measured_efficiencies(cluster, set(fits))})
    priors = [k for fields in TIER_FIELDS.values() for k in fields if k not in measured]
    return {"cluster": cluster, "efficiency": efficiency,
            "provenance": {"basis": "measured", "measured": measured, "priors": priors,
                           "note": "bandwidth/latency fitted to nccl-tests output by steptune netcal; the measured "
                                   "tiers' bandwidth efficiencies are 1: bus bandwidth is what was achieved",
                           "date": when, "command": command, "sources": sources}}


# ---- the command ----------------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("files", nargs="*", metavar="[COLLECTIVE=]FILE",
                   help="the standard output of nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf or "
                        "sendrecv_perf; the collective is read from the output's '# Collective test starting' line "
                        "or the file name, or given as COLLECTIVE=FILE")
    p.add_argument("--base", required=True, metavar="FILE",
                   help="the cluster file whose network fields are replaced, everything else kept "
                        "(e.g. search_spaces/clusters/h100-sxm.yaml)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the cluster file to write; a malformed or truncated input writes nothing and names the "
                        "file and line")
    p.add_argument("--measure", type=int, default=0, metavar="N",
                   help="first measure N local ranks with python -m trainer.measure.netbench (gloo on CPU) and fit those "
                        "tables with the files given; they are saved beside --out")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter", metavar="OPS",
                   help="the collectives --measure runs, comma-separated")
    p.add_argument("--repeats", type=int, default=3, metavar="R",
                   help="--measure: runs of each collective, pooled per message size by the median (default: 3)")
    p.add_argument("--max-repeats", type=int, default=9, metavar="R",
                   help="--measure: while a table's fit error is over 20%%, or its times do not grow with the size "
                        "(a burst of load), measure it again, up to this many runs in all (default: 9); past it the "
                        "output says which table and why")


def _split(arg: str) -> tuple[str | None, str]:
    name, sep, path = arg.partition("=")
    return (name, path) if sep and name in COLLECTIVES else (None, arg)


def run(args) -> int:
    """``steptune netcal``: parse, fit, write the cluster file, print what was measured."""
    import datetime
    import os
    import sys

    import yaml

    from orchestrator.calibration.prefilter import load_cluster

    out = Path(args.out)
    base = Path(args.base)
    load_cluster(base)  # a bad base file fails before anything is measured
    if not args.files and not args.measure:
        raise ValueError("netcal: give nccl-tests output files, or --measure N to measure local ranks")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if bad := [o for o in ops if o not in COLLECTIVES]:
        raise ValueError(f"--ops: {bad[0]!r} is not one of {', '.join(COLLECTIVES)}")
    inputs = [_split(a) for a in args.files]
    for _, path in inputs:
        if not Path(path).is_file():
            raise ValueError(f"netcal: {path}: no such file")
    if not 1 <= args.repeats <= args.max_repeats:
        raise ValueError(f"--repeats {args.repeats} / --max-repeats {args.max_repeats}: need 1 <= repeats <= max-repeats")
    tables = [parse(Path(p).read_text(), p, c) for c, p in inputs]
    measured: dict[str, list[Table]] = {}
    if args.measure:
        from trainer.measure.netbench import measure_local

        def one(op: str) -> None:
            k = len(measured.setdefault(op, []))
            path = out.with_name(f"{out.stem}.{op}_perf{'' if k == 0 else f'.{k + 1}'}.txt")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(measure_local(op, args.measure))
            measured[op].append(parse(path.read_text(), str(path), op))

        for _ in range(args.repeats):
            for op in ops:  # interleaved, so a burst of load hits every collective alike
                one(op)

    def refit() -> dict[str, TierFit]:
        """The fit of every table; a tier whose measured times came out flat (a burst of load over the large
        sizes) is measured again, up to --max-repeats, before the error stands."""
        while True:
            try:
                return fit(tables + [pooled(v) for v in measured.values()])
            except FlatTimes as e:
                again = [op for op, v in measured.items() if any(s.startswith(v[0].source) for s in e.sources)
                         and len(v) < args.max_repeats]
                if not again:
                    raise
                print(f"{', '.join(Path(s).name for s in e.sources)}: the times do not grow with the size; "
                      f"measuring {', '.join(again)} again (run {min(len(measured[o]) for o in again) + 1} of at "
                      f"most {args.max_repeats})")
                for op in again:
                    one(op)

    fits = refit()

    def err_of(op: str) -> float:
        return next(e for f in fits.values() for t, e in zip(f.tables, f.table_rel_rms)
                    if t.source.startswith(measured[op][0].source))

    history = {op: [err_of(op)] for op in measured}  # per collective, its pooled table's fit error after each run
    settled: dict[str, str] = {}  # collective -> why it is measured no more
    while todo := [op for op in measured if err_of(op) > FIT_WARN and op not in settled]:
        op = max(todo, key=err_of)
        h = history[op]
        if len(measured[op]) >= args.max_repeats:
            settled[op] = f"still after {len(measured[op])} runs (--max-repeats)"
        elif len(h) >= 3 and max(h[-3:]) - min(h[-3:]) < STABLE:
            settled[op] = (f"its runs agree (the pooled table's fit error held at {h[-1]:.0%} over its last runs): "
                           f"what is left is the collective's own shape, which more runs will not change")
        else:
            print(f"{Path(measured[op][0].source).name} x{len(measured[op])}: fit error {h[-1]:.0%} > {FIT_WARN:.0%}; "
                  f"measuring {op} again (run {len(measured[op]) + 1} of at most {args.max_repeats})")
            one(op)
            fits = refit()
            h.append(err_of(op))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = cluster_file(yaml.safe_load(base.read_text()) or {}, fits, when, "steptune netcal " + " ".join(
        sys.argv[2:] if len(sys.argv) > 2 else args.files))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(f"# Written by steptune netcal from {base}; the network fields are measured (see provenance).\n"
                   + yaml.safe_dump(doc, sort_keys=False))
    try:
        load_cluster(tmp)  # what is written must load as a cluster file
    except ValueError:
        tmp.unlink()
        raise
    os.replace(tmp, out)
    print(f"{'tier':<11} {'GB/s per GPU':>12} {'latency us':>10} {'fit rms':>8}  tables (each with its own fit rms)")
    for f in fits.values():
        print(f"{f.tier:<11} {f.bw_GBps:12.4g} {f.latency_us:10.4g} {f.rel_rms:8.1%}  " + ", ".join(
            f"{t.collective} x{t.ranks} on {t.nodes} node(s) ({Path(t.source).name}"
            f"{f', {t.repeats} runs pooled' if t.repeats > 1 else ''}: {e:.1%})"
            for t, e in zip(f.tables, f.table_rel_rms)))
    for f in fits.values():
        for t, e in zip(f.tables, f.table_rel_rms):
            if e <= FIT_WARN:
                continue
            op = next((o for o, v in measured.items() if v[0].source in t.source), None)
            print(f"warning: {Path(t.source).name} ({t.collective}, {f.tier}): fit error {e:.0%} > {FIT_WARN:.0%}"
                  + (f"; {settled[op]}" if op in settled else "")
                  + f"; farthest from latency + bytes / bandwidth at {off_the_line(t, f)}", file=sys.stderr)
    print(f"wrote {out} (basis: measured; priors kept from {base.name}: "
          f"{', '.join(doc['provenance']['priors']) or 'none'})")
    return 0
