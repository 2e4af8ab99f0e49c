"""nccl-tests output -> the planner's network: the parser (formats, bad input), the fit, the cluster file, the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.calibration import netcal
from orchestrator.calibration.prefilter import load_cluster
from orchestrator.planner import comm
from trainer.measure.netbench import Row, format_table

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "search_spaces" / "clusters" / "h100-sxm.yaml"


def _read(name: str) -> netcal.Table:
    path = FIX / name
    return netcal.parse(path.read_text(), str(path))


def test_single_node_all_reduce_both_columns():
    t = _read("all_reduce_perf_8gpu.txt")
    assert (t.collective, t.ranks, t.nodes, t.tier) == ("all_reduce", 8, 1, "intra_node")
    assert t.devices == ("NVIDIA H100 80GB HBM3",)
    assert len(t.points) == 20 and sum(p.in_place for p in t.points) == 10
    assert (t.points[-2].size_bytes, t.points[-2].time_us, t.points[-1].time_us) == (1073741824, 5961.4, 5955.8)


def test_multi_node_header_and_interleaved_nccl_log_lines():
    t = _read("all_gather_perf_2node.txt")
    assert (t.collective, t.ranks, t.nodes, t.ranks_per_node, t.tier) == ("all_gather", 8, 2, 4, "inter_node")


def test_collective_from_the_starting_line_and_na_wrong_column():
    t = _read("sendrecv_perf_2node.txt")
    assert (t.collective, t.ranks, t.tier) == ("sendrecv", 2, "inter_node")


def _broken(tmp_path: Path, name: str, edit) -> Path:
    lines = (FIX / name).read_text().splitlines()
    path = tmp_path / name
    path.write_text("\n".join(edit(lines)) + "\n")
    return path


@pytest.mark.parametrize("edit, match", [
    (lambda ls: ls[:-4], r"all_reduce_perf_8gpu.txt:\d+: the output ends before .* truncated"),
    (lambda ls: ls[:20] + [ls[20][:40]] + ls[21:], r"all_reduce_perf_8gpu.txt:21: expected 13 columns"),
    (lambda ls: ls[:18] + [ls[18].replace("      0    18.", "      3    18.", 1)] + ls[19:],
     r"all_reduce_perf_8gpu.txt:19: 3 wrong values at 4096 B"),
    (lambda ls: [ln for ln in ls if "size" not in ln], r"no nccl-tests table header"),
    (lambda ls: [ln for ln in ls if "Rank  3" not in ln], r"must list ranks 0..N-1"),
    (lambda ls: ls[:18] + [ls[18].replace("18.95", "abc")] + ls[19:], r":19: size and time must be numbers"),
])
def test_malformed_output_is_one_line_naming_file_and_line(tmp_path, edit, match):
    path = _broken(tmp_path, "all_reduce_perf_8gpu.txt", edit)
    with pytest.raises(ValueError, match=match):
        netcal.parse(path.read_text(), str(path))


def test_which_collective_must_be_known(tmp_path):
    text = (FIX / "all_reduce_perf_8gpu.txt").read_text()
    with pytest.raises(ValueError, match="cannot tell which collective.*COLLECTIVE=FILE"):
        netcal.parse(text, str(tmp_path / "run1.log"))
    assert netcal.parse(text, "run1.log", "reduce_scatter").collective == "reduce_scatter"


def _synthetic(op: str, hosts: list[str], alpha_us: float, bus_GBps: float) -> str:
    """A table whose times follow the planner's own formulas exactly."""
    n = len(hosts)
    rows = []
    for size in (8, 1024, 65536, 1 << 20, 16 << 20, 256 << 20):
        if op == "all_reduce":
            t = float(comm.all_reduce_time(n, size, bus_GBps * 1e9, alpha_us * 1e-6))
        elif op == "sendrecv":
            t = float(comm.p2p_time(size, bus_GBps * 1e9, alpha_us * 1e-6))
        else:
            t = float(comm.reduce_scatter_time(n, size, bus_GBps * 1e9, alpha_us * 1e-6))
        rows.append(Row(size, size // 4, t * 1e6, t * 1e6))
    return format_table(op, rows, [(h, "GPU", 1) for h in hosts], "synthetic")


@pytest.mark.parametrize("op, hosts", [("all_reduce", ["a"] * 8), ("reduce_scatter", ["a"] * 4),
                                       ("all_gather", ["a"] * 4 + ["b"] * 4), ("all_reduce", ["a", "b"]),
                                       ("sendrecv", ["a", "b"])])
def test_fit_recovers_the_planners_own_parameters(op, hosts):
    table = netcal.parse(_synthetic(op, hosts, alpha_us=7.0, bus_GBps=120.0), f"{op}.txt")
    (f,) = netcal.fit([table]).values()
    per_node = 1 if table.nodes == 1 or op == "sendrecv" else table.ranks_per_node
    assert f.tier == table.tier
    assert f.bw_GBps == pytest.approx(120.0 / per_node, rel=1e-3)  # formats round times to 0.1 us
    assert f.latency_us == pytest.approx(7.0, rel=2e-2) and f.rel_rms < 1e-2
    # What the planner then charges a group of that shape is the measured bus bandwidth again.
    if f.tier == "intra_node":
        bus = comm.bus_bandwidth(table.ranks, table.ranks, f.bw_GBps, 1.0)
    else:
        bus = comm.bus_bandwidth(table.ranks, per_node, 1e9, f.bw_GBps)
    assert bus == pytest.approx(120.0, rel=1e-3)


def test_fit_joins_tables_of_a_tier_and_rejects_flat_times():
    tables = [netcal.parse(_synthetic("all_reduce", ["a"] * 8, 5.0, 300.0), "all_reduce_perf.txt"),
              netcal.parse(_synthetic("all_gather", ["a"] * 8, 5.0, 300.0), "all_gather_perf.txt")]
    fits = netcal.fit(tables)
    assert set(fits) == {"intra_node"} and len(fits["intra_node"].tables) == 2
    assert fits["intra_node"].bw_GBps == pytest.approx(300.0, rel=1e-3)
    flat = format_table("all_reduce", [Row(s, s // 4, 10.0, 10.0) for s in (8, 1024, 1 << 20)],
                        [("a", "GPU", 1)] * 2, "flat")
    with pytest.raises(ValueError, match="do not grow with the size"):
        netcal.fit([netcal.parse(flat, "all_reduce_perf.txt")])


def test_hops_and_volume_are_the_planners():
    for n in (2, 3, 8, 64):
        hops, vol = netcal.hops_and_volume("all_reduce", n, 1e6)
        assert hops * 1e-6 + vol / 1e9 == pytest.approx(float(comm.all_reduce_time(n, 1e6, 1e9, 1e-6)))
        hops, vol = netcal.hops_and_volume("all_gather", n, 1e6)
        assert hops * 1e-6 + vol / 1e9 == pytest.approx(float(comm.all_gather_time(n, 1e6, 1e9, 1e-6)))


def test_cluster_file_names_what_is_measured_and_loads(tmp_path):
    fits = netcal.fit([_read("all_reduce_perf_8gpu.txt"), _read("sendrecv_perf_2node.txt")])
    doc = netcal.cluster_file(yaml.safe_load(BASE.read_text()), fits, "2026-12-02T00:00:00Z", "test")
    prov = doc["provenance"]
    assert prov["basis"] == "measured" and prov["priors"] == []
    assert set(prov["measured"]) == {"intra_node_bw_GBps", "intra_node_latency_us", "inter_node_bw_GBps",
                                     "inter_node_latency_us"}
    assert [s["file"].rsplit("/", 1)[-1] for s in prov["sources"]] == ["all_reduce_perf_8gpu.txt",
                                                                      "sendrecv_perf_2node.txt"]
    assert doc["efficiency"]["dp_bw_eff"] == 1.0 and doc["cluster"]["peak_tflops"] == yaml.safe_load(
        BASE.read_text())["cluster"]["peak_tflops"]
    # the 8-GPU all-reduce's large sizes run at ~300-315 GB/s bus bandwidth: the fit lands there
    assert 250 < doc["cluster"]["intra_node_bw_GBps"] < 330
    assert 40 < doc["cluster"]["inter_node_bw_GBps"] < 55 and 5 < doc["cluster"]["inter_node_latency_us"] < 20
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    cluster, eff = load_cluster(path)
    assert cluster.intra_node_bw_GBps == doc["cluster"]["intra_node_bw_GBps"] and eff.dp_bw_eff == 1.0


def test_cli_writes_the_file_or_nothing(tmp_path, capsys):
    out = tmp_path / "measured.yaml"
    files = [str(FIX / "all_reduce_perf_8gpu.txt"), str(FIX / "all_gather_perf_2node.txt")]
    assert main(["netcal", *files, "--base", str(BASE), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "intra_node" in text and "inter_node" in text and "basis: measured" in text
    assert yaml.safe_load(out.read_text())["provenance"]["basis"] == "measured"
    out.unlink()
    bad = _broken(tmp_path, "all_reduce_perf_8gpu.txt", lambda ls: ls[:-4])
    assert main(["netcal", str(bad), "--base", str(BASE), "--out", str(out)]) == 2
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
    assert main(["netcal", "--base", str(BASE), "--out", str(out)]) == 2
    assert main(["netcal", files[0], "--base", str(tmp_path / "nope.yaml"), "--out", str(out)]) == 2
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce,bogus", "--base", str(BASE), "--out", str(out)]) == 2
    assert not out.exists()


def test_measured_cluster_gives_the_prediction_of_the_same_numbers_set_by_hand(tmp_path):
    """Composition: the planner predicts with a netcal file exactly what it predicts with those numbers typed in."""
    import dataclasses

    from orchestrator.planner import predict
    from orchestrator.planner.parse import plan_config_from_dict

    fits = netcal.fit([_read("all_reduce_perf_8gpu.txt"), _read("all_gather_perf_2node.txt")])
    doc = netcal.cluster_file(yaml.safe_load(BASE.read_text()), fits, "now", "test")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    cluster, eff = load_cluster(path)
    knobs = {"parallel": {"pp": 2, "dp": 8}, "tensor_parallel": {"size": 4}, "batch": {"global_batch": 64},
             "model": {"num_layers": 8, "hidden_size": 4096, "num_heads": 32, "ffn_hidden_size": 16384,
                       "vocab_size": 32000}}
    by_file = plan_config_from_dict({**knobs, "cluster": {**dataclasses.asdict(cluster), "num_gpus": 64},
                                     "efficiency": dataclasses.asdict(eff)})
    hand = dict(yaml.safe_load(BASE.read_text())["cluster"], num_gpus=64,
                intra_node_bw_GBps=round(fits["intra_node"].bw_GBps, 4),
                intra_node_latency_us=round(fits["intra_node"].latency_us, 3),
                inter_node_bw_GBps=round(fits["inter_node"].bw_GBps, 4),
                inter_node_latency_us=round(fits["inter_node"].latency_us, 3))
    by_hand = plan_config_from_dict({**knobs, "cluster": hand, "efficiency": {
        **yaml.safe_load(BASE.read_text()).get("efficiency", {}), "tp_bw_eff": 1.0, "pp_bw_eff": 1.0,
        "dp_bw_eff": 1.0}})
    a, b = predict(by_file), predict(by_hand)
    assert math.isclose(a.step_time_s, b.step_time_s, rel_tol=1e-12) and a.step_time_s > 0


def test_each_table_reports_its_own_fit_error_and_a_bad_one_is_flagged():
    good = netcal.parse(_synthetic("all_reduce", ["a"] * 2, 200.0, 1.3), "all_reduce_perf.txt")
    noisy = _synthetic("all_gather", ["a"] * 2, 200.0, 1.3)
    # every other row of the all-gather 3x slower: that table, not the all-reduce, is off the line
    lines = noisy.splitlines()
    rows = [i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#")]
    for i in rows[::2]:
        tok = lines[i].split()
        lines[i] = lines[i].replace(tok[5], f"{3 * float(tok[5]):.1f}", 1)
    bad = netcal.parse("\n".join(lines) + "\n", "all_gather_perf.txt")
    (f,) = netcal.fit([good, bad]).values()
    assert len(f.table_rel_rms) == 2 and f.table_rel_rms[0] < f.table_rel_rms[1]
    assert f.table_rel_rms[1] > netcal.FIT_WARN
    warnings = netcal.fit_warnings({"intra_node": f})
    assert len(warnings) == 1 and "all_gather_perf.txt" in warnings[0] and "> 20%" in warnings[0]
    doc = netcal.cluster_file(yaml.safe_load(BASE.read_text()), {"intra_node": f}, "d", "c")
    errs = [s["fit_rel_rms"] for s in doc["provenance"]["sources"]]
    assert errs[0] != errs[1]


def test_latency_comes_from_the_small_sizes_despite_an_outlier():
    text = _synthetic("all_reduce", ["a"] * 2, 200.0, 1.3)
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    tok = lines[first].split()
    lines[first] = lines[first].replace(tok[5], f"{5 * float(tok[5]):.1f}", 1)  # one slow 8-byte repetition
    (f,) = netcal.fit([netcal.parse("\n".join(lines) + "\n", "all_reduce_perf.txt")]).values()
    assert f.latency_us == pytest.approx(200.0, rel=0.05) and f.bw_GBps == pytest.approx(1.3, rel=0.05)


@pytest.mark.parametrize("base, gpus, tiers, expect", [
    ("cpu-local.yaml", 2, {"intra_node"}, {"tp_bw_eff", "dp_bw_eff", "pp_bw_eff"}),   # one host: every group on it
    ("h100-sxm.yaml", 8, {"intra_node"}, {"tp_bw_eff", "dp_bw_eff", "pp_bw_eff"}),    # one 8-GPU node
    ("h100-sxm.yaml", 64, {"intra_node"}, {"tp_bw_eff"}),                             # DP/PP cross nodes: priors
    ("h100-sxm.yaml", 64, {"inter_node"}, {"dp_bw_eff", "pp_bw_eff"}),
    ("h100-sxm.yaml", 64, {"intra_node", "inter_node"}, {"tp_bw_eff", "dp_bw_eff", "pp_bw_eff"}),
])
def test_written_bandwidth_efficiencies_are_the_docs_rule(base, gpus, tiers, expect):
    """docs/planner.md (netcal, "Writes") states which efficiencies become 1; the file netcal writes agrees."""
    data = yaml.safe_load((REPO / "search_spaces" / "clusters" / base).read_text())
    data["cluster"]["num_gpus"] = gpus
    fits = {t: netcal.TierFit(t, 1.0, 100.0, 0.0, (), ()) for t in tiers}
    doc = netcal.cluster_file(data, fits, "d", "c")
    ones = {k for k in ("tp_bw_eff", "dp_bw_eff", "pp_bw_eff") if doc["efficiency"].get(k) == 1.0}
    kept = {k for k in {"tp_bw_eff", "dp_bw_eff", "pp_bw_eff"} - expect if (data.get("efficiency") or {}).get(k) != 1.0}
    assert ones & set(expect) == set(expect) and not (ones & kept)
    docs = " ".join((REPO / "docs" / "planner.md").read_text().split())
    assert "`tp_bw_eff` with the intra-node tier" in docs
    assert "`dp_bw_eff` and `pp_bw_eff` with the inter-node tier, or with the intra-node tier when the whole job" in docs


def _scaled(text: str, factor_of_row) -> str:
    """``text`` with row i's out-of-place and in-place times multiplied by ``factor_of_row(i)``."""
    lines = text.splitlines()
    rows = [i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#")]
    for k, i in enumerate(rows):
        tok = lines[i].split()
        f = factor_of_row(k)
        tok[5], tok[9] = f"{f * float(tok[5]):.1f}", f"{f * float(tok[9]):.1f}"
        lines[i] = "  ".join(tok)
    return "\n".join(lines) + "\n"


def test_repeats_pool_by_the_median_per_size_so_one_slow_repeat_moves_nothing():
    clean = _synthetic("all_reduce", ["a"] * 2, 200.0, 1.3)
    slow = _scaled(clean, lambda k: 5.0 if k % 2 else 1.0)  # every other size 5x slower in this repeat
    tables = [netcal.parse(t, f"all_reduce_perf{i}.txt") for i, t in enumerate((clean, slow, clean))]
    one = netcal.pooled(tables)
    assert (one.source, one.repeats) == ("all_reduce_perf0.txt", 3) and one.collective == "all_reduce" and one.hosts == ("a", "a")
    assert [p.size_bytes for p in one.points] == sorted({p.size_bytes for p in tables[0].points})
    assert [p.time_us for p in one.points] == [p.time_us for p in tables[0].points if not p.in_place]
    (f,) = netcal.fit([one]).values()
    assert f.latency_us == pytest.approx(200.0, rel=0.02) and f.rel_rms < 0.01
    assert netcal.pooled(tables[:1]) is tables[0]
    other = netcal.parse(_synthetic("all_gather", ["a"] * 2, 200.0, 1.3), "all_gather_perf.txt")
    with pytest.raises(ValueError, match="repeats must measure one collective over the same ranks"):
        netcal.pooled([tables[0], other])


def test_bad_tables_names_the_tables_over_the_line_worst_first():
    good = netcal.parse(_synthetic("all_reduce", ["a"] * 2, 200.0, 1.3), "all_reduce_perf.txt")
    fits = netcal.fit([good])
    assert netcal.bad_tables(fits) == []
    bad = netcal.parse(_scaled(_synthetic("all_gather", ["a"] * 2, 200.0, 1.3), lambda k: 3.0 if k % 2 else 1.0),
                       "all_gather_perf.txt")
    fits = netcal.fit([good, bad])
    ((src, err),) = netcal.bad_tables(fits)
    assert src == "all_gather_perf.txt" and err == fits["intra_node"].table_rel_rms[1] > netcal.FIT_WARN
    assert "B: " in netcal.off_the_line(bad, fits["intra_node"]) and "us on the line" in netcal.off_the_line(
        bad, fits["intra_node"])


def test_measure_repeats_a_table_off_the_line_up_to_the_cap_then_says_why(tmp_path, monkeypatch, capsys):
    """--measure: every all-reduce run 3x slow on every other size (off the line whatever the repeats), the
    all-gather clean: the all-reduce is measured again until --max-repeats, the all-gather is not; the file is
    written and the warning says the cap was reached."""
    import trainer.measure.netbench

    calls = []

    def fake(op, n):
        calls.append(op)
        text = _synthetic(op, ["a"] * n, 200.0, 1.3)
        return _scaled(text, lambda k: 3.0 if k % 2 else 1.0) if op == "all_reduce" else text

    monkeypatch.setattr(trainer.measure.netbench, "measure_local", fake)
    out = tmp_path / "c.yaml"
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce,all_gather", "--repeats", "2", "--max-repeats", "4",
                 "--base", str(BASE), "--out", str(out)]) == 0
    assert calls.count("all_reduce") == 4 and calls.count("all_gather") == 2
    printed = capsys.readouterr()
    assert "measuring all_reduce again (run 3 of at most 4)" in printed.out
    assert "still after 4 runs (--max-repeats)" in printed.err and out.exists()
    assert main(["netcal", "--measure", "2", "--repeats", "5", "--max-repeats", "4", "--base", str(BASE),
                 "--out", str(out)]) == 2
    assert "--repeats 5 / --max-repeats 4" in capsys.readouterr().err


def test_measure_stops_when_more_runs_no_longer_narrow_the_fit(tmp_path, monkeypatch, capsys):
    """The same off-the-line shape in every run: the pooled error holds still, so netcal stops before its cap and
    says the runs agree (the collective's shape, not noise)."""
    import trainer.measure.netbench

    calls = []
    monkeypatch.setattr(trainer.measure.netbench, "measure_local", lambda op, n: calls.append(op) or _scaled(
        _synthetic(op, ["a"] * n, 200.0, 1.3), lambda k: 3.0 if k % 2 else 1.0))
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce", "--repeats", "1", "--max-repeats", "9",
                 "--base", str(BASE), "--out", str(tmp_path / "c.yaml")]) == 0
    assert len(calls) == 3
    assert "its runs agree" in capsys.readouterr().err


def _flat(op: str, n: int) -> str:
    """A table on a host so busy that every size took the same time: no bandwidth can be fitted to it."""
    rows = [Row(size, size // 4, 5000.0, 5000.0) for size in (8, 1024, 65536, 1 << 20, 16 << 20)]
    return format_table(op, rows, [("a", "GPU", 1)] * n, "synthetic")


def test_measure_again_when_a_burst_of_load_flattened_the_times(tmp_path, monkeypatch, capsys):
    """--measure --repeats 1: the first all-reduce run came out flat (a burst of load over the large sizes), the
    second follows the line: netcal measures again instead of failing, and fits the pooled runs. Flat in every run,
    the error stands after --max-repeats runs and nothing is written."""
    import trainer.measure.netbench

    calls = []

    def fake(op, n):
        calls.append(op)
        return _flat(op, n) if len(calls) == 1 else _synthetic(op, ["a"] * n, 200.0, 1.3)

    monkeypatch.setattr(trainer.measure.netbench, "measure_local", fake)
    out = tmp_path / "c.yaml"
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce", "--repeats", "1", "--base", str(BASE),
                 "--out", str(out)]) == 0
    assert len(calls) >= 2 and out.exists()
    assert "the times do not grow with the size; measuring all_reduce again (run 2 of at most 9)" in (
        capsys.readouterr().out)

    calls.clear()
    monkeypatch.setattr(trainer.measure.netbench, "measure_local", lambda op, n: calls.append(op) or _flat(op, n))
    out2 = tmp_path / "d.yaml"
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce", "--repeats", "1", "--max-repeats", "3",
                 "--base", str(BASE), "--out", str(out2)]) == 2
    assert len(calls) == 3 and not out2.exists()
    assert "do not grow with the size" in capsys.readouterr().err
