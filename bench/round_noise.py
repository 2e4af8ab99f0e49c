"""What a landscape's refinement rounds (bench/landscape.py --refine-top) say about the host's noise: pure
functions of the refined block, rendered into the landscape's page so every figure comes with its command."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import numpy as np


def noise(ref: dict[str, Any]) -> dict[str, float]:
    """Over the refined configs' log step times by round: ``run_sd`` (median over configs of the sd of a run),
    ``correlation`` (mean between configs over their common rounds), ``round_sd`` (sd of a round's mean
    deviation: what a round's machine state adds to every run of it), ``paired_sd`` / ``unpaired_sd`` (median
    over pairs of configs of the sd of log(a / b) within a round / across different rounds)."""
    runs = {k: {int(n): math.log(t) for n, t in v.items()} for k, v in ref["runs"].items()}
    rounds = sorted({n for v in runs.values() for n in v})
    keys = [k for k in runs if len(runs[k]) >= 3]
    m = np.array([[runs[k].get(n, np.nan) for n in rounds] for k in keys])
    dev = m - np.nanmean(m, axis=1, keepdims=True)
    corr = np.ma.corrcoef(np.ma.masked_invalid(m))
    off = [float(corr[i, j]) for i in range(len(keys)) for j in range(len(keys)) if i != j]
    paired, unpaired = [], []
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            both = ~np.isnan(m[i]) & ~np.isnan(m[j])
            if both.sum() >= 3:
                paired.append(float(np.std(m[i, both] - m[j, both])))
                a, b = m[i, both], np.roll(m[j, both], 1)  # another round's run of b
                unpaired.append(float(np.std(a - b)))
    return {"run_sd": float(np.median(np.nanstd(m, axis=1))), "correlation": float(np.mean(off)),
            "round_sd": float(np.nanstd(np.nanmean(dev, axis=0))),
            "paired_sd": float(np.median(paired)), "unpaired_sd": float(np.median(unpaired))}


def truth_bootstrap(ref: dict[str, Any], top: int = 4, resamples: int = 1000, seed: int = 0
                    ) -> dict[str, dict[str, float]]:
    """Resampling the baseline's rounds (with replacement), each of the ``top`` configs with the lowest ``ratio``:
    how often it is the best, within 2% and within 5% of the best by the geometric mean of its paired ratios."""
    base = {int(n): t for n, t in ref["runs"][ref["baseline_key"]].items()}
    runs = {k: {int(n): t for n, t in v.items()} for k, v in ref["runs"].items()}
    keys = sorted((k for k in ref["ratio"] if k != ref["baseline_key"]), key=ref["ratio"].get)[:top]
    rng, rounds = random.Random(seed), sorted(base)
    hits = {k: {"best": 0, "within_2": 0, "within_5": 0} for k in keys}
    for _ in range(resamples):
        pick = [rng.choice(rounds) for _ in rounds]
        fig = {k: math.exp(statistics.fmean(math.log(runs[k][n] / base[n]) for n in pick if n in runs[k]))
               for k in keys if any(n in runs[k] for n in pick)}
        low = min(fig.values())
        for k, v in fig.items():
            hits[k]["best"] += v == low
            hits[k]["within_2"] += v <= low * 1.02
            hits[k]["within_5"] += v <= low * 1.05
    return {k: {s: n / resamples for s, n in h.items()} for k, h in hits.items()}
