"""The graph budget of an execution (service/jobs/execution.py ``Executor.build``): the
operator counts its blocks and tasks against ``max_graph_blocks`` and ``max_graph_tasks``
before it builds anything, the whole graph's tasks are counted once built, and past either
the request is a 400 naming the setting. A 167-byte request used to make the service build
and schedule a graph of 500,004 blocks (8.6 GiB, a 503 after 315 s)."""

from __future__ import annotations

import io
import json
import re
import time

import numpy as np
import psutil
import pytest
import requests

from tests.service.api.calls import put_array, unique
from tests.service.conftest import NPY, assert_problem, npy_bytes
from tests.service.processes import start_server, stop_server


def padded_body(name: str) -> bytes:
    """The request: SpaceToBatchND of a stored 1 x 4 x 1 array in chunks of 1, padded by
    500,000 rows, the result stored: 500,004 output blocks."""
    body = {"inputs": {"x": {"href": f"/arrays/{name}"}, "block_shape": [1], "paddings": [[500000, 0]]},
            "outputs": {"result": {"transmissionMode": "reference"}}}
    return json.dumps(body, separators=(",", ":")).encode()


def assert_over_the_blocks_budget(response) -> None:
    body = assert_problem(response, 400)
    for needle in ("space_to_batch_nd:", "500004 blocks", "100000 allowed", "less padding",
                   "max_graph_blocks", "CHUNKED_TENSOR_OPS_MAX_GRAPH_BLOCKS"):
        assert needle in body["detail"], body["detail"]


@pytest.mark.smoke
def test_a_small_request_for_a_huge_graph_is_refused_at_once(client, service_root):
    name = unique("tiny")
    put_array(client, name, np.arange(4, dtype=np.float32).reshape(1, 4, 1), params={"chunks": "1,1,1"})
    body = padded_body(name)
    assert len(body) < 170
    arrays = sorted(p.name for p in (service_root / "arrays").iterdir())
    started = time.monotonic()
    response = client.post("/processes/space_to_batch_nd/execution", content=body,
                           headers={"Content-Type": "application/json"})
    assert time.monotonic() - started < 5
    assert_over_the_blocks_budget(response)
    assert sorted(p.name for p in (service_root / "arrays").iterdir()) == arrays  # nothing stored
    # A padding under the budget is computed as before.
    small = client.post("/processes/space_to_batch_nd/execution", json={
        "inputs": {"x": {"href": f"/arrays/{name}"}, "block_shape": [1], "paddings": [[6, 0]]}})
    assert small.status_code == 200, small.text
    assert np.load(io.BytesIO(small.content)).ravel().tolist() == [0] * 6 + [0, 1, 2, 3]


def test_a_gather_of_many_params_chunks_by_many_index_chunks_passes_the_task_budget(client, monkeypatch):
    """Stored params in 300 chunks and stored indices in 300: 90,000 pairs of blocks, past a
    budget of 500 tasks. (The service never builds the pairs: with lazy indices, small params
    go whole to every indices block and large ones through the job's scratch store, so the
    graph is linear in the blocks, 600 tasks here; max_graph_blocks bounds those.)"""
    params, indices = unique("params"), unique("indices")
    put_array(client, params, np.zeros((300, 4)), params={"chunks": "1,4"})
    put_array(client, indices, np.arange(300, dtype=np.int64).reshape(300, 1), params={"chunks": "1,1"})
    monkeypatch.setattr(client.app.state.services.executor, "max_graph_tasks", 500, raising=False)
    started = time.monotonic()
    response = client.post("/processes/gather_nd/execution", json={
        "inputs": {"params": {"href": f"/arrays/{params}"}, "indices": {"href": f"/arrays/{indices}"}}})
    assert time.monotonic() - started < 5
    body = assert_problem(response, 400)
    for needle in ("gather_nd: the graph would have about 600 tasks, more than the 500 allowed", "larger chunks",
                   "max_graph_tasks", "CHUNKED_TENSOR_OPS_MAX_GRAPH_TASKS"):
        assert needle in body["detail"], body["detail"]


def test_the_whole_graph_is_counted_once_built(client, monkeypatch):
    """The stored input's own tasks count too: DepthToSpace of 64 chunks makes 64 blocks
    (the operator's count: 64 tasks, within the budget) on top of the input's reads."""
    name = unique("grid")
    put_array(client, name, np.zeros((1, 8, 8, 4), np.float32), params={"chunks": "1,1,1,4"})
    monkeypatch.setattr(client.app.state.services.executor, "max_graph_tasks", 100, raising=False)
    response = client.post("/processes/depth_to_space/execution",
                           json={"inputs": {"x": {"href": f"/arrays/{name}"}, "block_size": 2}})
    body = assert_problem(response, 400)
    assert re.search(r"depth_to_space: the graph would have about 1[2-9]\d tasks, more than the 100 allowed",
                     body["detail"]), body
    assert "max_graph_tasks" in body["detail"]


def test_the_request_costs_a_real_service_little(tmp_path):
    """Against ``python -m service``: the 167-byte request is answered 400 within seconds, and
    the service's memory and CPU time barely move (it used to take 8.6 GiB and 315 s)."""
    server = start_server(tmp_path / "data", tmp_path / "server.log", processes=False)  # refused before any task
    try:
        array = npy_bytes(np.arange(4, dtype=np.float32).reshape(1, 4, 1))
        put = requests.put(f"{server.url}/arrays/tiny?chunks=1,1,1", data=array, headers={"Content-Type": NPY},
                           timeout=60)
        assert put.status_code == 201, put.text
        warm = requests.post(f"{server.url}/processes/space_to_batch_nd/execution", timeout=60, json={
            "inputs": {"x": {"href": "/arrays/tiny"}, "block_shape": [1], "paddings": [[6, 0]]}})
        assert warm.status_code == 200, warm.text  # imports and caches in place before the baseline
        service = psutil.Process(server.proc.pid)
        rss, cpu = service.memory_info().rss, sum(service.cpu_times()[:2])
        started = time.monotonic()
        response = requests.post(f"{server.url}/processes/space_to_batch_nd/execution", data=padded_body("tiny"),
                                 headers={"Content-Type": "application/json"}, timeout=60)
        elapsed = time.monotonic() - started
        grown, spent = service.memory_info().rss - rss, sum(service.cpu_times()[:2]) - cpu
        print(f"answered in {elapsed:.2f} s; RSS {rss / 2**20:.0f} MiB + {grown / 2**20:.1f} MiB; CPU {spent:.2f} s")
        assert_over_the_blocks_budget(response)
        assert elapsed < 10
        assert grown < 256 * 2**20
        assert spent < 60
    finally:
        stop_server(server)
