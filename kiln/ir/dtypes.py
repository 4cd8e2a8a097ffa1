"""Tensor element types of the graph IR.

Names follow ONNX's ``TensorProto.DataType`` spelled in lower case (``float32``,
``int64``, ...); each maps to a numpy dtype, and to the storage type a WebGPU
buffer holds (WGSL has no 64-bit integers, so ``int64`` is *stored* as ``i32``
after a checked narrowing).
"""

from __future__ import annotations

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
}

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
}


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
    return dtype.startswith("float")


def expr_dtype(dtype: str) -> str:
    """The tensor-expression dtype values of ``dtype`` are computed in: ``float32``, ``int32`` or ``bool``.

    Integers of every width compute in 32 bits (WGSL's ``i32``); int64 is narrowed (see
    :data:`kiln.package.format.STORAGE`); float16 computes in f32 and is rounded to half precision
    when stored. Raises KilnError for float64 (WGSL has no f64).
    """
    if dtype == "bool" or dtype == "float32":
        return dtype
    if dtype == "float16":  # computed in f32, rounded to half precision when stored
        return "float32"
    if dtype in ("int32", "int64", "int16", "uint16", "int8", "uint8"):
        return "int32"
    raise KilnError(f"{dtype} tensors are not supported by the webgpu target")


def storage_itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` in a WebGPU buffer (4 for every dtype kernels compute in)."""
    from kiln.package.format import STORAGE

    return NUMPY[STORAGE[dtype]].itemsize if dtype in STORAGE else itemsize(dtype)
