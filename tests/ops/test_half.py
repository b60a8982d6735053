"""The compiled float32 -> float16 conversion equals NumPy's for every class of bit pattern.

(All 2**32 patterns were compared once by hand, see bench/RESULTS.md; here every exponent
with edge-case and random mantissas, both signs.)
"""

import numpy as np

from ops._half import float32_to_float16


def test_matches_numpy_bit_for_bit():
    rng = np.random.default_rng(0)
    exponents = np.arange(256, dtype=np.uint32) << 23
    edges = np.array([0, 1, 2, 0x7FF, 0x800, 0x801, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                      0x3000, 0x400000, 0x400001, 0x7FE000, 0x7FEFFF, 0x7FF000, 0x7FFFFF], np.uint32)
    mantissas = np.concatenate([edges, rng.integers(0, 1 << 23, 2000, dtype=np.uint32)])
    bits = (exponents[:, None] | mantissas[None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)]).reshape(-1, 16)
    values = bits.view(np.float32)
    out = np.empty(values.shape, np.float16)
    float32_to_float16(values, out)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    assert out.view(np.uint16).tolist() == expected.view(np.uint16).tolist()


def test_strided_views():
    values = np.linspace(-70000, 70000, 60, dtype=np.float32).reshape(6, 10)
    out = np.zeros((6, 20), np.float16)
    float32_to_float16(values[:, ::-1], out[:, ::2])
    with np.errstate(over="ignore"):
        assert out[:, ::2].tobytes() == values[:, ::-1].astype(np.float16).tobytes()
    assert (out[:, 1::2] == 0).all()
