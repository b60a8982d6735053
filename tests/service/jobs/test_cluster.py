"""The service on a real multi-process Dask cluster, started as a compose file would start it:
``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, the service pointed at the
scheduler with ``scheduler="tcp://..."``. Jobs build their graphs on ``xarray.open_zarr`` of
stored inputs and write with ``to_zarr`` through the distributed client; the workers read and
write the data root by path (same machine, same path)."""

from __future__ import annotations

import math
import time

import dask
import numpy as np
import pytest
from distributed import Client
from fastapi.testclient import TestClient

import ops
from service.api.app import create_app
from tests.service.cluster_jobs import (assert_bit_exact, bounded, download, execute_body, job_leftovers, processing,
                                        submit, upload, wait_job, workers_idle)
from tests.service.conftest import NPY, eventually, inline, load_npy, make_settings
from tests.service.processes import dask_processes, free_port

INVALID_PARAMETER = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/invalid-parameter"
GiB = 2**30


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """(scheduler address, a driver Client): a scheduler and two one-thread workers of 1 GiB."""
    with dask_processes(tmp_path_factory.mktemp("dask-logs"), workers=2, nthreads=1) as (address, _, client):
        yield address, client


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("cluster-data-root")


@pytest.fixture(scope="module")
def api(dask_cluster, data_root):
    address, _ = dask_cluster
    settings = make_settings(data_root, scheduler=address, chunk_bytes=64 * 1024)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_healthz_reports_the_external_cluster(api, dask_cluster):
    address, _ = dask_cluster
    response = api.get("/healthz")
    assert response.status_code == 200, response.text
    cluster = response.json()["cluster"]
    assert "scheduler" not in cluster and address not in response.text  # only for a token's holder
    assert cluster["workers"] == 2
    assert cluster["threads"] == 2
    assert cluster["memory_limit"] == 2 * GiB
    assert cluster["embedded"] is False
    assert "error" not in cluster or cluster["error"] is None


@pytest.mark.smoke
def test_zarr_to_zarr_job_with_progress(api):
    x = np.random.default_rng(1).standard_normal((1, 512, 512, 16), dtype=np.float32)  # 16 MiB
    info = upload(api, "progress-x", x)
    assert math.prod(info["chunks"]) * 4 <= 64 * 1024  # 256 chunks of 64 KiB: seconds on the cluster
    job_id = submit(api, "depth_to_space", {"x": {"href": "/arrays/progress-x"}, "block_size": 2},
                    result_name="progress-y")
    final, seen = wait_job(api, job_id)
    assert final["status"] == "successful", final
    assert final["progress"] == 100
    assert seen == sorted(seen), f"progress went down: {seen}"
    assert any(0 < p < 100 for p in seen), f"no progress strictly between 0 and 100 seen: {seen}"
    assert any(link["rel"].endswith("/results") for link in final["links"])
    results = api.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200, results.text
    assert results.json()["result"]["href"] == "/arrays/progress-y"
    assert_bit_exact(download(api, "progress-y"), ops.depth_to_space(x, 2))


@pytest.fixture(scope="module")
def gather_params(api):
    """Stored GatherNd params whose gathered rows make output blocks of MiBs: tasks long
    enough that a job has some running when it is dismissed or fails."""
    params = np.random.default_rng(2).standard_normal((4096, 128), dtype=np.float32)
    upload(api, "gather-params", params)
    return params


def test_dismiss_a_running_job(api, gather_params, dask_cluster, data_root):
    _, client = dask_cluster
    # 160 output blocks of 5 MiB: still running well after the half second the test waits (with
    # 40, the job sometimes finished first, and a finished job's result is kept).
    indices = np.random.default_rng(4).integers(0, 4096, size=(1_600_000, 1), dtype=np.int64)
    upload(api, "dismiss-indices", indices, chunks="10000,1")
    job_id = submit(api, "gather_nd", {"params": {"href": "/arrays/gather-params"},
                                       "indices": {"href": "/arrays/dismiss-indices"}},
                    result_name="dismissed-y")
    submitted = time.monotonic()
    while True:
        info = api.get(f"/jobs/{job_id}").json()
        assert info["status"] in ("accepted", "running"), info
        if info["status"] == "running" and time.monotonic() - submitted > 0.5:
            break
        assert time.monotonic() - submitted < 20
        time.sleep(0.05)
    with bounded(15):
        response = api.delete(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "dismissed"
    assert response.json()["jobID"] == job_id
    assert api.get(f"/jobs/{job_id}").json()["status"] == "dismissed"
    # no result, no partial output, nothing left running for it on the cluster
    assert api.get("/arrays/dismissed-y/info").status_code == 404
    assert job_leftovers(data_root, job_id) == []
    assert eventually(lambda: processing(client) == []), processing(client)
    assert eventually(lambda: workers_idle(client))
    assert job_leftovers(data_root, job_id) == [], "a task of the dismissed job wrote after its cleanup"
    assert api.get("/arrays/dismissed-y/info").status_code == 404
    assert api.get(f"/jobs/{job_id}/results").status_code == 404
    # idempotent
    again = api.delete(f"/jobs/{job_id}")
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "dismissed"
    # the cluster still works
    small = np.arange(2 * 4 * 4 * 8, dtype=np.float32).reshape(2, 4, 4, 8)
    upload(api, "after-dismiss-x", small, chunks="1,2,4,8")
    next_job = submit(api, "depth_to_space", {"x": {"href": "/arrays/after-dismiss-x"}, "block_size": 2})
    final, _ = wait_job(api, next_job)
    assert final["status"] == "successful", final
    assert_bit_exact(download(api, next_job), ops.depth_to_space(small, 2))


def _task_prefixes(client: Client) -> set[str]:
    return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))


@pytest.mark.parametrize("bad", [False, True], ids=["ok", "bad-index"])
def test_a_large_gather_goes_through_the_jobs_scratch_and_leaves_nothing(api, gather_params, dask_cluster, data_root,
                                                                         bad):
    """Params past the broadcast limit (a quarter of array.chunk-size, lowered here to 1 MiB):
    the job's GatherNd takes the scratch plan, its files go to the job's own scratch directory
    under the data root, where the workers reach them, and nothing is left when it ends."""
    _, client = dask_cluster
    indices = np.random.default_rng(7).integers(-4096, 4096, size=(30_000, 1), dtype=np.int64)
    if bad:
        indices[12_345, 0] = 5000
    name = f"scratch-indices-{bad}"
    upload(api, name, indices, chunks="4000,1")
    with dask.config.set({"array.chunk-size": "1MiB"}):
        job_id = submit(api, "gather_nd", {"params": {"href": "/arrays/gather-params"},
                                           "indices": {"href": f"/arrays/{name}"}}, result_name=f"scratch-y-{bad}")
        final, _ = wait_job(api, job_id)
    assert {"gather_nd-split", "gather_nd-serve"} <= _task_prefixes(client)
    if bad:
        assert final["status"] == "failed", final
        assert "indices[12345, 0] = 5000 is out of range for dimension 0 of size 4096" in final["message"]
    else:
        assert final["status"] == "successful", final
        assert_bit_exact(download(api, f"scratch-y-{bad}"), ops.gather_nd(gather_params, indices))
    assert job_leftovers(data_root, job_id) == []


def test_the_scratch_setting_puts_job_scratch_elsewhere(dask_cluster, tmp_path, monkeypatch):
    """CHUNKED_TENSOR_OPS_SCRATCH: a job's GatherNd scratch goes under that directory (a
    shared disk, say) instead of the data root, and is removed when the job ends."""
    from ops import _scratch

    address, _ = dask_cluster
    runs = []
    new_run = _scratch.Scratch.new_run
    monkeypatch.setattr(_scratch.Scratch, "new_run", lambda self, prefix: runs.append(new_run(self, prefix)) or runs[-1])
    settings = make_settings(tmp_path / "root", scheduler=address, chunk_bytes=64 * 1024, scratch=str(tmp_path / "shared"))
    params = np.random.default_rng(11).standard_normal((512, 64), dtype=np.float32)
    indices = np.random.default_rng(12).integers(0, 512, size=(5000, 1), dtype=np.int64)
    with TestClient(create_app(settings)) as other, dask.config.set({"array.chunk-size": "256KiB"}):
        upload(other, "p", params, chunks="64,64")
        upload(other, "i", indices, chunks="1000,1")
        job_id = submit(other, "gather_nd", {"params": {"href": "/arrays/p"}, "indices": {"href": "/arrays/i"}},
                        result_name="y")
        final, _ = wait_job(other, job_id)
        assert final["status"] == "successful", final
        assert_bit_exact(download(other, "y"), ops.gather_nd(params, indices))
    assert len(runs) == 1 and runs[0].url.startswith(f"{tmp_path / 'shared'}/job-{job_id}-")
    assert list((tmp_path / "shared").iterdir()) == []
    assert job_leftovers(tmp_path / "root", job_id) == []


def test_failing_job_reports_the_index_error(api, gather_params, dask_cluster, data_root):
    _, client = dask_cluster
    indices = np.random.default_rng(3).integers(0, 4096, size=(100_000, 1), dtype=np.int64)
    indices[3, 0] = 4096  # one past the end of dimension 0, in the first of 10 blocks
    with pytest.raises(IndexError) as expected:
        ops.gather_nd(gather_params, indices)
    message = str(expected.value)
    assert "out of range" in message
    upload(api, "fail-indices", indices, chunks="10000,1")
    job_id = submit(api, "gather_nd", {"params": {"href": "/arrays/gather-params"},
                                       "indices": {"href": "/arrays/fail-indices"}},
                    result_name="fail-y")
    final, _ = wait_job(api, job_id)
    assert final["status"] == "failed", final
    assert message in final["message"]
    assert not any(link["rel"].endswith("/results") for link in final["links"])
    results = api.get(f"/jobs/{job_id}/results")
    assert results.status_code == 400, results.text
    assert results.headers["content-type"].startswith("application/problem+json")
    body = results.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert body["type"] == INVALID_PARAMETER
    assert body["status"] == 400
    assert message in body["detail"]
    assert api.get("/arrays/fail-y/info").status_code == 404
    # the job's other blocks were stopped, and none wrote into its output after the cleanup
    assert eventually(lambda: processing(client) == []), processing(client)
    assert eventually(lambda: workers_idle(client))
    assert job_leftovers(data_root, job_id) == []


def test_unreachable_scheduler_is_503_not_a_hang(tmp_path, caplog):
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody listens there
    settings = make_settings(tmp_path, scheduler=address, scheduler_timeout=2)
    with bounded(15), TestClient(create_app(settings)) as api:  # the app starts anyway
        with bounded(15):
            health = api.get("/healthz")
        assert health.status_code == 503, health.text
        assert health.headers["content-type"].startswith("application/json")
        assert health.json()["cluster"]["error"]
        assert health.json()["status"] == "unavailable"

        x = np.arange(2 * 4 * 4 * 8, dtype=np.float32).reshape(2, 4, 4, 8)
        upload(api, "offline-x", x)  # storing arrays needs no cluster
        with bounded(15):
            response = api.post("/processes/depth_to_space/execution",
                                json=execute_body({"x": {"href": "/arrays/offline-x"}, "block_size": 2}))
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["type"].endswith("cluster-unavailable")
        assert body["status"] == 503
        assert body["detail"] == "the Dask scheduler is unreachable", body
        # whoever reaches the scheduler runs code on the cluster: no answer names it
        port = address.rsplit(":", 1)[1]
        assert port not in response.text and port not in health.text, (response.text, health.text)
        assert f"the Dask scheduler at {address} is unreachable" in caplog.text  # the operator's log names it

        # all-inline inputs, value transmission: computed on NumPy in the service, no cluster
        with bounded(15):
            response = api.post("/processes/depth_to_space/execution",
                                json={"inputs": {"x": inline(x), "block_size": 2}, "response": "raw"})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith(NPY)
        assert_bit_exact(load_npy(response.content), ops.depth_to_space(x, 2))


_RNG = np.random.default_rng(7)
_IMAGE = _RNG.standard_normal((2, 8, 8, 16), dtype=np.float32)
_BATCH = _RNG.standard_normal((12, 4, 3, 2), dtype=np.float32)
_PARAMS = _RNG.standard_normal((10, 8, 3), dtype=np.float32)
_POINTS = np.stack([_RNG.integers(-10, 10, 40), _RNG.integers(0, 8, 40)], axis=1).astype(np.int64)
_ACC = _RNG.integers(-100000, 100000, size=(16, 48), dtype=np.int32)

# process id: (stored arrays with their ?chunks=, keyword parameters, the NumPy result)
OPERATOR_CASES = {
    "depth_to_space": ({"x": (_IMAGE, "1,4,4,16")}, {"block_size": 2}, lambda: ops.depth_to_space(_IMAGE, 2)),
    "space_to_depth": ({"x": (_IMAGE, "1,4,4,16")}, {"block_size": 2, "mode": "CRD"},
                       lambda: ops.space_to_depth(_IMAGE, 2, mode="CRD")),
    "space_to_batch": ({"x": (_IMAGE[:, :6, :6], "1,3,3,16")}, {"block_size": 2, "paddings": [[1, 1], [0, 2]]},
                       lambda: ops.space_to_batch(_IMAGE[:, :6, :6], 2, [[1, 1], [0, 2]])),
    "space_to_batch_nd": ({"x": (_IMAGE[:, :6, :5], "1,3,2,8")},
                          {"block_shape": [2, 3], "paddings": [[1, 1], [0, 1]]},
                          lambda: ops.space_to_batch_nd(_IMAGE[:, :6, :5], [2, 3], [[1, 1], [0, 1]])),
    "batch_to_space_nd": ({"x": (_BATCH, "6,2,3,2")}, {"block_shape": [2, 3], "crops": [[1, 1], [0, 2]]},
                          lambda: ops.batch_to_space_nd(_BATCH, [2, 3], [[1, 1], [0, 2]])),
    "gather_nd": ({"params": (_PARAMS, "5,4,3"), "indices": (_POINTS, "10,2")}, {},
                  lambda: ops.gather_nd(_PARAMS, _POINTS)),
    "ascend_dequant": ({"src": (_ACC, "4,48")}, {"deq_scale": 0.0078125, "dst_dtype": "float32"},
                       lambda: ops.ascend_dequant(_ACC, 0.0078125, dst_dtype="float32")),
}


@pytest.mark.parametrize("process", list(OPERATOR_CASES))
def test_every_operator_on_the_cluster(api, process):
    stored, params, expected = OPERATOR_CASES[process]
    inputs = dict(params)
    for role, (array, chunks) in stored.items():
        name = f"op-{process}-{role}"
        upload(api, name, np.ascontiguousarray(array), chunks=chunks)
        inputs[role] = {"href": f"/arrays/{name}"}
    job_id = submit(api, process, inputs, result_name=f"op-{process}-result")
    final, _ = wait_job(api, job_id)
    assert final["status"] == "successful", final
    assert final["progress"] == 100
    results = api.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200, results.text
    assert results.json() == {"result": {"href": f"/arrays/op-{process}-result", "type": NPY}}
    assert_bit_exact(download(api, f"op-{process}-result"), expected())
