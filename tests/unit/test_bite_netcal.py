"""netcal's parser and fit at their boundaries (issue 30: each case is a mutant the older tests let through)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.calibration import netcal
from orchestrator.planner import comm

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
AR = (FIX / "all_reduce_perf_8gpu.txt").read_text().splitlines()
HEADER_END = next(i for i, ln in enumerate(AR) if "(B)" in ln) + 1  # first row's index
NCCL = "dgx-a-017:41021:41021 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7"


def _parse(lines: list[str], source: str = "all_reduce_perf.txt", collective: str | None = None) -> netcal.Table:
    return netcal.parse("\n".join(lines) + "\n", source, collective)


def _refused(lines: list[str], source: str = "all_reduce_perf.txt") -> str:
    with pytest.raises(ValueError) as e:
        _parse(lines, source)
    assert "\n" not in str(e.value)
    return str(e.value)


def _row(size: int, t_out: str, t_in: str, wrong: str = "0") -> str:
    return f"  {size:>10}  {size // 4:>12}     float     sum      -1  {t_out:>7}  1.00  1.00  {wrong:>6}  " \
           f"{t_in:>7}  1.00  1.00  {wrong:>6}"


def _with_rows(rows: list[str]) -> list[str]:
    return AR[:HEADER_END] + rows + [ln for ln in AR[HEADER_END:] if ln.startswith("#")]


def test_nccl_log_lines_inside_the_table_are_skipped():
    t = _parse(AR[:HEADER_END + 3] + [NCCL, "   " + NCCL.replace("INFO", "WARN")] + AR[HEADER_END + 3:])
    assert len(t.points) == 20


def test_comment_and_launcher_lines_are_not_taken_for_the_header():
    assert len(_parse(["mpirun: launching 8 ranks", *AR]).points) == 20
    notes = ["# note: busbw = algbw x 2(n-1)/n", "# sizes from 8 B to 1 GB, time in us"]
    assert len(_parse(AR[:HEADER_END + 2] + notes + AR[HEADER_END + 2:]).points) == 20


def test_a_row_after_the_closing_line_is_refused_naming_the_line():
    lines = AR + [AR[HEADER_END]]
    assert _refused(lines) == (f"all_reduce_perf.txt:{len(lines)}: a row after the closing '# Avg bus bandwidth' "
                               f"line: {AR[HEADER_END].strip()!r}")


def test_the_first_time_column_is_out_of_place_and_the_second_in_place():
    t = _parse(_with_rows([_row(1024, "20.0", "30.0"), _row(1 << 30, "6000.0", "7000.0")]))
    assert [(p.size_bytes, p.time_us, p.in_place) for p in t.points] == [
        (1024, 20.0, False), (1024, 30.0, True), (1 << 30, 6000.0, False), (1 << 30, 7000.0, True)]


@pytest.mark.parametrize("row, ok", [
    (_row(0, "20.0", "20.0"), False), (_row(1, "20.0", "20.0"), True),
    (_row(1024, "0.0", "20.0"), False), (_row(1024, "0.5", "0.5"), True), (_row(1024, "inf", "20.0"), False),
    (_row(1024, "-1.0", "20.0"), False),
])
def test_sizes_and_times_must_be_positive_and_finite(row, ok):
    lines = _with_rows([row])
    if ok:
        assert len(_parse(lines).points) == 2
    else:
        assert _refused(lines).startswith(f"all_reduce_perf.txt:{HEADER_END + 1}: size and times must be positive")


@pytest.mark.parametrize("wrong, ok", [("0", True), ("0.00", True), ("N/A", True), ("2", False), ("1.0", False),
                                       ("?", False)])
def test_the_wrong_count_must_be_zero(wrong, ok):
    lines = _with_rows([_row(1024, "20.0", "20.0", wrong)])
    if ok:
        assert len(_parse(lines).points) == 2
    else:
        assert f"{wrong} wrong values at 1024 B" in _refused(lines)


def test_an_error_column_in_place_of_wrong_is_checked_too():
    lines = [ln.replace("#wrong", " error") for ln in _with_rows([_row(1024, "20.0", "20.0", "1e-3")])]
    assert "1e-3 wrong values at 1024 B" in _refused(lines)
    lines = [ln.replace("#wrong", " error") for ln in _with_rows([_row(1024, "20.0", "20.0", "0e+00")])]
    assert len(_parse(lines).points) == 2


def test_the_collective_comes_from_the_starting_line_before_the_file_name():
    t = _parse(["# Collective test starting: all_gather_perf", *AR], source="run7.log")
    assert t.collective == "all_gather"
    assert _parse(["# Collective test starting: all_gather_perf", *AR], "run7.log", "reduce_scatter").collective \
        == "reduce_scatter"


def test_an_empty_table_and_uneven_hosts_are_refused_with_their_reason():
    assert _refused(_with_rows([])) == f"all_reduce_perf.txt:{len(_with_rows([]))}: the table has no rows"
    uneven = [ln.replace("dgx-a-017", "dgx-a-018") if "Rank  7" in ln else ln for ln in AR]
    assert _refused(uneven).startswith("all_reduce_perf.txt: ranks are spread unevenly over hosts (")


def test_one_rank_moves_nothing():
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert netcal.hops_and_volume(op, 1, 1e6) == (0.0, 0.0)
    assert netcal.hops_and_volume("sendrecv", 1, 1e6) == (1.0, 1e6)


def _exact(op: str, hosts: tuple[str, ...], alpha_s: float, bus_Bps: float, sizes=None) -> netcal.Table:
    """A table of unrounded times from the planner's own formulas (no print/parse rounding)."""
    n = len(hosts)
    times = []
    for size in sizes or (8, 1024, 65536, 1 << 20, 16 << 20, 256 << 20):
        if op == "sendrecv":
            t = float(comm.p2p_time(size, bus_Bps, alpha_s))
        elif op == "all_reduce":
            t = float(comm.all_reduce_time(n, size, bus_Bps, alpha_s))
        else:
            t = float(comm.reduce_scatter_time(n, size, bus_Bps, alpha_s))
        times.append(netcal.Point(size, t * 1e6, False))
    return netcal.Table(f"{op}_perf.txt", op, hosts, ("GPU",), tuple(times))


@pytest.mark.parametrize("op, hosts, per_node", [
    ("all_reduce", ("a",) * 8, 1), ("all_gather", ("a",) * 4 + ("b",) * 4, 4),
    ("sendrecv", ("a", "a", "b", "b"), 1)])
def test_the_fit_recovers_exact_parameters(op, hosts, per_node):
    (f,) = netcal.fit([_exact(op, hosts, 7e-6, 120e9)]).values()
    # The latency is read from the small sizes (per hop), where the bandwidth term still adds a trace: 0.2%.
    assert f.latency_us == pytest.approx(7.0, rel=2e-3) and f.bw_GBps == pytest.approx(120.0 / per_node, rel=1e-3)
    assert f.rel_rms < 1e-3


def test_a_negative_latency_is_refitted_as_bandwidth_alone():
    # Small messages faster than the bandwidth line alone: least squares would give a negative latency.
    t = _exact("sendrecv", ("a", "b"), 0.0, 100e9)
    points = tuple(netcal.Point(p.size_bytes, p.time_us * (0.5 if p.size_bytes < 1024 else 1.0), False)
                   for p in t.points)
    (f,) = netcal.fit([netcal.Table(t.source, t.collective, t.hosts, t.devices, points)]).values()
    x = [p.size_bytes / (p.time_us * 1e-6) for p in points]  # sendrecv: volume = size; one unknown, 1 / bw
    assert f.latency_us == 0.0 and f.bw_GBps == pytest.approx(1e-9 * sum(v * v for v in x) / sum(x), rel=1e-9)


@pytest.mark.parametrize("share, fitted", [(0.05, False), (0.2, True)])
def test_a_flat_table_whose_bandwidth_explains_little_of_the_largest_time_is_refused(share, fitted):
    # 1000 us at every size but the largest, which adds `share` of its time as bandwidth-bound transfer.
    size = 1 << 30
    points = [netcal.Point(s, 1000.0, False) for s in (8, 1024, 1 << 20)]
    points.append(netcal.Point(size, 1000.0 / (1 - share), False))
    table = netcal.Table("all_gather_perf.txt", "all_gather", ("a", "a"), ("GPU",), tuple(points))
    if fitted:
        assert netcal.fit([table])["intra_node"].bw_GBps > 0
    else:
        with pytest.raises(ValueError, match="the times do not grow with the size"):
            netcal.fit([table])


def test_the_cluster_file_keeps_the_base_and_records_each_source():
    table = _exact("all_reduce", ("a",) * 8, 7e-6, 120e9)
    fits = netcal.fit([table])
    base = {"cluster": {"peak_tflops": 989}, "efficiency": {"mfu_prior": 0.4, "dp_bw_eff": 0.7}}
    doc = netcal.cluster_file(base, fits, "2026-12-02T00:00:00Z", "steptune netcal x")
    # Measured links carry all of one node's traffic (tp, dp and pp): their efficiencies become 1 (docs/planner.md).
    assert doc["efficiency"] == {"mfu_prior": 0.4, "dp_bw_eff": 1.0, "tp_bw_eff": 1.0, "pp_bw_eff": 1.0}
    assert doc["cluster"]["peak_tflops"] == 989
    prov = doc["provenance"]
    assert (prov["date"], prov["command"]) == ("2026-12-02T00:00:00Z", "steptune netcal x")
    assert prov["note"].startswith("bandwidth/latency fitted to nccl-tests output by steptune netcal")
    assert prov["sources"] == [{"file": "all_reduce_perf.txt", "repeats": 1, "collective": "all_reduce", "tier": "intra_node",
                                "ranks": 8, "nodes": 1, "ranks_per_node": 8, "devices": ["GPU"],
                                "sizes_bytes": [8, 256 << 20], "points": 6,
                                "fit_rel_rms": round(fits["intra_node"].rel_rms, 4),
                                "tier_fit_rel_rms": round(fits["intra_node"].rel_rms, 4)}]


def test_the_cluster_file_records_each_tables_fit_error_to_four_places():
    tables = [netcal.parse((FIX / "all_reduce_perf_8gpu.txt").read_text(), "all_reduce_perf_8gpu.txt")]
    fits = netcal.fit(tables)
    rms = fits["intra_node"].rel_rms
    assert 0.001 < rms < 0.5 and round(rms, 4) != round(rms, 5)  # a real table: a fit error with more digits
    (source,) = netcal.cluster_file({}, fits, "now", "x")["provenance"]["sources"]
    assert source["fit_rel_rms"] == round(rms, 4)


def test_a_table_with_no_latency_bound_point_keeps_the_joint_fits_latency():
    # Every size is large enough that its bandwidth term is over LATENCY_SHARE of its time: the exact joint fit
    # stands, latency included (refitting bandwidth alone would drop the latency to 0).
    t = _exact("all_reduce", ("a",) * 8, 7e-6, 120e9, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20))
    (f,) = netcal.fit([t]).values()
    assert f.latency_us == pytest.approx(7.0, rel=1e-6) and f.bw_GBps == pytest.approx(120.0, rel=1e-6)


@pytest.mark.parametrize("op, hosts", [("all_reduce", ("a",) * 8), ("sendrecv", ("a", "b"))])
def test_the_latency_is_the_median_of_the_small_messages_so_one_slow_repetition_does_not_move_it(op, hosts):
    t = _exact(op, hosts, 7e-6, 120e9, sizes=(8, 16, 32, 64, 128, 1 << 20, 16 << 20, 256 << 20))
    points = tuple(netcal.Point(p.size_bytes, p.time_us * (3.0 if p.size_bytes == 16 else 1.0), False)
                   for p in t.points)
    (f,) = netcal.fit([netcal.Table(t.source, t.collective, t.hosts, t.devices, points)]).values()
    # A joint least-squares fit would be pulled about 5% up by the 3x slower 16 B message.
    assert f.latency_us == pytest.approx(7.0, rel=2e-3) and f.bw_GBps == pytest.approx(120.0, rel=1e-3)


def test_a_one_rank_table_moves_nothing_and_does_not_change_the_fit():
    eight = _exact("all_reduce", ("a",) * 8, 7e-6, 120e9)
    alone = netcal.Table("one_perf.txt", "all_reduce", ("a",), ("GPU",),
                         tuple(netcal.Point(s, 5.0, False) for s in (8, 16, 32, 64, 128, 256, 512)))
    (f,) = netcal.fit([eight]).values()
    (g,) = netcal.fit([eight, alone]).values()
    assert (g.latency_us, g.bw_GBps) == pytest.approx((f.latency_us, f.bw_GBps), rel=1e-9)


def test_the_latency_is_stated_in_microseconds_exactly():
    # Small sends all at 7 us (one hop each): the latency is exactly that, not within a tolerance.
    points = [netcal.Point(s, 7.0, False) for s in (1, 2, 4)]
    points += [netcal.Point(s, 7.0 + s / 100e9 * 1e6, False) for s in (16 << 20, 256 << 20)]
    (f,) = netcal.fit([netcal.Table("sendrecv_perf.txt", "sendrecv", ("a", "b"), ("GPU",), tuple(points))]).values()
    assert f.latency_us == pytest.approx(7.0, rel=1e-12)


@pytest.mark.parametrize("error, warned", [(0.19, False), (0.2, False), (0.21, True)])
def test_a_table_is_flagged_only_when_its_fit_error_is_over_twenty_percent(error, warned):
    table = _exact("all_reduce", ("a",) * 8, 7e-6, 120e9)
    fit = netcal.TierFit("intra_node", 120.0, 7.0, error, (table,), (error,))
    assert bool(netcal.fit_warnings({"intra_node": fit})) is warned


@pytest.mark.parametrize("cluster, efficiencies", [
    ({"num_gpus": 16, "gpus_per_node": 16}, ("tp_bw_eff", "dp_bw_eff", "pp_bw_eff")),
    ({"num_gpus": 16, "gpus_per_node": 8}, ("tp_bw_eff",)),
    ({"num_gpus": 8}, ("tp_bw_eff", "dp_bw_eff", "pp_bw_eff")),  # eight GPUs per node unless stated
    ({"num_gpus": 9}, ("tp_bw_eff",)),
    ({}, ("tp_bw_eff", "dp_bw_eff", "pp_bw_eff")),
])
def test_dp_and_pp_traffic_counts_as_measured_by_the_intra_node_tier_only_when_the_job_fits_in_one_node(
        cluster, efficiencies):
    assert netcal.measured_efficiencies(cluster, {"intra_node"}) == efficiencies
    assert netcal.measured_efficiencies(cluster, {"intra_node", "inter_node"}) == ("tp_bw_eff", "dp_bw_eff",
                                                                                   "pp_bw_eff")


# ---- repeats pooled per message size (pooled) -------------------------------------------------------------

def _table(source: str, times: dict[int, list[float]], op: str = "all_reduce", hosts=("a", "a")) -> netcal.Table:
    """Points of (size, time) in the given order; several times at one size are its out- and in-place calls."""
    points = tuple(netcal.Point(s, t, k == 1) for s, ts in times.items() for k, t in enumerate(ts))
    return netcal.Table(source, op, hosts, ("GPU",), points)


def test_pooled_repeats_are_the_median_per_size_of_every_call_out_of_place_in_sizes_order():
    first = _table("r1.txt", {1 << 20: [30.0, 31.0], 8: [5.0, 9.0]})
    second = _table("r2.txt", {8: [6.0, 7.0], 1 << 20: [40.0, 41.0]})
    one = netcal.pooled([first, second])
    # Per size, the median of all four calls (out- and in-place of both repeats), sizes ascending.
    assert one.points == (netcal.Point(8, 6.5, False), netcal.Point(1 << 20, 35.5, False))
    assert (one.source, one.collective, one.hosts, one.devices, one.repeats) == ("r1.txt", "all_reduce",
                                                                                   ("a", "a"), ("GPU",), 2)


def test_one_table_is_its_own_pool_and_keeps_its_in_place_points():
    only = _table("r1.txt", {8: [5.0, 9.0]})
    assert netcal.pooled([only]) is only and only.points[1].in_place


@pytest.mark.parametrize("other", [_table("r2.txt", {8: [5.0]}, op="all_gather"),
                                   _table("r2.txt", {8: [5.0]}, hosts=("a", "b")),
                                   _table("r2.txt", {8: [5.0]}, hosts=("a", "a", "a"))])
def test_repeats_of_another_collective_or_other_ranks_are_refused(other):
    first = _table("r1.txt", {8: [5.0]})
    for tables in ([first, other], [other, first], [first, first, other]):
        with pytest.raises(ValueError) as e:
            netcal.pooled(tables)
        assert str(e.value) == f"{tables[0].source}: repeats must measure one collective over the same ranks"


# ---- tables over the line (bad_tables) ------------------------------------------------------------------

def _fits(errors: dict[str, list[float]]) -> dict[str, netcal.TierFit]:
    out = {}
    for tier, errs in errors.items():
        tables = tuple(_table(f"{tier}{i}.txt", {8: [5.0]}) for i in range(len(errs)))
        out[tier] = netcal.TierFit(tier, 100.0, 5.0, 0.1, tables, tuple(errs))
    return out


@pytest.mark.parametrize("errors, bad", [
    ({"intra_node": [0.1, 0.2]}, []),                                   # at FIT_WARN is not over it
    ({"intra_node": [0.2000001, 0.1]}, [("intra_node0.txt", 0.2000001)]),
    # Over every tier, the worst first.
    ({"intra_node": [0.3, 0.1, 0.5], "inter_node": [0.4, 0.25]},
     [("intra_node2.txt", 0.5), ("inter_node0.txt", 0.4), ("intra_node0.txt", 0.3), ("inter_node1.txt", 0.25)]),
])
def test_bad_tables_are_those_over_the_warning_line_worst_first(errors, bad):
    assert netcal.bad_tables(_fits(errors)) == bad


# ---- where a table leaves its tier's line (off_the_line) --------------------------------------------------

def _sendrecv(times: dict[int, float]) -> netcal.Table:
    return _table("sendrecv_perf.txt", {s: [t] for s, t in times.items()}, op="sendrecv", hosts=("a", "b"))


# A send of s bytes on the line of 5 us latency and 10 GB/s: 5 + s / 1e4 us.
LINE = netcal.TierFit("intra_node", 10.0, 5.0, 0.0, ())


def test_off_the_line_names_the_two_sizes_farthest_from_the_line_relatively_in_size_order():
    # Relative distances: 0, -0.5 (15 us on the line, 30 measured), 0, +1.01 (1005 on the line, 500 measured).
    t = _sendrecv({10_000: 6.0, 100_000: 30.0, 1_000_000: 105.0, 10_000_000: 500.0})
    assert netcal.off_the_line(t, LINE) == ("100000 B: 30 us measured, 15 us on the line; "
                                            "10000000 B: 500 us measured, 1005 us on the line")
    assert netcal.off_the_line(t, LINE, top=1) == "10000000 B: 500 us measured, 1005 us on the line"


def test_off_the_line_weighs_a_point_below_the_line_as_much_as_one_above():
    # 3x below the line at 1 MB (-67%) is farther than 1.5x above it at 100 kB (+50%): absolute relative distance.
    t = _sendrecv({10_000: 6.0, 100_000: 10.0, 1_000_000: 315.0, 10_000_000: 1005.0})
    assert netcal.off_the_line(t, LINE, top=1) == "1000000 B: 315 us measured, 105 us on the line"
    t = _sendrecv({10_000: 6.0, 100_000: 10.0, 1_000_000: 150.0, 10_000_000: 1005.0})
    assert netcal.off_the_line(t, LINE, top=1) == "100000 B: 10 us measured, 15 us on the line"


def test_off_the_line_uses_the_tiers_per_gpu_bandwidth_across_nodes():
    # An all-gather over 2 nodes x 2 ranks: 3 hops, 3/4 of the bytes, pushed through 2 members' NICs per node.
    t = _table("all_gather_perf.txt", {4_000_000: [1000.0], 40_000_000: [4000.0]}, op="all_gather",
               hosts=("a", "a", "b", "b"))
    f = netcal.TierFit("inter_node", 10.0, 5.0, 0.0, ())
    # 3 x 5 + 3e6 / 2 / 1e4 = 165 us; 3 x 5 + 3e7 / 2 / 1e4 = 1515 us.
    assert netcal.off_the_line(t, f) == ("4000000 B: 1000 us measured, 165 us on the line; "
                                         "40000000 B: 4000 us measured, 1515 us on the line")


def test_off_the_line_prices_the_bytes_at_exactly_a_billion_per_gb():
    # A 10 GB send at 10 GB/s (GB = 1e9 bytes) is 1000000.5005 us of transfer plus 5 us: 1000005.5005 us on the
    # line, printed to the microsecond. A GB a billionth larger would put it at 1000005.4995, printed 1000005.
    t = _sendrecv({10_000: 6.0, 10_000_005_005: 3_000_000.0})
    assert netcal.off_the_line(t, LINE, top=1) == "10000005005 B: 3000000 us measured, 1000006 us on the line"
