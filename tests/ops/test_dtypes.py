"""The supported element types, and bfloat16 without ml_dtypes imported up front.

ml_dtypes is imported only when bfloat16 is asked for (its import takes most of a second, paid
by every command-line run, service process and worker). Every door that can name bfloat16 by a
string must then still find it: each case below runs in a fresh interpreter, where nothing
has imported ml_dtypes yet, and must give what it gives in this process, where it is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ops import dtypes

# Each snippet sets ``out`` to plain JSON values.
CASES = {
    "ascend_dequant to a bfloat16 named by a string": """
        import ops
        y = ops.ascend_dequant(np.arange(-8, 8, dtype=np.int32).reshape(2, 8), np.float32(0.37), dst_dtype="bfloat16")
        out = [dtypes.name(y.dtype), y.view(np.uint16).tolist()]
    """,
    "a bfloat16 param by name": """
        refused = False
        try:
            dtypes.named(">bfloat16")  # NumPy reads no other spelling of it, nor does this
        except TypeError:
            refused = True
        out = [dtypes.name(dtypes.check_supported("x", "bfloat16")), dtypes.name(dtypes.named("bfloat16")), refused]
    """,
    "NPY with X-Array-Dtype bfloat16": """
        import io
        from service.storage import npy
        buffer = io.BytesIO()
        np.save(buffer, np.array([0x3F80, 0xC0A0], "<u2"))
        y = npy.decode(buffer.getvalue(), max_bytes=1 << 20, declared_dtype="bfloat16")
        out = [dtypes.name(y.dtype), y.astype(np.float32).tolist()]
    """,
    "NPY whose descr is bfloat16": """
        import io
        from service.storage import npy
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, {"descr": "bfloat16", "fortran_order": False, "shape": (2,)})
        buffer.write(np.array([0x3F80, 0x4040], "<u2").tobytes())
        y = npy.decode(buffer.getvalue(), max_bytes=1 << 20)
        out = [dtypes.name(y.dtype), y.astype(np.float32).tolist()]
    """,
    "a stored bfloat16 Zarr variable": """
        import xarray as xr
        from service.storage import raw_dtypes
        y = raw_dtypes.from_stored(xr.DataArray(np.array([0x3F80, 0x4100], "<u2"), dims=["x"], attrs={"ops_dtype": "bfloat16"}))
        out = [dtypes.name(y.dtype), y.values.astype(np.float32).tolist()]
    """,
}
PRELUDE = "import numpy as np\nfrom ops import dtypes\n"


def _in_this_process(snippet: str):
    scope: dict = {}
    exec(PRELUDE + textwrap.dedent(snippet), scope)
    return scope["out"]


def _in_a_fresh_process(snippet: str):
    script = (PRELUDE + 'import sys\nassert "ml_dtypes" not in sys.modules, "imported before it was asked for"\n'
              + textwrap.dedent(snippet) + "\nimport json\nprint(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("snippet", CASES.values(), ids=CASES.keys())
def test_bfloat16_by_name_without_ml_dtypes_imported_up_front(snippet):
    expected = _in_this_process(snippet)
    assert expected[0] == "bfloat16" and expected[1]
    assert _in_a_fresh_process(snippet) == expected


@pytest.mark.smoke
def test_the_operators_the_command_line_and_the_service_start_without_ml_dtypes():
    script = ("import sys, ops, service.cli.run, service.api.app\n"
              "x = ops.depth_to_space(__import__('numpy').zeros((1, 2, 2, 4), 'float32'), 2)\n"
              "print('ml_dtypes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_supported_types_in_the_order_messages_list_them():
    assert tuple(dtypes.name(t) for t in dtypes.SUPPORTED) == dtypes.SUPPORTED_NAMES
    assert dtypes.bfloat16 == np.dtype(__import__("ml_dtypes").bfloat16)
    for t in dtypes.SUPPORTED:
        assert dtypes.check_supported("x", t) == t
        assert dtypes.check_supported("x", t.newbyteorder(">")) == t.newbyteorder(">")
        assert dtypes.is_bfloat16(t) == (t == dtypes.bfloat16)
    with pytest.raises(dtypes.InvalidArgument, match="x dtype must be one of bool, int8, .*, complex32; got float8"):
        dtypes.check_supported("x", np.dtype(__import__("ml_dtypes").float8_e4m3fn))
