"""One semantics, many doors: the same call through ``ops.registry`` (what every door runs), the
service's execution endpoint and ``chunked-tensor-ops run`` is refused with the same message,
word for word, or gives the same result, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import zarr

import ops
from ops import registry
from ops.errors import InvalidArgument
from service.cli import main as cli
from tests.helpers import assert_same
from tests.service.conftest import inline, load_npy

RNG = np.random.default_rng(7)
IMAGE = RNG.standard_normal((2, 8, 8, 16), dtype=np.float32)

# (operator, keyword inputs, the command line's hint after the shared message)
BAD_CALLS = [
    ("depth_to_space", {"blocksize": 2}, ""),                             # unknown input
    ("depth_to_space", {}, " (--param block_size=VALUE)"),                # missing parameter
    ("depth_to_space", {"block_size": 3}, ""),                            # the operator's rule, on the shape
    ("depth_to_space", {"block_size": 2.0}, ""),                          # the operator's rule, on the value
    ("depth_to_space", {"block_size": 2, "mode": "XYZ"}, ""),
    ("depth_to_space", {"block_size": 2, "dims": [1]}, ""),               # dims that map nothing
    ("depth_to_space", {"block_size": 2, "dims": {"Q": "dim_0"}}, ""),
    ("space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[1, 0], [0, 0]]}, ""),
    ("space_to_batch", {"block_size": 2, "paddings": [[0, 0]]}, ""),
    ("batch_to_space_nd", {"block_shape": [3, 3], "crops": [[0, 0], [0, 0]]}, ""),
    ("gather_nd", {"batch_dims": 0}, " (--input indices=PATH)"),          # missing array input
    ("space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[0, 0], [0, 0]], "pad_value": "nan"}, ""),
    ("space_to_batch", {"block_size": 2, "paddings": [[0, 0], [0, 0]], "pad_value": 1e39}, ""),  # not a float32
]


def _registry_message(op: str, kwargs: dict) -> str:
    dims = kwargs.get("dims")
    params = {k: v for k, v in kwargs.items() if k != "dims"}
    with pytest.raises(InvalidArgument) as caught:
        registry.apply(op, {"x": IMAGE} if op != "gather_nd" else {"params": IMAGE}, params, dims)
    return str(caught.value)


def _service_message(client, op: str, kwargs: dict) -> str:
    first = "params" if op == "gather_nd" else "x"
    response = client.post(f"/processes/{op}/execution", json={"inputs": {first: inline(IMAGE), **kwargs}})
    assert response.status_code == 400, response.text
    return response.json()["detail"]


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["run", *args])
    return code, capsys.readouterr().err


def _cli_args(path, op: str, kwargs: dict) -> list[str]:
    import json

    params = [item for k, v in kwargs.items() for item in ("--param", f"{k}={json.dumps(v)}")]
    return [op, "--input", str(path), *params]


@pytest.fixture(scope="module")
def stored_image(tmp_path_factory):
    path = tmp_path_factory.mktemp("doors") / "image.zarr"
    zarr.create_array(str(path), data=IMAGE, chunks=(1, 8, 8, 16))
    return path


@pytest.mark.smoke
@pytest.mark.parametrize("op, kwargs, hint", BAD_CALLS, ids=[f"{op}-{sorted(kw)}" for op, kw, _ in BAD_CALLS])
def test_a_refusal_reads_the_same_through_every_door(client, capsys, tmp_path, stored_image, op, kwargs, hint):
    message = _registry_message(op, kwargs)
    assert _service_message(client, op, kwargs) == message
    code, err = _cli(capsys, *_cli_args(stored_image, op, kwargs), "--output", str(tmp_path / "out.zarr"))
    assert (code, err) == (2, f"chunked-tensor-ops run: error: {message}{hint}\n")
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("op, kwargs", [
    ("depth_to_space", {"block_size": 2, "mode": "CRD"}),
    ("space_to_depth", {"block_size": 2}),
    ("space_to_batch_nd", {"block_shape": [2, 4], "paddings": [[0, 2], [4, 0]]}),
    ("space_to_batch", {"block_size": 2, "paddings": [[0, 0], [2, 2]]}),
    ("batch_to_space_nd", {"block_shape": [2, 1], "crops": [[1, 0], [0, 0]]}),
    ("space_to_batch_nd", {"block_shape": [2, 4], "paddings": [[0, 2], [4, 0]], "pad_value": "NaN"}),
    ("space_to_batch", {"block_size": 2, "paddings": [[0, 0], [2, 2]], "pad_value": -1.5}),
])
def test_a_result_is_the_same_through_every_door(client, capsys, tmp_path, stored_image, op, kwargs):
    expected = getattr(ops, op)(IMAGE, **kwargs)
    assert_same(registry.apply(op, {"x": IMAGE}, kwargs).values, expected)
    response = client.post(f"/processes/{op}/execution", json={"inputs": {"x": inline(IMAGE), **kwargs}})
    assert response.status_code == 200, response.text
    assert_same(load_npy(response.content), expected)
    out = tmp_path / "out.zarr"
    code, err = _cli(capsys, *_cli_args(stored_image, op, kwargs), "--output", str(out), "--in-process", "--quiet")
    assert code == 0, err
    assert_same(xr.open_zarr(out)["result"].values, expected)


def test_a_gather_is_the_same_through_every_door(client, capsys, tmp_path, stored_image):
    # In a notebook the accessor gathers from the in-memory array its chunks are views of;
    # the service and the command line gather from their inputs' blocks.
    index = np.array([[1, -1], [0, 3], [-2, 7], [1, 0], [0, 3]])
    expected = ops.gather_nd(IMAGE, index)
    assert_same(registry.apply("gather_nd", {"params": IMAGE, "indices": index}, {}).values, expected)
    chunked = xr.DataArray(IMAGE, dims=("n", "h", "w", "c")).chunk({"n": 1, "h": 4, "w": 3})
    assert_same(chunked.ops.gather_nd(xr.DataArray(index, dims=("point", "idx"))).values, expected)
    response = client.post("/processes/gather_nd/execution",
                           json={"inputs": {"params": inline(IMAGE), "indices": inline(index)}})
    assert response.status_code == 200, response.text
    assert_same(load_npy(response.content), expected)
    stored_index = tmp_path / "index.zarr"
    zarr.create_array(str(stored_index), data=index, chunks=(2, 2))
    out = tmp_path / "out.zarr"
    code, err = _cli(capsys, "gather_nd", "--input", f"params={stored_image}", "--input", f"indices={stored_index}",
                     "--output", str(out), "--in-process", "--quiet")
    assert code == 0, err
    assert_same(xr.open_zarr(out)["result"].values, expected)


def test_a_labelled_scale_is_aligned_by_label_through_every_door(capsys, tmp_path):
    """A scale stored in another channel order than src: the accessor, the registry and run
    all align it by label (run used to apply it by position)."""
    labels = [f"c{i}" for i in range(8)]
    src = xr.DataArray(RNG.integers(-500, 500, (6, 8), dtype=np.int32), dims=("row", "channel"),
                       coords={"channel": labels})
    scale = xr.DataArray(RNG.uniform(0.5, 2, 8).astype(np.float32)[::-1], dims=("channel",),
                         coords={"channel": labels[::-1]})
    expected = src.ops.ascend_dequant(scale, dst_dtype="float32")
    assert_same(registry.apply("ascend_dequant", {"src": src, "deq_scale": scale}, {"dst_dtype": "float32"}).values,
                expected.values)
    src.to_dataset(name="src").to_zarr(tmp_path / "src.zarr", zarr_format=3)
    scale.to_dataset(name="scale").to_zarr(tmp_path / "scale.zarr", zarr_format=3)
    out = tmp_path / "out.zarr"
    code, err = _cli(capsys, "ascend_dequant", "--input", f"src={tmp_path / 'src.zarr'}", "--input",
                     f"deq_scale={tmp_path / 'scale.zarr'}", "--param", "dst_dtype=float32", "--output", str(out),
                     "--in-process", "--quiet")
    assert code == 0, err
    written = xr.open_zarr(out)["src"]
    assert_same(written.values, expected.values)
    assert list(written["channel"].values) == labels
