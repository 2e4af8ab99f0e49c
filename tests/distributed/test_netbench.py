"""The network path end to end on CPU: a real gloo collective benchmark -> nccl-tests' format -> netcal -> planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.plan import netcal
from orchestrator.plan.prefilter import load_cluster
from trainer.netbench import measure_local

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
