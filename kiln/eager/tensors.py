"""Eager tensors on WebGPU: creation, dtype rules and elementwise ops with their gradients.

A :class:`Tensor` is a row-major ``shape`` of ``dtype`` (``float32``, ``int32`` or ``bool``)
held in one device buffer; ops run a kernel at once (:mod:`kiln.eager.kernels`) and keep the
result on the device, and only :meth:`Tensor.numpy` reads it back. Buffers are immutable:
``reshape`` shares its input's buffer, and in-place updates (:meth:`Tensor.copy_`, optimizer
steps) give the tensor a new buffer.

Dtype rules (a subset of numpy's): arithmetic promotes ``bool < int32 < float32`` (a Python
float makes the result float32, a Python int keeps an int32 tensor int32), ``/`` always gives
float32, comparisons give bool. Reductions, layout ops and matmul live in :mod:`kiln.eager.ops`
and are bound to :class:`Tensor` as methods there.
"""

from __future__ import annotations

import numpy as np

from kiln.arith.expr import binop, cast, const, select
from kiln.eager import autograd, kernels
from kiln.eager.device import runtime
from kiln.errors import ShapeError
from kiln.kernels.elementwise import binary_expr, unary_expr

DTYPES = ("float32", "int32", "bool")
_RANK = {"bool": 0, "int32": 1, "float32": 2}
_INT32 = np.iinfo(np.int32)
_rng = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seed the generator of :func:`randn`, :func:`rand` and dropout masks."""
    global _rng
    _rng = np.random.default_rng(seed)


def _np_dtype_to_eager(dt: np.dtype) -> str:
    dt = np.dtype(dt)
    if dt == np.bool_:
        return "bool"
    if np.issubdtype(dt, np.integer):
        return "int32"
    if np.issubdtype(dt, np.floating):
        return "float32"
    raise ShapeError(f"kiln.tensor: cannot hold {dt} data (float32, int32 and bool are supported)")


class Tensor:
    """A tensor on the eager runtime's device.

    Attributes:
        shape: tuple of dims.
        dtype: ``float32``, ``int32`` or ``bool``.
        requires_grad: whether ops on it are recorded for :meth:`backward`.
        grad: the accumulated gradient (a Tensor of the same shape) after :meth:`backward`, or None.
    """

    __array_priority__ = 1000  # numpy scalars on the left defer to Tensor's reflected operators
    __slots__ = ("__weakref__", "_node", "_version", "buf", "dtype", "grad", "requires_grad", "shape")

    def __init__(self, buf, shape, dtype: str, requires_grad: bool = False):
        self.buf = buf
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self._node = None
        self._version = 0  # bumped by in-place updates; backward refuses graphs whose inputs changed since

    # ------------------------------------------------------------------ construction and readback
    @classmethod
    def from_numpy(cls, a, dtype: str | None = None, requires_grad: bool = False) -> Tensor:
        """Upload array-like ``a`` (converted to ``dtype``; default from its numpy dtype, float64 -> float32).

        Raises:
            ShapeError: an unsupported dtype, or integers outside int32's range.
        """
        a = np.asarray(a)
        dtype = dtype or _np_dtype_to_eager(a.dtype)
        if dtype not in DTYPES:
            raise ShapeError(f"unknown dtype {dtype!r}; eager tensors are {', '.join(DTYPES)}")
        if dtype == "int32" and a.size and np.issubdtype(a.dtype, np.integer) and (a.min() < _INT32.min or
                                                                                  a.max() > _INT32.max):
            raise ShapeError("kiln.tensor: integer values outside int32's range")
        host = a.astype(kernels.BUFFER_NP[dtype])
        return cls(runtime().upload(host), a.shape, dtype, requires_grad)

    def numpy(self) -> np.ndarray:
        """The values as a new numpy array (waits for every pending kernel; the one device-to-host copy)."""
        raw = runtime().read(self.buf, self.size * 4)
        a = np.frombuffer(raw, dtype=kernels.BUFFER_NP[self.dtype], count=self.size).reshape(self.shape)
        return a.astype(bool) if self.dtype == "bool" else a.copy()

    def item(self) -> float | int | bool:
        """The value of a one-element tensor as a Python number.

        Raises:
            ShapeError: more than one element.
        """
        if self.size != 1:
            raise ShapeError(f"item(): tensor of shape {self.shape} has {self.size} elements, not 1")
        return self.numpy().reshape(()).item()

    def tolist(self):
        """The values as nested Python lists."""
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a.astype(dtype) if dtype is not None else a

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def numel(self) -> int:
        """Number of elements (PyTorch's name)."""
        return self.size

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    def dim(self) -> int:
        """Number of dims (PyTorch's name)."""
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"kiln.tensor({np.array2string(self.numpy(), precision=4, separator=', ')}, dtype={self.dtype}{grad})"

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    __hash__ = object.__hash__  # == is elementwise, so tensors hash by identity (as in PyTorch)

    # ------------------------------------------------------------------ autograd
    @property
    def is_leaf(self) -> bool:
        """True for tensors no recorded op made (created ones, parameters, detached results)."""
        return self._node is None

    @property
    def grad_fn(self):
        """The recorded op that made this tensor (None for leaves)."""
        return self._node

    def requires_grad_(self, flag: bool = True) -> Tensor:
        """Set ``requires_grad`` in place; returns self."""
        if flag and self.dtype != "float32":
            raise ShapeError(f"only float32 tensors can require gradients, not {self.dtype}")
        self.requires_grad = flag
        return self

    def backward(self, grad=None, create_graph: bool = False) -> None:
        """Accumulate gradients of this tensor into ``.grad`` of the leaves; see :func:`kiln.eager.autograd.backward`."""
        autograd.backward(self, grad, create_graph)

    def detach(self) -> Tensor:
        """The same values (the same buffer) with no graph."""
        return Tensor(self.buf, self.shape, self.dtype)

    def copy_(self, src) -> Tensor:
        """Replace this tensor's values by ``src``'s (broadcast and cast to this tensor's shape and dtype), in place.

        Buffers are immutable, so this points the tensor at a new buffer. A graph recorded earlier
        that used this tensor can no longer be differentiated: its ``backward`` raises (PyTorch's
        version-counter check), so update parameters between a backward pass and the next forward
        pass, as optimizers do.
        """
        src = as_tensor(src)
        if src.dtype != self.dtype:
            src = src.to(self.dtype)
        if src.shape != self.shape:
            src = src.expand(self.shape)  # (shape methods are bound by kiln.eager.ops)
        self.buf = src.buf
        self._version += 1
        return self

    def zero_(self) -> Tensor:
        """Set every element to 0, in place."""
        return self.copy_(zeros(self.shape, self.dtype))

    # ------------------------------------------------------------------ dtypes
    def to(self, dtype: str) -> Tensor:
        """A copy converted to ``dtype`` (float -> int truncates toward zero; nonzero -> True)."""
        if dtype not in DTYPES:
            raise ShapeError(f"unknown dtype {dtype!r}; eager tensors are {', '.join(DTYPES)}")
        if dtype == self.dtype:
            return self
        if dtype == "bool":
            fn = lambda x: binop("!=", x, _zero(x.dtype))
        else:
            fn = lambda x: cast(x, dtype)
        out = _run(f"Cast_{dtype}", fn, [self])
        return autograd.attach(out, "Cast", (self,), lambda g: (g,)) if dtype == "float32" else out

    def float(self) -> Tensor:
        """``to("float32")``."""
        return self.to("float32")

    def int(self) -> Tensor:
        """``to("int32")``."""
        return self.to("int32")

    def bool(self) -> Tensor:
        """``to("bool")``."""
        return self.to("bool")

    # ------------------------------------------------------------------ operators
    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __truediv__(self, o): return div(self, o)
    def __rtruediv__(self, o): return div(o, self)
    def __pow__(self, o): return pow(self, o)
    def __rpow__(self, o): return pow(o, self)
    def __neg__(self): return neg(self)
    def __abs__(self): return abs(self)
    def __lt__(self, o): return _compare("Less", self, o)
    def __le__(self, o): return _compare("LessOrEqual", self, o)
    def __gt__(self, o): return _compare("Greater", self, o)
    def __ge__(self, o): return _compare("GreaterOrEqual", self, o)
    def __eq__(self, o): return _compare("Equal", self, o)
    def __ne__(self, o): return _compare("NotEqual", self, o)
    def __and__(self, o): return _logical("And", self, o)
    def __or__(self, o): return _logical("Or", self, o)
    def __xor__(self, o): return _logical("Xor", self, o)
    def __invert__(self): return logical_not(self)

    def exp(self): return exp(self)
    def log(self): return log(self)
    def sqrt(self): return sqrt(self)
    def tanh(self): return tanh(self)
    def sigmoid(self): return sigmoid(self)
    def relu(self): return relu(self)
    def abs(self): return abs(self)
    def neg(self): return neg(self)
    def sin(self): return sin(self)
    def cos(self): return cos(self)
    def square(self): return mul(self, self)
    def reciprocal(self): return reciprocal(self)
    def clamp(self, min=None, max=None): return clamp(self, min, max)
    def maximum(self, o): return maximum(self, o)
    def minimum(self, o): return minimum(self, o)


def _zero(dtype: str):
    return const(0, dtype)


def as_tensor(x, dtype: str | None = None) -> Tensor:
    """``x`` if it is a Tensor, else ``x`` uploaded (see :meth:`Tensor.from_numpy`)."""
    return x if isinstance(x, Tensor) else Tensor.from_numpy(x, dtype)


def tensor(data, dtype: str | None = None, requires_grad: bool = False) -> Tensor:
    """A new tensor from array-like ``data`` (numpy arrays, nested lists, numbers, or a Tensor, which is copied).

    Args:
        dtype: ``float32``, ``int32`` or ``bool`` (default: from the data; float64 and Python
            floats become float32, integers int32).
        requires_grad: record ops on it for :meth:`Tensor.backward` (float32 only).

    Raises:
        ShapeError: an unsupported dtype or out-of-range integers.
    """
    if isinstance(data, Tensor):
        data = data.numpy()
    t = Tensor.from_numpy(data, dtype)
    return t.requires_grad_(True) if requires_grad else t


def zeros(shape, dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """A tensor of zeros of ``shape`` (int or tuple)."""
    return full(shape, 0, dtype, requires_grad)


def ones(shape, dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """A tensor of ones of ``shape``."""
    return full(shape, 1, dtype, requires_grad)


def full(shape, value, dtype: str = "float32", requires_grad: bool = False) -> Tensor:
    """A tensor of ``shape`` filled with ``value``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return tensor(np.full(shape, value, kernels.BUFFER_NP[dtype]), dtype, requires_grad)


def zeros_like(x: Tensor) -> Tensor:
    """Zeros of ``x``'s shape and dtype."""
    return zeros(x.shape, x.dtype)


def ones_like(x: Tensor) -> Tensor:
    """Ones of ``x``'s shape and dtype."""
    return ones(x.shape, x.dtype)


def randn(*shape, requires_grad: bool = False) -> Tensor:
    """Standard normal float32 samples of ``shape`` (drawn on the host by numpy, see :func:`manual_seed`)."""
    shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
    return tensor(_rng.standard_normal(shape).astype(np.float32), requires_grad=requires_grad)


def rand(*shape, requires_grad: bool = False) -> Tensor:
    """Uniform float32 samples in [0, 1) of ``shape``."""
    shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
    return tensor(_rng.random(shape).astype(np.float32), requires_grad=requires_grad)


def arange(start, stop=None, step=1, dtype: str | None = None) -> Tensor:
    """``numpy.arange``: int32 for integer arguments, float32 otherwise."""
    if stop is None:
        start, stop = 0, start
    a = np.arange(start, stop, step)
    return tensor(a, dtype)


# ---------------------------------------------------------------------- running elementwise kernels
def _run(name: str, fn, operands: list, dtypes: list[str] | None = None) -> Tensor:
    """Run elementwise ``fn`` (operand expressions -> expression) over tensors and scalars; no graph."""
    if dtypes is None:
        dtypes = [o.dtype for o in operands]
    buf, shape, dtype = kernels.elementwise(name, fn, operands, dtypes)
    return Tensor(buf, shape, dtype)


def _scalar_dtype(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, (int, np.integer)):
        return "int32"
    if isinstance(x, (float, np.floating)):
        return "float32"
    raise TypeError(f"unsupported operand {type(x).__name__}")


def _promote(operands: list, at_least: str = "bool") -> tuple[list, list[str]]:
    """Operands converted to one dtype (numpy-like ``bool < int32 < float32``; Python ints do not
    promote int tensors, Python floats make float32); returns ``(operands, dtypes)``."""
    kinds = [o.dtype if isinstance(o, Tensor) else _scalar_dtype(o) for o in operands]
    want = max([*kinds, at_least], key=_RANK.get)
    out = []
    for o in operands:
        if isinstance(o, Tensor):
            out.append(o.to(want) if o.dtype != want else o)
        elif not isinstance(o, Tensor) and not isinstance(o, (bool, int, float, np.number)):
            out.append(Tensor.from_numpy(o, want))
        else:
            out.append(float(o) if want == "float32" else int(o) if want == "int32" else bool(o))
    return out, [want] * len(out)


def unbroadcast(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``g`` summed over the dims along which an operand of ``shape`` was broadcast (the gradient rule of broadcasting)."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + k for k, d in enumerate(shape) if d == 1 and g.shape[lead + k] != 1)
    if axes:
        g = g.sum(axes, keepdims=True)  # (reduction and shape methods are bound by kiln.eager.ops)
    return g.reshape(shape)


def _binary(op: str, a, b, backward=None, at_least: str = "bool") -> Tensor:
    """Binary op ``op`` (an ONNX name of :func:`kiln.kernels.elementwise.binary_expr`) with promotion and a graph."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = Tensor.from_numpy(a)
    (a2, b2), dtypes = _promote([a, b], at_least)
    out = _run(op, lambda x, y: binary_expr(op, x, y), [a2, b2], dtypes)
    if backward is None:
        return out
    ins = tuple(x for x in (a, b) if isinstance(x, Tensor))

    def grads(g):
        ga, gb = backward(g, a2, b2, out)
        res = []
        for x, gx in ((a, ga), (b, gb)):
            if isinstance(x, Tensor):
                res.append(None if gx is None else unbroadcast(gx, x.shape))
        return tuple(res)

    return autograd.attach(out, op, ins, grads)


def add(a, b) -> Tensor:
    """``a + b`` with broadcasting."""
    return _binary("Add", a, b, lambda g, a, b, out: (g, g))


def sub(a, b) -> Tensor:
    """``a - b`` with broadcasting."""
    return _binary("Sub", a, b, lambda g, a, b, out: (g, neg(g)))


def mul(a, b) -> Tensor:
    """``a * b`` with broadcasting."""
    return _binary("Mul", a, b, lambda g, a, b, out: (g * b, g * a))


def div(a, b) -> Tensor:
    """``a / b`` with broadcasting (true division: always float32)."""
    return _binary("Div", a, b, lambda g, a, b, out: (g / b, neg(g) * out / b), at_least="float32")


def pow(a, b) -> Tensor:
    """``a ** b`` (numpy's results for negative bases and integral exponents; float32)."""
    def back(g, a, b, out):
        if isinstance(b, Tensor):
            return g * b * (a ** (b - 1.0)), g * out * log(a)
        if b == 1.0:
            return g, None
        if b == 2.0:
            return g * (2.0 * a), None
        return g * b * (a ** (b - 1.0)), None

    return _binary("Pow", a, b, back, at_least="float32")


def maximum(a, b) -> Tensor:
    """Elementwise maximum (ties share the gradient equally, as in PyTorch)."""
    return _binary("Max", a, b, lambda g, a, b, out: (g * _tie_weight(a, b), g * _tie_weight(b, a)))


def minimum(a, b) -> Tensor:
    """Elementwise minimum (ties share the gradient equally)."""
    return _binary("Min", a, b, lambda g, a, b, out: (g * _tie_weight(b, a), g * _tie_weight(a, b)))


def _tie_weight(a, b) -> Tensor:
    """1 where ``a > b``, 0.5 where equal, 0 where less: the share of max(a, b)'s gradient going to ``a``."""
    fn = lambda x, y: select(binop(">", x, y), 1.0, select(binop("==", x, y), 0.5, 0.0))
    (a, b), dts = _promote([a, b], "float32")
    return _run("MaxTieWeight", fn, [a, b], dts)


def _compare(op: str, a, b) -> Tensor:
    """A comparison (bool result, no gradient)."""
    if op == "NotEqual":
        (a2, b2), dts = _promote([a, b])
        return _run("NotEqual", lambda x, y: binop("!=", x, y), [a2, b2], dts)
    return _binary(op, a, b)


def _logical(op: str, a, b) -> Tensor:
    """``&``, ``|``, ``^`` of bool tensors (bitwise on int32 tensors)."""
    dts = {a.dtype if isinstance(a, Tensor) else _scalar_dtype(a), b.dtype if isinstance(b, Tensor)
           else _scalar_dtype(b)}
    if dts == {"bool"}:
        return _binary(op, a, b)
    if "float32" in dts:
        raise TypeError(f"{op} needs bool or int32 operands, not float32")
    return _binary({"And": "BitwiseAnd", "Or": "BitwiseOr", "Xor": "BitwiseXor"}[op], a, b)


def logical_not(x: Tensor) -> Tensor:
    """``~x`` for bool tensors."""
    if x.dtype != "bool":
        raise TypeError(f"~ needs a bool tensor, not {x.dtype}")
    return _run("Not", lambda v: binop("==", v, False), [x])


def where(cond, x, y) -> Tensor:
    """``x`` where ``cond`` else ``y`` (all broadcast; ONNX Where); gradients flow to the chosen side."""
    cond = as_tensor(cond, "bool") if not isinstance(cond, Tensor) else cond
    if cond.dtype != "bool":
        cond = cond.to("bool")
    (x2, y2), dts = _promote([x, y])
    out = _run("Where", lambda c, p, q: select(c, p, q), [cond, x2, y2], ["bool", *dts])
    ins = tuple(v for v in (x, y) if isinstance(v, Tensor))

    def grads(g):
        res = []
        if isinstance(x, Tensor):
            res.append(unbroadcast(where(cond, g, 0.0), x.shape))
        if isinstance(y, Tensor):
            res.append(unbroadcast(where(cond, 0.0, g), y.shape))
        return tuple(res)

    return autograd.attach(out, "Where", ins, grads)


# ---------------------------------------------------------------------- unary ops
def _unary(op: str, x: Tensor, backward, attrs: dict | None = None, name: str | None = None) -> Tensor:
    """Unary op ``op`` (an ONNX name of :func:`kiln.kernels.elementwise.unary_expr`) on float32 ``x``."""
    x = as_tensor(x)
    if x.dtype != "float32" and op not in ("Neg", "Abs", "Relu", "Sign"):
        x = x.to("float32")
    attrs = attrs or {}
    out = _run(name or op, lambda v: unary_expr(op, v, attrs), [x])
    if backward is None:
        return out
    return autograd.attach(out, op, (x,), lambda g: (backward(g, x, out),))


def neg(x) -> Tensor:
    """``-x``."""
    return _unary("Neg", x, lambda g, x, out: neg(g))


def exp(x) -> Tensor:
    """e ** x."""
    return _unary("Exp", x, lambda g, x, out: g * out)


def log(x) -> Tensor:
    """Natural logarithm."""
    return _unary("Log", x, lambda g, x, out: g / x)


def sqrt(x) -> Tensor:
    """Square root."""
    return _unary("Sqrt", x, lambda g, x, out: g * 0.5 / out)


def tanh(x) -> Tensor:
    """Hyperbolic tangent (the compiler's expression: a series near 0, clamped beyond 15)."""
    return _unary("Tanh", x, lambda g, x, out: g * (1.0 - out * out))


def sigmoid(x) -> Tensor:
    """1 / (1 + e ** -x)."""
    return _unary("Sigmoid", x, lambda g, x, out: g * out * (1.0 - out))


def relu(x) -> Tensor:
    """max(x, 0); the gradient at 0 is 0 (as in PyTorch)."""
    return _unary("Relu", x, lambda g, x, out: where(x > 0.0, g, 0.0))


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """x for x >= 0, ``negative_slope * x`` otherwise."""
    a = float(negative_slope)
    return _unary("LeakyRelu", x, lambda g, x, out: where(x >= 0.0, g, g * a), {"alpha": a}, f"LeakyRelu_{a!r}")


def abs(x) -> Tensor:
    """|x|; the gradient at 0 is 0."""
    return _unary("Abs", x, lambda g, x, out: g * sign(x))


def sign(x) -> Tensor:
    """-1, 0 or 1 (no gradient)."""
    return _unary("Sign", x, None)


def sin(x) -> Tensor:
    """Sine (radians)."""
    return _unary("Sin", x, lambda g, x, out: g * cos(x))


def cos(x) -> Tensor:
    """Cosine (radians)."""
    return _unary("Cos", x, lambda g, x, out: neg(g * sin(x)))


def reciprocal(x) -> Tensor:
    """1 / x."""
    return _unary("Reciprocal", x, lambda g, x, out: neg(g * out * out))


def floor(x) -> Tensor:
    """Round down (zero gradient almost everywhere: none recorded)."""
    return _unary("Floor", x, None)


def ceil(x) -> Tensor:
    """Round up (no gradient)."""
    return _unary("Ceil", x, None)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805  # Klambauer et al. 2017 (PyTorch's values)


def erf(x) -> Tensor:
    """The error function (the compiler's Abramowitz-Stegun 7.1.26 expression, |error| <= 1.5e-7)."""
    return _unary("Erf", x, lambda g, x, out: g * 1.1283791670955126 * exp(neg(x * x)))  # 2 / sqrt(pi)


def gelu(x) -> Tensor:
    """x * Phi(x) with the exact normal CDF (``F.gelu``'s default); gradient Phi(x) + x phi(x)."""
    return _unary("Gelu", x, lambda g, x, out: g * (0.5 + 0.5 * erf(x * 0.7071067811865476)
                                                    + x * (0.3989422804014327 * exp(x * x * -0.5))))


def softplus(x) -> Tensor:
    """log(1 + e ** x), computed without overflow; gradient sigmoid(x)."""
    return _unary("Softplus", x, lambda g, x, out: g * sigmoid(x))


def elu(x, alpha: float = 1.0) -> Tensor:
    """x for x > 0, alpha (e ** x - 1) otherwise."""
    a = float(alpha)
    return _unary("Elu", x, lambda g, x, out: where(x > 0.0, g, g * (out + a)), {"alpha": a}, f"Elu_{a!r}")


def selu(x) -> Tensor:
    """scale * elu(x, alpha) with the self-normalising constants."""
    attrs = {"alpha": _SELU_ALPHA, "gamma": _SELU_SCALE}
    return _unary("Selu", x, lambda g, x, out: where(x > 0.0, g * _SELU_SCALE, g * (out + _SELU_SCALE * _SELU_ALPHA)),
                  attrs)


def silu(x) -> Tensor:
    """x * sigmoid(x) (swish), differentiated through its parts."""
    return x * sigmoid(x)


def mish(x) -> Tensor:
    """x * tanh(softplus(x)), differentiated through its parts."""
    return x * tanh(softplus(x))


def softsign(x) -> Tensor:
    """x / (1 + |x|)."""
    return _unary("Softsign", x, lambda g, x, out: g / ((1.0 + abs(x)) ** 2.0))


def hardsigmoid(x) -> Tensor:
    """clamp(x / 6 + 1/2, 0, 1) (``F.hardsigmoid``); gradient 1/6 inside (-3, 3)."""
    return _unary("HardSigmoid", x, lambda g, x, out: where((x > -3.0) & (x < 3.0), g * (1 / 6), 0.0),
                  {"alpha": 1 / 6, "beta": 0.5})


def tan(x) -> Tensor:
    """Tangent (radians)."""
    return _unary("Tan", x, lambda g, x, out: g * (1.0 + out * out))


def atan(x) -> Tensor:
    """Arctangent."""
    return _unary("Atan", x, lambda g, x, out: g / (1.0 + x * x))


def sinh(x) -> Tensor:
    """Hyperbolic sine."""
    return _unary("Sinh", x, lambda g, x, out: g * cosh(x))


def cosh(x) -> Tensor:
    """Hyperbolic cosine."""
    return _unary("Cosh", x, lambda g, x, out: g * sinh(x))


def clamp(x, min: float | None = None, max: float | None = None) -> Tensor:
    """``x`` limited to ``[min, max]`` (ONNX Clip); the gradient passes where ``min <= x <= max``."""
    attrs = {k: float(v) for k, v in (("min", min), ("max", max)) if v is not None}

    def back(g, x, out):
        keep = None
        if min is not None:
            keep = x >= float(min)
        if max is not None:
            hi = x <= float(max)
            keep = hi if keep is None else keep & hi
        return where(keep, g, 0.0)

    return _unary("Clip", x, back, attrs, f"Clip_{min!r}_{max!r}")


__all__ = [
    "Tensor",
    "abs",
    "add",
    "arange",
    "as_tensor",
    "atan",
    "ceil",
    "clamp",
    "cos",
    "cosh",
    "div",
    "elu",
    "erf",
    "exp",
    "floor",
    "full",
    "gelu",
    "hardsigmoid",
    "leaky_relu",
    "log",
    "logical_not",
    "manual_seed",
    "maximum",
    "minimum",
    "mish",
    "mul",
    "neg",
    "ones",
    "ones_like",
    "pow",
    "rand",
    "randn",
    "reciprocal",
    "relu",
    "selu",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "sinh",
    "softplus",
    "softsign",
    "sqrt",
    "sub",
    "tan",
    "tanh",
    "tensor",
    "unbroadcast",
    "where",
    "zeros",
    "zeros_like",
]
