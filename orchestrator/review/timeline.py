"""The per-rank timeline picture: what an engineer would otherwise open Nsight Systems for.

One row per rank, a few measured updates laid side by side, each phase span a coloured bar. Gradient
reduction buckets (``dp_reduce``) run *under* other phases, so they get a thin lane of their own at the
top of the row: overlap shows as the two drawn on top of each other, exposed communication as
``dp_comm_wait`` in the main lane. A pure function of the result dict; matplotlib's Agg canvas is used
directly (no pyplot), so rendering never touches global state or needs a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

# Main-lane phases, in legend order. Colours chosen so that the two kinds of waiting (communication
# and pipeline bubbles) stand out against compute.
PHASE_COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "optimizer": "#8172B2",
    "dp_comm_wait": "#C44E52",
    "pipeline_idle": "#D9D9D9",
}
# Spans that overlap the main lane (gradient-reduction buckets in flight).
OVERLAY_PHASES = {"dp_reduce": "#DD8452", "reduce": "#DD8452", "tp_comm": "#937860"}
UNKNOWN_COLOUR = "#999999"
LABELS = {
    "forward": "forward", "backward": "backward", "optimizer": "optimizer",
    "dp_comm_wait": "dp communication wait (exposed)", "pipeline_idle": "pipeline idle (bubble)",
    "dp_reduce": "gradient reduce in flight", "reduce": "gradient reduce in flight",
    "tp_comm": "tensor-parallel communication (inside forward/backward)",
}
MAX_ROWS = 64  # beyond this the picture is unreadable anyway; the title says how many were left out
GAP_FRACTION = 0.04  # blank space between consecutive steps, as a fraction of the longest step


def render_timeline(result: dict[str, Any], path: Path, steps: int = 2) -> Path:
    """Draw the first ``steps`` recorded updates of every rank of ``result`` (a ``Result.to_dict()``)
    into a PNG at ``path``; returns ``path``. Ranks without spans still get their (empty) row."""
    path = Path(path)
    ranks = sorted(result.get("ranks") or [], key=lambda r: (r.get("pp_rank", 0), r.get("dp_rank", 0),
                                                              r.get("rank", 0)))
    shown_steps = sorted({s["step"] for r in ranks for s in r.get("spans", [])})[:max(1, steps)]
    left_out = max(0, len(ranks) - MAX_ROWS)
    ranks = ranks[:MAX_ROWS]

    # Each step's width is its slowest rank's last span end, so the steps line up across rows.
    widths = {st: max((s["end_s"] for r in ranks for s in r.get("spans", []) if s["step"] == st), default=0.0)
              for st in shown_steps}
    gap = GAP_FRACTION * max(widths.values(), default=0.0)
    offsets, x = {}, 0.0
    for st in shown_steps:
        offsets[st] = x
        x += widths[st] + gap

    n = max(1, len(ranks))
    fig = Figure(figsize=(13, 1.8 + 0.42 * n), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    seen: dict[str, str] = {}
    for row, r in enumerate(ranks):
        y = n - 1 - row  # first pipeline stage on top
        for s in r.get("spans", []):
            if s["step"] not in offsets:
                continue
            phase = str(s.get("phase", "?"))
            start = offsets[s["step"]] + float(s["start_s"])
            # Zero-length spans (an instant, e.g. a launch) still get a visible sliver.
            width = max(float(s["end_s"]) - float(s["start_s"]), 0.002 * max(x, 1e-9))
            if phase in OVERLAY_PHASES:
                colour = OVERLAY_PHASES[phase]
                ax.broken_barh([(start, width)], (y + 0.28, 0.14), facecolors=colour, alpha=0.45, linewidth=0)
            else:
                colour = PHASE_COLOURS.get(phase, UNKNOWN_COLOUR)
                ax.broken_barh([(start, width)], (y - 0.38, 0.62), facecolors=colour,
                               edgecolor="white", linewidth=0.3)
            seen.setdefault(phase, colour)

    for st in shown_steps:
        ax.axvline(offsets[st], color="black", linewidth=0.6, linestyle=":")
        ax.text(offsets[st] + widths[st] / 2, n - 0.4, f"step {st}", ha="center", va="bottom", fontsize=9)
    ax.set_yticks(range(n))
    with_tp = ((result.get("config") or {}).get("tensor_parallel") or {}).get("size", 1) > 1
    ax.set_yticklabels([_row_label(r, with_tp) for r in reversed(ranks)] or ["(no ranks)"], fontsize=8)
    ax.set_ylim(-0.7, n - 0.1 + 0.35)
    ax.set_xlim(0, x if x > 0 else 1.0)
    ax.set_xlabel("seconds (each update starts at its dotted line)")
    ax.set_title(_title(result, shown_steps, left_out), fontsize=10)
    if not shown_steps:
        ax.text(0.5, 0.5, "no phase spans recorded (run.timeline_steps = 0 or the trial failed)",
                transform=ax.transAxes, ha="center", va="center")
    order = list(PHASE_COLOURS) + sorted(p for p in seen if p not in PHASE_COLOURS)
    handles = [Patch(facecolor=seen[p], label=LABELS.get(p, p)) for p in order if p in seen]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _row_label(rank: dict[str, Any], with_tp: bool = False) -> str:
    tp = f", tp {rank.get('tp_rank', 0)}" if with_tp else ""
    return f"rank {rank.get('rank', '?')} (pp {rank.get('pp_rank', '?')}, dp {rank.get('dp_rank', '?')}{tp})"


def _title(result: dict[str, Any], steps: list[int], left_out: int) -> str:
    cfg = result.get("config") or {}
    par, pipe = cfg.get("parallel") or {}, cfg.get("pipeline") or {}
    dp_kind = (cfg.get("data_parallel") or {}).get("kind", "?")
    rec = (cfg.get("recompute") or {}).get("kind", "?")
    micro = (cfg.get("batch") or {}).get("micro_batch_size")
    parts = [f"per-rank timeline, steps {', '.join(map(str, steps)) or '-'}"]
    if par:
        parts.append(f"pp={par.get('pp')} dp={par.get('dp')} {pipe.get('schedule', '')} "
                     f"micro_batch={micro} {dp_kind} recompute={rec}")
    step_time = (result.get("summary") or {}).get("step_time_s")
    if step_time:
        parts.append(f"median step {step_time * 1e3:.1f} ms")
    if left_out:
        parts.append(f"first {MAX_ROWS} ranks shown, {left_out} left out")
    return " | ".join(parts)
