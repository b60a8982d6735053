"""``service.jobs.plan``: an execute request's inputs parsed by their wire models and bound by
the operator registry, before anything is computed."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.service import ExecuteRequest
from service.errors import ServiceError
from service.jobs.plan import plan_request
from service.storage.local import ArrayStore
from tests.service.conftest import inline

IMAGE = np.arange(2 * 4 * 4 * 8, dtype=np.float32).reshape(2, 4, 4, 8)


@pytest.fixture
def store(tmp_path):
    return ArrayStore(tmp_path, chunk_bytes=1 << 20, max_upload_bytes=1 << 30)


def plan(store, process_id: str, inputs: dict, **request):
    return plan_request(process_id, ExecuteRequest(inputs=inputs, **request), "0" * 32, "http://127.0.0.1:1",
                        store=store, max_inline_bytes=1 << 20)


@pytest.mark.smoke
def test_qualified_values_are_unwrapped_as_their_plain_forms(store):
    """OGC lets any input be qualified (``{"value": ..., "mediaType": "application/json"}``):
    the same call as with the plain values."""
    plain = plan(store, "depth_to_space", {"x": inline(IMAGE), "block_size": 2, "dims": {"C": "c"}})
    qualified = plan(store, "depth_to_space", {"x": inline(IMAGE), "block_size": {"value": 2},
                                               "dims": {"value": {"C": "c"}, "mediaType": "application/json"}})
    assert plain.call.kwargs == qualified.call.kwargs == {"block_size": 2}
    assert plain.call.dims == qualified.call.dims == {"C": "c"}
    np.testing.assert_array_equal(qualified.call.arrays["x"], IMAGE)
    src = np.arange(8, dtype=np.int32).reshape(2, 4)
    for scale in (0.5, {"value": 0.5}, {"value": 0.5, "mediaType": "application/json"}):
        call = plan(store, "ascend_dequant", {"src": inline(src), "deq_scale": scale, "dst_dtype": "float32"}).call
        assert call.arrays["deq_scale"] == 0.5


@pytest.mark.parametrize("value, message", [
    ({"value": "AAAA", "mediaType": "image/png"},
     "input 'x': mediaType should be 'application/x-npy', got 'image/png'"),
    ({"value": "AAAA", "encoding": "hex"}, "input 'x': encoding should be 'base64', got 'hex'"),
    ({"href": 7}, "input 'x': href should be a valid string, got 7"),
    ("/arrays/a", "input 'x' must be {\"href\": \"/arrays/NAME\"} or an inline NPY"),
    (True, "input 'x' must be {\"href\": \"/arrays/NAME\"} or an inline NPY"),
    ({"value": 2}, "depth_to_space: input 'x' must be an array, got the number 2"),
    ({"href": "/arrays/missing"}, "input 'x': no array named 'missing'"),
    ({"value": "not base64!"}, "input 'x': value is not valid base64"),
])
def test_a_malformed_array_input_is_refused_naming_it(store, value, message):
    with pytest.raises(ServiceError) as caught:
        plan(store, "depth_to_space", {"x": value, "block_size": 2})
    assert caught.value.status in (400, 404)
    assert str(caught.value.detail).startswith(message), caught.value.detail


def test_a_qualified_value_with_another_media_type_is_refused(store):
    with pytest.raises(ServiceError) as caught:
        plan(store, "depth_to_space", {"x": inline(IMAGE), "block_size": {"value": 2, "mediaType": "text/plain"}})
    assert caught.value.detail == "input 'block_size': mediaType should be 'application/json', got 'text/plain'"
