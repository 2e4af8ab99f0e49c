"""The corpus is well-formed, the prediction bands hold the held-out truth at their stated rate, and the stored
band and fit uncertainty are what the corpus gives today."""

import numpy as np
import pytest

from orchestrator.planner import corpus, fidelity


@pytest.fixture(scope="module")
def fits():
    """The per-generation fits of today's corpus (seconds: shared by the tests that read them)."""
    return fidelity.fit_all(corpus.load())


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


def test_dgxc_rows_follow_the_split_rule_declared_in_the_header():
    """corpus.yaml: within a later-added source, each model's rows sorted by GPU count alternate fit,
    heldout, fit, ... (so each model has a held-out row)."""
    groups: dict[tuple, list] = {}
    for r in corpus.load():
        if r.source == "DGXC" and r.split != "not_modelled":
            groups.setdefault((r.raw["layers"], r.raw["hidden"]), []).append(r)
    assert len(groups) == 3
    for rows in groups.values():
        rows.sort(key=lambda r: r.raw["gpus"])
        assert [r.split for r in rows] == ["fit" if i % 2 == 0 else "heldout" for i in range(len(rows))]
        assert all(r.gpu == "h100-sxm" and r.raw.get("cp", 1) == 1 for r in rows)


def test_equivalent_ffn_keeps_nemotron4_parameters():
    """GQA + a two-matrix (squared-ReLU) MLP given as ``ffn``: Nemotron-4 15B has 3.2B embedding and 12.5B
    non-embedding parameters (Nemotron-4 15B technical report, arXiv 2402.16819, Sec. 2)."""
    r = next(x for x in corpus.load() if x.id == "dgxc-nemotron4-15b-16")
    assert corpus.equivalent_ffn(r.raw) == 24576 + 8 * 128 - 6144
    P = r.config(fidelity.A100_PRIOR).model.total_params
    emb = 2 * 256000 * 6144                          # untied input and output embeddings
    assert abs(emb / 3.2e9 - 1) < 0.02 and abs((P - emb) / 12.5e9 - 1) < 0.01


def test_h100_fit_moves_at_most_one_parameter_per_fit_row():
    rows = [r for r in corpus.load() if r.split == "fit"]
    a100 = fidelity.fit_generation(rows, "a100-80gb")
    one = fidelity.fit_generation([r for r in rows if r.id == "l3-405b-8192"], "h100-sxm", base=a100.efficiency)
    assert set(one.fitted) == {"matmul_eff"}
    assert one.efficiency.dp_bw_eff == a100.efficiency.dp_bw_eff


def test_bands_hold_heldout_truth_at_their_stated_rate_out_of_source():
    """Band built from the other sources' LOSO residuals, checked on the left-out source's rows; the stored band
    states the measured share (every prediction's band_basis says it)."""
    from orchestrator.planner.band import load_band
    hits, total = fidelity.out_of_source_coverage(fidelity.loso(corpus.load()))
    # Stated 80%. Measured 36/48 with split-conformal ranks (32/48 with plain quantiles): every DGXC and Llama 3
    # row, about two thirds of each A100 source's. Out of source the band under-covers, documented in
    # docs/planner-validation.md; 0.72 guards against it getting worse.
    assert hits / total >= 0.72, f"{hits}/{total} inside"
    assert load_band().out_of_source == (hits, total)
    assert f"held {hits} of {total} runs" in load_band().basis


def test_band_holds_the_heldout_truth_at_least_at_its_stated_rate_in_sample(fits):
    """Cut at the split-conformal ranks, the band holds at least its stated share of the residuals it came from
    (plain 10th-90th quantiles of 25 values held 19, 76%, for a stated 80%)."""
    from orchestrator.planner.band import load_band

    band = load_band()
    rows = corpus.load()
    res = [e for _, e in fidelity.heldout_residuals(rows, fits)]
    inside = sum(band.lo <= e <= band.hi for e in res)
    assert inside / len(res) >= band.coverage, f"{inside}/{len(res)} inside"


def test_stored_band_matches_the_corpus(fits):
    """corpus/band.yaml (what every prediction reads) is the band the corpus gives today; rerun
    bench/planner_validation.py to refresh it."""
    from orchestrator.planner.band import load_band

    rows = corpus.load()  # the out-of-source share is checked in the test above (it refits per source)
    stored = load_band()
    fresh = fidelity.band_from_residuals([e for _, e in fidelity.heldout_residuals(rows, fits)])
    assert (stored.n, stored.coverage) == (fresh.n, fresh.coverage)
    assert abs(stored.lo - fresh.lo) < 1e-5 and abs(stored.hi - fresh.hi) < 1e-5


def test_stored_fit_uncertainty_matches_the_corpus(fits):
    """corpus/uncertainty.yaml (the interval of every prediction made with a corpus set, the 500B preset's
    included) is the bootstrap the corpus gives today: computed from today's corpus and cluster files, around
    today's point fits, with today's held-out residuals, and its first replicate recomputes to what is stored.
    Rerun bench/planner_validation.py to refresh it."""
    from orchestrator.planner.corpus_uncertainty import corpus_digest, load_corpus_uncertainty

    stored = load_corpus_uncertainty()
    fix = "; rerun .venv/bin/python bench/planner_validation.py"
    assert stored["corpus_digest"] == corpus_digest(), "the corpus or a cluster file changed" + fix
    assert (stored["seed"], stored["replicates"]) == (fidelity.BOOTSTRAP_SEED, fidelity.BOOTSTRAP_REPLICATES)
    rows = corpus.load()
    held = fidelity.log_residuals(rows, fits)
    assert set(stored["sets"]) == set(corpus.GENERATIONS)
    first = fidelity.resampled_fits(rows, 0, stored["seed"])
    for g, s in stored["sets"].items():
        fresh = fidelity.transferred_efficiency(fits, g)
        assert s.point == pytest.approx({k: getattr(fresh, k) for k in s.point}, rel=1e-6), g + fix
        assert s.uncertainty.residuals["step_time_s"] == pytest.approx(held, abs=1e-6), g + fix
        assert len(s.uncertainty.samples) == stored["replicates"]
        src = fidelity.TRANSFER.get(g, g)
        again = {k: getattr(first[src].efficiency, k) for k in s.point}
        assert s.uncertainty.samples[0] == pytest.approx(again, rel=1e-4), g + fix


def test_fit_intervals_hold_the_heldout_rows_at_their_stated_rate(fits):
    """The stored sets' 90% intervals (every replicate's prediction times a held-out residual, the row's own
    left out) hold the held-out rows' published step times. Measured 23 of 25 (bench/planner_validation.py,
    section 11); without the residuals, or with the fit rows' own, 10 and 19. The floor guards against worse."""
    from orchestrator.planner.corpus_uncertainty import load_corpus_uncertainty

    rows = corpus.load()
    inside, n, _ = fidelity.heldout_coverage(rows, fits, load_corpus_uncertainty()["sets"])
    assert inside / n >= 0.84, f"{inside}/{n} inside"


def test_transferred_set_is_labelled_blind_and_own_fit_fitted(fits):
    assert fidelity.transferred_efficiency(fits, "b200").basis == "blind"
    assert fidelity.transferred_efficiency(fits, "a100-80gb").basis == "fitted"


def test_corpus_bucket_size_follows_megatron_cores_default():
    """Megatron-Core DDP's default bucket is max(40M, 1M x dp) parameters; a row that states mcore_default
    gets it in MB of its reduction dtype, others keep 40M; anything else names the field."""
    from orchestrator.planner.corpus import bucket_params

    row = {"id": "r", "bucket_params": "mcore_default"}
    assert bucket_params(row, 8) == 40e6 and bucket_params(row, 512) == 512e6
    assert bucket_params({"id": "r"}, 512) == 40e6
    with pytest.raises(ValueError, match="bucket_params"):
        bucket_params({"id": "r", "bucket_params": "big"}, 8)
    n15 = {r.id: r for r in corpus.load()}["dgxc-nemotron4-15b-2048"].config(fidelity.A100_PRIOR)
    assert n15.data_parallel.bucket_mb == pytest.approx(512e6 * 4 / 1e6)  # DP 512, fp32 gradients
