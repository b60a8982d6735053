"""Where arrays live: the service's array store, on a local data root or in an object store.

``local`` (``ArrayStore``, a directory) and ``s3`` (``ObjectArrayStore``, ``s3://bucket/prefix``)
keep every array as a Zarr v3 group behind one interface; the modules beside them hold what
the two share: array names (``names``), raw-bit dtypes (``raw_dtypes``), consolidated
metadata (``metadata``), uploads (``upload``, ``npy``, ``zip_extract``) and what
``chunked-tensor-ops run`` reads and writes (``run_storage``). Nothing here imports
``service.api``, ``service.jobs`` or ``service.cli``.
"""
