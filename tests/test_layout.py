"""The house rules of DESIGN.md that a test can check: packages and import directions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_ops_does_not_import_the_service_stack():
    modules = _imports_after("import ops")
    assert "fastapi" not in modules and "service" not in modules


def test_schemas_imports_no_array_libraries():
    modules = _imports_after("import schemas")
    assert not {"numpy", "dask", "fastapi", "ops"} & modules


def test_service_package_is_importable():
    _imports_after("import service")


def test_readme_names_the_two_commands_and_the_makefile_has_them():
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make serve") < readme.index("make test")  # serve is the first command
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "\nserve:" in makefile and "\ntest:" in makefile


def test_user_docs_do_not_point_outside_the_project():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "../shared" not in path.read_text(), path


def test_service_import_starts_nothing():
    """create_app is a factory: importing the service opens no cluster, files or sockets."""
    modules = _imports_after("import service.app")
    assert "fastapi" in modules
    out = subprocess.run([sys.executable, "-c", "import threading, service.app; print(threading.active_count())"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "1"


def test_demo_runs():
    out = subprocess.run([sys.executable, "-m", "ops.demo"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "depth_to_space" in out.stdout and "batch_to_space_nd" in out.stdout


def test_numba_is_imported_at_the_first_compiled_call_not_by_import_ops():
    """A Dask worker imports ``ops`` to run any task; numba (~50 MiB) only for the kernels that
    need it, so a gather on a 384 MiB worker keeps that room."""
    assert "numba" not in _imports_after("import ops, ops.gather_nd")
    assert "numba" in _imports_after(
        "import numpy as np, ops; ops.depth_to_space(np.zeros((1, 2, 2, 4), np.float32), 2)"
    )
