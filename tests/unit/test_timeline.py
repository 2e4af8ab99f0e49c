"""The timeline picture from synthetic spans: a valid PNG of the expected size, colours where expected."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest

from orchestrator.review.timeline import PHASE_COLOURS, UNKNOWN_COLOUR, render_timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _spans(step: int, shift: float, unknown: bool = False) -> list[dict]:
    s = [("forward", 0.00, 0.02), ("pipeline_idle", 0.02, 0.03), ("backward", 0.03, 0.07),
         ("dp_reduce", 0.05, 0.08), ("dp_reduce", 0.06, 0.08), ("dp_comm_wait", 0.07, 0.08),
         ("optimizer", 0.08, 0.10), ("reduce", 0.09, 0.09)]  # a zero-length launch mark
    if unknown:
        s.append(("mystery_phase", 0.10, 0.12))
    return [{"step": step, "phase": p, "start_s": a + shift, "end_s": b + shift} for p, a, b in s]


def _result(n_pp: int = 2, n_dp: int = 2, unknown: bool = False) -> dict:
    ranks = []
    for pp in range(n_pp):
        for dp in range(n_dp):
            spans = _spans(5, 0.001 * pp, unknown) + _spans(6, 0.002 * dp, unknown)
            ranks.append({"rank": pp * n_dp + dp, "pp_rank": pp, "dp_rank": dp, "spans": spans})
    return {"config": {"parallel": {"pp": n_pp, "dp": n_dp}, "pipeline": {"schedule": "1f1b"},
                       "batch": {"micro_batch_size": 1}, "data_parallel": {"kind": "replicate"},
                       "recompute": {"kind": "none"}},
            "summary": {"step_time_s": 0.1}, "ranks": ranks}


def _has_colour(img: np.ndarray, hex_colour: str, tol: float = 0.01, min_pixels: int = 2000) -> bool:
    # A bar is a solid block of pixels; anti-aliased text and edges give only scattered ones.
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img[..., :3] - rgb).max(axis=-1) < tol).sum()) >= min_pixels


def test_png_is_valid_with_one_row_per_rank(tmp_path):
    path = render_timeline(_result(), tmp_path / "sub" / "timeline.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(path)
    # 13 in x 100 dpi wide; height grows with the rank count (1.8 in + 0.42 in per rank).
    assert img.shape[1] == 1300 and img.shape[0] == int(round((1.8 + 0.42 * 4) * 100))
    for phase in ("forward", "backward", "optimizer", "dp_comm_wait"):
        assert _has_colour(img, PHASE_COLOURS[phase]), phase


def test_height_follows_rank_count(tmp_path):
    small = mpimg.imread(render_timeline(_result(1, 1), tmp_path / "a.png"))
    big = mpimg.imread(render_timeline(_result(4, 2), tmp_path / "b.png"))
    assert big.shape[0] > small.shape[0]


def test_unknown_phase_gets_the_neutral_colour(tmp_path):
    img = mpimg.imread(render_timeline(_result(unknown=True), tmp_path / "t.png"))
    assert _has_colour(img, UNKNOWN_COLOUR)
    plain = mpimg.imread(render_timeline(_result(), tmp_path / "p.png"))
    assert not _has_colour(plain, UNKNOWN_COLOUR)


@pytest.mark.parametrize("result", [{}, {"ranks": []}, {"ranks": [{"rank": 0, "pp_rank": 0, "dp_rank": 0, "spans": []}]}])
def test_nothing_recorded_still_gives_a_picture(tmp_path, result):
    path = render_timeline(result, tmp_path / "empty.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert mpimg.imread(path).shape[1] == 1300


def test_pure_no_pyplot_state(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    render_timeline(_result(), tmp_path / "t.png", steps=1)
    assert plt.get_fignums() == before
