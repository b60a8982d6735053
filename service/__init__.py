"""The REST service over ``ops``: OGC API - Processes for the operators, Zarr v3 over HTTP for
arrays, jobs on a Dask cluster. ``service.api.app.create_app(settings)`` builds it.

Its rooms: ``api`` (the FastAPI application and its routers), ``jobs`` (planning, executing
and recording jobs on the cluster), ``storage`` (the array store, local or ``s3://``, and the
NPY and zip codecs of uploads) and ``cli`` (``chunked-tensor-ops serve`` and ``run``), with
``settings`` and ``errors`` beside them for all four.

Dependencies point one way, ``service -> ops -> schemas``: nothing in ``ops`` imports this.
Inside, ``api`` may import ``jobs`` and ``storage``, ``jobs`` may import ``storage``, ``cli``
may import all; ``storage`` imports none of the other three.
"""
