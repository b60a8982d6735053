"""The command line: ``chunked-tensor-ops serve`` and ``run`` (``main``, also ``python -m
service``); ``run``, one operator Zarr to Zarr on a Dask cluster without the service, is
``run`` with its flags (``flags``), inputs (``inputs``) and exit codes (``run_errors``). The CLI may
import every other part of the service; none imports it.
"""
