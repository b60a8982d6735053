"""Operator parameter models: ranges and enums, nothing that needs the input's shape.

Integers are strict (no bools, floats or numeric strings) and bounded to int64, since the
reference operators take int32/int64 tensors.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

INT64_MAX = 2**63 - 1
# The largest block size whose square still fits in int64 (DepthToSpace divides C by it).
MAX_SQUARE_ROOT_INT64 = math.isqrt(INT64_MAX)

DataFormat = Literal["NHWC", "NCHW", "NCHW_VECT_C"]
DepthToSpaceMode = Literal["DCR", "CRD"]

NonNegative = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
BlockEntry = Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]
# block_shape has 1 <= M < rank <= 8 entries.
BlockShape = Annotated[list[BlockEntry], Field(min_length=1, max_length=7)]
PairList = Annotated[list[tuple[NonNegative, NonNegative]], Field(min_length=1, max_length=7)]
# The value of padded cells: a number the input's dtype can hold (checked with the dtype), or
# "NaN", since JSON has no NaN.
PadValue = Annotated[StrictInt | StrictFloat | Literal["NaN"], Field(
    description="The value of the padded cells (default 0): a number the input's dtype holds, "
                "or \"NaN\" for floating (and packed) data")]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DepthToSpaceParams(_Params):
    """DepthToSpace: moves ``block_size**2`` channel groups into spatial blocks."""

    block_size: Annotated[StrictInt, Field(ge=2, le=MAX_SQUARE_ROOT_INT64)]
    data_format: DataFormat = "NHWC"
    mode: DepthToSpaceMode = "DCR"


class SpaceToDepthParams(DepthToSpaceParams):
    """SpaceToDepth: the exact inverse of DepthToSpace with the same parameters."""


def _check_rows(name: str, rows: list, block_shape: list[int]) -> None:
    """One (before, after) row per spatial dim, and block sizes whose product fits int64."""
    if len(rows) != len(block_shape):
        raise ValueError(
            f"{name} must have one [before, after] row per block_shape entry "
            f"({len(block_shape)}), got {len(rows)} rows"
        )
    if math.prod(block_shape) > INT64_MAX:
        raise ValueError(
            f"block_shape product must fit in int64, got {math.prod(block_shape)} for {block_shape}"
        )


class SpaceToBatchParams(_Params):
    """SpaceToBatch (the seed operator): 4-D NHWC, square blocks, padding with ``pad_value``."""

    block_size: Annotated[StrictInt, Field(ge=1, le=MAX_SQUARE_ROOT_INT64)]
    paddings: tuple[tuple[NonNegative, NonNegative], tuple[NonNegative, NonNegative]]
    pad_value: PadValue = 0


class SpaceToBatchNDParams(_Params):
    """SpaceToBatchND (TensorFlow): M spatial dims, padding with ``pad_value`` (zero by default)."""

    block_shape: BlockShape
    paddings: PairList
    pad_value: PadValue = 0

    @model_validator(mode="after")
    def _rows_match(self):
        _check_rows("paddings", self.paddings, self.block_shape)
        return self


class BatchToSpaceNDParams(_Params):
    """BatchToSpaceND (TensorFlow): the inverse of SpaceToBatchND, with crops."""

    block_shape: BlockShape
    crops: PairList

    @model_validator(mode="after")
    def _rows_match(self):
        _check_rows("crops", self.crops, self.block_shape)
        return self


class GatherNdParams(_Params):
    """GatherNd: index tuples in the last axis of ``indices`` select elements or slices."""

    batch_dims: NonNegative = 0
    negative_index_support: StrictBool = True


class AscendDequantParams(_Params):
    """AscendDequant: int32 (or float32 with a policy) times a scale, to float16/bfloat16/float32."""

    dst_dtype: Literal["float16", "bfloat16", "float32"]
    calc_count: NonNegative | None = None
    mode: Literal["single_row", "multi_row"] = "single_row"
    policy: Literal["per_token", "per_group"] | None = None
    group_size: Annotated[StrictInt, Field(ge=1, le=INT64_MAX)] | None = None
    k_dim: Literal[0, 1] = 1
    align_output: StrictBool = False

    @model_validator(mode="after")
    def _group_size_rule(self):
        if self.group_size is not None and self.group_size % 32:
            raise ValueError(f"group_size must be a multiple of 32, got {self.group_size}")
        return self
