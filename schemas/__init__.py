"""Wire-format models: the shape-independent rules of every operator, as pydantic models.

No numpy, dask or fastapi here; ``ops`` validates its parameters with these models, and the
service publishes them as its OpenAPI / JSON Schema.
"""

from schemas.params import (
    AscendDequantParams,
    BatchToSpaceNDParams,
    DataFormat,
    DepthToSpaceMode,
    DepthToSpaceParams,
    GatherNdParams,
    SpaceToBatchNDParams,
    SpaceToBatchParams,
    SpaceToDepthParams,
)

__all__ = [
    "AscendDequantParams",
    "BatchToSpaceNDParams",
    "DataFormat",
    "DepthToSpaceMode",
    "DepthToSpaceParams",
    "GatherNdParams",
    "SpaceToBatchNDParams",
    "SpaceToBatchParams",
    "SpaceToDepthParams",
]
