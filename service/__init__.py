"""The REST service over ``ops``: OGC API - Processes for the operators, Zarr v3 over HTTP for
arrays, jobs on a Dask cluster. ``service.app.create_app(settings)`` builds it.

Dependencies point one way, ``service -> ops -> schemas``: nothing in ``ops`` imports this.
"""
