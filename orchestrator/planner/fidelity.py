"""How well the planner predicts published runs it was not fitted to, and the bands that follow from it.

* one efficiency set per GPU generation, fitted only on the corpus rows declared ``fit`` for it (B200 and
  H200 have no published rows: they take the H100 set, which is a transfer, said so wherever it is used);
* held-out errors, leave-one-source-out (refit without a source, predict that source), and
* a prediction band: two order statistics of the held-out relative residuals, chosen by the split-conformal
  rule so that the band covers a new run like the held-out ones at least at its stated rate, applied to any
  prediction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .band import BAND_COVERAGE, Band, conformal_ranks, write_band
from .calibrate import calibrate
from .cluster import Efficiency
from .corpus import Row, load
from .predict import point_step_time

A100_PRIOR = Efficiency(matmul_eff=0.6, gemm_tokens_half=256.0, attention_eff=0.3, op_overhead_us=50.0,
                        tp_bw_eff=0.7, pp_bw_eff=0.7, dp_bw_eff=0.7, optimizer_bw_eff=0.5,
                        mem_reserved_gb=4.0, flash_attention_eff=0.5)
"""Starting values (priors, not measurements) for the A100 fit."""
A100_FIT = ("matmul_eff", "gemm_tokens_half", "attention_eff", "op_overhead_us", "dp_bw_eff")
H100_FIT = ("matmul_eff", "dp_bw_eff")
"""In priority order; a fit moves at most one parameter per fit row (``fit_generation``), so Llama 3's one
8,192-GPU row alone fits matmul_eff only. The rest transfer from the A100 set. TP communication overlap is
not an efficiency: a row says whether its run had it (``tp_comm_overlap``) and timing.py derives what stays
exposed from the GEMMs it runs under. Declared in corpus.yaml's header with the split."""
TRANSFER = {"h200": "h100-sxm", "b200": "h100-sxm"}


@dataclass(frozen=True)
class Fit:
    generation: str
    efficiency: Efficiency
    fitted: dict[str, float]
    rows: tuple[str, ...]


def _records(rows: Sequence[Row], eff: Efficiency) -> list[dict]:
    return [{"config": r.config(eff), "step_time_s": r.published_step_s} for r in rows]


def fit_generation(rows: Sequence[Row], generation: str, base: Efficiency | None = None) -> Fit:
    """The efficiency set for ``generation`` fitted on ``rows`` of that generation (split == 'fit' is the
    caller's choice, so leave-one-source-out can refit on fewer)."""
    mine = [r for r in rows if r.gpu == generation]
    if generation == "a100-80gb":
        start, names = base or A100_PRIOR, A100_FIT
    elif generation == "h100-sxm":
        a100 = base or fit_generation(rows, "a100-80gb").efficiency
        # at most one parameter per H100 fit row (H100_FIT's order): the rest stay transferred.
        start, names = dataclasses.replace(a100, mem_reserved_gb=5.0), H100_FIT[:max(1, len(mine))]
    else:
        raise ValueError(f"generation: {generation} has no fit rows; use transferred_efficiency")
    if not mine:
        return Fit(generation, start, {}, ())
    cal = calibrate(_records(mine, start), mine[0].config(start), fit=names)
    return Fit(generation, cal.efficiency, {k: float(v) for k, v in cal.fitted.items()}, tuple(r.id for r in mine))


def fit_all(rows: Sequence[Row]) -> dict[str, Fit]:
    """A100 then H100 (which starts from the A100 set), each on its own fit rows only."""
    fit_rows = [r for r in rows if r.split == "fit"]
    a100 = fit_generation(fit_rows, "a100-80gb")
    h100 = fit_generation(fit_rows, "h100-sxm", base=a100.efficiency)
    return {"a100-80gb": a100, "h100-sxm": h100}


def transferred_efficiency(fits: dict[str, Fit], generation: str) -> Efficiency:
    """The set for ``generation``: its own fit (basis fitted), or another generation's (basis blind)."""
    src = TRANSFER.get(generation, generation)
    fit = fits[src]
    if src == generation:
        return dataclasses.replace(fit.efficiency, basis="fitted",
                                   basis_note=f"fitted on corpus rows {', '.join(fit.rows) or '(none: priors)'}")
    return dataclasses.replace(fit.efficiency, basis="blind",
                               basis_note=f"{src} set (fitted on corpus rows {', '.join(fit.rows)}) transferred to "
                                          f"{generation}, which has no published rows")


def predicted_step(row: Row, fits: dict[str, Fit]) -> float:
    return point_step_time(row.config(transferred_efficiency(fits, row.gpu)))


def rel_error(pred: float, truth: float) -> float:
    """Signed relative step-time error, pred / truth - 1."""
    return pred / truth - 1.0


def loso(rows: Sequence[Row]) -> dict[str, list[tuple[str, float]]]:
    """Leave one source out: refit every generation without that source's rows, predict that source's rows
    (fit and held-out alike). A source whose generation is left with no fit rows keeps the prior set."""
    out: dict[str, list[tuple[str, float]]] = {}
    modelled = [r for r in rows if r.split != "not_modelled"]
    for source in sorted({r.source for r in modelled}):
        fit_rows = [r for r in modelled if r.split == "fit" and r.source != source]
        a100 = fit_generation(fit_rows, "a100-80gb")
        fits = {"a100-80gb": a100, "h100-sxm": fit_generation(fit_rows, "h100-sxm", base=a100.efficiency)}
        out[source] = [(r.id, rel_error(predicted_step(r, fits), r.published_step_s))
                       for r in modelled if r.source == source]
    return out


def band_from_residuals(residuals: Sequence[float], coverage: float = BAND_COVERAGE) -> Band:
    """The band from held-out residuals at their split-conformal ranks (``conformal_ranks``), widened to hold 0."""
    r = np.sort(np.asarray(residuals, dtype=float))
    k_lo, k_hi = conformal_ranks(len(r), coverage)
    return Band(float(min(r[k_lo - 1], 0.0)), float(max(r[k_hi - 1], 0.0)), coverage, len(r))


def heldout_residuals(rows: Sequence[Row], fits: dict[str, Fit]) -> list[tuple[Row, float]]:
    return [(r, rel_error(predicted_step(r, fits), r.published_step_s)) for r in rows if r.split == "heldout"]


def out_of_source_coverage(lo: dict[str, list[tuple[str, float]]]) -> tuple[int, int]:
    """(inside, rows): each source's leave-one-source-out residuals checked against the band built from the
    other sources' (``loso``'s output)."""
    inside = rows = 0
    for source, res in lo.items():
        band = band_from_residuals([e for s, v in lo.items() if s != source for _, e in v])
        inside += sum(band.lo <= e <= band.hi for _, e in res)
        rows += len(res)
    return inside, rows


def default_band() -> Band:
    """The band every prediction carries (recomputed; ``band.load_band`` reads the stored copy): held-out
    residuals of the corpus under the per-generation fits, with its measured out-of-source coverage."""
    rows = load()
    band = band_from_residuals([e for _, e in heldout_residuals(rows, fit_all(rows))])
    return dataclasses.replace(band, out_of_source=out_of_source_coverage(loso(rows)))


def refresh_band() -> Band:
    """Recompute the band and store it where every prediction reads it (bench/planner_validation.py)."""
    band = default_band()
    write_band(band)
    return band
