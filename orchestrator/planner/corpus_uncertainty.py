"""The corpus fits' uncertainty, stored: where a prediction made with a corpus efficiency set takes its interval.

``fidelity.fit_uncertainty`` refits every generation ``BOOTSTRAP_REPLICATES`` times on its fit rows drawn with
replacement (a minute or more), so the result is stored in ``corpus/uncertainty.yaml`` beside the band:
per GPU generation, the point fit's fitted values (``point``) and the ``Uncertainty`` (the replicates' fitted
values and the held-out residuals). ``bench/planner_validation.py`` rewrites it; ``tests/unit/test_fidelity.py``
fails when it no longer matches the corpus (``corpus_digest``) or the point fits.

A set's uncertainty describes that set: ``applies`` refuses it for an efficiency set whose fitted fields are
not the point's (an override of matmul_eff, the article-calibrated set), so such a prediction never borrows an
interval fitted around other values.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from .cluster import Efficiency
from .corpus import CLUSTERS, GENERATIONS, HERE
from .uncertainty import Uncertainty

UNCERTAINTY_FILE = HERE / "uncertainty.yaml"
APPLIES_WITHIN = 0.01
"""Relative difference up to which an efficiency set's fitted field counts as the point's (a preset rounds the
corpus set to 3 digits)."""


@dataclass(frozen=True)
class SetUncertainty:
    """A fitted efficiency set's uncertainty with the fitted values it was computed around: a corpus set (per
    GPU generation) or a calibration file's."""

    source: str
    """Where it comes from, for people: 'the b200 corpus set', 'calibration file cal.yaml'."""
    point: Mapping[str, float]
    """The point fit's value of every field the replicates hold."""
    uncertainty: Uncertainty

    def applies(self, eff: Efficiency) -> str | None:
        """None when ``eff`` is this set (every fitted field within ``APPLIES_WITHIN``); else why not."""
        for name, value in self.point.items():
            mine = float(getattr(eff, name))
            if abs(mine - value) > APPLIES_WITHIN * max(abs(value), 1e-12):
                return (f"{self.source} has {name} = {value:.4g}, this efficiency set {mine:.4g}: its uncertainty "
                        f"describes other values")
        return None


def corpus_digest() -> str:
    """sha256 of what the fits read: corpus.yaml and every generation's cluster file."""
    h = hashlib.sha256((HERE / "corpus.yaml").read_bytes())
    for g in GENERATIONS:
        h.update((CLUSTERS / f"{g}.yaml").read_bytes())
    return h.hexdigest()


def write_corpus_uncertainty(sets: Mapping[str, SetUncertainty], seed: int, replicates: int,
                             path: Path = UNCERTAINTY_FILE) -> Path:
    header = ("# Written by bench/planner_validation.py: every generation's corpus fit refitted on its fit rows drawn\n"
              "# with replacement (orchestrator/planner/fidelity.py, fit_uncertainty); do not edit.\n"
              "# tests/unit/test_fidelity.py fails when it no longer matches the corpus.\n")
    doc: dict[str, Any] = {"seed": seed, "replicates": replicates, "corpus_digest": corpus_digest(),
                           "sets": {g: {"point": {k: float(v) for k, v in s.point.items()},
                                        "uncertainty": s.uncertainty.to_dict()} for g, s in sets.items()}}
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120))
    load_corpus_uncertainty.cache_clear()
    return path


@functools.lru_cache(maxsize=1)
def load_corpus_uncertainty(path: Path = UNCERTAINTY_FILE) -> dict[str, Any]:
    """The stored file: seed, replicates, corpus_digest and ``sets`` (generation -> ``SetUncertainty``)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    sets = {g: SetUncertainty(f"the {g} corpus set", dict(s["point"]),
                              Uncertainty.from_dict(s["uncertainty"], f"{Path(path).name}: sets.{g}"))
            for g, s in (data.get("sets") or {}).items()}
    return {**data, "sets": sets}


def corpus_set(generation: str) -> SetUncertainty:
    """The stored set of ``generation`` (a100-80gb, h100-sxm, h200, b200); ValueError naming the choices."""
    sets = load_corpus_uncertainty()["sets"]
    if generation not in sets:
        raise ValueError(f"corpus: {generation!r} has no stored set; choose from {', '.join(sets)}")
    return sets[generation]
