"""An independent oracle: the operators' index formulas (docs/operators.md) evaluated literally with index arrays.

Nothing here shares code with ``ops``; fancy indexing copies elements exactly for every dtype.
"""

from __future__ import annotations

import math

import numpy as np


def _to_nhwc(x, data_format):
    if data_format == "NHWC":
        return x
    if data_format == "NCHW":
        return x.transpose(0, 2, 3, 1)
    n, o, h, w, v = x.shape  # channel c = 4*o + v
    return x.transpose(0, 2, 3, 1, 4).reshape(n, h, w, o * v)


def _from_nhwc(y, data_format):
    if data_format == "NHWC":
        return y
    if data_format == "NCHW":
        return y.transpose(0, 3, 1, 2)
    n, h, w, c = y.shape
    return y.reshape(n, h, w, c // 4, 4).transpose(0, 3, 1, 2, 4)


def depth_to_space(x, bs, data_format="NHWC", mode="DCR"):
    xn = _to_nhwc(x, data_format)
    n_, h_, w_, c_ = xn.shape
    cp = c_ // (bs * bs)
    n, ho, wo, c = np.indices((n_, h_ * bs, w_ * bs, cp), sparse=False)
    h, i = np.divmod(ho, bs)
    w, j = np.divmod(wo, bs)
    source_channel = (i * bs + j) * cp + c if mode == "DCR" else c * bs * bs + i * bs + j
    return np.ascontiguousarray(_from_nhwc(xn[n, h, w, source_channel], data_format))


def space_to_depth(x, bs, data_format="NHWC", mode="DCR"):
    xn = _to_nhwc(x, data_format)
    n_, hs, ws, cp = xn.shape
    n, h, w, co = np.indices((n_, hs // bs, ws // bs, cp * bs * bs))
    if mode == "DCR":
        ij, c = np.divmod(co, cp)
    else:
        c, ij = np.divmod(co, bs * bs)
    i, j = np.divmod(ij, bs)
    return np.ascontiguousarray(_from_nhwc(xn[n, h * bs + i, w * bs + j, c], data_format))


def space_to_batch_nd(x, block_shape, paddings, fill=None):
    """``fill``: the padded cells' value, a 0-d array of x's dtype (default zeros)."""
    m = len(block_shape)
    batch = x.shape[0]
    spatial = [
        (x.shape[1 + k] + paddings[k][0] + paddings[k][1]) // block_shape[k] for k in range(m)
    ]
    out_shape = (batch * math.prod(block_shape), *spatial, *x.shape[1 + m :])
    y = np.zeros(out_shape, x.dtype)
    if fill is not None:
        y[...] = fill
    index = np.indices(out_shape)
    group, b = np.divmod(index[0], batch)
    offsets = np.unravel_index(group, block_shape) if block_shape else ()
    source = [b]
    valid = np.ones(out_shape, bool)
    for k in range(m):
        s = index[1 + k] * block_shape[k] + offsets[k] - paddings[k][0]
        valid &= (s >= 0) & (s < x.shape[1 + k])
        source.append(s)
    source += [index[1 + m + r] for r in range(x.ndim - 1 - m)]
    y[valid] = x[tuple(s[valid] for s in source)]
    return y


def space_to_batch(x, block_size, paddings):
    """The seed's 4-D formula, exactly as written (n_out = n + (bh*bs + bw)*N)."""
    pt, pb, pl, pr = np.asarray(paddings).reshape(-1).tolist()
    n_, h_, w_, c_ = x.shape
    bs = block_size
    out_shape = (n_ * bs * bs, (h_ + pt + pb) // bs, (w_ + pl + pr) // bs, c_)
    y = np.zeros(out_shape, x.dtype)
    for n_out, h_out, w_out in np.ndindex(*out_shape[:3]):
        n = n_out % n_
        rem = n_out // n_
        bh, bw = rem // bs, rem % bs
        h_in = h_out * bs + bh - pt
        w_in = w_out * bs + bw - pl
        if 0 <= h_in < h_ and 0 <= w_in < w_:
            y[n_out, h_out, w_out] = x[n, h_in, w_in]
    return y


def batch_to_space_nd(x, block_shape, crops):
    m = len(block_shape)
    groups = math.prod(block_shape)
    batch = x.shape[0] // groups
    spatial = [x.shape[1 + k] * block_shape[k] - crops[k][0] - crops[k][1] for k in range(m)]
    out_shape = (batch, *spatial, *x.shape[1 + m :])
    index = np.indices(out_shape)
    offsets, coarse = [], []
    for k in range(m):
        u = index[1 + k] + crops[k][0]
        coarse.append(u // block_shape[k])
        offsets.append(u % block_shape[k])
    group = np.ravel_multi_index(offsets, block_shape) if m else 0
    source = [group * batch + index[0], *coarse, *[index[1 + m + r] for r in range(x.ndim - 1 - m)]]
    return x[tuple(source)]


def gather_nd(params, indices, batch_dims=0):
    """One tuple at a time, as the seed describes it (negative values count from the end)."""
    indices = np.asarray(indices)
    b = batch_dims
    c = indices.shape[-1]
    lead = indices.shape[:-1]
    out = np.empty(lead + params.shape[b + c :], params.dtype)
    for position in np.ndindex(*lead):
        tuple_ = [int(v) for v in indices[position]]
        coordinates = list(position[:b]) + [
            v + params.shape[b + k] if v < 0 else v for k, v in enumerate(tuple_)
        ]
        out[position] = params[tuple(coordinates)]
    return out


def _nan_times_nan_keeps_src(product, f, per_element):
    """Where both factors are NaN, the product is src's NaN, quieted: the operator's rule.

    IEEE 754 lets a product of two NaNs carry either payload, and NumPy's own choice differs
    between its loops (an in-place and an out-of-place multiply of the same arrays can differ)
    and releases, so the reference states the rule instead of inheriting NumPy's."""
    both = np.isnan(f) & np.isnan(per_element)
    if both.any():
        quiet = (f.view(np.uint32) | np.uint32(0x00400000)).view(np.float32)
        product[both] = quiet[both]
    return product


@np.errstate(over="ignore", invalid="ignore")
def dequant(src, scale, dst, calc_count=None, policy=None, group_size=None, k_dim=1):
    """The plain expression (src.astype(f32) * scale).astype(dst), with the operator's documented masks."""
    src = np.atleast_2d(src)
    m, n = src.shape
    scale = np.asarray(scale)
    if scale.dtype == np.uint64:
        scale = (scale & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    scale = scale.astype(np.float32)
    f = src.astype(np.float32)
    if policy is None:
        cc = n if calc_count is None else calc_count
        per_column = np.broadcast_to(scale[:cc] if scale.ndim else scale, (cc,))
        full = np.concatenate([per_column, np.ones(n - cc, np.float32)])
        product = _nan_times_nan_keeps_src(f * full, f, np.broadcast_to(full, f.shape))
        product[:, cc:] = f[:, cc:]
    else:
        if policy == "per_token":
            per_element = np.broadcast_to(scale.reshape(m, 1), (m, n))
        elif k_dim == 0:
            per_element = scale[np.arange(m) // group_size, :]
        else:
            per_element = scale[:, np.arange(n) // group_size]
        product = _nan_times_nan_keeps_src(f * per_element, f, per_element)
        rows = (m * n if calc_count is None else calc_count) // max(n, 1)
        product[rows:] = f[rows:]
    return product.astype(dst)
