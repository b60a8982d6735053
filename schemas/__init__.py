"""Wire-format models: the shape-independent rules of every operator, as pydantic models.

No numpy, dask or fastapi here; ``ops`` validates its parameters with these models, and the
service publishes them as its OpenAPI / JSON Schema.
"""

from schemas.params import (
    BatchToSpaceNDParams,
    DataFormat,
    DepthToSpaceMode,
    DepthToSpaceParams,
    SpaceToBatchNDParams,
    SpaceToBatchParams,
    SpaceToDepthParams,
)

__all__ = [
    "BatchToSpaceNDParams",
    "DataFormat",
    "DepthToSpaceMode",
    "DepthToSpaceParams",
    "SpaceToBatchNDParams",
    "SpaceToBatchParams",
    "SpaceToDepthParams",
]
