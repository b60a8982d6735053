"""Build what the image builds, without Docker, and run the compose stack from it.

1. The build context as ``.dockerignore`` leaves it is copied to a temporary directory.
2. ``pip install --constraint=requirements/lock.txt .`` of that context goes into a new virtual
   environment (Python 3.11, no test extras), as ``deploy/Dockerfile`` does into ``/opt/venv``;
   ``deploy/bin`` is copied next to it.
3. ``tests/test_deploy.py``'s process tests start the compose commands from that environment
   (``DEPLOY_TEST_BIN``) and run a job through them.

It needs the package index (a few minutes the first time). Usage, from the repository root::

    .venv/bin/python deploy/check_install.py [--python python3.11] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_deploy import dockerignored  # noqa: E402  (the same reading of .dockerignore)


def copy_context(destination: Path) -> int:
    """Copy every file that .dockerignore lets into the build context; how many."""
    negated = [line.strip()[1:].strip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip().startswith("!")]

    def worth_walking(directory: str) -> bool:  # not ignored, or holding a path let in again
        return not dockerignored(directory) or any(n.startswith(directory + "/") for n in negated)

    count = 0
    for directory, subdirectories, files in os.walk(REPO):
        relative = Path(directory).relative_to(REPO)
        subdirectories[:] = [d for d in subdirectories if worth_walking((relative / d).as_posix())]
        for name in files:
            path = (relative / name).as_posix()
            if not dockerignored(path):
                (destination / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / path, destination / path)
                count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3.11", help="the interpreter of the new environment")
    parser.add_argument("--keep", type=Path, help="build in DIR and keep it (default: a temporary directory)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="check-install-"))
    context, venv = work / "context", work / "venv"
    try:
        print(f"build context: {copy_context(context)} files -> {context}", flush=True)
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--constraint=requirements/lock.txt", "."],
                       cwd=context, check=True)
        for shim in (context / "deploy" / "bin").iterdir():
            shutil.copy2(shim, venv / "bin" / shim.name)
        print(f"installed into {venv}; running the compose commands from it", flush=True)
        env = {**os.environ, "DEPLOY_TEST_BIN": str(venv / "bin")}
        test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_deploy.py", "-k", "stack or async_job"], cwd=REPO, env=env)
        return test.returncode
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
