"""Where arrays live: the service's array store, on a local data root or in an object store.

``local`` (``ArrayStore``, a directory) and ``s3`` (``ObjectArrayStore``, ``s3://bucket/prefix``)
keep every array as a Zarr v3 group behind one interface (``protocol.ArrayStorage``; what the
two have in common is ``base.StoreBase``). The modules beside them hold what the two share:
array names (``names``), raw-bit dtypes (``raw_dtypes``), consolidated metadata
(``metadata``), uploads (``upload``, ``npy``, ``zip_extract``) and what ``chunked-tensor-ops
run`` reads and writes (``run_storage``, its outputs behind ``run_storage.RunOutput``).
Nothing here imports ``service.api``, ``service.jobs`` or ``service.cli``.
"""
