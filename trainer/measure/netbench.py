"""Collective microbenchmark in nccl-tests' output format, on whatever backend the world runs (gloo on CPU).

``python -m trainer.measure.netbench --op all_reduce --nprocs 2`` starts N local ranks (torchrun's variables, like
the trainer's launcher) and prints the table nccl-tests' ``all_reduce_perf`` prints: the ranks and their
hosts, then per message size the out-of-place and in-place time (microseconds), algorithm and bus bandwidth
(GB/s, nccl-tests' conventions). Under torchrun (``RANK`` set) it joins that world instead. The output is
what ``steptune netcal`` reads, so a machine without NCCL walks the same path as a GPU cluster.

Times: each size is run ``warmup`` times untimed, then, after a barrier, ``iters`` times in up to five blocks,
each timed to a device synchronisation; the time of one call is the median block's span over its calls, and the
slowest rank's is reported (a collective is as slow as its last member). torch.distributed has no out-of-place all-reduce, so that
column's call copies the input into a separate output buffer first (NCCL's out-of-place call writes one too).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = ("all_reduce", "reduce_scatter", "all_gather", "sendrecv")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}
"""nccl-tests' bus bandwidth = algorithm bandwidth x this (its docs/PERFORMANCE.md)."""


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    out_of_place_us: float
    in_place_us: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(op: str, size: int, device: torch.device, in_place: bool):
    """A closure running one collective of ``size`` bytes of fp32 (nccl-tests' size: the whole buffer)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    count = max(1, size // 4)
    if op == "all_reduce":
        buf = torch.ones(count, device=device)
        out = buf if in_place else torch.empty_like(buf)
        return lambda: dist.all_reduce(buf if in_place else out.copy_(buf))
    if op in ("reduce_scatter", "all_gather"):
        part = max(1, count // n)
        full = torch.ones(part * n, device=device)
        mine = full[rank * part:(rank + 1) * part] if in_place else torch.ones(part, device=device)
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(full, mine)
        return lambda: dist.reduce_scatter_tensor(mine, full)
    send, recv = torch.ones(count, device=device), torch.empty(count, device=device)

    def sendrecv():
        reqs = [dist.isend(send, (rank + 1) % n), dist.irecv(recv, (rank - 1) % n)]
        for r in reqs:
            r.wait()
    return sendrecv


BLOCKS = 5
"""Timed blocks per size: a size's time is the median over them of a block's time per iteration."""


def _time(fn, iters: int, warmup: int, device: torch.device) -> float:
    """Microseconds per call: the ``iters`` calls in up to ``BLOCKS`` blocks, each timed to a device sync, the
    median block's time per call, the slowest rank's. nccl-tests averages one block; on a shared host one
    preempted call then moves a latency-bound size's mean several-fold (a busy neighbour made 8-byte all-reduces
    look slower than 16 MB ones), and not the median of five blocks. Blocks, not single calls, keep a sync per
    call from inflating a GPU's small-message latency."""
    for _ in range(warmup):
        fn()
    _sync(device)
    dist.barrier()
    blocks = min(iters, BLOCKS)
    per_call = []
    for b in range(blocks):
        n = iters // blocks + (1 if b < iters % blocks else 0)
        start = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(device)
        per_call.append((time.perf_counter() - start) / n)
    elapsed = torch.tensor([statistics.median(per_call) * 1e6])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def sizes_between(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' -b/-e/-f: min_bytes, x factor, ... up to max_bytes."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError("netbench: need 4 <= min_bytes <= max_bytes and factor >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def bench(op: str, sizes: list[int], iters: int, warmup: int, device: torch.device) -> list[Row]:
    """Every size, out-of-place then in-place, on the current world."""
    n = dist.get_world_size()
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        if op in ("reduce_scatter", "all_gather"):
            count = max(1, count // n)  # nccl-tests prints the per-rank count for these
        rows.append(Row(size, count, _time(_call(op, size, device, False), iters, warmup, device),
                        _time(_call(op, size, device, True), iters, warmup, device)))
    return rows


def format_table(op: str, rows: list[Row], ranks: list[tuple[str, str, int]], args: str) -> str:
    """The rows as nccl-tests prints them (header, '# Using devices', the table, the closing lines)."""
    """``ranks``: (host, device name, pid) per rank."""
    n = len(ranks)
    lines = [f"# Collective test starting: {op}_perf", f"# {args}", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10} device {r:2d} [cpu] {dev}"
              for r, (host, dev, pid) in enumerate(ranks)]
    lines += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
              f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  "
              f"{'busbw':>6}  {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}",
              f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
              f"{'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}"]
    redop = "none" if op in ("all_gather", "sendrecv") else "sum"
    bus = []
    for r in rows:
        cells = []
        for t in (r.out_of_place_us, r.in_place_us):
            alg = r.size_bytes / (t * 1e-6) / 1e9
            bus.append(alg * BUS_FACTOR[op](n))
            cells.append(f"{t:7.1f}  {alg:6.2f}  {bus[-1]:6.2f}  {0:6d}")
        lines.append(f"  {r.size_bytes:>10}  {r.count:>12}  {'float':>8}  {redop:>6}  {-1:>6}  " + "  ".join(cells))
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4f}", "#"]
    return "\n".join(lines) + "\n"


def run_on_world(op: str, sizes: list[int], iters: int, warmup: int, args: str) -> str | None:
    """Benchmark on the current world; rank 0 gets the table, the others None."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    rows = bench(op, sizes, iters, warmup, device)
    names: list = [None] * dist.get_world_size()
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{dist.get_backend()} CPU"
    dist.all_gather_object(names, (socket.gethostname(), dev, os.getpid()))
    if dist.get_rank() != 0:
        return None
    return format_table(op, rows, names, args)


def _free_port() -> int:
    # trainer.launch has the same three lines; a measurement imports no entry point (trainer/__init__.py).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_rank(rank: int, world: int, port: int, ns: argparse.Namespace, out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        text = run_on_world(ns.op, sizes_between(ns.min_bytes, ns.max_bytes, ns.factor), ns.iters, ns.warmup,
                            _describe(ns, world))
        if text is not None:
            with open(out, "w") as f:
                f.write(text)
    finally:
        dist.destroy_process_group()


def _describe(ns: argparse.Namespace, world: int) -> str:
    return (f"steptune netbench: {world} ranks, minBytes {ns.min_bytes} maxBytes {ns.max_bytes} "
            f"step: {ns.factor}(factor) warmup iters: {ns.warmup} iters: {ns.iters}")


def measure_local(op: str, nprocs: int, min_bytes: int = 8, max_bytes: int = 16 << 20, factor: int = 4,
                  iters: int = 10, warmup: int = 3) -> str:
    """Run the benchmark on ``nprocs`` local gloo ranks and return rank 0's table."""
    import tempfile

    import torch.multiprocessing as mp

    if op not in OPS:
        raise ValueError(f"netbench: op must be one of {', '.join(OPS)}, not {op!r}")
    if nprocs < 2:
        raise ValueError("netbench: nprocs must be >= 2 (a collective needs a group)")
    ns = argparse.Namespace(op=op, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, iters=iters,
                            warmup=warmup)
    sizes_between(min_bytes, max_bytes, factor)  # bad sizes fail here, before any process starts
    with tempfile.TemporaryDirectory(prefix="netbench-") as d:
        out = os.path.join(d, "table.txt")
        mp.start_processes(_local_rank, args=(nprocs, _free_port(), ns, out), nprocs=nprocs, start_method="spawn")
        with open(out) as f:
            return f.read()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.measure.netbench", description=__doc__.split("\n")[0])
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("--nprocs", type=int, default=2, help="local ranks to start (ignored under torchrun)")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    ns = p.parse_args(argv)
    try:
        if "RANK" in os.environ:  # under torchrun: join its world
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            text = run_on_world(ns.op, sizes_between(ns.min_bytes, ns.max_bytes, ns.factor), ns.iters, ns.warmup,
                                _describe(ns, dist.get_world_size()))
            dist.destroy_process_group()
        else:
            text = measure_local(ns.op, ns.nprocs, ns.min_bytes, ns.max_bytes, ns.factor, ns.iters, ns.warmup)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if text:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
