"""Planner vs the published-run corpus: fit/held-out split, leave-one-source-out, goal figures, bands.

    .venv/bin/python bench/planner_validation.py [--out bench/results/planner_validation.md]

1. The corpus (orchestrator/planner/corpus/corpus.yaml) and its declared split.
2. One efficiency set per GPU generation, fitted on that generation's fit rows only.
3. Every row: published vs predicted step time, with the prediction band.
4. Goal figures (held-out median / worst, leave-one-source-out worst), met or not.
5. Leave one source out. 6. A transcription cross-check. 7. Memory: what ran in 80 GB.
8. Which rows, as transcribed, would not fit in their GPU's memory (a diagnostic), and the FSDP rows' memory.
9. torchtitan: MFU cross-check and network sensitivity. 10. MT-NLG at its three cluster sizes, and DeepSpeed's
pipeline engine checked against it (diagnostic). 11. The fits' uncertainty (bootstrap over the fit rows), stored
in orchestrator/planner/corpus/uncertainty.yaml, and its intervals' coverage of the held-out rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.planner import NoRecompute, apply_params, predict, predicts_oom  # noqa: E402
from orchestrator.planner import corpus, fidelity  # noqa: E402
from orchestrator.planner.band import write_band  # noqa: E402
from orchestrator.planner.comm import p2p_time  # noqa: E402
from orchestrator.planner.knobs import Consts, encode  # noqa: E402
from orchestrator.planner.published import FIT_RUNS  # noqa: E402
from orchestrator.planner.timing import stage_times  # noqa: E402



def _pct(pred: float, ref: float) -> float:
    return 100.0 * (pred / ref - 1.0)


def corpus_section(lines: list[str]) -> tuple[list, dict]:
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    held = fidelity.heldout_residuals(rows, fits)
    lo = fidelity.loso(rows)
    band = dataclasses.replace(fidelity.band_from_residuals([e for _, e in held]),
                               out_of_source=fidelity.out_of_source_coverage(lo))
    write_band(band)  # what every prediction reads (orchestrator/planner/corpus/band.yaml)
    src = corpus.sources()
    lines += ["## 1. Corpus and split (orchestrator/planner/corpus/corpus.yaml)", "",
              f"{len(rows)} published runs from {len({r.source for r in rows})} sources on "
              f"{len({r.gpu for r in rows})} GPU generations; the split is declared in the corpus file and was "
              "committed before the fit code. Every figure is compared as seconds per iteration on the row's own "
              "FLOP basis (see the file's header).", ""]
    lines += [f"* **{k}**: {v}" for k, v in src.items()] + [""]
    lines += ["## 2. Efficiency sets, fitted on the fit rows of their generation only", ""]
    for g, f in fits.items():
        lines.append(f"* {g} ({len(f.rows)} fit rows): " + ", ".join(f"{k} = {v:.3g}" for k, v in f.fitted.items()))
    lines += ["* h200, b200: no published rows; they take the h100-sxm set (a transfer, not a fit).", "",
              "## 3. Every row: published vs predicted step time", "",
              f"Band: {band.basis}; stored in orchestrator/planner/corpus/band.yaml, which every prediction reads.", "",
              "| row | source | GPU | split | TPxPPxDP (v) | GBS/MBS | recompute | published figure | published s | "
              "predicted s | error | band s |", "|---|---|---|---|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        x = r.raw
        rc = x.get("recompute", "full")
        rc = rc if isinstance(rc, str) else f"{rc['kind']} {rc.get('method', '')} {rc.get('num_layers', '')}".strip()
        shape = f"{x['tp']}x{x['pp']}x{x['gpus'] // (x['tp'] * x['pp'] * x.get('cp', 1))} ({x.get('vp', 1)})"
        if r.split == "not_modelled":
            pred_s = err_s = band_s = "not modelled"
        else:
            p = fidelity.predicted_step(r, fits)
            low, high = band.apply(p)
            pred_s, err_s, band_s = f"{p:.3f}", f"{_pct(p, r.published_step_s):+.1f}%", f"{low:.2f}-{high:.2f}"
        lines.append(f"| {r.id} | {r.source} | {r.gpu} | {r.split} | {shape} | {x['gbs']}/{x['mbs']} | {rc} | "
                     f"{r.figure} | {r.published_step_s:.3f} | {pred_s} | {err_s} | {band_s} |")
    errs = np.abs([e for _, e in held]) * 100
    inside = sum(band.lo <= e <= band.hi for _, e in held)
    lines += ["", "## 4. Goal figures", "",
              "| figure | goal | measured | met |", "|---|---:|---:|---|",
              f"| held-out median abs step-time error | <= 5% | {np.median(errs):.2f}% | {np.median(errs) <= 5} |",
              f"| held-out worst abs error | <= 10% | {errs.max():.1f}% | {errs.max() <= 10} |"]
    worst = {s: max(abs(e) for _, e in v) * 100 for s, v in lo.items()}
    lw = max(worst.values())
    lines += [f"| leave-one-source-out worst abs error | <= 15% | {lw:.1f}% | {lw <= 15} |",
              f"| held-out truth inside the {band.coverage:.0%} band | {band.coverage:.0%} | "
              f"{inside}/{len(held)} | {inside / len(held) >= band.coverage} (in sample: the band is cut from these "
              "residuals at split-conformal ranks) |",
              f"| out of source: each source's rows inside the band of the others' LOSO residuals | "
              f"{band.coverage:.0%} | {band.out_of_source[0]}/{band.out_of_source[1]} | "
              f"{band.out_of_source[0] / band.out_of_source[1] >= band.coverage} |", "",
              "Held-out errors by row: " + ", ".join(f"{r.id} {100 * e:+.1f}%" for r, e in held), "",
              "## 5. Leave one source out (refit without the source, predict all its rows)", "",
              "| source left out | rows | median abs error | worst abs error |", "|---|---:|---:|---:|"]
    for s, v in lo.items():
        a = np.abs([e for _, e in v]) * 100
        lines.append(f"| {s} | {len(v)} | {np.median(a):.1f}% | {a.max():.1f}% |")
    lines += ["", "## 6. Transcription cross-check: Korthikanti et al. step times vs the Megatron-LM README's MFU", "",
              "| row | published s | implied MFU (72 B s l h^2 (1 + s/6h + V/12lh) / GPUs / 312 TFLOP/s / s) | README MFU |",
              "|---|---:|---:|---:|"]
    readme = {"k22-22b-sel": 41.5, "k22-175b-sel": 51.4, "k22-530b-sel": 56.0, "k22-1t-sel": 56.3}
    for r in rows:
        if r.id in readme:
            x = r.raw
            # Korthikanti et al.'s MFU counts 72 B s l h^2 (1 + s/6h + V/(12 l h)) model FLOPs.
            f = 72.0 * x["gbs"] * x["seq"] * x["layers"] * x["hidden"] ** 2 * (
                1 + x["seq"] / (6 * x["hidden"]) + x["vocab"] / (12 * x["layers"] * x["hidden"]))
            mfu = 100 * f / (x["gpus"] * 312e12 * r.published_step_s)
            lines.append(f"| {r.id} | {r.published_step_s} | {mfu:.1f}% | {readme[r.id]}% |")
    lines.append("")
    return rows, fits


def memory_section(lines: list[str]) -> None:
    lines += ["## 7. Memory: the published configs ran in 80 GB; without recomputation (or at a larger batch) they would not", "",
              "No published per-GPU memory figure is used here: the check is that what ran is predicted to fit, "
              "and that dropping recomputation (which the papers needed) is predicted not to.", "",
              "| run | config | predicted peak GB | predicted OOM | published |", "|---|---|---:|---|---|"]
    for run in FIT_RUNS[2::2]:
        cfg = run.config()
        plain = dataclasses.replace(cfg, recompute=NoRecompute(),
                                    tensor_parallel=dataclasses.replace(cfg.tensor_parallel, sequence_parallel=False))
        for label, c, paper in (("as published (full recompute)", cfg, "ran"),
                                ("no recompute, no SP", plain, "not run")):
            oom, _ = predicts_oom(c)
            peak = predict(c).peak_memory_bytes / 1e9
            lines.append(f"| {run.name.split()[0]} | {label} | {peak:.0f} | {oom} | {paper} |")
    # torchtitan's page: Llama 2 70B with selective (op) AC ran at local batch 1 and ran out of memory at 2.
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    r = next(r for r in rows if r.id == "tt-llama2-70b-sel-op")
    cfg = r.config(fidelity.transferred_efficiency(fits, r.gpu))
    bs2 = apply_params(cfg, {"batch.micro_batch_size": 2, "batch.global_batch": 2 * cfg.batch.global_batch})
    for label, c, page in (("local batch 1", cfg, "ran"), ("local batch 2", bs2, "out of memory (the page's footnote)")):
        oom, _ = predicts_oom(c)
        lines.append(f"| torchtitan Llama 2 70B, op AC, FSDP2 | {label} | {predict(c).peak_memory_bytes / 1e9:.0f} "
                     f"| {oom} | {page} |")
    lines.append("")


FEASIBILITY_WHY = {
    "TT": "FSDP2 as transcribed (orchestrator/planner/fsdp.py: state sharded 18/d, gathered blocks, one reduce-scatter "
          "buffer): the assumed recompute or sequence length, or the activation model",
    "L3": "no recompute (stated) keeps every layer's activations (0.57 GB per layer at TP8 + SP) for the "
          "interleaved warm-up's 2(p-1) + (v-1)p + 1 = 143 chunk passes on stage 0 (V = 8), 112 of them through "
          "a layer (the other 31 through the embedding-only chunk), plus FSDP without resharding (gathered "
          "blocks and the unsharded fp32 gradient accumulation, 20 GB); the paper's deallocation of stage "
          "input/output tensors and its own schedule (a configurable number of consecutive microbatches per "
          "chunk) are not modelled",
}


def feasibility_section(lines: list[str]) -> None:
    """Every row as transcribed must fit in its GPU's memory: a row that does not is a transcription (or a
    mechanism the planner lacks), whatever its step-time error. A diagnostic, not a new split."""
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    held = fidelity.heldout_residuals(rows, fits)
    lines += ["## 8. Transcription check: does each row, as transcribed, fit in its GPU's memory?", "",
              "Rows predicted not to fit in HBM as transcribed (predicted peak > the GPU's memory). Their step time "
              "is then predicted for a config that cannot have run. This check was added after the goal figures above "
              "were seen, so it does not change the declared split: the figures in section 4 stay the result. The "
              "line after the table is a diagnostic only.", "",
              "| row | split | predicted peak GB | HBM GB | step-time error | why |", "|---|---|---:|---:|---:|---|"]
    out = set()
    for r in rows:
        if r.split == "not_modelled":
            continue
        cfg = r.config(fidelity.transferred_efficiency(fits, r.gpu))
        p = predict(cfg)
        if not p.fits_memory:
            out.add(r.id)
            err = _pct(fidelity.predicted_step(r, fits), r.published_step_s)
            lines.append(f"| {r.id} | {r.split} | {p.peak_memory_bytes / 1e9:.0f} | {cfg.cluster.hbm_gb:.0f} | "
                         f"{err:+.1f}% | {FEASIBILITY_WHY.get(r.source, 'the memory model (a few GB) or the transcription')} |")
    rest = np.abs([e for r, e in held if r.id not in out]) * 100
    lines += ["", f"Held-out rows that do fit ({len(rest)} of {len(held)}): median abs error {np.median(rest):.1f}%, "
              f"worst {rest.max():.1f}% (diagnostic).", ""]
    fsdp_memory(lines, rows, fits)


def fsdp_memory(lines: list[str], rows, fits) -> None:
    """The rows that ran FSDP: where their predicted peak comes from (orchestrator/planner/fsdp.py)."""
    lines += ["Rows that ran FSDP (transcribed as data_parallel.kind fsdp; docs/planner.md, FSDP): predicted memory "
              "per GPU by part, GB.", "",
              "| row | params | grads | optimizer | activations | FSDP buffers | reserved | peak | HBM |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "fsdp" not in r.raw or r.split == "not_modelled":
            continue
        cfg = r.config(fidelity.transferred_efficiency(fits, r.gpu))
        p = predict(cfg)
        m = p.memory_per_stage[0]
        cells = " | ".join(f"{m[k] / 1e9:.1f}" for k in ("params", "grads", "optimizer", "activations", "fsdp_buffers",
                                                          "reserved"))
        lines.append(f"| {r.id} | {cells} | {p.peak_memory_bytes / 1e9:.1f} | {cfg.cluster.hbm_gb:.0f} |")
    lines.append("")


TT_NIC_GBPS = (25.0, 12.5, 6.25)
"""Inter-node bandwidth per GPU for the torchtitan sensitivity: the DGX A100 file's, a half and a quarter."""


def torchtitan_section(lines: list[str]) -> None:
    """torchtitan's rows: their MFU as the page computes it (a transcription check), and how the predicted step
    moves with the network, which the page does not state (a sensitivity: the rows keep the cluster file's)."""
    rows = [r for r in corpus.load() if r.source == "TT"]
    fits = fidelity.fit_all(corpus.load())
    lines += ["## 9. torchtitan rows: MFU cross-check and network sensitivity (diagnostic)", "",
              "MFU from the published tokens/s as (6 N + 12 l h s) tokens/s / 312 TFLOP/s, N every GEMM and "
              "embedding parameter (the basis that reproduces the page's figures). Step error at lower inter-node bandwidth per GPU (GB/s); the corpus keeps "
              f"{TT_NIC_GBPS[0]:g}.", "",
              "| row | page MFU | implied MFU | " + " | ".join(f"error at {b:g}" for b in TT_NIC_GBPS) + " |",
              "|---|---:|---:|" + "---:|" * len(TT_NIC_GBPS)]
    for r in rows:
        x = r.raw
        h, layers, g = x["hidden"], x["layers"], x["gated_ffn"]
        kv = x.get("kv_heads", x["heads"]) * (h // x["heads"])
        n = layers * (2 * h * h + 2 * h * kv + 3 * h * g) + 2 * x["vocab"] * h  # norms aside: < 0.01%
        implied = (6 * n + 12 * layers * h * x["seq"]) * x["mbs"] * x["seq"] / r.published_step_s / 312e12
        cfg = r.config(fidelity.transferred_efficiency(fits, r.gpu))
        errs = []
        for bw in TT_NIC_GBPS:
            c = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, inter_node_bw_GBps=bw))
            errs.append(f"{_pct(predict(c).step_time_s, r.published_step_s):+.1f}%")
        lines.append(f"| {r.id} | {x['page_mfu']}% | {100 * implied:.1f}% | " + " | ".join(errs) + " |")
    lines.append("")


MTNLG_SCALE = ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113))
"""Smith et al. 2022, Sec. 2.4: DGX A100 nodes, seconds per iteration and TFLOP/s per GPU at batch 1,920 (the
280-node point is the corpus row; the other two are the same run's layout at DP 10 and 12). Transcribed from a
third-party quote of the section (llm-analysis, examples/megatron-turing-nlg/README.md); the section itself
was not reachable here. The bench checks each against its TFLOP/s."""


def mtnlg_section(lines: list[str]) -> None:
    """MT-NLG at the three cluster sizes its paper reports (diagnostic, not corpus rows): whether the planner's
    shortfall is a fixed cost per update or grows with the microbatches each pipeline runs."""
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    r = next(x for x in rows if x.id == "mtnlg-530b")
    x = r.raw
    lines += ["## 10. MT-NLG at its three published cluster sizes (diagnostic, not corpus rows)", "",
              "Same model and TP8 x PP35 layout, batch 1,920, DP 8 / 10 / 12 (Smith et al. 2022, Sec. 2.4; only the "
              "280-node run is a corpus row, held out). Missing = published - predicted; per slot = missing / "
              "(microbatches + pp - 1), the pipeline's 1F1B time slots.", "",
              "| nodes | microbatches | published s | TFLOP/s (paper / eq. 3 from the time) | predicted s | error | "
              "missing s | missing per slot ms |", "|---:|---:|---:|---|---:|---:|---:|---:|"]
    pts = []
    for nodes, t, tflops in MTNLG_SCALE:
        cfg = dataclasses.replace(r, raw={**x, "gpus": 8 * nodes}).config(fidelity.transferred_efficiency(fits, r.gpu))
        p = predict(cfg)
        eq3 = corpus.eq3_flops(x) / (8 * nodes * t) / 1e12
        missing = t - p.step_time_s
        slots = p.microbatches + x["pp"] - 1
        pts.append((slots, missing))
        lines.append(f"| {nodes} | {p.microbatches} | {t} | {tflops} / {eq3:.1f} | {p.step_time_s:.2f} | "
                     f"{_pct(p.step_time_s, t):+.1f}% | {missing:.1f} | {1e3 * missing / slots:.0f} |")
    slope, fixed = np.polyfit([a for a, _ in pts], [b for _, b in pts], 1)
    lines += ["", f"A line through the three: missing = {1e3 * slope:.0f} ms per slot + {fixed:.1f} s per update. Part of "
              "the shortfall grows with the microbatches a pipeline runs and part does not.", ""]
    deepspeed_checks(lines, r, fits)


def train_schedule_time(F: np.ndarray, B: np.ndarray, send: float, m: int) -> float:
    """The pipeline part of an update under DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py), step
    by step: 2 (m + p - 1) steps; in each, every stage runs one forward or one backward (or nothing), even stages
    forward on even steps, odd stages on odd steps; a step starts with blocking sends and receives with one
    neighbour (a forward step with the stage before it, a backward step with the one after), which wait for
    both to have finished the previous step, ``send`` seconds per message. ``F``, ``B``: per stage, one
    microbatch (B with its recompute). Returns the last stage's end."""
    p, end = len(F), np.zeros(len(F))
    prev = [-1] * p
    for k in range(2 * (m + p - 1)):
        new = end.copy()
        for s in range(p):
            fwd = k % 2 == s % 2  # TrainSchedule._step_to_micro_batch, its four cases
            if fwd:
                mb = (k - k % 2) // 2 - s // 2
            elif k % 2 == 0:  # an odd stage's backward on an even step
                mb = k // 2 - p + (s + 1) // 2
            else:  # an even stage's backward on an odd step
                mb = (k - 1) // 2 - p + 1 + s // 2
            partner = s - 1 if fwd else s + 1
            msgs = (0 <= mb < m) + (0 <= prev[s] < m) if 0 <= partner < p else 0
            start = max(end[s], end[partner]) + msgs * send if msgs else end[s]
            new[s] = start + ((F[s] if fwd else B[s]) if 0 <= mb < m else 0.0)
            prev[s] = mb
        end = new
    return float(end.max())


def deepspeed_checks(lines: list[str], r, fits) -> None:
    """The two ways DeepSpeed's pipeline engine (which MT-NLG ran: Smith et al. 2022) differs from Megatron's
    schedule, each priced for the corpus row: its step-synchronous TrainSchedule, and sending whole activations
    instead of a 1/t slice per tensor-parallel rank (which DeepSpeed does not do: with tensor parallelism its
    engine partitions them, ``is_pipe_partitioned = is_model_parallel``, and all-gathers on arrival, as
    Megatron's scatter/gather does)."""
    cfg = r.config(fidelity.transferred_efficiency(fits, r.gpu))
    p = predict(cfg)
    C, K = Consts.of(cfg), encode([cfg])
    st = stage_times(C, K)
    F, B, send = st["F"][0], st["B"][0], float(st["p2p"][0])
    m, pp = cfg.microbatches, cfg.parallel.pp
    rest = p.step_time_s - p.compute_track_s
    lockstep = train_schedule_time(F, B, send, m) + rest
    T, h, t = cfg.batch.micro_batch_size * cfg.job.seq_len, cfg.model.hidden_size, cfg.tensor_parallel.size
    whole = float(p2p_time(2.0 * T * h, C.bw_pp, *C.pp_latency()))
    whole_s = p.step_time_s + 2 * (m + pp - 1) * (whole - send)
    pub = r.published_step_s
    lines += ["DeepSpeed's pipeline engine, priced for the corpus row (mtnlg-530b; the planner's per-stage forward "
              f"{1e3 * F.max():.1f} ms and backward with recompute {1e3 * B.max():.1f} ms per microbatch, one send "
              f"{1e3 * send:.2f} ms):", "",
              "| what | predicted s | error |", "|---|---:|---:|",
              f"| the planner (Megatron's 1F1B: m x the slowest stage + fill and drain) | {p.step_time_s:.2f} | "
              f"{_pct(p.step_time_s, pub):+.1f}% |",
              f"| DeepSpeed's TrainSchedule step by step: 2(m + p - 1) steps, blocking sends paired at each step "
              f"| {lockstep:.2f} | {_pct(lockstep, pub):+.1f}% |",
              f"| whole {2 * T * h / 1e6:.0f} MB activations per send from every TP rank (not what DeepSpeed does "
              f"under TP) | {whole_s:.2f} | {_pct(whole_s, pub):+.1f}% |", "",
              "The step-synchronous schedule costs what 1F1B costs (each step waits for its neighbour, but the "
              "neighbours are a pass apart, as in 1F1B), and DeepSpeed partitions the sends as Megatron does: "
              "neither mechanism the source describes accounts for the gap.", ""]


def uncertainty_section(lines: list[str], rows, fits, replicates: int) -> None:
    """Bootstrap every generation's fit over its fit rows, store it (corpus/uncertainty.yaml), and check the
    intervals it gives on the held-out rows with three choices of residuals."""
    sets = fidelity.refresh_uncertainty(rows, fits, replicates)
    u = sets["b200"].uncertainty
    lines += ["## 11. The fits' uncertainty (orchestrator/planner/corpus/uncertainty.yaml)", "",
              f"Each generation's fit repeated {replicates} times on its fit rows drawn with replacement (the H100 "
              f"fit from each replicate's A100 set; seed {fidelity.BOOTSTRAP_SEED}), beside the held-out rows' "
              "step-time residuals log(published / predicted). A prediction made with a corpus set (the 500B "
              "preset's blind set is the b200 one: `planner.uncertainty: {corpus: b200}`) carries the 5th-95th "
              "percentile of its prediction under every replicate times a drawn residual "
              "(orchestrator/planner/uncertainty.py).", "",
              "| set | field | point | 90% of the replicates |", "|---|---|---:|---|"]
    for g in ("a100-80gb", "h100-sxm"):
        for name, point in sets[g].point.items():
            iv = sets[g].uncertainty.field_interval(name, point)
            lines.append(f"| {g} | {name} | {point:.4g} | {iv.low:.4g}-{iv.high:.4g} |")
    lines += ["", f"b200 and h200 take the h100-sxm set and its replicates ({u.basis}).", "",
              "Which residuals: the share of the 25 held-out rows whose published step time falls inside its 90% "
              "interval (built with that row's own residual left out), by what the replicates are combined with:", "",
              "| residuals | held-out rows inside | median width (high - low) / point |", "|---|---:|---:|"]
    for label, key in (("none (the replicates' spread alone)", "none"), ("the fit rows' own (in sample)", "fit"),
                       ("the other held-out rows' (stored)", "heldout")):
        inside, n, width = fidelity.heldout_coverage(rows, fits, sets, key)
        lines.append(f"| {label} | {inside}/{n} ({inside / n:.0%}) | {100 * width:.1f}% |")
    lines += ["", "Only the held-out residuals make the interval hold what it states: the fit rows are reproduced "
              "closely by construction, and the parameters' spread alone says nothing of what the model lacks. The "
              "stored sets use them.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner_validation.md"))
    ap.add_argument("--replicates", type=int, default=fidelity.BOOTSTRAP_REPLICATES,
                    help="bootstrap refits of every generation (default: %(default)s; the stored file's count)")
    args = ap.parse_args()
    lines = ["# Planner validation", "", "Command: `.venv/bin/python bench/planner_validation.py`", ""]
    rows, fits = corpus_section(lines)
    memory_section(lines)
    feasibility_section(lines)
    torchtitan_section(lines)
    mtnlg_section(lines)
    uncertainty_section(lines, rows, fits, args.replicates)
    lines += ["The 500B preset, blind and calibrated: `python bench/preset_500b.py` (bench/results/preset_500b.md).", ""]
    write_and_print("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
