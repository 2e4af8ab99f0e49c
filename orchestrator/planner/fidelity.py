"""How well the planner predicts published runs it was not fitted to, and the bands that follow from it.

* one efficiency set per GPU generation, fitted only on the corpus rows declared ``fit`` for it (B200 and
  H200 have no published rows: they take the H100 set, which is a transfer, said so wherever it is used);
* held-out errors, leave-one-source-out (refit without a source, predict that source), and
* a prediction band: two order statistics of the held-out relative residuals, chosen by the split-conformal
  rule so that the band covers a new run like the held-out ones at least at its stated rate, applied to any
  prediction;
* the fits' uncertainty (``fit_uncertainty``): every generation's fit repeated on its fit rows drawn with
  replacement (a bootstrap), beside the held-out residuals; stored in corpus/uncertainty.yaml
  (``fit_uncertainty_file.py``), it gives a prediction made with a corpus set its interval.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .band import BAND_COVERAGE, Band, conformal_ranks, write_band
from .calibrate import SOLVER_TOL, calibrate
from .cluster import Efficiency
from .corpus import Row, load
from .predict import point_step_time
from .corpus import GENERATIONS
from .corpus_uncertainty import SetUncertainty, write_corpus_uncertainty
from .uncertainty import Uncertainty, intervals

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


def fit_generation(rows: Sequence[Row], generation: str, base: Efficiency | None = None,
                   tol: float = SOLVER_TOL) -> Fit:
    """The efficiency set for ``generation`` fitted on ``rows`` of that generation (split == 'fit' is the
    caller's choice, so leave-one-source-out can refit on fewer; a bootstrap passes rows drawn with
    replacement, repeats included). ``tol``: the solver's (calibrate's)."""
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
    cal = calibrate(_records(mine, start), mine[0].config(start), fit=names, tol=tol)
    return Fit(generation, cal.efficiency, {k: float(v) for k, v in cal.fitted.items()}, tuple(r.id for r in mine))


def fit_all(rows: Sequence[Row]) -> dict[str, Fit]:
    """A100 then H100 (which starts from the A100 set), each on its own fit rows only."""
    fit_rows = [r for r in rows if r.split == "fit"]
    a100 = fit_generation(fit_rows, "a100-80gb")
    h100 = fit_generation(fit_rows, "h100-sxm", base=a100.efficiency)
    return {"a100-80gb": a100, "h100-sxm": h100}


BOOTSTRAP_REPLICATES = 100
"""Refits of every generation on resampled fit rows (``fit_uncertainty``)."""
BOOTSTRAP_SEED = 0
BOOTSTRAP_TOL = 1e-6
"""A replicate's solver tolerance: against the point fit's 1e-12 it moves no fitted value by more than 1e-4 of
itself (A100 and H100 fits, checked when chosen), far inside the replicates' spread, at a fifth of the time."""


def generation_fields(generation: str) -> tuple[str, ...]:
    """The fields a generation's set was fitted in: its own fit's and, for a set that starts from the A100 set
    (H100, and what takes the H100 set by transfer), the A100 fit's."""
    src = TRANSFER.get(generation, generation)
    if src == "a100-80gb":
        return A100_FIT
    return tuple(dict.fromkeys(A100_FIT + H100_FIT))


def resample(rows: Sequence[Row], replicate: int, seed: int = BOOTSTRAP_SEED) -> dict[str, list[Row]]:
    """One bootstrap replicate's fit rows: each generation's fit rows drawn with replacement, as many as it has,
    from the random stream (``seed``, ``replicate``). Rows of one generation never stand in for another's."""
    rng = np.random.default_rng([seed, replicate])
    fit_rows = [r for r in rows if r.split == "fit"]
    out = {}
    for generation in ("a100-80gb", "h100-sxm"):
        mine = [r for r in fit_rows if r.gpu == generation]
        out[generation] = [mine[i] for i in rng.integers(0, len(mine), size=len(mine))]
    return out


def resampled_fits(rows: Sequence[Row], replicate: int, seed: int = BOOTSTRAP_SEED) -> dict[str, Fit]:
    """One bootstrap replicate of ``fit_all``: the rows ``resample`` draws, refitted in fit_all's order, the H100
    fit starting from this replicate's A100 set."""
    drawn = resample(rows, replicate, seed)
    a100 = fit_generation(drawn["a100-80gb"], "a100-80gb", tol=BOOTSTRAP_TOL)
    h100 = fit_generation(drawn["h100-sxm"], "h100-sxm", base=a100.efficiency, tol=BOOTSTRAP_TOL)
    return {"a100-80gb": a100, "h100-sxm": h100}


def log_residuals(rows: Sequence[Row], fits: dict[str, Fit], split: str = "heldout") -> tuple[float, ...]:
    """log(published / predicted) step time of every modelled row of ``split`` under the point fits."""
    return tuple(float(np.log(r.published_step_s / predicted_step(r, fits))) for r in rows if r.split == split)


def fit_uncertainty(rows: Sequence[Row], fits: dict[str, Fit], replicates: Sequence[dict[str, Fit]],
                    generation: str) -> Uncertainty:
    """The uncertainty of ``generation``'s set (its own fit, or the set it takes by transfer): the fitted fields
    of every bootstrap replicate, and the step-time residuals of the held-out rows (all generations: the
    errors of the corpus sets on published runs they were not fitted to)."""
    src = TRANSFER.get(generation, generation)
    names = generation_fields(generation)
    samples = tuple({n: float(getattr(rep[src].efficiency, n)) for n in names} for rep in replicates)
    held = log_residuals(rows, fits)
    rows_of = "its fit rows" if src == "a100-80gb" else "its fit rows and the A100 fit's it starts from"
    how = (f"bootstrap of the {src} corpus fit: {len(replicates)} refits on {rows_of}, drawn with replacement; "
           f"residuals: the {len(held)} held-out published runs' step times")
    if src != generation:
        how += f"; transferred to {generation}, which has no published rows (the transfer's own error is not in it)"
    return Uncertainty(samples, {"step_time_s": held}, basis=how)


def corpus_sets(rows: Sequence[Row], fits: dict[str, Fit], replicates: Sequence[dict[str, Fit]]
                ) -> dict[str, SetUncertainty]:
    """Every generation's set (its own fit or its transfer): the point fit's fitted values and ``fit_uncertainty``."""
    return {g: SetUncertainty(f"the {g} corpus set",
                              {n: float(getattr(transferred_efficiency(fits, g), n)) for n in generation_fields(g)},
                              fit_uncertainty(rows, fits, replicates, g)) for g in GENERATIONS}


def refresh_uncertainty(rows: Sequence[Row], fits: dict[str, Fit], replicates: int = BOOTSTRAP_REPLICATES,
                        seed: int = BOOTSTRAP_SEED) -> dict[str, SetUncertainty]:
    """Bootstrap every fit and store the sets where a prediction reads them (bench/planner_validation.py)."""
    sets = corpus_sets(rows, fits, [resampled_fits(rows, i, seed) for i in range(replicates)])
    write_corpus_uncertainty(sets, seed, replicates)
    return sets


def heldout_coverage(rows: Sequence[Row], fits: dict[str, Fit], sets: dict[str, SetUncertainty],
                     residuals: str = "heldout") -> tuple[int, int, float]:
    """(inside, rows, median relative width) of the held-out rows' step-time intervals under ``sets``'
    replicates. ``residuals``: ``heldout`` (each row's own residual left out: its interval is built without it),
    ``fit`` (the fit rows' own, in sample) or ``none`` (the replicates' spread alone)."""
    held = [r for r in rows if r.split == "heldout"]
    if residuals not in ("heldout", "fit", "none"):
        raise ValueError(f"residuals: {residuals!r} is not heldout, fit or none")
    own = log_residuals(rows, fits, "heldout")
    in_sample = log_residuals(rows, fits, "fit") if residuals == "fit" else ()
    inside, widths = 0, []
    for i, r in enumerate(held):
        u = sets[r.gpu].uncertainty
        res = own[:i] + own[i + 1:] if residuals == "heldout" else in_sample
        u = dataclasses.replace(u, residuals={"step_time_s": res} if res else {})
        eff = transferred_efficiency(fits, r.gpu)
        iv = intervals([r.config(eff)], eff, u)[0]["step_time_s"]
        inside += iv.contains(r.published_step_s)
        widths.append((iv.high - iv.low) / iv.point)
    return inside, len(held), float(np.median(widths))


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
