"""The communication model against hand-computed cases, and the overlap rule's bounds."""

import numpy as np
import pytest

from orchestrator.planner.comm import (all_gather_time, all_reduce_time, bucket_tail, bucketed_time, bus_bandwidth,
                                       exposed_after_slack, p2p_time, reduce_scatter_time)


def test_ring_all_reduce_of_1gb_over_8_gpus_at_100_GBps():
    # 2 (n-1)/n * 1e9 B / 100e9 B/s = 17.5 ms, plus min(ring 14 hops, tree 2*3 hops) * 5 us = 30 us
    t = all_reduce_time(8, 1e9, 100e9, 5e-6)
    assert float(t) == pytest.approx(0.0175 + 6 * 5e-6, rel=1e-12)


def test_reduce_scatter_and_all_gather_move_half_an_all_reduce():
    rs = reduce_scatter_time(4, 4e8, 50e9, 0.0)
    assert float(rs) == pytest.approx(0.75 * 4e8 / 50e9)
    assert float(all_gather_time(4, 4e8, 50e9, 0.0)) == pytest.approx(float(rs))
    assert float(all_reduce_time(4, 4e8, 50e9, 0.0)) == pytest.approx(2 * float(rs))
    assert float(all_reduce_time(1, 4e8, 50e9, 1e-3)) == 0.0


def test_bus_bandwidth_inside_a_node_and_across_rails():
    assert bus_bandwidth(8, 8, 300e9, 25e9) == 300e9              # all on NVLink
    assert bus_bandwidth(32, 8, 300e9, 25e9) == 200e9             # 8 rails x 25 GB/s < NVLink
    assert bus_bandwidth(32, 1, 300e9, 25e9) == 25e9              # TP8: one member, one NIC per node
    assert bus_bandwidth(64, 8, 150e9, 25e9) == 150e9             # NVLink caps the rails


@pytest.mark.parametrize("per_bucket,n,window", [(0.1, 10, 0.5), (0.01, 10, 5.0), (1.0, 1, 3.0), (0.2, 40, 7.9)])
def test_overlap_never_hides_more_than_the_compute_it_overlaps(per_bucket, n, window):
    total = per_bucket * n
    tail = float(bucket_tail(per_bucket, n, window))
    hidden = total - tail
    assert tail >= per_bucket - 1e-15          # the last bucket is always exposed
    assert hidden <= window + 1e-12            # never more than the window
    assert tail <= total + 1e-12


def test_bucket_tail_hand_case():
    # 4 buckets of 1 s ready at 1, 2, 3, 4 s of a 4 s backward: sends end at 5 s -> 1 s tail
    assert float(bucket_tail(1.0, 4, 4.0)) == pytest.approx(1.0)
    # 4 buckets of 2 s: first ready at 1 s, sends back to back end at 9 s -> 5 s after the window
    assert float(bucket_tail(2.0, 4, 4.0)) == pytest.approx(5.0)
    assert np.allclose(exposed_after_slack([5.0, 5.0], [0.0, 6.0]), [5.0, 0.0])


# ---- every collective: latency + bytes / bandwidth per message (issue 28) ---------------------------------

@pytest.mark.parametrize("n, nbytes, bus, alpha, msg, expect", [
    # latency-bound: 8 bytes, 2 ranks: 2 hops of alpha + the message's fixed cost, bytes negligible
    (2, 8, 1e9, 200e-6, 500e-6, 2 * 200e-6 + 500e-6 + 8 / 1e9),
    # bandwidth-bound: 1 GB over 8 ranks: 2 x 7/8 of it at the bus bandwidth dominates
    (8, 1e9, 100e9, 5e-6, 10e-6, 2 * 7 / 8 * 1e9 / 100e9 + 2 * 3 * 5e-6 + 10e-6),
])
def test_all_reduce_is_latency_plus_bytes_over_bandwidth_per_message(n, nbytes, bus, alpha, msg, expect):
    assert float(all_reduce_time(n, nbytes, bus, alpha, msg)) == pytest.approx(expect)


def test_latency_bound_and_bandwidth_bound_regimes():
    small = float(all_reduce_time(2, 8, 1e9, 200e-6, 500e-6))
    big = float(all_reduce_time(2, 1e9, 1e9, 200e-6, 500e-6))
    assert (small - 900e-6) / small < 1e-4            # tiny message: all latency
    assert (1e9 / 1e9) / big > 0.99                   # 1 GB: all bandwidth


@pytest.mark.parametrize("overlap", [False, True])
def test_halving_the_bucket_doubles_the_latency_term(overlap):
    """n buckets of the same gradient bytes pay n messages: the bandwidth term is the same, the latency doubles."""
    total, bus, alpha, msg = 4e6, 1e9, 100e-6, 400e-6
    def dp(n):
        per = all_reduce_time(2, total / n, bus, alpha, msg)
        return float(bucket_tail(per, n, 0.0) if overlap else bucketed_time(per, n))
    lat = 2 * alpha + msg
    bw_term = total / bus
    assert dp(4) == pytest.approx(4 * lat + bw_term)
    assert dp(8) == pytest.approx(8 * lat + bw_term)
    assert dp(8) - bw_term == pytest.approx(2 * (dp(4) - bw_term))


def test_overlap_hides_at_most_its_share_of_the_window_and_never_the_last_bucket():
    per, n, window = 1e-3, 10, 20e-3
    assert float(bucket_tail(per, n, window, 1.0)) == pytest.approx(per)                      # all but the last hidden
    assert float(bucket_tail(per, n, window, 0.25)) == pytest.approx(n * per - 0.25 * window * (n - 1) / n)
    assert float(bucket_tail(per, n, window, 0.0)) == pytest.approx(n * per)                  # nothing hidden
    assert float(bucket_tail(per, 1, window, 1.0)) == pytest.approx(per)                      # one bucket: exposed


def test_p2p_and_reduce_scatter_pay_the_message_cost_once():
    assert float(p2p_time(1e6, 1e9, 10e-6, 90e-6)) == pytest.approx(1e-3 + 100e-6)
    assert float(reduce_scatter_time(4, 4e6, 1e9, 10e-6, 50e-6)) == pytest.approx(3e6 / 1e9 + 30e-6 + 50e-6)


def test_measured_dp_latency_replaces_the_links_hops_for_each_bucket():
    """efficiency.dp_latency_us (fitted from DP slices) is what each data-parallel bucket pays instead of the
    link's hops x latency: with it, 10x the buckets adds 9 x that latency to a no-overlap DP wait."""
    import dataclasses

    from orchestrator.planner import predict
    from orchestrator.calibration.prefilter import load_cluster, plan_for_trial
    from trainer.config import TrainConfig
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cluster, eff = load_cluster(root / "search_spaces" / "clusters" / "cpu-local.yaml")
    base = TrainConfig.from_dict({"model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 64},
                                  "batch": {"global_batch": 4}, "parallel": {"dp": 2},
                                  "data_parallel": {"kind": "replicate", "overlap_grad_reduce": False, "bucket_mb": 5.0}})
    def wait(bucket_mb, lat):
        cfg = dataclasses.replace(base, data_parallel=dataclasses.replace(base.data_parallel, bucket_mb=bucket_mb))
        return predict(plan_for_trial(cfg, cluster, dataclasses.replace(eff, dp_latency_us=lat))).dp_exposed_s
    one = wait(5.0, 1000.0)                                   # one bucket
    many = wait(5.0 / 100, 1000.0)
    no_lat = wait(5.0 / 100, 0.0)
    n = round((many - no_lat) / 1e-3)
    assert n > 1 and many - one == pytest.approx((n - 1) * 1e-3, rel=1e-6)
