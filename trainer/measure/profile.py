"""``run.profile_step``: one warm-up update recorded with torch.profiler, a Chrome trace per rank.

The trace is the op-level view (every aten op, every gloo/NCCL collective, CUDA kernels on a GPU) that the
phase timeline summarises; open it in https://ui.perfetto.dev or chrome://tracing. Only a warm-up update
may be profiled (``RunConfig`` checks it), so the profiler's own overhead never reaches a measured step time.
"""

from __future__ import annotations

import contextlib
import gzip
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from trainer.measure.result import trace_name


class StepProfiler:
    """Profiles update ``step`` (None: none) of one rank and writes its gzipped trace under ``trace_dir``."""

    def __init__(self, step: int | None, device: torch.device, rank: int, trace_dir: str | Path | None) -> None:
        self.step, self.device, self.rank = step, device, rank
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.trace_file: str | None = None

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[None]:
        if step != self.step:
            yield
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            yield
        self.trace_file = str(self._write(prof))

    def _write(self, prof: torch.profiler.profile) -> Path:
        directory = self.trace_dir or Path(tempfile.mkdtemp(prefix="steptune-trace-"))
        directory.mkdir(parents=True, exist_ok=True)
        out = directory / trace_name(self.rank)
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            # Compressed: a CPU trace of a tiny model is already megabytes of JSON, and it crosses Ray.
            out.write_bytes(gzip.compress(raw.read_bytes(), compresslevel=6))
        return out
