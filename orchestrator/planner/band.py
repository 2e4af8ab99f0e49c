"""The prediction band every planner prediction carries, and where it comes from.

The band is the empirical spread of the planner's relative step-time errors on published runs it was not
fitted to (the corpus's held-out rows, ``fidelity.py``). Computing it refits every generation (seconds), so
it is stored in ``corpus/band.yaml``; ``bench/planner_validation.py`` rewrites that file and
``tests/unit/test_fidelity.py`` fails when it no longer matches the corpus.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

BAND_FILE = Path(__file__).resolve().parent / "corpus" / "band.yaml"


@dataclass(frozen=True)
class Band:
    """Relative band [lo, hi] around a point prediction, from held-out residuals, and its nominal coverage."""

    lo: float
    """Lower edge as a relative error (pred / truth - 1 quantile), <= 0."""
    hi: float
    """Upper edge, >= 0."""
    coverage: float
    """Nominal share of truths inside (0.8 for the 10th-90th percentile)."""
    n: int
    """Held-out residuals the quantiles were taken over."""
    out_of_source: tuple[int, int] | None = None
    """Measured, not nominal: (inside, rows) when each source's rows are checked against the band built from
    the other sources' leave-one-source-out residuals (``fidelity.out_of_source_coverage``); None if not
    measured."""

    def __post_init__(self) -> None:
        if not (self.lo <= 0.0 <= self.hi) or self.lo <= -1.0:
            raise ValueError(f"band: need -1 < lo <= 0 <= hi, got lo={self.lo}, hi={self.hi}")
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"band.coverage: must be in (0, 1), got {self.coverage}")

    def apply(self, point: float) -> tuple[float, float]:
        """(lower, upper) seconds for a predicted step time.

        The residual is pred / truth - 1, so truth = pred / (1 + residual): the model's under-prediction
        (residual lo < 0) widens the upper end. ``lo`` and ``hi`` are quantiles of the residual, so the truth
        lies in [pred / (1 + hi), pred / (1 + lo)] at the stated coverage."""
        return point / (1.0 + self.hi), point / (1.0 + self.lo)

    @property
    def basis(self) -> str:
        text = (f"{self.coverage:.0%} band: truth = prediction / (1 + e), e between the "
                f"{(1 - self.coverage) / 2:.0%} and {(1 + self.coverage) / 2:.0%} quantiles "
                f"[{100 * self.lo:+.1f}%, {100 * self.hi:+.1f}%] of the step-time errors on {self.n} held-out "
                f"published runs (orchestrator/planner/corpus; fits per GPU generation)")
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


def write_band(band: Band, path: Path = BAND_FILE) -> Path:
    header = ("# Written by bench/planner_validation.py from the corpus's held-out residuals; do not edit.\n"
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
