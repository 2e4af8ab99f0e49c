"""The prediction band every planner prediction carries, and where it comes from.

The band is the spread of the planner's relative step-time errors on published runs it was not fitted to
(the corpus's held-out rows, ``fidelity.py``), cut at the split-conformal ranks (``conformal_ranks``).
Computing it refits every generation (seconds), so it is stored in ``corpus/band.yaml``;
``bench/planner_validation.py`` rewrites that file and ``tests/unit/test_fidelity.py`` fails when it no
longer matches the corpus.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

BAND_FILE = Path(__file__).resolve().parent / "corpus" / "band.yaml"
BAND_COVERAGE = 0.8
"""The band's stated coverage: an 80% band from the held-out residuals."""


def conformal_ranks(n: int, coverage: float = BAND_COVERAGE) -> tuple[int, int]:
    """1-based ranks (k_lo, k_hi) of the sorted residuals that bound a band of ``coverage`` from n residuals.

    Split conformal prediction (Lei et al. 2018, Distribution-Free Predictive Inference for Regression): with
    alpha = (1 - coverage) / 2 in each tail, k_lo = floor((n + 1) alpha) and k_hi = ceil((n + 1)(1 - alpha)).
    A new residual exchangeable with the n falls in [r_(k_lo), r_(k_hi)] with probability at least coverage.
    Plain quantiles of n values promise no such thing (they held 19 of 25 held-out rows for a stated 80%).
    """
    alpha = (1.0 - coverage) / 2.0
    k_lo, k_hi = math.floor((n + 1) * alpha + 1e-9), math.ceil((n + 1) * (1.0 - alpha) - 1e-9)
    if k_lo < 1 or k_hi > n:
        need = math.ceil(1.0 / alpha - 1.0 - 1e-9)
        raise ValueError(f"band: a {coverage:.0%} band needs at least {need} held-out residuals, got {n}")
    return k_lo, k_hi


@dataclass(frozen=True)
class Band:
    """Relative band [lo, hi] around a point prediction, from held-out residuals, and its stated coverage."""

    lo: float
    """Lower edge as a relative error (pred / truth - 1): the residual at rank k_lo, <= 0."""
    hi: float
    """Upper edge: the residual at rank k_hi, >= 0."""
    coverage: float
    """Stated share of truths inside (0.8), guaranteed for a run exchangeable with the held-out ones."""
    n: int
    """Held-out residuals the band was cut from."""
    out_of_source: tuple[int, int] | None = None
    """Measured, not nominal: (inside, rows) when each source's rows are checked against the band built from
    the other sources' leave-one-source-out residuals (``fidelity.out_of_source_coverage``); None if not
    measured."""

    def __post_init__(self) -> None:
        if not (self.lo <= 0.0 <= self.hi) or self.lo <= -1.0:
            raise ValueError(f"band: need -1 < lo <= 0 <= hi, got lo={self.lo}, hi={self.hi}")
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"band.coverage: must be in (0, 1), got {self.coverage}")
        conformal_ranks(self.n, self.coverage)  # enough residuals for the stated coverage

    def apply(self, point: float) -> tuple[float, float]:
        """(lower, upper) seconds for a predicted step time.

        The residual is pred / truth - 1, so truth = pred / (1 + residual): the model's under-prediction
        (residual lo < 0) widens the upper end. ``lo`` and ``hi`` bound the residual, so the truth lies in
        [pred / (1 + hi), pred / (1 + lo)] at the stated coverage."""
        return point / (1.0 + self.hi), point / (1.0 + self.lo)

    @property
    def basis(self) -> str:
        k_lo, k_hi = conformal_ranks(self.n, self.coverage)
        text = (f"{self.coverage:.0%} band: truth = prediction / (1 + e), e between the {_ordinal(k_lo)} and "
                f"{_ordinal(k_hi)} smallest [{100 * self.lo:+.1f}%, {100 * self.hi:+.1f}%] of the step-time errors "
                f"on {self.n} held-out published runs (split-conformal ranks; orchestrator/planner/corpus; fits "
                f"per GPU generation)")
        if self.out_of_source is not None:
            inside, rows = self.out_of_source
            text += (f"; on a software stack it was not built from it held {inside} of {rows} runs "
                     f"({inside / rows:.0%}), so there it understates the uncertainty")
        return text

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"lo": self.lo, "hi": self.hi, "coverage": self.coverage, "n": self.n}
        if self.out_of_source is not None:
            out["out_of_source"] = list(self.out_of_source)
        return out


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def write_band(band: Band, path: Path = BAND_FILE) -> Path:
    header = ("# Written by bench/planner_validation.py from the corpus's held-out residuals (split-conformal\n"
              "# ranks); do not edit.\n"
              "# tests/unit/test_fidelity.py fails when it no longer matches the corpus.\n")
    path.write_text(header + yaml.safe_dump({k: round(v, 6) if isinstance(v, float) else v
                                             for k, v in band.to_dict().items()}, sort_keys=False))
    load_band.cache_clear()
    return path


@functools.lru_cache(maxsize=1)
def load_band(path: Path = BAND_FILE) -> Band:
    """The stored band (read once per process)."""
    data = yaml.safe_load(Path(path).read_text())
    oos = data.get("out_of_source")
    return Band(lo=float(data["lo"]), hi=float(data["hi"]), coverage=float(data["coverage"]), n=int(data["n"]),
                out_of_source=None if oos is None else (int(oos[0]), int(oos[1])))
