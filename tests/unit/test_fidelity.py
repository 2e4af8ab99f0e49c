"""The corpus is well-formed and the prediction bands hold the held-out truth at their stated rate."""

import numpy as np

from orchestrator.planner import corpus, fidelity


def test_corpus_meets_the_size_and_diversity_floor():
    rows = corpus.load()
    modelled = [r for r in rows if r.split != "not_modelled"]
    assert len(modelled) >= 25
    assert len({r.source for r in modelled}) >= 3 and len({r.gpu for r in modelled}) >= 2
    assert all(r.raw.get("note") for r in rows)
    assert {r.id for r in rows if r.split == "fit"}.isdisjoint({r.id for r in rows if r.split == "heldout"})


def test_equivalent_ffn_keeps_llama_parameters():
    r = next(x for x in corpus.load() if x.id == "l3-405b-8192")
    P = r.config(fidelity.A100_PRIOR).model.total_params
    assert abs(P / 405.9e9 - 1) < 0.01          # Llama 3.1 405B: 405.9e9 parameters (HF model card)


def test_bands_hold_heldout_truth_at_their_stated_rate_out_of_source():
    """Band built from the other sources' LOSO residuals, checked on the left-out source's rows."""
    rows = corpus.load()
    lo = fidelity.loso(rows)
    hits = total = 0
    for source, res in lo.items():
        others = [e for s, v in lo.items() if s != source for _, e in v]
        band = fidelity.band_from_residuals(others)
        hits += sum(band.lo <= e <= band.hi for _, e in res)
        total += len(res)
    rate = hits / total
    # stated 80%; with 25 rows a binomial 95% interval reaches down to about 0.62
    assert rate >= 0.62, f"{hits}/{total} inside"


def test_stored_band_matches_the_corpus():
    """corpus/band.yaml (what every prediction reads) is the band the corpus gives today; rerun
    bench/planner_validation.py to refresh it."""
    from orchestrator.planner.band import load_band

    stored, fresh = load_band(), fidelity.default_band()
    assert (stored.n, stored.coverage) == (fresh.n, fresh.coverage)
    assert abs(stored.lo - fresh.lo) < 1e-5 and abs(stored.hi - fresh.hi) < 1e-5


def test_transferred_set_is_labelled_blind_and_own_fit_fitted():
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    assert fidelity.transferred_efficiency(fits, "b200").basis == "blind"
    assert fidelity.transferred_efficiency(fits, "a100-80gb").basis == "fitted"
