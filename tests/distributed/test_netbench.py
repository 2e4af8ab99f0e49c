"""The network path end to end on CPU: a real gloo collective benchmark -> nccl-tests' format -> netcal -> planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.calibration import netcal
from orchestrator.calibration.prefilter import load_cluster
from trainer.measure.netbench import measure_local

pytestmark = pytest.mark.distributed
BASE = Path(__file__).resolve().parents[2] / "search_spaces" / "clusters" / "cpu-local.yaml"


@pytest.mark.timeout(180)
def test_gloo_tables_parse_as_nccl_tests_output_and_calibrate_a_cluster(tmp_path, capsys):
    text = measure_local("reduce_scatter", 2, min_bytes=1024, max_bytes=1 << 20, factor=32, iters=3, warmup=1)
    table = netcal.parse(text, "measured")  # the collective comes from the output's own header line
    assert (table.collective, table.ranks, table.tier) == ("reduce_scatter", 2, "intra_node")
    assert [p.size_bytes for p in table.points if not p.in_place] == [1024, 32768, 1 << 20]

    out = tmp_path / "cpu-measured.yaml"
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce", "--base", str(BASE), "--out", str(out)]) == 0
    assert "intra_node" in capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    (source,) = doc["provenance"]["sources"]
    assert source["collective"] == "all_reduce" and Path(source["file"]).is_file() and source["ranks"] == 2
    cluster, _ = load_cluster(out)
    assert cluster.intra_node_bw_GBps > 0 and cluster.intra_node_bw_GBps == doc["cluster"]["intra_node_bw_GBps"]


def test_one_preempted_call_does_not_move_a_sizes_time():
    # A busy neighbour preempts one call of a latency-bound size for 60 ms: the mean of one block (nccl-tests' way)
    # would read ~7 ms per call, the median of five blocks reads the 1 ms calls.
    import time

    import torch
    import torch.distributed as dist

    from trainer.measure import netbench
    from trainer.launch import free_port

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        calls = []

        def call():
            calls.append(1)
            time.sleep(0.060 if len(calls) == 4 else 0.001)  # the 4th call: 3 warm-up calls before it

        us = netbench._time(call, iters=10, warmup=3, device=torch.device("cpu"))
        assert len(calls) == 13
        assert 900 < us < 4000, us
    finally:
        dist.destroy_process_group()
