"""The storage contracts: both array stores implement ``ArrayStorage``, both kinds of stored
key ``StoredKey`` and both outputs of ``chunked-tensor-ops run`` ``RunOutput``, method by
method with the same signatures; and a local store's key reads the bytes of its file."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from service.settings import Settings
from service.storage import base
from service.storage.local import ArrayStore, LocalKey
from service.storage.protocol import ArrayStorage, StoredKey
from service.storage.run_storage import LocalOutput, ObjectOutput, RunOutput
from service.storage.s3 import ObjectArrayStore, RemoteKey
from tests.service.conftest import npy_bytes

IMPLEMENTATIONS = [
    (ArrayStorage, ArrayStore),
    (ArrayStorage, ObjectArrayStore),
    (StoredKey, LocalKey),
    (StoredKey, RemoteKey),
    (RunOutput, LocalOutput),
    (RunOutput, ObjectOutput),
]


def methods(protocol) -> dict:
    return {name: member for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def properties(protocol) -> list[str]:
    return [name for name, member in vars(protocol).items() if isinstance(member, property)]


def parameters(function) -> list[tuple]:
    """What a caller relies on: each parameter's name, kind and default (annotations differ:
    a local store's locations are paths, an object store's are versions)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.smoke
@pytest.mark.parametrize(("protocol", "cls"), IMPLEMENTATIONS, ids=lambda x: x.__name__)
def test_each_class_has_every_method_of_its_protocol_with_the_same_signature(protocol, cls):
    assert not issubclass(protocol, cls) and protocol not in cls.__mro__  # structural, not inherited stubs
    assert methods(protocol), protocol
    for name, declared in methods(protocol).items():
        implemented = inspect.getattr_static(cls, name, None)
        assert callable(implemented), f"{cls.__name__} has no method {name}"
        assert parameters(getattr(cls, name)) == parameters(declared), f"{cls.__name__}.{name}"
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name in properties(protocol):
        assert name in fields or isinstance(inspect.getattr_static(cls, name, None), property), \
            f"{cls.__name__} has no {name}"


def test_the_protocols_see_the_stores_and_outputs_they_describe(tmp_path, monkeypatch):
    local = ArrayStore(tmp_path / "root", chunk_bytes=4096, max_upload_bytes=2**20)
    monkeypatch.setattr(ObjectArrayStore, "_check_bucket", lambda self, create: None)  # no server here
    remote = ObjectArrayStore("s3://bucket/prefix", options={"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}},
                              state_dir=tmp_path / "state", chunk_bytes=4096, max_upload_bytes=2**20)
    for store in (local, remote):
        assert isinstance(store, ArrayStorage)
        for name in ArrayStorage.__annotations__:
            assert hasattr(store, name), (type(store).__name__, name)
    assert (remote.root, remote.state_dir, remote.tmp.is_dir()) == ("s3://bucket/prefix", tmp_path / "state", True)
    for output in (LocalOutput(str(tmp_path / "out.zarr")), ObjectOutput("memory://runs/out.zarr", Settings())):
        assert isinstance(output, RunOutput)
    assert not isinstance(object(), RunOutput) and not isinstance(object(), ArrayStorage)


def test_a_local_key_reads_the_bytes_of_its_file(tmp_path, monkeypatch):
    store = ArrayStore(tmp_path / "root", chunk_bytes=4096, max_upload_bytes=2**20)
    upload = store.npy_upload("keys", dims=None, chunks="8,8", declared_dtype=None, overwrite=False)
    try:
        upload.feed(npy_bytes(np.arange(16 * 16, dtype="<f8").reshape(16, 16)))
        upload.finish()
    finally:
        upload.abort()
    group = store.arrays / "keys"

    metadata = store.open_key("keys", "zarr.json")
    assert isinstance(metadata, StoredKey)
    assert (metadata.name, metadata.local_path) == ("zarr.json", group / "zarr.json")
    assert metadata.read(0, metadata.size) == (group / "zarr.json").read_bytes()

    chunk_file = next(p for p in sorted((group / "keys" / "c").rglob("*")) if p.is_file())
    data = chunk_file.read_bytes()
    chunk = store.open_key("keys", chunk_file.relative_to(group).as_posix())
    assert (chunk.size, chunk.local_path) == (len(data), chunk_file)
    assert chunk.read(3, 11) == data[3:11] and chunk.read(5, 5) == b""
    monkeypatch.setattr(base, "KEY_PIECE_BYTES", 7)  # several pieces from one small chunk
    pieces = list(chunk.pieces(2, len(data)))
    assert len(pieces) > 1 and max(map(len, pieces)) == 7 and b"".join(pieces) == data[2:]

    for missing in ("nothing.json", "keys/c/9/9", "../zarr.json", "keys/./zarr.json", ""):
        assert store.open_key("keys", missing) is None, missing
