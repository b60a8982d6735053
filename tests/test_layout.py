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


def test_readme_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_demo_runs():
    out = subprocess.run([sys.executable, "-m", "ops.demo"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "depth_to_space" in out.stdout and "batch_to_space_nd" in out.stdout
