"""Jobs: an execute request planned (``plan``), run on the Dask cluster (``cluster``) by the
executor (``execution``) with progress from the scheduler (``progress``), and recorded in SQLite
(``records``). Jobs read and write arrays through ``service.storage``; nothing here imports
``service.api`` or ``service.cli``.
"""
