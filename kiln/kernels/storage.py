"""How tensors of each dtype sit in WebGPU buffers, as tensor expressions around a kernel.

WGSL storage buffers hold 32-bit scalars only (no ``bool``, 8-, 16- or 64-bit integers;
WGSL §6.2.9 and §4.4.3), so every tensor is stored 4 bytes an element
(:data:`kiln.package.format.STORAGE`): float32 as ``f32``; int32, int64 (narrowed), int16,
uint16, int8, uint8 and bool (0 or 1) as ``i32``. A kernel reads its buffers through
:func:`load_view` (``bool`` values become ``x != 0``) and writes its result through
:func:`store_view` (``bool`` becomes 0/1, 8- and 16-bit integers wrap around as ONNX's
fixed-width arithmetic does).
The runtimes convert model inputs and outputs on upload and readback.

With fp16 compute (``kiln compile --precision fp16``) float weights and activations are stored as
``f16`` instead (:meth:`kiln.passes.memory_plan.MemoryPlan.storage`), read through a cast to f32 and
written through a cast to f16; :func:`kiln.te.half.demote` then moves arithmetic to f16.
"""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, call, cast
from kiln.errors import KilnError
from kiln.ir import dtypes
from kiln.kernels.narrow import is_narrow_float, round_narrow
from kiln.package.format import STORAGE
from kiln.te.compute import Tensor, compute

_INT32 = (-(2**31), 2**31 - 1)


def buffer_dtype(dtype: str) -> str:
    """The expression dtype of a buffer holding ``dtype`` tensors (``float32`` or ``int32``).

    Raises:
        KilnError: ``dtype`` cannot live in a WebGPU buffer (float16, float64, ...).
    """
    if dtype not in STORAGE:
        raise KilnError(f"{dtype} tensors are not supported by the webgpu target")
    return STORAGE[dtype]


def load_view(buffer: Tensor, dtype: str) -> Tensor:
    """The values of ``dtype`` a kernel computes with, read from placeholder ``buffer`` (inlined away)."""
    want = dtypes.expr_dtype(dtype)
    if buffer.dtype == want:
        return buffer
    return compute(buffer.shape, lambda *i: cast(buffer[i], want), buffer.name)


#: narrow integer dtype -> (number of values, lowest value)
NARROW = {"uint8": (256, 0), "int8": (256, -128), "uint16": (65536, 0), "int16": (65536, -32768),
          "int4": (16, -8), "uint4": (16, 0), "int2": (4, -2), "uint2": (4, 0)}


def wrap(x, dtype: str):
    """``x`` (int32 expression) wrapped into a narrow integer ``dtype``'s range (e.g. uint8: mod 256)."""
    if dtype not in NARROW:
        return x
    n, lo = NARROW[dtype]
    return binop("%", binop("%", x - lo, n) + n, n) + lo


def round_half(x):
    """``x`` (f32) rounded to the nearest half-precision value, overflowing to infinity and keeping NaN.

    One ``round_f16`` call, which each target renders as a helper function (WGSL's ``pack2x16float``
    is indeterminate outside f16's finite range, so the helpers clamp first and make infinities at run
    time: Chromium's WGSL compiler, Tint, rejects infinite constant expressions). ``x`` appears once,
    so rounding every intermediate of a fused group (:func:`round_view`) does not duplicate its code.
    """
    return call("round_f16", x)


def round_view(t: Tensor, dtype: str) -> Tensor:
    """``t`` (a node's result of ``dtype``, computed in f32) with its values rounded to float16 when
    ``dtype`` is ``float16``, as if it had been stored and read back; other dtypes are returned as is.

    A fused group rounds every float16 intermediate this way (:func:`kiln.compiler.group_expr`), so a
    float16 model's results do not depend on which nodes fusion keeps in one kernel: each node's result
    is a float16 value, as ONNX (and its reference evaluator, which computes op by op in numpy float16)
    defines it.
    """
    if dtype != "float16" or t.dtype != "float32":
        return t
    return compute(t.shape, lambda *i: round_half(t[i]), t.name)


def placeholder_dtype(dtype: str, stored: str | None = None) -> str:
    """The expression dtype of a placeholder for a buffer holding ``dtype`` tensors as ``stored``
    elements (``float16`` with fp16 compute, see :mod:`kiln.te.half`; by default :func:`buffer_dtype`)."""
    return "float16" if stored == "float16" else buffer_dtype(dtype)


def store_view(t: Tensor, dtype: str, stored: str | None = None) -> Tensor:
    """``t`` (a kernel's result of ``dtype``) as the values its buffer stores (float16: rounded to half
    precision, so values match a device computing in f16 at every kernel boundary). With ``stored``
    ``float16`` (fp16 compute) the result is cast to ``f16``; :func:`kiln.te.half.demote` then decides
    where the arithmetic happens."""
    if stored == "float16":
        return compute(t.shape, lambda *i: cast(t[i], "float16"), t.name)
    store = buffer_dtype(dtype)
    if dtype == "float16":
        return compute(t.shape, lambda *i: round_half(cast(t[i], store)), t.name)
    if is_narrow_float(dtype):  # bfloat16, float8, float4: rounded to the format (kiln.kernels.narrow); e8m0
        # truncates, which leaves a Cast's already rounded result as it is (rounding up again would not)
        return compute(t.shape, lambda *i: round_narrow(cast(t[i], store), dtype, round_mode="down"), t.name)
    if t.dtype == store and dtype not in NARROW:
        return t
    return compute(t.shape, lambda *i: wrap(cast(t[i], store), dtype), t.name)


def scalar(value, dtype: str, what: str) -> float | int | bool:
    """A scalar constant baked into a kernel as a literal of ``dtype``'s expression type.

    Raises:
        KilnError: an integer constant outside int32's range (naming ``what``).
    """
    want = dtypes.expr_dtype(dtype)
    if isinstance(value, Expr):  # a run-time dim (size expression), read from the dims uniform by the kernel
        return value if want == "int32" else cast(value, want)
    if want == "bool":
        return bool(value)
    if want == "int32":
        v = int(value)
        if not _INT32[0] <= v <= _INT32[1]:
            raise KilnError(f"{what}: {dtype} constant {v} does not fit in int32, which the webgpu target computes "
                            "integers in")
        return v
    return float(value)
