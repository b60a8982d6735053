"""The house rules a test can check: packages, import directions, the two commands."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


PACKAGES = ("schemas", "ops", "service")  # each may import only the ones before it


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, read from the source (imports inside functions
    too, which a fresh interpreter would not show until they run)."""
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def project_module(name: str) -> str | None:  # "ops.dims.find_dims" -> "ops.dims"
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        names = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 more
                    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names += [f"{base}.{alias.name}" for alias in node.names]
        graph[module] = {target for name in names if (target := project_module(name))} - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_circles_and_dependencies_point_service_ops_schemas():
    graph = import_graph()
    assert {"ops.accessor", "ops.registry", "service.api.app", "schemas"} <= set(graph)
    assert cycles(graph) == []
    upward = [(module, target) for module, targets in graph.items() for target in targets
              if PACKAGES.index(target.split(".")[0]) > PACKAGES.index(module.split(".")[0])]
    assert upward == []


def test_the_circle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.smoke
def test_ops_does_not_import_the_service_stack(fresh_imports):
    modules = fresh_imports["ops"]["modules"]
    assert "fastapi" not in modules and "service" not in modules


def test_schemas_imports_no_array_libraries(fresh_imports):
    assert not {"numpy", "dask", "fastapi", "ops"} & fresh_imports["schemas"]["modules"]


def test_service_package_is_importable(fresh_imports):
    assert "service" in fresh_imports["service"]["modules"]


def test_readme_names_the_two_commands_and_the_makefile_has_them():
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make serve") < readme.index("make test")  # serve is the first command
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "\nserve:" in makefile and "\ntest:" in makefile


def test_user_docs_do_not_point_outside_the_project():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "../shared" not in path.read_text(), path


@pytest.mark.smoke
def test_service_import_starts_nothing(fresh_imports):
    """create_app is a factory: importing the service opens no cluster, files or sockets."""
    assert "fastapi" in fresh_imports["service.api.app"]["modules"]
    assert fresh_imports["service.api.app"]["threads"] == 1


def test_demo_runs(capsys):
    runpy.run_module("ops.demo", run_name="__main__")
    out = capsys.readouterr().out
    assert "depth_to_space" in out and "batch_to_space_nd" in out


def test_numba_is_imported_at_the_first_compiled_call_not_by_import_ops(fresh_imports):
    """A Dask worker imports ``ops`` to run any task; numba (~50 MiB) only for the kernels that
    need it, so a gather on a 384 MiB worker keeps that room."""
    assert "numba" not in fresh_imports["ops"]["modules"]
    assert "numba" in fresh_imports["first compiled call"]["modules"]


def test_every_test_module_has_a_smoke_test():
    """CI runs ``pytest -m smoke`` on the Pythons that do not run the whole suite: that subset
    must reach every module."""
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert modules
    missing = [str(p.relative_to(ROOT)) for p in modules if "@pytest.mark.smoke\n" not in p.read_text()]
    assert missing == []


def test_bench_imports_nothing_from_the_tests():
    """Benchmarks run by hand from a clone without a test suite's fixtures; the tests may use
    what the benchmarks share (bench/fuzzing.py, bench/load.py), not the reverse."""
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(path.name, name) for name in names if name.split(".")[0] == "tests"]
    assert found == []


#: The largest a module of the packages may grow, docstrings included: a module is one concern.
MODULE_LINES = 500


def test_every_module_is_one_room_of_at_most_500_lines():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    assert {path: lines for path, lines in sizes.items() if lines > MODULE_LINES} == {}
