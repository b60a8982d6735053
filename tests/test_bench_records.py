"""The benchmarks' record of their runs: bench/RESULTS.md holds each benchmark's latest run,
and the run it replaces moves to bench/history/ unchanged. And which cases a run takes."""

from __future__ import annotations

import datetime

import pytest

from bench.common import record_section


@pytest.mark.smoke
def test_a_new_run_replaces_its_section_and_the_old_one_moves_to_the_history(tmp_path):
    results, history = tmp_path / "RESULTS.md", tmp_path / "history"
    results.write_text("# Benchmark results\n\nintro\n\n## `python -m bench.load`\n\nold load table\n\n"
                       "## `python -m bench.out_of_core`\n\nold out-of-core table\n")
    record_section("bench.load", "Machine: m.\n\n| new load table |", results, history)
    record_section("bench.service", "new service table", results, history)

    text = results.read_text()
    assert text.count("## `python -m bench.load`") == 1 and "old load table" not in text
    assert "| new load table |" in text and "old out-of-core table" in text  # the others untouched
    assert text.index("bench.load") < text.index("bench.out_of_core") < text.index("bench.service")  # in place; new at the end
    (archive,) = history.iterdir()
    today = datetime.date.today()
    assert archive.name == f"RESULTS-{today:%Y-%m}.md"
    moved = archive.read_text()
    assert f"## `python -m bench.load` (replaced on {today.isoformat()})\n\nold load table\n" in moved
    assert "bench.service" not in moved  # a first run replaces nothing

    record_section("bench.load", "third", results, history)
    assert archive.read_text().count("(replaced on") == 2 and "| new load table |" in archive.read_text()


def test_graph_scale_picks_cases_by_part_of_their_name_or_exactly():
    from bench.graph_scale import CASES, chosen

    names = [c.name for c in CASES]
    assert [n for n in names if chosen(n, "space_to_batch_nd")] == ["space_to_batch_nd", "space_to_batch_nd pad 1"]
    assert [n for n in names if chosen(n, "=space_to_batch_nd")] == ["space_to_batch_nd"]
    assert [n for n in names if chosen(n, "=depth_to_space")] == ["depth_to_space"]
    assert not any(chosen(n, "=pad 1") for n in names)  # exactly: no part of a name
