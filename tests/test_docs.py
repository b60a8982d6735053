"""The user docs: examples that run, docstrings that match them, links that resolve, a site that builds."""

from __future__ import annotations

import doctest
import inspect
import pydoc
import re
import shutil
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest

import ops

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
USER_DOCS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
OPERATORS = ["depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd",
             "batch_to_space_nd", "gather_nd", "ascend_dequant"]


def _pycon_blocks(path: Path) -> list[str]:
    """The ```pycon blocks of a Markdown file (interactive sessions, doctest syntax)."""
    return re.findall(r"```pycon\n(.*?)```", path.read_text(), flags=re.S)


def _docstring_examples(function) -> str:
    """The Examples section of a numpydoc docstring, dedented."""
    doc = inspect.getdoc(function)
    assert "\nExamples\n--------\n" in doc, f"{function.__name__} has no Examples section"
    return textwrap.dedent(doc.split("\nExamples\n--------\n", 1)[1]).strip()


def _run_doctest(text: str, name: str) -> doctest.TestResults:
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    test = parser.get_doctest(text, {}, name, None, 0)
    assert test.examples, f"{name}: no examples found"
    runner.run(test)
    return runner.summarize(verbose=False)


# ---------------------------------------------------------------------------------------------
# Examples: the docs' and the docstrings' are the same text, and both run


@pytest.mark.parametrize("path", [DOCS / "operators.md", DOCS / "accessor.md"], ids=lambda p: p.name)
def test_every_documented_session_runs(path):
    blocks = _pycon_blocks(path)
    assert blocks, f"{path.name} has no examples"
    for k, block in enumerate(blocks):
        result = _run_doctest(block, f"{path.name} example {k}")
        assert result.failed == 0, f"{path.name} example {k} failed (see the doctest report above)"


@pytest.mark.parametrize("name", OPERATORS)
@pytest.mark.smoke
def test_docstring_example_is_the_reference_example_and_runs(name):
    function = getattr(ops, name)
    example = _docstring_examples(function)
    documented = [block.strip() for block in _pycon_blocks(DOCS / "operators.md")]
    assert example in documented, f"the Examples of ops.{name} differ from every example in docs/operators.md"
    result = _run_doctest(example, f"ops.{name}")
    assert result.failed == 0


@pytest.mark.parametrize("name", OPERATORS)
def test_help_shows_the_reference(name):
    """help(ops.X) shows a numpydoc reference: parameters, returns, raises, an example."""
    text = pydoc.render_doc(getattr(ops, name), renderer=pydoc.plaintext)
    for section in ("Parameters", "Returns", "Raises", "Examples"):
        assert f"\n    {section}\n    ---" in text, f"help(ops.{name}) lacks {section}"
    signature = inspect.signature(getattr(ops, name))
    for parameter in signature.parameters:
        assert re.search(rf"^\s+{parameter} :", text, flags=re.M), f"help(ops.{name}) does not describe {parameter}"


# ---------------------------------------------------------------------------------------------
# Links


def _slug(heading: str) -> str:
    """The anchor of a Markdown heading (Python-Markdown's toc slugify, as mkdocs and GitHub)."""
    text = re.sub(r"[`*_]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not a link
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    for link in _links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        assert resolved.exists(), f"{path.name}: link {link!r} points at nothing"
        assert resolved.is_relative_to(ROOT), f"{path.name}: link {link!r} leaves the project"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{path.name}: link {link!r}: no such heading"


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_point_nowhere_outside_the_project(path):
    text = path.read_text()
    assert "/work/shared" not in text and "../shared" not in text
    for link in _links(path):
        assert not (DOCS / link.partition("#")[0]).resolve().is_relative_to(ROOT.parent / "shared"), link
    if path.parent == ROOT:
        assert not [link for link in _links(path) if link.startswith("../")], path.name


def test_the_link_checker_catches_a_broken_link(tmp_path):
    """The checks above can fail: a made-up page with a dead link and a dead anchor."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[there](missing.md) [here](#no-such-heading) [ok](#title)\n")
    assert _links(page) == ["missing.md", "#no-such-heading", "#title"]
    assert "no-such-heading" not in _anchors(page) and "title" in _anchors(page)
    assert _slug("DepthToSpace and SpaceToDepth") == "depthtospace-and-spacetodepth"
    assert _slug("`.ops.invert()`: undo") == "opsinvert-undo"


# ---------------------------------------------------------------------------------------------
# The site


def test_mkdocs_builds_the_docs_strictly(tmp_path):
    """`mkdocs build --strict` (mkdocs is in the docs and test extras): every page in the nav,
    every link and anchor resolves. About 2 s."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "site" / "operators" / "index.html").exists()
    built = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.glob("*.md")}
    for page in built - {"index"}:
        assert (tmp_path / "site" / page / "index.html").exists(), page
    shutil.rmtree(tmp_path / "site")
