"""What steptune reads from a training framework's own log: one ``Iteration`` per logged iteration, one ``ParsedLog``
per run, with its steady state (warm-up excluded, medians) and a status that says when there is nothing to trust.

Pure: the per-framework parsers (``megatron.parse_log``, ``torchtitan.parse_log``, ``steptune.parse_result``) build
these records from text; nothing here reads a file or starts a process.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

STATUSES = ("ok", "nan", "truncated", "no_iterations", "no_steady_state")
"""ok: iterations past the warm-up and, where the log says how many were asked for, all of them; nan: a logged
loss or grad norm is NaN/inf or the framework counted NaN iterations; truncated: the log stops before the last
iteration asked for (a crash, a kill, a timeout); no_iterations: no iteration line at all (the job never trained
or the log is another framework's); no_steady_state: every logged iteration is inside the warm-up."""


@dataclass(frozen=True)
class Iteration:
    """One logged iteration (Megatron: one line per ``--log-interval``, figures averaged over the interval)."""

    step: int
    """The iteration number the framework printed (1-based in Megatron and torchtitan)."""
    first_step: int
    """The first iteration this line's figures average over (``step`` when the framework logs every one)."""
    time_s: float | None = None
    """Seconds per iteration as the framework measured it; None where its line does not carry it (torchtitan)."""
    loss: float | None = None
    """The language-model loss (Megatron ``lm loss``, torchtitan ``loss``, steptune's step loss)."""
    grad_norm: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    """Every loss column of the line by its printed name (Megatron prints MoE's ``load_balancing_loss`` etc.)."""
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    """A fraction (the framework prints a percentage), on the framework's own peak basis."""
    memory_bytes: int | None = None
    """Peak reserved device memory since the last line (torchtitan); Megatron reports memory on its own lines."""
    skipped: int = 0
    """Iterations the framework skipped in this interval (Megatron: inf/NaN gradients under loss scaling)."""
    nan: int = 0
    """Iterations with a NaN loss the framework counted in this interval."""


@dataclass(frozen=True)
class ParsedLog:
    framework: str
    status: str
    """One of STATUSES."""
    reason: str | None
    """Why, when not ok, in words a user can act on."""
    iterations: list[Iteration]
    warmup: int
    """Iterations excluded as warm-up: a line counts only if every iteration it averages is past them."""
    expected: int | None = None
    """Iterations the run was asked for, where the log (Megatron's ``N/ TOTAL``) or the caller says."""
    memory: dict[str, int] = field(default_factory=dict)
    """Peak device memory in bytes over every rank that reported it (Megatron: allocated, max_allocated,
    reserved, max_reserved; torchtitan: max_reserved; steptune: peak, on its result's peak_memory_basis)."""
    ignored_lines: int = 0
    """Lines that looked like iteration lines but could not be read (reported, never guessed at)."""
    resolution: dict[str, float] = field(default_factory=dict)
    """Half the last digit printed, per metric (loss, grad_norm), where the parser reads it off the printed numbers
    (a declared framework); the built-in frameworks state theirs in their adapter instead."""

    @property
    def steady(self) -> list[Iteration]:
        return [it for it in self.iterations if it.first_step > self.warmup]

    def median(self, name: str) -> float | None:
        """The median of an Iteration field over the steady state (None: not logged there)."""
        vals = [getattr(it, name) for it in self.steady if getattr(it, name) is not None]
        vals = [v for v in vals if math.isfinite(v)]
        return statistics.median(vals) if vals else None

    @property
    def step_time_s(self) -> float | None:
        return self.median("time_s")

    @property
    def peak_memory_bytes(self) -> int | None:
        for key in ("max_reserved", "max_allocated", "peak", "reserved", "allocated"):
            if key in self.memory:
                return self.memory[key]
        return None

    def summary(self) -> dict[str, Any]:
        """The figures a trial is judged by: medians over the steady state, peaks, counts."""
        return {"status": self.status, "reason": self.reason, "iterations": len(self.iterations),
                "last_iteration": self.iterations[-1].step if self.iterations else None, "expected": self.expected,
                "warmup": self.warmup, "steady_lines": len(self.steady), "step_time_s": self.step_time_s,
                "tflops_per_gpu": self.median("tflops_per_gpu"),
                "tokens_per_s_per_gpu": self.median("tokens_per_s_per_gpu"), "mfu": self.median("mfu"),
                "peak_memory_bytes": self.peak_memory_bytes, "memory": dict(self.memory),
                "skipped_iterations": sum(it.skipped for it in self.iterations),
                "nan_iterations": sum(it.nan for it in self.iterations), "ignored_lines": self.ignored_lines,
                **({"resolution": dict(self.resolution)} if self.resolution else {})}

    def to_dict(self) -> dict[str, Any]:
        return {"framework": self.framework, **self.summary(), "per_iteration": [asdict(it) for it in self.iterations]}


def judge(framework: str, iterations: Sequence[Iteration], warmup: int, expected: int | None,
          memory: dict[str, int] | None = None, ignored_lines: int = 0) -> ParsedLog:
    """The status of a run's iterations: the first problem found, in the order of STATUSES' docstring."""
    its = _dedupe(iterations)
    status, reason = "ok", None
    bad = next((it for it in its if _not_finite(it.loss) or _not_finite(it.grad_norm)
                or any(_not_finite(v) for v in it.losses.values()) or it.nan), None)
    if not its:
        status, reason = "no_iterations", (f"no {framework} iteration line in the log: the job did not train, or its "
                                           f"log is not {framework}'s (check the framework: line and log level)")
    elif bad is not None:
        status, reason = "nan", f"non-finite loss or grad norm at iteration {bad.step}"
    elif expected is not None and its[-1].step < expected:
        status, reason = "truncated", (f"the log stops at iteration {its[-1].step} of {expected} (crashed, killed "
                                       f"or out of time)")
    elif not any(it.first_step > warmup for it in its):
        status, reason = "no_steady_state", (f"all {len(its)} logged iteration(s) are within the {warmup} warm-up "
                                             f"iterations; run more iterations or log more often")
    return ParsedLog(framework, status, reason, its, warmup, expected, dict(memory or {}), ignored_lines)


def _not_finite(v: float | None) -> bool:
    return v is not None and not math.isfinite(v)


def _dedupe(iterations: Sequence[Iteration]) -> list[Iteration]:
    """In step order, the first line of each step kept (several ranks or nodes may print the same line)."""
    seen: dict[int, Iteration] = {}
    for it in iterations:
        seen.setdefault(it.step, it)
    return [seen[k] for k in sorted(seen)]


def number(text: str) -> float:
    """A printed figure: ``1,234`` and ``nan``/``inf`` included (ValueError for anything else)."""
    return float(text.replace(",", ""))
