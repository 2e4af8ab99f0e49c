"""A stable fit: each slice measured in several interleaved rounds, fitted on robust figures, with each fitted
parameter's uncertainty and, when it is too wide, what would narrow it.

``steptune profile`` and ``bench/slice_proof.py`` run every slice once per round, all slices in a new order each
round, so a burst of load hits every slice alike. The fit takes each slice's median run (``median_run``: a real
run, so its phases and memory belong together). ``round_resamples`` draws the bootstrap's resamples: whole
rounds, with replacement, the same draw for every slice, so that what a round shares (the machine's state while
it ran) stays together as it does in a paired comparison. ``unpinned`` names each fitted parameter whose 90%
interval is wider than ``PIN`` allows, the slice that weighs on it most, and how many rounds that slice would
need: an interval narrows as one over the square root of the runs, so ``n (half-width / allowed)^2``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

PIN = {"dp_overlap_eff": ("abs", 0.25)}
"""Largest accepted half-width of a fitted parameter's 90% interval: ``("abs", x)`` in the parameter's own units
(a share of a window), else ``DEFAULT_PIN`` of its value, with ``FLOOR`` for a parameter that may fit near 0."""
DEFAULT_PIN = 0.5
FLOOR = {"op_overhead_us": 50.0, "pass_overhead_us": 50.0, "step_overhead_us": 100.0, "optimizer_tensor_us": 5.0,
         "dp_latency_us": 50.0, "pp_latency_us": 50.0, "gemm_tokens_half": 32.0, "mem_activation_factor": 0.1}


def median_run(runs: Sequence[Any]) -> Any:
    """The run whose step time is the median of a slice's runs (the lower middle of an even count): a real run,
    so its phases and memory belong together."""
    ordered = sorted(runs, key=lambda r: float(r.summary.step_time_s))
    return ordered[(len(ordered) - 1) // 2]


def round_resamples(runs: Mapping[str, Mapping[int, Any]], n: int, seed: int = 0) -> Iterator[dict[str, list[Any]]]:
    """``n`` bootstrap resamples of the rounds: each draws as many rounds as there are, with replacement, and gives
    every slice its runs of the drawn rounds (a round drawn twice counts twice); a slice that ran in none of them
    keeps all its runs."""
    rounds = sorted({r for v in runs.values() for r in v})
    rng = random.Random(seed)
    for _ in range(n):
        drawn = [rng.choice(rounds) for _ in rounds]
        yield {name: [v[r] for r in drawn if r in v] or list(v.values()) for name, v in runs.items()}


@dataclass(frozen=True)
class Unpinned:
    """A fitted parameter the rounds did not pin down, and what would."""

    name: str
    value: float
    low: float
    high: float
    allowed: float
    """The largest accepted half-width."""
    slice: str
    """The slice whose measurement weighs on it most."""
    rounds: int
    """Rounds that slice has."""
    rounds_needed: int
    """Rounds at which the interval would be narrow enough, if it narrows as one over the square root."""

    def text(self) -> str:
        return (f"{self.name} = {self.value:.4g}, 90% interval {self.low:.4g} to {self.high:.4g} (half-width allowed "
                f"{self.allowed:.3g}): measure slice {self.slice} in about {self.rounds_needed} rounds (it has "
                f"{self.rounds}), or on a quieter machine")


def allowed_half_width(name: str, value: float) -> float:
    kind, x = PIN.get(name, ("rel", DEFAULT_PIN))
    return x if kind == "abs" else x * max(abs(value), FLOOR.get(name, 0.0))


def unpinned(values: Mapping[str, float], u: Any, ident: Any, rounds: Mapping[str, int]) -> tuple[Unpinned, ...]:
    """Each fitted parameter (``values``) whose interval over ``u``'s replicates is wider than allowed."""
    out = []
    for name, v in values.items():
        iv = u.field_interval(name, v)
        half, allowed = (iv.high - iv.low) / 2, allowed_half_width(name, v)
        if half > allowed:
            where = ident.weighs_most.get(name, "").split(": ")[0]
            n = rounds.get(where, max(rounds.values(), default=1))
            out.append(Unpinned(name, v, iv.low, iv.high, allowed, where, n,
                                max(n + 1, math.ceil(n * (half / allowed) ** 2))))
    return tuple(out)
