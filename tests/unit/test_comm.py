"""The communication model against hand-computed cases, and the overlap rule's bounds."""

import numpy as np
import pytest

from orchestrator.planner.comm import (all_gather_time, all_reduce_time, bucket_tail, bus_bandwidth,
                                       exposed_after_slack, reduce_scatter_time)


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
