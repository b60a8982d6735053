"""examples/quickstart.ipynb runs top to bottom (so it never rots) and shows what it says it shows."""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
OPERATORS = ["depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd", "batch_to_space_nd",
             "gather_nd", "ascend_dequant"]


@pytest.mark.smoke
def test_quickstart_runs_and_tells_the_truth(tmp_path, monkeypatch):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    scratch = tmp_path / "tmp"  # the kernel's temporary directory: left empty (it kept ~116 MB)
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    started = time.perf_counter()
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    elapsed = time.perf_counter() - started
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
    # the picture: space_to_depth's phases rebuilt exactly by depth_to_space, north-up, with colour bars
    for claim in ("phases rebuilt exactly: True", "same pixel centres: True", "round trip exact: True",
                  "restored: True", "same as eager: True", "north up: True"):
        assert claim in text, claim
    bars, images = map(int, re.search(r"colour bars: (\d+) for (\d+) images", text).groups())
    assert bars == images >= 7
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    # the lazy out-of-core run shows a finished progress bar
    assert "100% Completed" in text
    assert "cleaned up: True" in text and not any(scratch.iterdir()), list(scratch.iterdir())
    # every operator once, on labelled data through the accessor (mapping forms)
    source = "\n".join(cell.source for cell in code)
    for name in OPERATORS:
        assert re.search(rf"\.ops\.{name}\(", source), name
    assert elapsed < 120, f"the notebook took {elapsed:.0f} s; keep it well under a minute"
