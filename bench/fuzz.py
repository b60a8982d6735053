"""API fuzzing, the long run (by hand, not a test): ``python -m bench.fuzz [--examples N]``.

Schemathesis's own engine over every operation of the OpenAPI document, all its phases
(the document's examples, coverage, fuzzing, and stateful sequences that follow the
document's links: PUT an array then read/delete it, start a job then poll/dismiss it) and
all its default checks, against the service with an in-process Dask cluster on a temporary
data root. The same document, bodies and check policy as ``tests/service/test_schemathesis.py``
(see ``bench/fuzzing.py``), with ``N`` examples per operation instead of 20.

Prints what was sent (responses by operation and status) and every distinct failure with a
curl line that reproduces it; exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import warnings

# Zarr says consolidated metadata is not in the v3 spec yet; Starlette announces httpx2.
warnings.filterwarnings("ignore", "Consolidated metadata is currently not part")
warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient` is deprecated")

from fastapi.testclient import TestClient  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import Status, events, from_schema  # noqa: E402

from service.api.app import create_app  # noqa: E402
from service.settings import Settings  # noqa: E402
from bench import fuzzing  # noqa: E402


def settings(root: str) -> Settings:
    # TestClient's requests say Host: testserver, which a loopback service answers only when told
    return Settings(data_root=root, n_workers=1, threads_per_worker=2, cluster_processes=False,
                    memory_limit="4GiB", allowed_hosts=["testserver"])


def run(examples: int, seed: int | None, phases: list[str] | None) -> int:
    config = {"generation": {"max-examples": examples}, "operations": fuzzing.CONFIG_OPERATIONS}
    if seed is not None:
        config["seed"] = seed
    if phases:
        config["phases"] = {name: {"enabled": name in phases}
                            for name in ("examples", "coverage", "fuzzing", "stateful")}
    failures: dict[tuple[str, str, str], str] = {}
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    errors = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as root:
        app = create_app(settings(root))
        with TestClient(app):
            schema = fuzzing.load_schema(settings(root), config=SchemathesisConfig.from_dict(config))
            schema.app = fuzzing.Started(app)
            for event in from_schema(schema).execute():
                if isinstance(event, events.PhaseStarted):
                    print(f"-- {event.phase.name.value}", flush=True)
                elif isinstance(event, events.ScenarioFinished):
                    recorder = event.recorder
                    for case_id, interaction in recorder.interactions.items():
                        if interaction.response is not None:
                            seen[_label(recorder, case_id, interaction)][interaction.response.status_code] += 1
                    for case_id, checks in recorder.checks.items():
                        for check in checks:
                            if check.status == Status.FAILURE and check.failure_info is not None:
                                failure = check.failure_info.failure
                                key = (recorder.label, check.name, failure.title)
                                failures.setdefault(key, f"{failure.message}\n    {check.failure_info.code_sample}")
                elif isinstance(event, (events.NonFatalError, events.FatalError)):
                    errors.append(getattr(event, "info", None) or getattr(event, "exception", event))
    elapsed = time.monotonic() - started
    print(f"\n{sum(sum(c.values()) for c in seen.values())} responses in {elapsed:.0f} s "
          f"({examples} examples per operation)")
    for label in sorted(seen):
        print(f"  {label:55} {dict(sorted(seen[label].items()))}")
    for (label, check, title), detail in sorted(failures.items()):
        print(f"\nFAILURE {label}: {check}: {title}\n    {detail}")
    for error in errors:
        print(f"\nERROR {error}")
    print(f"\n{len(failures)} distinct failure(s), {len(errors)} error(s)")
    return 1 if failures or errors else 0


def _label(recorder, case_id: str, interaction) -> str:
    """The operation of an interaction, or (for a method the document does not list) the
    method and the path it was sent to."""
    method = interaction.request.method
    node = recorder.cases.get(case_id)
    operation = node.value.operation if node is not None else None
    if operation is not None and operation.method.upper() == method:
        return operation.label
    return f"{method} (not in the document) {operation.path if operation is not None else '?'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per operation (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: random)")
    parser.add_argument("--phases", nargs="*", choices=["examples", "coverage", "fuzzing", "stateful"],
                        help="only these phases (default: all)")
    args = parser.parse_args(argv)
    return run(args.examples, args.seed, args.phases)


if __name__ == "__main__":
    sys.exit(main())
