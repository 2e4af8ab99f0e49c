"""Measurements: device-synchronised phase timers, saved-activation bytes, peak FLOP/s.

Times are taken after a device synchronisation, so on a GPU they cover the work, not its launch. The
accumulator is plain bookkeeping fed with those times; summaries are medians over measured steps.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from collections import defaultdict
from typing import Iterator

try:
    import nvtx  # a no-op without a CUDA profiler attached; torch.cuda.nvtx raises on CPU builds
except ImportError:  # the GPU tier runs on a machine's own torch, without the project's install (tests/gpu)
    nvtx = None
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.model.op_checkpoint import counting_cached_outputs
from trainer.measure.result import Span


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """Per-step phase accumulator for one rank, fed with device-synchronised times."""

    def __init__(self, device: torch.device, keep_spans_for: set[int]) -> None:
        self.device = device
        self.keep = keep_spans_for
        self.totals: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.spans: list[Span] = []
        self.step = -1
        self.step_start = 0.0
        self.marks: dict[int, dict[str, float]] = defaultdict(dict)

    def begin_step(self, step: int) -> float:
        sync(self.device)
        self.step, self.step_start = step, time.perf_counter()
        return self.step_start

    def now(self) -> float:
        return time.perf_counter() - self.step_start

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        sync(self.device)
        start = self.now()
        # Labelled in a torch.profiler trace too (run.profile_step), and only then: no cost on measured updates.
        label = (torch.profiler.record_function(name) if torch.autograd._profiler_enabled()
                 else contextlib.nullcontext())
        with nvtx.annotate(name) if nvtx else contextlib.nullcontext(), label:
            yield
        sync(self.device)
        self.add(name, start, self.now())

    def add(self, name: str, start: float, end: float) -> None:
        self.totals[self.step][name] += end - start
        if self.step in self.keep:
            self.spans.append(Span(self.step, name, start, end))

    def mark(self, name: str, first: bool = True) -> None:
        """Remember a moment of this step (first or last occurrence)."""
        t = self.now()
        marks = self.marks[self.step]
        if not first or name not in marks:
            marks[name] = t

    def medians(self, steps: list[int]) -> dict[str, float]:
        names = {n for s in steps for n in self.totals[s]}
        return {n: statistics.median(self.totals[s].get(n, 0.0) for s in steps) for n in sorted(names)}


class SavedActivations:
    """Peak bytes of tensors saved for backward, via ``torch.autograd.graph.saved_tensors_hooks``.

    Storages are counted once however many ops save them; parameters (and views of them) are not
    activations and are skipped. What recomputation holds transiently inside backward is not counted:
    checkpoint's own hooks take those tensors. A saved tensor stops counting when autograd frees it (its holder is collected), so the peak
    reflects how many microbatches a schedule keeps in flight and what recompute discards. Op-level
    recompute's cached outputs bypass these hooks; its layers report them through ``hold`` instead.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._refs: dict[int, list[int]] = {}

    def reset_peak(self) -> None:
        self.peak = self.live

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), counting_cached_outputs(self):
            yield

    def hold(self, nbytes: int):
        """Count ``nbytes`` held outside autograd's saved tensors (op-level recompute's cache) until the
        returned callable is called."""
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self.live -= nbytes
        return release

    def _pack(self, t: torch.Tensor):
        # Weights (and views of them, like the transpose a Linear saves) are parameters, not activations.
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or t.device.type == "meta":
            return t
        storage = local_storage(t)
        key = storage.data_ptr()
        entry = self._refs.get(key)
        if entry is None:
            self._refs[key] = [1, storage.nbytes()]
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        else:
            entry[0] += 1
        # Held detached: autograd keeps a saved *output* without its grad_fn to avoid a reference cycle,
        # and a hook that held the tensor itself would bring that cycle (and a leak until gc) back.
        return _Held(t.detach(), key, self)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]


def local_storage(t: torch.Tensor):
    """The storage holding this rank's bytes of ``t``: a DTensor (tensor parallelism) is a wrapper whose own
    storage is empty; its local shard is what occupies memory."""
    return (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()


class _Held:
    __slots__ = ("tensor", "key", "owner")

    def __init__(self, tensor: torch.Tensor, key: int, owner: SavedActivations) -> None:
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self) -> None:
        self.owner._release(self.key)


# ---- peak FLOP/s ------------------------------------------------------------------------------

# Dense BF16 tensor-core peaks from the vendors' datasheets (no sparsity), FLOP/s per GPU.
GPU_BF16_PEAK = {"B200": 2.25e15, "H200": 989e12, "H100": 989e12, "A100": 312e12}

_cpu_peak_cache: dict[tuple[int, str], float] = {}


def peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s per rank, its basis). An unknown GPU or precision gives None: no MFU, never a guess."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if precision != "bf16":
            return None, f"no declared {precision} peak for {name}: MFU not computed"
        for key, peak in GPU_BF16_PEAK.items():
            if key in name:
                return peak, f"{key} dense BF16 datasheet peak {peak / 1e12:.0f} TFLOP/s ({name})"
        return None, f"unknown GPU {name!r}: no declared peak, MFU not computed"
    threads = torch.get_num_threads()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    key = (threads, precision)
    if key not in _cpu_peak_cache:
        _cpu_peak_cache[key] = _measure_cpu_matmul(dtype)
    peak = _cpu_peak_cache[key]
    return peak, (f"measured CPU peak: best of 5 {precision} 512x512x512 matmuls on {threads} thread(s), "
                  f"{peak / 1e9:.1f} GFLOP/s")


def _measure_cpu_matmul(dtype: torch.dtype, n: int = 512) -> float:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def process_peak_rss_bytes() -> int:
    """High-water mark of this process's resident memory since it started (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
