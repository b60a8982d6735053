"""The s3fs options of an ``s3://`` data root, scratch or ``chunked-tensor-ops run`` URL, from
the settings (``CHUNKED_TENSOR_OPS_S3_*`` and ``..._STORAGE_OPTIONS``)."""

from __future__ import annotations

from service.settings import Settings

# Unless storage_options say otherwise: give up on an unreachable endpoint within seconds.
DEFAULT_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}


def storage_options(settings: Settings) -> dict:
    """The s3fs options the settings describe: ``storage_options`` with the ``s3_*`` fields
    over them, and short connection timeouts unless ``config_kwargs`` is given."""
    options = dict(settings.storage_options)
    client = dict(options.get("client_kwargs") or {})
    if settings.s3_endpoint_url:
        client["endpoint_url"] = settings.s3_endpoint_url
    if settings.s3_region:
        client["region_name"] = settings.s3_region
    if client:
        options["client_kwargs"] = client
    if settings.s3_key is not None:
        options["key"] = settings.s3_key.get_secret_value()
    if settings.s3_secret is not None:
        options["secret"] = settings.s3_secret.get_secret_value()
    options.setdefault("config_kwargs", DEFAULT_CONFIG)
    # s3fs reads a whole object with a HEAD first when max_concurrency > 1 (to split one larger
    # than its 50 MiB block size into concurrent ranged GETs): two round trips for every Zarr
    # chunk, which is far smaller. One GET each.
    options.setdefault("max_concurrency", 1)
    return options
