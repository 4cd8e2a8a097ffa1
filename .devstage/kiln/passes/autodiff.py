"""Reverse-mode automatic differentiation of the graph IR.

:func:`gradients` appends, to a graph, the nodes computing the gradients of a scalar loss with respect
to chosen values (the trainable weights), given the gradient of the loss with respect to some values
(the *seeds*, e.g. ``softmax(logits) - onehot(labels)`` for cross-entropy). Each primitive has one
backward rule, written with :class:`~kiln.ir.graph.Builder` calls over IR values (micrograd's style:
the rules read like the forward ops they reverse), so the backward pass is ordinary IR: the same
passes fuse it, the same tensor expressions generate its kernels, and :mod:`kiln.ir.interp` runs it.

Only nodes on a path from a value that needs a gradient to a seed are differentiated: a frozen
trunk before a trainable classifier gets no backward nodes at all. Gradient primitives with no ONNX
counterpart (``ConvWeightGrad``, pooling gradients) are in :mod:`kiln.ir.ops_grad`; a convolution's
input gradient is the ``ConvTranspose`` primitive. These are the rules of :mod:`kiln.eager`
(``kiln/eager/tensors.py``, ``ops.py``, ``functional.py``) over IR values instead of tensors; ties of
``Max``/``Min`` and of max reductions share the gradient equally, max pooling sends it to each window's
first maximum, and ``Clip``'s gradient passes where ``min <= x <= max`` (PyTorch's ``clamp``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.errors import KilnError
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Graph, Node, Value
from kiln.ir.ops import _pool_windows

#: backward rule: (builder, node, gradient of its output, which inputs need one) -> one gradient per input
Rule = Callable[[Builder, Node, Value, list[bool]], list[Value | None]]

RULES: dict[str, Rule] = {}


def rule(*names: str):
    """Register the decorated function as the backward rule of primitives ``names``."""
    def wrap(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return wrap


def scalar(b: Builder, value: float, like: Value) -> Value:
    """A scalar constant of ``like``'s dtype."""
    return b.const(np.array(value, dtypes.NUMPY[like.dtype]), name="c")


def unbroadcast(b: Builder, g: Value, shape: tuple[int, ...]) -> Value:
    """``g`` summed over the dims numpy broadcasting added to ``shape`` (the adjoint of broadcasting)."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(i for i in range(len(g.shape)) if i < lead or (shape[i - lead] == 1 and g.shape[i] != 1))
    if axes:
        g = b.op("ReduceSum", [g], axes=axes, keepdims=1)
    return b.op("Reshape", [g], shape=tuple(shape)) if tuple(g.shape) != tuple(shape) else g


def _where(b: Builder, cond: Value, t: Value, f: Value) -> Value:
    return b.op("Where", [cond, t, f])


# ----------------------------------------------------------------------------- elementwise
@rule("Add")
def _add(b, node, g, need):
    x, y = node.inputs
    return [unbroadcast(b, g, x.shape), unbroadcast(b, g, y.shape)]


@rule("Sub")
def _sub(b, node, g, need):
    x, y = node.inputs
    return [unbroadcast(b, g, x.shape), unbroadcast(b, b.op("Neg", [g]), y.shape) if need[1] else None]


@rule("Mul")
def _mul(b, node, g, need):
    x, y = node.inputs
    return [unbroadcast(b, b.op("Mul", [g, y]), x.shape) if need[0] else None,
            unbroadcast(b, b.op("Mul", [g, x]), y.shape) if need[1] else None]


@rule("Div")
def _div(b, node, g, need):
    x, y = node.inputs
    out = node.outputs[0]
    return [unbroadcast(b, b.op("Div", [g, y]), x.shape) if need[0] else None,
            unbroadcast(b, b.op("Neg", [b.op("Div", [b.op("Mul", [g, out]), y])]), y.shape) if need[1] else None]


@rule("Pow")
def _pow(b, node, g, need):
    x, p = node.inputs
    out = node.outputs[0]
    gx = gp = None
    if need[0]:  # p * x^(p-1) = p * out / x is wrong at x = 0; use x^(p-1) directly
        pm1 = b.op("Sub", [p, scalar(b, 1.0, p)])
        gx = unbroadcast(b, b.op("Mul", [g, b.op("Mul", [p, b.op("Pow", [x, pm1])])]), x.shape)
    if need[1]:
        gp = unbroadcast(b, b.op("Mul", [g, b.op("Mul", [out, b.op("Log", [x])])]), p.shape)
    return [gx, gp]


@rule("Max", "Min")
def _max_min(b, node, g, need):
    x, y = node.inputs
    wins = b.op("Greater" if node.op == "Max" else "Less", [x, y])
    half = b.op("Mul", [g, scalar(b, 0.5, g)])
    zero = scalar(b, 0.0, g)
    tie = b.op("Equal", [x, y])
    gx = _where(b, wins, g, _where(b, tie, half, zero)) if need[0] else None
    gy = _where(b, wins, zero, _where(b, tie, half, g)) if need[1] else None
    return [unbroadcast(b, gx, x.shape) if gx is not None else None,
            unbroadcast(b, gy, y.shape) if gy is not None else None]


@rule("Where")
def _where_rule(b, node, g, need):
    c, x, y = node.inputs
    zero = scalar(b, 0.0, g)
    return [None, unbroadcast(b, _where(b, c, g, zero), x.shape) if need[1] else None,
            unbroadcast(b, _where(b, c, zero, g), y.shape) if need[2] else None]


def _unary(fn: Callable[[Builder, Value, Value, Value, dict], Value]) -> Rule:
    def r(b, node, g, need):
        return [fn(b, node.inputs[0], node.outputs[0], g, node.attrs)]
    return r


def _mul(b, *vs):
    out = vs[0]
    for v in vs[1:]:
        out = b.op("Mul", [out, v])
    return out


UNARY_RULES = {
    "Identity": lambda b, x, y, g, a: g,
    "Neg": lambda b, x, y, g, a: b.op("Neg", [g]),
    "Relu": lambda b, x, y, g, a: _where(b, b.op("Greater", [x, scalar(b, 0.0, x)]), g, scalar(b, 0.0, g)),
    "LeakyRelu": lambda b, x, y, g, a: _where(b, b.op("GreaterOrEqual", [x, scalar(b, 0.0, x)]), g,
                                              b.op("Mul", [g, scalar(b, a["alpha"], g)])),
    "Exp": lambda b, x, y, g, a: b.op("Mul", [g, y]),
    "Log": lambda b, x, y, g, a: b.op("Div", [g, x]),
    "Sqrt": lambda b, x, y, g, a: b.op("Div", [g, b.op("Mul", [y, scalar(b, 2.0, y)])]),
    "Reciprocal": lambda b, x, y, g, a: b.op("Neg", [_mul(b, g, y, y)]),
    "Tanh": lambda b, x, y, g, a: b.op("Mul", [g, b.op("Sub", [scalar(b, 1.0, y), b.op("Mul", [y, y])])]),
    "Sigmoid": lambda b, x, y, g, a: _mul(b, g, y, b.op("Sub", [scalar(b, 1.0, y), y])),
    "Abs": lambda b, x, y, g, a: b.op("Mul", [g, b.op("Sign", [x])]),
    "Sin": lambda b, x, y, g, a: b.op("Mul", [g, b.op("Cos", [x])]),
    "Cos": lambda b, x, y, g, a: b.op("Neg", [b.op("Mul", [g, b.op("Sin", [x])])]),
    "Softplus": lambda b, x, y, g, a: b.op("Mul", [g, b.op("Sigmoid", [x])]),
    "Erf": lambda b, x, y, g, a: _mul(b, g, scalar(b, 2 / np.sqrt(np.pi), g),
                                      b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])),
}


def _clip(b, x, y, g, a):
    ok = None
    for key, cmp in (("min", "GreaterOrEqual"), ("max", "LessOrEqual")):
        if a.get(key) is not None:
            c = b.op(cmp, [x, scalar(b, a[key], x)])
            ok = c if ok is None else b.op("And", [ok, c])
    return g if ok is None else _where(b, ok, g, scalar(b, 0.0, g))


def _hard_sigmoid(b, x, y, g, a):
    z = b.op("Add", [b.op("Mul", [x, scalar(b, a["alpha"], x)]), scalar(b, a["beta"], x)])
    ok = b.op("And", [b.op("Greater", [z, scalar(b, 0.0, z)]), b.op("Less", [z, scalar(b, 1.0, z)])])
    return _where(b, ok, b.op("Mul", [g, scalar(b, a["alpha"], g)]), scalar(b, 0.0, g))


def _cast(b, x, y, g, a):
    if not dtypes.is_float(x.dtype):
        raise KilnError(f"cannot differentiate a Cast from {x.dtype}")
    return g if x.dtype == y.dtype else b.op("Cast", [g], to=x.dtype)


UNARY_RULES.update({"Clip": _clip, "HardSigmoid": _hard_sigmoid, "Cast": _cast})
for _name, _fn in UNARY_RULES.items():
    RULES[_name] = _unary(_fn)


# ----------------------------------------------------------------------------- products and reductions
def _swap_last(b: Builder, v: Value) -> Value:
    perm = (*range(len(v.shape) - 2), len(v.shape) - 1, len(v.shape) - 2)
    return b.op("Transpose", [v], perm=perm)


@rule("MatMul")
def _matmul(b, node, g, need):
    x, y = node.inputs
    return [unbroadcast(b, b.op("MatMul", [g, _swap_last(b, y)]), x.shape) if need[0] else None,
            unbroadcast(b, b.op("MatMul", [_swap_last(b, x), g]), y.shape) if need[1] else None]


def _keep(x: Value, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


@rule("ReduceSum", "ReduceMean")
def _reduce_sum(b, node, g, need):
    x, = node.inputs
    axes = node.attrs["axes"]
    gk = b.op("Reshape", [g], shape=_keep(x, axes)) if g.shape != _keep(x, axes) else g
    if node.op == "ReduceMean":
        gk = b.op("Mul", [gk, scalar(b, 1.0 / max(1, x.size // max(1, node.outputs[0].size)), g)])
    return [b.op("Expand", [gk], shape=tuple(x.shape)) if gk.shape != x.shape else gk]


@rule("ReduceMax", "ReduceMin")
def _reduce_max(b, node, g, need):
    x, = node.inputs
    keep = _keep(x, node.attrs["axes"])
    y = node.outputs[0]
    yk = b.op("Reshape", [y], shape=keep) if y.shape != keep else y
    gk = b.op("Reshape", [g], shape=keep) if g.shape != keep else g
    hit = b.op("Equal", [x, yk])
    count = b.op("ReduceSum", [b.op("Cast", [hit], to=x.dtype)], axes=node.attrs["axes"], keepdims=1)
    return [_where(b, hit, b.op("Div", [gk, count]), scalar(b, 0.0, g))]


# ----------------------------------------------------------------------------- data movement
@rule("Reshape")
def _reshape(b, node, g, need):
    return [b.op("Reshape", [g], shape=tuple(node.inputs[0].shape))]


@rule("Transpose")
def _transpose(b, node, g, need):
    perm = node.attrs["perm"]
    return [b.op("Transpose", [g], perm=tuple(int(i) for i in np.argsort(perm)))]


@rule("Expand")
def _expand(b, node, g, need):
    return [unbroadcast(b, g, node.inputs[0].shape)]


@rule("Concat")
def _concat(b, node, g, need):
    ax = node.attrs["axis"]
    out, start = [], 0
    for v, n in zip(node.inputs, need):
        end = start + v.shape[ax]
        if n:
            starts = tuple(start if i == ax else 0 for i in range(len(g.shape)))
            ends = tuple(end if i == ax else d for i, d in enumerate(g.shape))
            out.append(b.op("Slice", [g], starts=starts, ends=ends, steps=(1,) * len(g.shape)))
        else:
            out.append(None)
        start = end
    return out


@rule("Slice")
def _slice(b, node, g, need):
    x, = node.inputs
    a = node.attrs
    if any(s != 1 for s in a["steps"]):
        raise KilnError(f"node {node.name!r}: no gradient for a Slice with steps {list(a['steps'])} yet")
    pads = tuple(a["starts"]) + tuple(d - e for d, e in zip(x.shape, a["ends"]))
    return [b.op("Pad", [g], pads=pads, mode="constant", value=0.0)]


@rule("Pad")
def _pad(b, node, g, need):
    x, = node.inputs
    p = node.attrs["pads"]
    n = len(x.shape)
    if node.attrs["mode"] != "constant" or min(p) < 0:
        raise KilnError(f"node {node.name!r}: only constant Pad with non-negative pads is differentiable")
    return [b.op("Slice", [g], starts=tuple(p[:n]), ends=tuple(p[i] + x.shape[i] for i in range(n)),
                 steps=(1,) * n)]


# ----------------------------------------------------------------------------- convolution and pooling
@rule("Conv")
def _conv(b, node, g, need):
    x, w = node.inputs
    a = node.attrs
    nsp = len(x.shape) - 2
    gx = gw = None
    if need[0]:
        s, d, p = a["strides"], a["dilations"], a["pads"]
        outpad = tuple(x.shape[2 + i] - (s[i] * (g.shape[2 + i] - 1) + (w.shape[2 + i] - 1) * d[i] + 1 - p[i]
                                         - p[nsp + i]) for i in range(nsp))
        gx = b.op("ConvTranspose", [g, w], strides=tuple(s), dilations=tuple(d), pads=tuple(p), group=a["group"],
                  output_padding=outpad)
    if need[1]:
        gw = b.op("ConvWeightGrad", [x, g], strides=tuple(a["strides"]), dilations=tuple(a["dilations"]),
                  pads=tuple(a["pads"]), group=a["group"], w_shape=tuple(w.shape))
    return [gx, gw]


def _pool_attrs(node: Node) -> dict:
    a = node.attrs
    return {"kernel_shape": tuple(a["kernel_shape"]), "strides": tuple(a["strides"]),
            "dilations": tuple(a["dilations"]), "pads": tuple(a["pads"]), "x_shape": tuple(node.inputs[0].shape)}


@rule("AveragePool")
def _avg_pool(b, node, g, need):
    x, = node.inputs
    counts = 0.0
    for _, inside, padded in _pool_windows(np.zeros((1, 1, *x.shape[2:]), np.float32), node.attrs, 0.0):
        counts = counts + (padded if node.attrs["count_include_pad"] else inside)
    inv = b.const((1.0 / np.maximum(counts, 1)).reshape(1, 1, *g.shape[2:]).astype(np.float32), name="pool_inv_count")
    return [b.op("PoolGradSum", [b.op("Mul", [g, inv])], **_pool_attrs(node))]


@rule("MaxPool")
def _max_pool(b, node, g, need):
    x, = node.inputs
    attrs = _pool_attrs(node)
    win = b.op("MaxPoolArgWindow", [x, node.outputs[0]], **{k: v for k, v in attrs.items() if k != "x_shape"})
    return [b.op("MaxPoolGrad", [g, win], **attrs)]


# ----------------------------------------------------------------------------- the pass
def requires_grad(graph: Graph, wrt: list[Value]) -> set[int]:
    """``id`` of every float value computed from one of ``wrt`` (including them)."""
    need = {id(v) for v in wrt}
    for node in graph.nodes:
        if any(id(v) in need for v in node.inputs):
            need.update(id(o) for o in node.outputs if dtypes.is_float(o.dtype))
    return need


def builder_for(graph: Graph) -> Builder:
    """A folding :class:`Builder` appending to ``graph`` that knows every name already taken."""
    b = Builder(graph, fold=True)
    for node in graph.nodes:
        b._names.update(o.name for o in node.outputs)
    b._names.update(v.name for v in graph.outputs)
    return b


def gradients(graph: Graph, seeds: list[tuple[Value, Value]], wrt: list[Value],
              builder: Builder | None = None) -> list[Value]:
    """Append the backward pass to ``graph``; returns the gradient of each of ``wrt``, in order.

    Args:
        seeds: ``(value, d loss / d value)`` pairs the backward pass starts from (same shapes).
        wrt: values to differentiate with respect to (graph inputs holding trainable weights).
        builder: the builder to append with (default :func:`builder_for` ``graph``).

    Raises:
        KilnError: a value of ``wrt`` does not affect the seeds, or a node on the way has an op with
            no backward rule (naming the node and op), or more than one output.
    """
    b = builder or builder_for(graph)
    need = requires_grad(graph, wrt)
    grads: dict[int, Value] = {}

    def accumulate(v: Value, g: Value) -> None:
        if tuple(g.shape) != tuple(v.shape):
            raise KilnError(f"internal error: gradient of %{v.name} has shape {list(g.shape)}, not {list(v.shape)}")
        grads[id(v)] = b.op("Add", [grads[id(v)], g]) if id(v) in grads else g

    for v, g in seeds:
        accumulate(v, g)
    forward = list(graph.nodes)
    scope = b.scope
    for node in reversed(forward):
        outs = [o for o in node.outputs if id(o) in grads]
        if not outs or not any(id(v) in need for v in node.inputs):
            continue
        if len(node.outputs) != 1:
            raise KilnError(f"node {node.name!r} ({node.op}): no gradient through ops with several outputs yet")
        fn = RULES.get(node.op)
        if fn is None:
            raise KilnError(f"node {node.name!r}: no gradient rule for primitive {node.op} yet")
        b.scope = f"grad_{node.name}"
        mask = [id(v) in need for v in node.inputs]
        for v, g, m in zip(node.inputs, fn(b, node, grads[id(node.outputs[0])], mask), mask):
            if m and g is not None:
                accumulate(v, g)
    b.scope = scope
    missing = [v.name for v in wrt if id(v) not in grads]
    if missing:
        raise KilnError(f"the loss does not depend on trainable tensor{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing)}")
    return [grads[id(v)] for v in wrt]
