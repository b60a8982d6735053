"""The HTTP API: ``create_app(settings)`` (``app``) builds the FastAPI application, one router
per resource (``routers``), the OGC process descriptions (``descriptions``) and what the routes
share (``state``: the services, the token check). The API may import ``service.jobs`` and
``service.storage``; neither imports it.
"""
