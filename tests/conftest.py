import json
import os
import subprocess
import sys
from pathlib import Path

import distributed.gc
import pytest
from hypothesis import HealthCheck, settings

# Dask and JIT warm-up make the first examples slow; correctness, not speed, is tested here.
settings.register_profile(
    "default",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# distributed's schedulers and workers register a garbage-collection timing callback when they
# start and remove it when they close, from their event loop's thread. An in-process cluster
# doing so while another thread is inside a full collection hands the callback a "stop"
# without its "start", and its AssertionError surfaces as an unraisable-exception error in
# whichever test runs then. Registered once here, before any cluster thread exists, the
# callback stays for the session and later starts and closes only count its users.
distributed.gc.enable_gc_diagnosis()

# The modules that take longest (servers, clusters and processes they start), first: `make
# test` hands whole modules to its processes in this order, and a long one handed out last
# would run alone at the end.
SLOW_FIRST = [
    "tests/service/test_faults.py", "tests/service/test_e2e_http.py", "tests/service/test_data_safety.py",
    "tests/service/cli/test_run.py", "tests/test_out_of_core.py", "tests/service/storage/test_s3.py",
    "tests/service/cli/test_run_s3.py", "tests/test_deploy.py", "tests/service/jobs/test_cluster.py",
    "tests/service/test_load.py", "tests/service/api/test_processes.py", "tests/ops/test_copy.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: k for k, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest as collected


# One fresh interpreter, shared by every test about what an import loads or starts: starting
# one costs seconds here (importing ops alone loads xarray, pandas and dask), so the stages
# run in a single process, each after the ones before it, as a user's session would.
IMPORT_STAGES = {
    "schemas": "import schemas",
    "ops": "import ops, ops.accessor.coords, ops.gather_nd, xarray",
    "service": "import service",
    "service.api.app": "import service.api.app",
    "first compiled call": "ops.depth_to_space(__import__('numpy').zeros((1, 2, 2, 4), 'float32'), 2)",
}
_PROBE = """
import json, sys, threading
stages = json.loads(sys.argv[1])
seen = {}
for name, statement in stages.items():
    exec(statement)
    seen[name] = {"modules": sorted(sys.modules), "threads": threading.active_count()}
print(json.dumps(seen))
"""


@pytest.fixture(scope="session")
def fresh_imports() -> dict[str, dict]:
    """For each of ``IMPORT_STAGES``, run in order in a new interpreter: ``{"modules": set of
    the modules loaded so far, "threads": threads running}``."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(IMPORT_STAGES)], capture_output=True,
                         text=True, check=True, cwd=root, timeout=300)
    return {name: {"modules": set(seen["modules"]), "threads": seen["threads"]}
            for name, seen in json.loads(out.stdout).items()}
