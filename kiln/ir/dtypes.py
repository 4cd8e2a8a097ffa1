"""Tensor element types of the graph IR.

Names follow ONNX's ``TensorProto.DataType`` spelled in lower case (``float32``,
``int64``, ...); each maps to a numpy dtype, and to the storage type a WebGPU
buffer holds (WGSL has no 64-bit integers, so ``int64`` is *stored* as ``i32``
after a checked narrowing).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from kiln.errors import KilnError

#: dtype name -> numpy dtype
NUMPY: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "uint16": np.dtype(np.uint16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float4e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
    "float8e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "int4": np.dtype(ml_dtypes.int4),
    "uint4": np.dtype(ml_dtypes.uint4),
    "int2": np.dtype(ml_dtypes.int2),
    "uint2": np.dtype(ml_dtypes.uint2),
}

#: floating-point dtypes narrower than float16 (numpy dtypes from ``ml_dtypes``): computed in f32, their values
#: rounded to the format (round half to even) at kernel boundaries and by Cast (kiln.kernels.narrow)
NARROW_FLOATS = ("bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1",
                 "float8e8m0")
#: integer dtypes narrower than 8 bits: computed in i32, wrapped into their range when stored
NARROW_INTS = ("int4", "uint4", "int2", "uint2")

_ONNX = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    TensorProto.BFLOAT16: "bfloat16",
}
# element types of newer onnx releases (float8: 1.14, float4e2m1: 1.18, float8e8m0 and 2-bit integers: 1.19+)
_ONNX.update({getattr(TensorProto, code): name for code, name in (
    ("FLOAT8E4M3FN", "float8e4m3fn"), ("FLOAT8E4M3FNUZ", "float8e4m3fnuz"), ("FLOAT8E5M2", "float8e5m2"),
    ("FLOAT8E5M2FNUZ", "float8e5m2fnuz"), ("FLOAT4E2M1", "float4e2m1"), ("FLOAT8E8M0", "float8e8m0"),
    ("INT4", "int4"), ("UINT4", "uint4"), ("INT2", "int2"), ("UINT2", "uint2")) if hasattr(TensorProto, code)})


def from_onnx(elem_type: int) -> str:
    """Map an ONNX ``TensorProto.DataType`` code to a Kiln dtype name.

    Raises:
        KilnError: for element types Kiln does not support (strings, complex, bfloat16, ...).
    """
    try:
        return _ONNX[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise KilnError(f"unsupported tensor element type {name}") from None


def from_numpy(dt: np.dtype | type) -> str:
    """Map a numpy dtype to a Kiln dtype name (raises KilnError if unsupported)."""
    dt = np.dtype(dt)
    for name, npdt in NUMPY.items():
        if npdt == dt:
            return name
    raise KilnError(f"unsupported numpy dtype {dt}")


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` in host memory."""
    return NUMPY[dtype].itemsize


def is_float(dtype: str) -> bool:
    """True for floating-point dtypes."""
    return dtype.startswith("float") or dtype == "bfloat16"


def expr_dtype(dtype: str) -> str:
    """The tensor-expression dtype values of ``dtype`` are computed in: ``float32``, ``int32`` or ``bool``.

    Integers of every width compute in 32 bits (WGSL's ``i32``); int64 is narrowed (see
    :data:`kiln.package.format.STORAGE`); float16 computes in f32 and is rounded to half precision
    when stored. Raises KilnError for float64 (WGSL has no f64).
    """
    if dtype == "bool" or dtype == "float32":
        return dtype
    if dtype == "float16" or dtype in NARROW_FLOATS:  # computed in f32, rounded to the format when stored
        return "float32"
    if dtype in ("int32", "int64", "int16", "uint16", "int8", "uint8", "uint32", "uint64") or dtype in NARROW_INTS:
        return "int32"
    raise KilnError(f"{dtype} tensors are not supported by the webgpu target")
