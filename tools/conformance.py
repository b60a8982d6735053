"""``make conformance``: the ported subset of OGC's test suite for OGC API - Processes 1.0
(tests/service/api/test_conformance_suite.py) against a live service on 127.0.0.1, one line per
requirement it checks::

    PASS /req/core/landingpage-op
    FAIL /req/core/job-op  (test_execute_async_and_its_results: AssertionError: ...)

A requirement passes when every test that checks it passes. The exit status is non-zero when
any requirement fails (or the run itself does). Arguments are passed on to pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = "tests/service/api/test_conformance_suite.py"


class RequirementReport:
    """A pytest plugin: each test's outcome, filed under the requirements it names."""

    def __init__(self):
        self.failures: dict[str, list[str]] = {}  # requirement -> why it failed (empty: passed)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when != "call" and report.passed:
            return
        for requirement in getattr(getattr(item, "function", None), "requirements", ()):
            failures = self.failures.setdefault(requirement, [])
            if not report.passed:
                reason = str(call.excinfo.value).splitlines()[0][:160] if call.excinfo else report.outcome
                failures.append(f"{item.name}: {reason}")

    def lines(self) -> list[str]:
        return [f"PASS {requirement}" if not why else f"FAIL {requirement}  ({'; '.join(why)})"
                for requirement, why in self.failures.items()]


def main(args: list[str]) -> int:
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    report = RequirementReport()
    status = pytest.main(["-q", "-p", "no:cacheprovider", SUITE, *args], plugins=[report])
    lines = report.lines()
    print("\nOGC API - Processes 1.0, per requirement:")
    print("\n".join(lines) if lines else "no requirement was checked")
    failed = sum(line.startswith("FAIL") for line in lines)
    print(f"{len(lines) - failed} passed, {failed} failed")
    return 1 if failed or status != 0 or not lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
