"""deploy/: the image definition and the compose stack, checked without a Docker daemon.

The compose file is parsed and its structure asserted (the scheduler's port never published,
workers with memory limits that agree with their containers, the API pointed at the scheduler,
one volume at the same path in the API and the workers, the token from the environment). Then
the very commands it names are started as processes on 127.0.0.1 -- only the hosts, the ports,
the volume path and the location of the executables are substituted -- and a job is run through
them end to end. The Dockerfile is read for what a build would do: the files it copies, the
``pip install`` of this project, the non-root user, and a command that exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from dask.utils import parse_bytes
from distributed.cli.dask_scheduler import main as dask_scheduler_cli
from distributed.cli.dask_worker import main as dask_worker_cli
from setuptools import find_packages

import ops
from service.cli.main import _serve_parser, settings_from
from tests.service.processes import alive, descendants, free_port

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
# The image puts /opt/venv/bin first on PATH; here: the venv's bin, or the environment that
# deploy/check_install.py built from the image's build context.
BIN = Path(os.environ.get("DEPLOY_TEST_BIN") or Path(sys.executable).parent)
PYTHON = str(BIN / "python") if os.environ.get("DEPLOY_TEST_BIN") else sys.executable
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
TOKEN_VARIABLE = "CHUNKED_TENSOR_OPS_TOKEN"
NPY = "application/x-npy"
START_TIMEOUT = 120.0  # each start-up phase; seconds when idle, generous for a loaded machine
STOP_TIMEOUT = 20.0
JOB_TIMEOUT = 90.0  # seconds when the machine is idle; generous for a loaded CI machine


# --- the compose file ---------------------------------------------------------------------------

COMPOSE = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]


def command_of(service: dict) -> list[str]:
    """What the container runs: ``entrypoint`` + ``command`` (the image's CMD is replaced)."""
    argv: list[str] = []
    for key in ("entrypoint", "command"):
        part = service.get(key) or []
        argv += shlex.split(part) if isinstance(part, str) else [str(p) for p in part]
    return argv


def running(*head: str) -> dict[str, dict]:
    """The services whose command starts with ``head`` (e.g. ``"dask", "worker"``)."""
    return {name: s for name, s in SERVICES.items() if command_of(s)[:len(head)] == list(head)}


def option(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``); None if absent."""
    for k, token in enumerate(argv):
        if token == flag:
            return argv[k + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def replicas(service: dict) -> int:
    return int((service.get("deploy") or {}).get("replicas", 1))


def compose_bytes(value: str | int) -> int:
    """A compose memory size: bytes, or a number with b/k/m/g (Docker's units are binary)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmg]?)b?", value.strip().lower())
    assert match, f"not a compose memory size: {value!r}"
    return int(float(match[1]) * 1024 ** "bkmg".index(match[2] or "b"))


def container_memory(service: dict) -> int | None:
    limit = ((service.get("deploy") or {}).get("resources") or {}).get("limits", {}).get("memory")
    limit = limit or service.get("mem_limit")
    return None if limit is None else compose_bytes(limit)


def mounts(service: dict) -> dict[str, str]:
    """Container path -> volume (or host path), from the short or the long volume syntax."""
    found = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        found[target] = source
    return found


def published(service: dict) -> list[tuple[str, str, int]]:
    """(host address, host port, container port) for every published port."""
    found = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            found.append((port.get("host_ip", ""), str(port.get("published", "")), int(port["target"])))
            continue
        parts = str(port).split("/")[0].rsplit(":", 2)
        if len(parts) == 1:  # "8000": a random host port on every interface
            found.append(("", "", int(parts[0])))
        elif len(parts) == 2:
            found.append(("", parts[0], int(parts[1])))
        else:
            found.append((parts[0], parts[1], int(parts[2])))
    return found


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` (the forms this file may use)."""
    def one(match: re.Match) -> str:
        name, operator, word = match[1], match[2], match[3]
        if operator == ":?" and not env.get(name):
            raise KeyError(f"compose would refuse to start: {word}")
        if operator == ":-" and not env.get(name):
            return word
        return env.get(name, "")
    return re.sub(r"\$\{(\w+)(?:(:\?|:-)([^}]*))?\}", one, value)


def scheduler_service() -> tuple[str, list[str]]:
    (name, service), = running("dask", "scheduler").items()
    return name, command_of(service)


def worker_services() -> dict[str, dict]:
    return running("dask", "worker")


def api_service() -> tuple[str, list[str]]:
    (name, service), = running("chunked-tensor-ops", "serve").items()
    return name, command_of(service)


def api_settings():
    """The API's command read by the service's own parser (the flags must exist)."""
    _, argv = api_service()
    return settings_from(_serve_parser(argparse.ArgumentParser()).parse_args(argv[2:]))


def scheduler_address() -> str:
    name, argv = scheduler_service()
    return f"tcp://{name}:{option(argv, '--port') or 8786}"


def healthcheck_code(test: list[str]) -> str:
    """The Python snippet of a ``["CMD", "python", "-c", CODE]`` health check."""
    assert test[:3] == ["CMD", "python", "-c"], test
    compile(test[3], "<healthcheck>", "exec")
    return test[3]


# --- compose: structure -------------------------------------------------------------------------


@pytest.mark.smoke
def test_the_scheduler_port_is_never_published():
    name, argv = scheduler_service()
    port = int(option(argv, "--port") or 8786)
    for host, _, target in published(SERVICES[name]):
        assert target != port, f"{name} publishes the scheduler port {port}: it runs arbitrary code"
        assert host == "127.0.0.1", f"{name} publishes {target} beyond the host's loopback"
    for other, service in SERVICES.items():
        assert service.get("network_mode") != "host", f"{other} shares the host's network"


def test_workers_have_memory_limits_that_their_containers_agree_with():
    workers = worker_services()
    assert sum(replicas(s) for s in workers.values()) >= 2
    for name, service in workers.items():
        argv = command_of(service)
        assert argv[2] == scheduler_address(), f"{name} does not join the scheduler service"
        limit = option(argv, "--memory-limit")
        assert limit, f"{name} has no --memory-limit"
        dask_limit = parse_bytes(limit)
        container = container_memory(service)
        assert container, f"{name} has no container memory limit"
        # Above Dask's limit (the nanny lives in the container too, and Dask must restart a worker
        # before the kernel's OOM killer does), but not so far above that it no longer bounds it.
        assert dask_limit < container <= dask_limit + 2**30, (name, limit, container)
        threads = int(option(argv, "--nthreads") or 0)
        assert threads >= 1, f"{name} leaves --nthreads to the container's CPU count"
        cpus = ((service.get("deploy") or {}).get("resources") or {}).get("limits", {}).get("cpus")
        if cpus is not None:
            assert float(cpus) >= threads, (name, cpus, threads)


def test_the_api_points_at_the_scheduler_and_shares_the_data_volume():
    name, argv = api_service()
    settings = api_settings()
    assert settings.scheduler == scheduler_address()
    assert settings.host == "0.0.0.0"
    data_root = str(settings.data_root)
    api_mounts = mounts(SERVICES[name])
    assert data_root in api_mounts, f"{name} does not mount its data root {data_root}"
    volume = api_mounts[data_root]
    assert volume in (COMPOSE.get("volumes") or {}), f"{volume} is not a named volume of the file"
    for worker, service in worker_services().items():
        assert mounts(service).get(data_root) == volume, f"{worker} does not see {volume} at {data_root}"
    assert any(target == settings.port for _, _, target in published(SERVICES[name])), "the API is not published"
    assert data_root not in mounts(SERVICES[scheduler_service()[0]]), "the scheduler needs no data"


def test_the_token_comes_from_the_environment_and_is_required():
    name, argv = api_service()
    assert option(argv, "--token") is None, "a token in the command line is visible to every process"
    value = (SERVICES[name].get("environment") or {})[TOKEN_VARIABLE]
    assert re.fullmatch(r"\$\{" + TOKEN_VARIABLE + r":\?[^}]+\}", value), value
    with pytest.raises(KeyError, match="refuse"):
        interpolate(value, {})
    assert interpolate(value, {TOKEN_VARIABLE: "s3cret"}) == "s3cret"


def test_one_image_for_every_service_restarted_by_compose():
    images = {service.get("image") for service in SERVICES.values()}
    assert len(images) == 1 and None not in images, images
    for name, service in SERVICES.items():
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), name
        build = service["build"]
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context == REPO, (name, context)
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_the_commands_are_valid_for_the_tools_they_name():
    _, scheduler = scheduler_service()
    dask_scheduler_cli.make_context("dask scheduler", scheduler[2:])
    for service in worker_services().values():
        dask_worker_cli.make_context("dask worker", command_of(service)[2:])
    api_settings()
    for service in SERVICES.values():
        healthcheck_code(service["healthcheck"]["test"])


def test_the_dashboard_is_published_on_loopback_only():
    name, argv = scheduler_service()
    dashboard = option(argv, "--dashboard-address") or ":8787"
    port = int(dashboard.rsplit(":", 1)[1])
    assert ("127.0.0.1", str(port), port) in published(SERVICES[name])


# --- the Dockerfile -----------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    arguments: str
    stage: int

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.arguments
        return value


def dockerfile() -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments dropped; ``stage`` counts FROMs."""
    instructions, pending, stage = [], "", -1
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, arguments = text.partition(" ")
        keyword = keyword.upper()
        stage += keyword == "FROM"
        instructions.append(Instruction(keyword, arguments.strip(), stage))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def dockerignored(path: str) -> bool:
    """Whether ``path`` (relative, with /) is left out of the build context by .dockerignore:
    the last matching pattern wins, a pattern that matches a directory matches what is in it."""
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(p, glob) for p in prefixes):
            ignored = not negated
    return ignored


def final_stage() -> list[Instruction]:
    instructions = dockerfile()
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def test_the_image_runs_python_3_11_slim_as_a_user_without_privileges():
    instructions = dockerfile()
    bases = [i.arguments.split()[0] for i in instructions if i.keyword == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases), bases
    users = [i.arguments for i in final_stage() if i.keyword == "USER"]
    assert users, "the image runs as root"
    assert users[-1].split(":")[0] not in ("root", "0"), users


def test_the_image_installs_this_project_without_the_test_extra():
    installs = [i for i in dockerfile() if i.keyword == "RUN" and re.search(r"\bpip install\b", i.arguments)]
    assert len(installs) == 1, installs
    words = shlex.split(installs[0].arguments.split("pip install", 1)[1].split("&&")[0])
    targets = [w for w in words if not w.startswith("-")]
    assert targets == ["."], f"pip install {words}: not this project alone"
    # The installing stage's WORKDIR holds pyproject.toml and everything setuptools packs.
    stage = installs[0].stage
    workdir = [i.arguments for i in dockerfile() if i.stage == stage and i.keyword == "WORKDIR"][-1]
    copied = set()
    for copy in (i for i in dockerfile() if i.stage == stage and i.keyword == "COPY"):
        *sources, destination = copy.arguments.split()
        assert not any(s.startswith("--from") for s in sources)
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the build context"
            assert not dockerignored(source), f"COPY {source}: excluded by .dockerignore"
            target = Path(workdir) / (destination if destination not in ("./", ".") else source)
            if target.is_relative_to(workdir):  # what `pip install .` in the WORKDIR sees
                copied.add(str(target.relative_to(workdir)).rstrip("/"))
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(REPO), include=include)
    assert packages, include
    for package in packages:
        assert package.split(".")[0] in copied, f"{package} is not copied into the image"
        assert not dockerignored(package.replace(".", "/") + "/__init__.py"), package


def test_the_runtime_stage_has_the_installed_environment_on_its_path():
    runtime = final_stage()
    copies = [i.arguments.split() for i in runtime if i.keyword == "COPY"]
    assert any(c[0].startswith("--from=") and c[1] == c[2] == "/opt/venv" for c in copies), copies
    env = " ".join(i.arguments for i in runtime if i.keyword == "ENV")
    assert re.search(r"PATH=/opt/venv/bin:\$PATH", env), env


def test_the_image_command_is_the_installed_console_script():
    (cmd,) = [i for i in final_stage() if i.keyword == "CMD"]
    argv = cmd.exec_form()
    assert argv[0] in PYPROJECT["project"]["scripts"], argv
    assert (BIN / argv[0]).exists(), f"{argv[0]} is not installed"
    assert argv[1] == "serve"
    settings = settings_from(_serve_parser(argparse.ArgumentParser()).parse_args(argv[2:]))
    assert settings.host == "0.0.0.0"
    (health,) = [i for i in final_stage() if i.keyword == "HEALTHCHECK"]
    check = json.loads(health.arguments.split(" CMD ", 1)[1])
    code = healthcheck_code(["CMD", *check])
    assert f"127.0.0.1:{settings.port}/healthz" in code


def test_the_image_answers_to_the_dask_script_names_of_the_helm_chart_and_the_operator():
    """``dask-scheduler``/``dask-worker`` (deploy/bin, copied next to ``dask`` in the venv) run
    ``dask scheduler``/``dask worker`` with the same arguments."""
    copies = [i.arguments.split() for i in dockerfile() if i.keyword == "COPY"]
    assert ["deploy/bin/", "/opt/venv/bin/"] in copies, copies
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    runs = {}
    for role in ("scheduler", "worker"):
        shim = DEPLOY / "bin" / f"dask-{role}"
        assert os.access(shim, os.X_OK), f"{shim} is not executable"
        assert not dockerignored(f"deploy/bin/dask-{role}")
        runs[role] = subprocess.Popen([str(shim), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)
    for role, proc in runs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and f"Launch a Dask {role}" in out, err


def test_the_build_context_leaves_out_what_the_image_must_not_carry():
    for path in (".venv/bin/python", ".venv-3.12/bin/python", ".git/HEAD", "data/jobs.sqlite", "tests/test_deploy.py",
                 "ops/__pycache__/x.pyc", "deploy/compose.yaml"):
        assert dockerignored(path), path
    for path in ("pyproject.toml", "requirements/lock.txt", "README.md", "ops/__init__.py", "service/cli/main.py", "schemas/__init__.py"):
        assert not dockerignored(path), path


# --- the compose commands, started as processes on 127.0.0.1 ------------------------------------


class Substitution:
    """The only changes from the compose file to this machine: service hosts and listen hosts ->
    127.0.0.1, each listening port -> a free port (the same one wherever it is named), the volume
    path -> a directory of the test, the executables -> the venv's."""

    def __init__(self, volume_path: str, data_dir: Path):
        self.volume_path = volume_path
        self.data_dir = data_dir
        self.ports: dict[tuple[str, int], int] = {}

    def port(self, owner: str, port: int | str) -> int:
        key = (owner, int(port))
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def argv(self, owner: str, argv: list[str]) -> list[str]:
        executable = argv[0]
        out = [PYTHON if executable == "python" else str(BIN / executable)]
        previous = None
        for token in argv[1:]:
            match = re.fullmatch(r"tcp://([\w.-]+):(\d+)", token)
            if match and match[1] in SERVICES:
                token = f"tcp://127.0.0.1:{self.port(match[1], match[2])}"
            elif previous == "--host":
                token = "127.0.0.1"
            elif previous in ("--port", "--worker-port", "--nanny-port"):
                token = str(self.port(owner, token))
            elif previous == "--dashboard-address":
                token = f"127.0.0.1:{self.port(owner, token.rsplit(':', 1)[1])}"
            elif token == self.volume_path or token.startswith(self.volume_path + "/"):
                token = str(self.data_dir) + token[len(self.volume_path):]
            out.append(token)
            previous = token if token.startswith("--") else None
        return out

    def healthcheck(self, owner: str, test: list[str]) -> list[str]:
        code = re.sub(r"http://127\.0\.0\.1:(\d+)", lambda m: f"http://127.0.0.1:{self.port(owner, m[1])}",
                      healthcheck_code(test))
        return [PYTHON, "-c", code]


def test_the_substitution_changes_only_hosts_ports_paths_and_executables(tmp_path):
    """What the process test runs is the compose command token for token, but for what a
    container has and this machine has not."""
    volume_path = str(api_settings().data_root)
    substitution = Substitution(volume_path, tmp_path)
    for name, service in SERVICES.items():
        argv = command_of(service)
        local = substitution.argv(name, argv)
        assert len(local) == len(argv), (argv, local)
        assert Path(local[0]).name == argv[0] and Path(local[0]).exists()
        for flag, before, after in zip(argv, argv[1:], local[1:]):
            if before == after:
                continue
            allowed = (before.startswith("tcp://") and re.fullmatch(r"tcp://127\.0\.0\.1:\d+", after)
                       or flag == "--host" and after == "127.0.0.1"
                       or flag == "--port" and re.fullmatch(r"\d+", after)
                       or flag == "--dashboard-address" and re.fullmatch(r"127\.0\.0\.1:\d+", after)
                       or before == volume_path and after == str(tmp_path))
            assert allowed, f"{name}: {flag} {before!r} became {after!r}"
    # One scheduler port, the same for the scheduler and everyone who joins it.
    scheduler_name, scheduler_argv = scheduler_service()
    port = substitution.argv(scheduler_name, scheduler_argv)
    joined = {substitution.argv(n, command_of(s))[2] for n, s in worker_services().items()}
    api_flag = option(substitution.argv(api_service()[0], api_service()[1]), "--scheduler")
    assert joined == {api_flag} == {f"tcp://127.0.0.1:{option(port, '--port')}"}


@dataclass
class Stack:
    url: str
    token: str
    data_dir: Path
    substitution: Substitution
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    service_of: dict[str, str] = field(default_factory=dict)  # process name -> compose service
    logs: Path | None = None

    def log_tail(self, chars: int = 3000) -> str:
        out = []
        for name in self.procs:
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n" + (self.logs / f"{name}.log").read_text(errors="replace")[-chars:])
        return "\n".join(out)

    def healthy(self, owner: str, service: dict) -> bool:
        argv = self.substitution.healthcheck(owner, service["healthcheck"]["test"])
        return subprocess.run(argv, capture_output=True, timeout=15).returncode == 0

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}


def _dockerfile_env(tmp: Path) -> dict[str, str]:
    """The runtime stage's ENV: its /tmp paths moved under the test's directory, /opt/venv/bin
    in PATH is BIN. NUMBA_CACHE_DIR is left to the venv's own (warm) cache: a fresh one would
    make each worker compile the kernels again, which is not what this test is about."""
    env = {}
    for instruction in final_stage():
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.arguments):
                name, value = pair.split("=", 1)
                if name == "PATH":
                    env[name] = value.replace("/opt/venv/bin", str(BIN)).replace("$PATH", os.environ["PATH"])
                elif name != "NUMBA_CACHE_DIR":
                    env[name] = re.sub(r"^/tmp", str(tmp), value)
    return env


def _wait(what: str, check, stack: Stack, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n{stack.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {START_TIMEOUT} s\n{stack.log_tail()}")
        time.sleep(0.25)


def _stop(stack: Stack) -> None:
    """SIGTERM in the reverse order of compose's start (API, workers, scheduler), SIGKILL after a
    timeout, and no process of theirs (a nanny's worker) left behind."""
    children: set[int] = set()
    for proc in stack.procs.values():
        children |= descendants(proc.pid)
    groups: dict[str, list[subprocess.Popen]] = {}  # per compose service, in start order
    for instance, proc in stack.procs.items():
        groups.setdefault(stack.service_of[instance], []).append(proc)
    for group in reversed(list(groups.values())):  # the replicas of a service together
        for proc in group:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in group:
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.2)
    for pid in children:
        if alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The compose stack as processes, started in compose's order (the scheduler healthy first)."""
    tmp = tmp_path_factory.mktemp("deploy")
    home, logs, data_dir = tmp / "home", tmp / "logs", tmp / "data"
    for path in (home, logs, data_dir):
        path.mkdir()
    api_name, api_argv = api_service()
    volume_path = str(api_settings().data_root)
    substitution = Substitution(volume_path, data_dir)
    token = secrets.token_urlsafe(24)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKED_TENSOR_OPS_")}
    base_env.update(_dockerfile_env(tmp))
    api_port = substitution.port(api_name, api_settings().port)
    stack = Stack(f"http://127.0.0.1:{api_port}", token, data_dir, substitution, logs=logs)

    def start(instance: str, service_name: str, argv: list[str]) -> subprocess.Popen:
        env = dict(base_env)
        for name, value in (SERVICES[service_name].get("environment") or {}).items():
            env[name] = interpolate(str(value), {TOKEN_VARIABLE: token})
        with open(logs / f"{instance}.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        stack.procs[instance] = proc
        stack.service_of[instance] = service_name
        return proc

    try:
        scheduler_name, scheduler_argv = scheduler_service()
        proc = start(scheduler_name, scheduler_name, substitution.argv(scheduler_name, scheduler_argv))
        _wait("the scheduler's health check", lambda: stack.healthy(scheduler_name, SERVICES[scheduler_name]),
              stack, proc)
        for name, service in worker_services().items():
            for k in range(replicas(service)):
                instance = f"{name}-{k + 1}"
                argv = substitution.argv(instance, command_of(service))
                # Compose leaves a worker's own address to Dask (the container's IP): here, loopback.
                if "--host" not in argv:
                    argv += ["--host", "127.0.0.1"]
                start(instance, name, argv)
        proc = start(api_name, api_name, substitution.argv(api_name, api_argv))
        _wait("the API's health check", lambda: stack.healthy(api_name, SERVICES[api_name]), stack, proc)
        yield stack
    finally:
        _stop(stack)


def _expected_cluster() -> tuple[int, int, int]:
    """(workers, threads, memory limit) that the compose file's workers add up to."""
    workers = threads = memory = 0
    for service in worker_services().values():
        argv, n = command_of(service), replicas(service)
        workers += n
        threads += n * int(option(argv, "--nthreads"))
        memory += n * parse_bytes(option(argv, "--memory-limit"))
    return workers, threads, memory


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_the_stack_reports_every_worker_and_passes_its_health_checks(stack):
    workers, threads, memory = _expected_cluster()

    def cluster() -> dict:  # described only to the token's holder
        answer = requests.get(f"{stack.url}/healthz", headers=stack.auth, timeout=10)
        return answer.json()["cluster"] if answer.status_code == 200 else {}

    _wait(f"/healthz reporting {workers} workers", lambda: cluster().get("workers") == workers, stack)
    reported = cluster()
    assert (reported["threads"], reported["memory_limit"]) == (threads, memory), reported
    assert reported["embedded"] is False
    scheduler_name, scheduler_argv = scheduler_service()
    scheduler_port = stack.substitution.port(scheduler_name, option(scheduler_argv, "--port"))
    assert reported["scheduler"] == f"tcp://127.0.0.1:{scheduler_port}"
    assert set(stack.service_of.values()) == set(SERVICES)
    for instance, name in stack.service_of.items():
        assert stack.healthy(instance, SERVICES[name]), f"{instance}'s health check fails\n{stack.log_tail()}"
    # The image's own HEALTHCHECK (written for the API) passes against the API as well.
    (health,) = [i for i in final_stage() if i.keyword == "HEALTHCHECK"]
    assert stack.healthy(api_service()[0], {"healthcheck": {"test": ["CMD", *json.loads(
        health.arguments.split(" CMD ", 1)[1])]}})


def test_an_async_job_through_the_compose_commands_is_bit_exact(stack):
    workers, _, _ = _expected_cluster()
    _wait(f"{workers} workers", lambda: requests.get(f"{stack.url}/healthz", headers=stack.auth, timeout=10).json()
          .get("cluster", {}).get("workers") == workers, stack)
    assert requests.get(f"{stack.url}/processes", timeout=10).status_code == 401  # the token is enforced
    x = np.random.default_rng(10).standard_normal((2, 32, 48, 16), dtype=np.float32)
    put = requests.put(f"{stack.url}/arrays/deploy-x", data=_npy(x), params={"chunks": "1,16,16,16"},
                       headers={"Content-Type": NPY, **stack.auth}, timeout=30)
    assert put.status_code == 201, put.text
    body = {"inputs": {"x": {"href": "/arrays/deploy-x"}, "block_size": 2},
            "outputs": {"result": {"format": {"mediaType": NPY}, "transmissionMode": "reference",
                                   "name": "deploy-y"}},
            "response": "document"}
    submitted = requests.post(f"{stack.url}/processes/depth_to_space/execution", json=body,
                              headers={"Prefer": "respond-async", **stack.auth}, timeout=30)
    assert submitted.status_code == 201, submitted.text
    job = submitted.json()["jobID"]
    deadline = time.monotonic() + JOB_TIMEOUT
    while (info := requests.get(f"{stack.url}/jobs/{job}", headers=stack.auth, timeout=10).json())["status"] \
            not in ("successful", "failed", "dismissed"):
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    assert info["status"] == "successful", f"{info}\n{stack.log_tail()}"
    got = requests.get(f"{stack.url}/arrays/deploy-y", headers=stack.auth, timeout=30)
    assert got.status_code == 200, got.text
    y = np.load(io.BytesIO(got.content), allow_pickle=False)
    # DepthToSpace NHWC/DCR by reshape and transpose, independent of ops: out[n, h*2+i, w*2+j, c]
    # = x[n, h, w, (i*2+j)*C + c].
    n, h, w, c = x.shape
    expected = x.reshape(n, h, w, 2, 2, c // 4).transpose(0, 1, 3, 2, 4, 5).reshape(n, h * 2, w * 2, c // 4)
    assert y.dtype == expected.dtype and y.shape == expected.shape
    assert y.tobytes() == np.ascontiguousarray(expected).tobytes()
    assert y.tobytes() == np.ascontiguousarray(ops.depth_to_space(x, 2)).tobytes()  # the library's NumPy kernel
    # The workers wrote the result into the shared volume (here: the test's directory).
    written = [p for p in stack.data_dir.rglob("*") if p.is_file() and "deploy-y" in str(p.relative_to(stack.data_dir))]
    assert written, sorted(str(p) for p in stack.data_dir.rglob("*"))
