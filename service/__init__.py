"""The REST service (FastAPI) over ``ops``: not built yet; see the service issue.

Dependencies point one way, ``service -> ops -> schemas``: nothing in ``ops`` imports this.
"""
