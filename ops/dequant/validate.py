"""AscendDequant's arguments checked and turned into the kernel's: the supported dtype
combinations, the scale's shape and how it maps onto the elements, the output width.
"""

from __future__ import annotations

import numbers

import dask.array as da
import numpy as np

from ops import _validate, dtypes
from ops.dequant.kernel import F32, NO_LIMIT
from ops.errors import InvalidArgument
from schemas import AscendDequantParams

_DST_NAMES = ("float16", "bfloat16", "float32")

# Supported combinations (docs/operators.md lists them). Classic: (dst, scale) for vector and scalar scales.
CLASSIC_VECTOR = [("float16", "uint64"), ("float32", "float32"), ("float32", "bfloat16"),
                  ("bfloat16", "bfloat16"), ("bfloat16", "float32")]
CLASSIC_SCALAR = [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                  ("float32", "float32")]
# per_token / per_group: (scale, dst) for int32 or float32 src.
POLICY_PAIRS = [("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32"),
                ("float32", "float16"), ("float32", "bfloat16")]


def _dst_name(dst_dtype) -> str:
    try:
        dtype = dtypes.named(dst_dtype) if isinstance(dst_dtype, str) else np.dtype(dst_dtype)
    except TypeError:
        dtype = None
    # A dtype's name is one of these only in native byte order (a big-endian one reads ">f2").
    found = None if dtype is None else dtypes.name(dtype)
    if found in _DST_NAMES:
        return found
    raise InvalidArgument(f"dst_dtype must be one of float16, bfloat16 or float32, got {dst_dtype!r}")


def _scale_array(deq_scale):
    """The scale as an array (Python numbers become float32 0-d arrays)."""
    if isinstance(deq_scale, (bool, np.bool_)):
        raise InvalidArgument(f"deq_scale must be a number or an array, got bool {deq_scale!r}")
    if isinstance(deq_scale, numbers.Real) and not isinstance(deq_scale, np.generic):
        return np.asarray(deq_scale, F32)
    if isinstance(deq_scale, np.float64):  # a Python float subclass: treated as one
        return np.asarray(deq_scale, F32)
    if isinstance(deq_scale, (np.ndarray, da.Array)):
        return deq_scale
    return np.asarray(deq_scale)


def _type_name(dtype) -> str:
    return dtypes.name(np.dtype(dtype).newbyteorder("="))  # either byte order is fine


def _unsupported(what: str, got: str, pairs, columns: str) -> InvalidArgument:
    listed = "; ".join("(" + ", ".join(pair) + ")" for pair in pairs)
    return InvalidArgument(f"{what}: ({columns}) = ({got}) is not supported; supported: {listed}")


def _validate_dequant(src, deq_scale, dst_dtype, calc_count, mode, policy, group_size, k_dim, align_output):
    p = _validate.params(
        AscendDequantParams,
        dst_dtype=_dst_name(dst_dtype),
        calc_count=None if calc_count is None else _validate.integer("calc_count", calc_count),
        mode=mode,
        policy=policy,
        group_size=None if group_size is None else _validate.integer("group_size", group_size),
        k_dim=_validate.integer("k_dim", k_dim),
        align_output=align_output,
    )
    src = _validate.array("src", src)
    if not src.dtype.isnative:  # the compiled kernel reads native words
        src = src.astype(src.dtype.newbyteorder("="))
    if src.ndim == 1:
        src = src.reshape(1, -1)
    _validate.rank("src", src, "1 or 2 ([n] or [m, n])", src.ndim == 2)
    m, n = src.shape
    scale = _scale_array(deq_scale)
    src_name, scale_name = _type_name(src.dtype), _type_name(scale.dtype)
    if p.policy is None:
        if src_name != "int32":
            raise InvalidArgument(f"src dtype must be int32 without a policy, got {src_name}")
        if scale.ndim > 1:
            raise InvalidArgument(f"deq_scale must be a scalar or a 1-D vector, got shape {list(scale.shape)}")
        pairs = CLASSIC_VECTOR if scale.ndim == 1 else CLASSIC_SCALAR
        if (p.dst_dtype, scale_name) not in pairs:
            kind = "vector" if scale.ndim == 1 else "scalar"
            error = _unsupported(f"with a {kind} deq_scale", f"{p.dst_dtype}, {scale_name}", pairs, "dst_dtype, scale dtype")
            raise InvalidArgument(f"{error}{_scale_fix(p.dst_dtype, scale, n)}")
        cc = n if p.calc_count is None else p.calc_count
        if p.calc_count is not None and not 1 <= cc <= n:
            raise InvalidArgument(f"calc_count must be in 1..n = {n}, got {cc}")
        if scale.ndim == 1 and scale.shape[0] < cc:
            raise InvalidArgument(
                f"deq_scale must have at least calc_count = {cc} elements, got {scale.shape[0]}"
            )
    else:
        if src_name not in ("int32", "float32"):
            raise InvalidArgument(f"src dtype must be int32 or float32 with policy={p.policy!r}, got {src_name}")
        if (scale_name, p.dst_dtype) not in POLICY_PAIRS:
            raise _unsupported(f"with policy={p.policy!r}", f"{src_name}, {scale_name}, {p.dst_dtype}",
                               [(s, *pair) for s in ("int32", "float32") for pair in POLICY_PAIRS],
                               "src, scale, dst_dtype")
        expected = _policy_scale_shape(p, m, n)
        if scale.shape not in expected:
            raise InvalidArgument(
                f"deq_scale must have shape {' or '.join(str(list(s)) for s in expected)} for "
                f"{_policy_label(p)}, got {list(scale.shape)}"
            )
        cc = m * n if p.calc_count is None else p.calc_count
        if not 0 <= cc <= m * n or (n and cc % n):
            raise InvalidArgument(
                f"calc_count must be a multiple of n = {n} in 0..m*n = {m * n} with policy={p.policy!r}, got {cc}"
            )
    if p.policy != "per_group" and p.group_size is not None:
        raise InvalidArgument(f"group_size applies only to policy='per_group', got group_size={p.group_size}")
    if p.policy != "per_group" and p.k_dim != 1:
        raise InvalidArgument(f"k_dim applies only to policy='per_group', got k_dim={p.k_dim}")
    if p.align_output and (n * 4) % 32:
        raise InvalidArgument(
            f"align_output=True needs 32-byte aligned src rows (n*4 % 32 == 0), got n = {n}"
        )
    return src, scale, p, cc


def _scale_fix(dst_name: str, scale, n: int) -> str:
    """The one-line fix for a float scale the classic form does not take, or ''."""
    if scale.dtype.kind != "f" and not dtypes.is_bfloat16(scale.dtype):
        return ""
    if dst_name == "float16":  # the device takes float16 output only from packed uint64 scales
        packed = "ops.pack_deq_scale(scale)" if scale.ndim == 1 else f"ops.pack_deq_scale(np.full({n}, scale))"
        return f". For float16 output pack the float scale: deq_scale={packed}"
    if scale.dtype == np.float64:
        return ". Pass the scale as float32: deq_scale=np.float32(scale)" if scale.ndim == 0 else \
            ". Pass the scale as float32: deq_scale=scale.astype(np.float32)"
    return ""


def _policy_label(p) -> str:
    if p.policy == "per_token":
        return "policy='per_token'"
    return f"policy='per_group', k_dim={p.k_dim}, group_size={p.group_size}"


def _policy_scale_shape(p, m: int, n: int):
    if p.policy == "per_token":
        return [(m,), (m, 1)]
    if p.group_size is None:
        raise InvalidArgument("group_size is required with policy='per_group'")
    g = p.group_size
    return [(-(-m // g), n)] if p.k_dim == 0 else [(m, -(-n // g))]


def _output_columns(n: int, dst_dtype, align: bool) -> int:
    if not align:
        return n
    itemsize = np.dtype(dst_dtype).itemsize
    return -(-(n * itemsize) // 32) * 32 // itemsize


def _plan(src_shape, scale, p, cc):
    """(scale as 2-D, (row_div, col_div, row_limit, col_limit)): how scales map onto elements."""
    m, n = src_shape
    if p.policy is None:
        limit = cc
        per_row = 32 // dtypes.named(p.dst_dtype).itemsize
        if p.mode == "single_row" and m == 1 and cc % per_row == 0 and n % cc == 0:
            # The device reads the row as [n / calc_count, calc_count]: every element is
            # scaled, by scale[j % calc_count].
            limit = n
            if scale.ndim == 1:
                scale = (da.tile if isinstance(scale, da.Array) else np.tile)(scale[:cc], n // cc)
        if scale.ndim == 0:
            return scale.reshape(1, 1), (0, 0, NO_LIMIT, limit)
        return scale.reshape(1, -1), (0, 1, NO_LIMIT, limit)
    rows = cc // n if n else 0
    if p.policy == "per_token":
        return scale.reshape(m, 1), (1, 0, rows, n)
    if p.k_dim == 0:
        return scale, (p.group_size, 1, rows, n)
    return scale, (1, p.group_size, rows, n)
