"""A stable fit: each slice measured several times, fitted on robust figures, with each parameter's uncertainty.

``steptune profile`` runs every slice ``--repeats`` rounds (all slices once, then again, so a burst of load hits
them alike). The compute fit takes each slice's median run (``median_run``: a real run, so its phases and
memory belong together); ``compute_intervals`` bootstraps the fit over the runs (one run per slice drawn at
random, refitted) for each parameter's 90% interval, and ``unpinned`` refuses a fit whose interval is wider
than ``COMPUTE_PIN``, naming the slice that scatters most. The data-parallel side does the same in
``orchestrator.plan.commfit``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from orchestrator.plan.slices import SlicePlan


COMPUTE_PIN = {"matmul_eff": 0.5, "flash_attention_eff": 0.5, "elementwise_bw_eff": 0.5, "optimizer_bw_eff": 0.5,
               "op_overhead_us": 0.5}
"""Largest accepted half-width of a compute parameter's bootstrap 90% interval, relative to its value (with a
floor of 50 us for the per-layer overhead, which may fit to 0). Memory and the GEMM half-size are not checked."""


def compute_intervals(ran: SlicePlan, runs: Mapping[str, Sequence[Any]],
                      fit: Callable[[list[Any]], Mapping[str, float]], n_boot: int,
                      seed: int = 0) -> dict[str, tuple[float, float]]:
    """Bootstrap over runs: each round picks one run per slice at random and refits (``fit``: results in the
    plan's order -> fitted parameters, e.g. ``profile.fit_slices``'); the 5th-95th percentile of each."""
    import random

    import numpy as np

    rng = random.Random(seed)
    boots = [fit([rng.choice(list(runs[s.name])) for s in ran.slices]) for _ in range(n_boot)]
    return {k: (float(np.percentile([b[k] for b in boots], 5)), float(np.percentile([b[k] for b in boots], 95)))
            for k in boots[0]} if boots else {}


def unpinned(values: Mapping[str, float], intervals: Mapping[str, tuple[float, float]],
             runs: Mapping[str, Sequence[Any]]) -> str | None:
    """Why the compute fit may not be written (a parameter whose interval is too wide, and the slice whose runs
    scatter most, to measure again), or None."""
    for k, pin in COMPUTE_PIN.items():
        if k not in intervals or k not in values:
            continue
        lo, hi = intervals[k]
        floor = 50.0 if k == "op_overhead_us" else 0.0
        if (hi - lo) / 2 > pin * max(abs(values[k]), floor):
            def spread(rs: Sequence[Any]) -> float:
                t = sorted(float(r.summary.step_time_s) for r in rs)
                return (t[-1] - t[0]) / t[len(t) // 2] if len(t) > 1 else 0.0
            worst = max((n for n in runs if runs[n]), key=lambda n: spread(runs[n]))
            return (f"{k} is not pinned down: bootstrap 90% interval {lo:.4g} to {hi:.4g} around {values[k]:.4g} "
                    f"(wider than {pin:.0%}); slice {worst} scatters most from run to run "
                    f"({spread(runs[worst]):.0%}): measure it more often (--repeats) or on a quieter machine")
    return None


def median_run(runs: Sequence[Any]) -> Any:
    """The run whose step time is the median of a slice's runs (the lower middle of an even count): a real run,
    so its phases and memory belong together."""
    ordered = sorted(runs, key=lambda r: float(r.summary.step_time_s))
    return ordered[(len(ordered) - 1) // 2]
