"""Properties of the nccl-tests parser (issue 30): whatever the text, a correct table or one clean line of
ValueError naming the file, never another exception."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings, strategies as st

from orchestrator.calibration import netcal

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
OUTPUTS = {name: (FIX / name).read_text() for name in ("all_reduce_perf_8gpu.txt", "all_gather_perf_2node.txt",
                                                      "sendrecv_perf_2node.txt")}
GOOD = {name: netcal.parse(text, name) for name, text in OUTPUTS.items()}
SOURCE = "some/dir/all_reduce_perf.txt"
LOG_LINES = st.sampled_from([
    "node-a01:7711:7711 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.11<0>",
    "node-a02:5102:5190 [1] NCCL WARN NET/IB : Got async event : port error",
    "  dgx-a-017:41021:41030 [3] NCCL INFO Channel 04/32 :    0   1   2   3   4   5   6   7",
])
# Text shaped like the real thing: its own lines, fragments of them, numbers and the words the parser looks for.
TOKENS = st.sampled_from(["#", "size", "time", "busbw", "#wrong", "Rank", "0", "-1", "8", "1e400", "nan", "N/A",
                          "float", "sum", "on", "device", "[0x18]", "# Avg bus bandwidth", "Group", "Pid", "\t"])
LINES = st.one_of(st.text(max_size=40), st.lists(TOKENS, max_size=16).map(" ".join),
                  st.sampled_from([ln for text in OUTPUTS.values() for ln in text.splitlines()]))


def _parse_or_clean_error(text: str, source: str = SOURCE) -> netcal.Table | None:
    try:
        return netcal.parse(text, source)
    except ValueError as e:
        message = str(e)
        assert len(message.splitlines()) == 1 and message.startswith(source), message
        return None


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINES, max_size=30))
def test_any_text_gives_a_table_or_one_clean_line(lines):
    _parse_or_clean_error("\n".join(lines))


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(OUTPUTS)), cut=st.integers(min_value=0), data=st.data())
def test_a_truncated_output_is_refused_or_is_the_whole_table(name, cut, data):
    text = OUTPUTS[name]
    cut = cut % (len(text) + 1)
    table = _parse_or_clean_error(text[:cut], name)
    if table is not None:  # only a cut in the trailing lines after the closing line leaves the whole table
        assert table.points == GOOD[name].points and table.hosts == GOOD[name].hosts


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(OUTPUTS)), logs=st.lists(st.tuples(st.integers(min_value=0), LOG_LINES),
                                                           max_size=8))
def test_nccl_log_lines_anywhere_change_nothing(name, logs):
    lines = OUTPUTS[name].splitlines()
    for at, log in logs:
        lines.insert(at % (len(lines) + 1), log)
    assert netcal.parse("\n".join(lines), name) == GOOD[name]


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(OUTPUTS)), at=st.integers(min_value=0), junk=LINES)
def test_a_foreign_line_anywhere_gives_a_table_or_one_clean_line(name, at, junk):
    lines = OUTPUTS[name].splitlines()
    lines.insert(at % (len(lines) + 1), junk)
    _parse_or_clean_error("\n".join(lines), name)
