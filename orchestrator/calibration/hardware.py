"""Which hardware a calibration file measured, and a warning when it is asked about other hardware.

``steptune profile`` writes ``provenance.hardware`` (the GPU's name, or ``CPU: <model name>``), ``torch``,
``backend`` (nccl or gloo) and the peak of the cluster file it was fitted against (``cluster_peak_tflops``).
``mismatch`` compares that with what a prediction is for: the cluster the planner is given (``plan``, the
model backend: a different peak is different hardware) or this host (guided search runs its trials here; the
slice proof compares a landscape and slices). A warning, not an error: fitted efficiencies often transfer
roughly, but the reader must know they were not measured on this hardware.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU: " + (platform.processor() or platform.machine())


def this_host() -> str:
    """This machine's accelerator name (the first GPU's), or its CPU model."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no usable torch/CUDA: a CPU host
        pass
    return cpu_model()


def of_results(results: Sequence[Any]) -> str:
    """The GPU's name from trainer results, or this host's CPU model for a CPU run."""
    name = results[0].ranks[0].device_name if results and results[0].ranks else "cpu"
    return cpu_model() if name == "cpu" else name


def identity(results: Sequence[Any], cluster_peak_tflops: float) -> dict[str, Any]:
    """The provenance fields that name the hardware a profile measured."""
    import torch

    hw = of_results(results)
    return {"hardware": hw, "torch": str(torch.__version__), "backend": "gloo" if hw.startswith("CPU") else "nccl",
            "cluster_peak_tflops": float(cluster_peak_tflops)}


def mismatch(prov: Mapping[str, Any], *, host: str | None = None, peak_tflops: float | None = None,
             what: str = "this prediction") -> str | None:
    """One warning line when ``prov`` (a calibration file's provenance) measured other hardware than ``host``
    or than a cluster of ``peak_tflops``; None when they agree or the file does not say."""
    hw = prov.get("hardware")
    if not hw:
        return None
    if host is not None and str(hw) != host:
        return (f"warning: the calibration was measured on {hw} (torch {prov.get('torch', '?')}, "
                f"{prov.get('backend', '?')}), {what} runs on {host}: its efficiencies are not this hardware's")
    peak = prov.get("cluster_peak_tflops")
    if peak_tflops is not None and isinstance(peak, (int, float)) and abs(peak / peak_tflops - 1.0) > 0.01:
        return (f"warning: the calibration was measured on {hw} (a cluster of {peak:g} TFLOP/s peak per device), "
                f"{what} is for a cluster of {peak_tflops:g} TFLOP/s: its efficiencies are not this hardware's")
    return None


def file_mismatch(path: str | Path, **kw: Any) -> str | None:
    """``mismatch`` for a calibration file on disk (no provenance: None)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    prov = data.get("provenance") if isinstance(data, Mapping) else None
    return mismatch(prov, **kw) if isinstance(prov, Mapping) else None
