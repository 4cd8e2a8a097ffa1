"""Neural-network functions on eager tensors (``kiln.eager.functional``, PyTorch's ``F``), with gradients.

Convolution and pooling run the compiler's expressions (:func:`kiln.kernels.nn.conv`,
:func:`kiln.kernels.nn.pool`); their gradients are tensor expressions too: the input gradient
of a convolution is the compiler's transposed convolution (:func:`kiln.kernels.resample.conv_transpose`),
the weight gradient a correlation of the input with the output gradient, and pooling gradients
gather each input element's windows. Softmax, batch normalisation and the losses are compositions
of eager ops, differentiated through them. Conventions follow PyTorch (NCHW, weights
``(out, in/groups, kh, kw)``, ``F.avg_pool2d``'s ``count_include_pad=True``).
"""

from __future__ import annotations

import numpy as np

from kiln.arith.expr import Expr, binop, const, reduce, reduce_axis, select
from kiln.eager import autograd, ops
from kiln.eager import tensors as tensor
from kiln.eager.ops import _op
from kiln.eager.tensors import Tensor, as_tensor, exp, log, sqrt, where
from kiln.errors import ShapeError
from kiln.kernels import nn as nn_k
from kiln.kernels import resample
from kiln.te.compute import compute


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


def _out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


# ---------------------------------------------------------------------- activations and normalisation
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (ONNX Softmax-13)."""
    e = exp(x - ops.max(x, axis, keepdims=True).detach())
    return e / ops.sum(e, axis, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - max - log(sum(exp(x - max))) along ``axis`` (ONNX LogSoftmax-13)."""
    z = x - ops.max(x, axis, keepdims=True).detach()
    return z - log(ops.sum(exp(z), axis, keepdims=True))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` (``weight``: ``(out, in)``; ``x``: ``(..., in)``), one fused kernel."""
    if x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: input features {x.shape[-1]} differ from the weight's {weight.shape[1]}")
    lead = x.shape[:-1]
    x2 = ops.reshape(x, (-1, x.shape[-1])) if x.ndim != 2 else x
    m, n = x2.shape[0], weight.shape[0]
    ins = [x2, weight] + ([bias] if bias is not None else [])

    def build(xp, wp, bp=None):
        k = reduce_axis(xp.shape[1], "rk")
        def body(i, j):
            acc = reduce("sum", xp[i, k] * wp[j, k], [k])
            return acc + bp[j] if bp is not None else acc
        return compute((m, n), body, "linear")

    out = _op("Linear", bias is not None, build, ins)

    def grad(g):
        gx = ops.matmul(g, weight)
        gw = ops.matmul(ops.transpose(g, 0, 1), x2)
        return (gx, gw) + ((ops.sum(g, 0),) if bias is not None else ())

    out = autograd.attach(out, "Linear", tuple(ins), grad)
    return ops.reshape(out, (*lead, n)) if x.ndim != 2 else out


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """Batch normalisation over every dim but 1 (``F.batch_norm``).

    Training normalises by the batch's mean and biased variance and updates the running
    statistics in place (``(1 - momentum) * running + momentum * batch``, the unbiased variance);
    evaluation uses the running statistics.
    """
    axes = tuple(d for d in range(x.ndim) if d != 1)
    shape = tuple(x.shape[1] if d == 1 else 1 for d in range(x.ndim))
    if training:
        mu = ops.mean(x, axes, keepdims=True)
        xc = x - mu
        var = ops.mean(xc * xc, axes, keepdims=True)
        if running_mean is not None:
            n = x.size // x.shape[1]
            with autograd.no_grad():
                running_mean.copy_(running_mean * (1 - momentum) + ops.reshape(mu, (-1,)) * momentum)
                running_var.copy_(running_var * (1 - momentum) + ops.reshape(var, (-1,)) * (momentum * n / max(n - 1, 1)))
        y = xc / sqrt(var + eps)
    else:
        if running_mean is None:
            raise ShapeError("batch_norm: evaluation needs running statistics")
        y = (x - ops.reshape(running_mean, shape)) / sqrt(ops.reshape(running_var, shape) + eps)
    if weight is not None:
        y = y * ops.reshape(weight, shape)
    if bias is not None:
        y = y + ops.reshape(bias, shape)
    return y


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` (identity when not training)."""
    if not training or p == 0:
        return x
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), not {p}")
    keep = tensor.tensor(tensor._rng.random(x.shape) >= p)
    return where(keep, x * (1.0 / (1 - p)), 0.0)


# ---------------------------------------------------------------------- losses
def one_hot(target: Tensor, num_classes: int) -> Tensor:
    """float32 one-hot rows of integer ``target`` (``(N,)`` -> ``(N, num_classes)``)."""
    target = as_tensor(target, "int32")
    return (tensor.arange(num_classes) == ops.unsqueeze(target, -1)).to("float32")


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``-log_softmax(logits)[n, target[n]]`` (``logits``: ``(N, C)``, ``target``: int class indices ``(N,)``),
    averaged (``mean``), summed (``sum``) or per row (``none``)."""
    nll = -ops.sum(log_softmax(logits, 1) * one_hot(target, logits.shape[1]), 1)
    return _reduce_loss(nll, reduction)


def mse_loss(pred: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean (or sum, or elementwise) squared error."""
    d = pred - target
    return _reduce_loss(d * d, reduction)


def _reduce_loss(x: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return ops.mean(x)
    if reduction == "sum":
        return ops.sum(x)
    if reduction == "none":
        return x
    raise ValueError(f"reduction must be mean, sum or none, not {reduction!r}")


# ---------------------------------------------------------------------- convolution
def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-D cross-correlation (``F.conv2d``; ONNX Conv): ``x (N, C, H, W)``, ``weight (O, C/groups, kh, kw)``.

    Raises:
        ShapeError: channels that do not match the weight and ``groups``.
    """
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    if c != cg * groups or o % groups:
        raise ShapeError(f"conv2d: input channels {c}, weight {weight.shape} and groups={groups} do not fit")
    shape = (n, o, _out_size(h, kh, s[0], p[0], d[0]), _out_size(w, kw, s[1], p[1], d[1]))
    if shape[2] <= 0 or shape[3] <= 0:
        raise ShapeError(f"conv2d: the {kh}x{kw} window does not fit the padded {h}x{w} input")
    key = (s, p, d, groups)
    out = _op("Conv", key, lambda xp, wp: nn_k.conv(xp, wp, s, d, (*p, *p), groups, shape, "conv"), [x, weight])

    def grad(g):
        return (conv2d_input_grad(g, weight, x.shape, s, p, d, groups),
                conv2d_weight_grad(x, g, weight.shape, s, p, d, groups))

    out = autograd.attach(out, "Conv2d", (x, weight), grad)
    return out + ops.reshape(bias, (1, o, 1, 1)) if bias is not None else out


def conv2d_input_grad(g: Tensor, weight: Tensor, x_shape, stride, padding, dilation, groups: int) -> Tensor:
    """d(conv2d)/d(input): the transposed convolution of ``g`` with ``weight`` (ONNX ConvTranspose's expression),
    to ``x_shape``.

    It is the adjoint of convolution in its input (``<conv_transpose(g, w), u> = <g, conv(u, w)>``), so its own
    gradients are ``conv2d(u, w)`` for ``g`` and ``conv2d_weight_grad(u, g)`` for ``w``.
    """
    attrs = {"group": groups, "strides": tuple(stride), "dilations": tuple(dilation), "pads": (*padding, *padding)}
    shape = tuple(x_shape)
    out = _op("ConvInputGrad", (shape, attrs["strides"], attrs["dilations"], attrs["pads"], groups),
              lambda gp, wp: resample.conv_transpose(gp, wp, attrs, shape, "conv_input_grad"), [g, weight])
    return autograd.attach(out, "ConvInputGrad", (g, weight), lambda u: (
        conv2d(u, weight, None, stride, padding, dilation, groups),
        conv2d_weight_grad(u, g, weight.shape, stride, padding, dilation, groups)))


def conv2d_weight_grad(x: Tensor, g: Tensor, w_shape, stride, padding, dilation, groups: int) -> Tensor:
    """d(conv2d)/d(weight): ``gw[o, c, i, j] = sum_{n, y, z} g[n, o, y, z] x[n, grp(o) C/groups + c, y s - p + i d, z s - p + j d]``.

    From ``<weight_grad(x, g), u> = <g, conv(x, u)> = <x, conv_transpose(g, u)>`` its own gradients are
    ``conv2d_input_grad(g, u)`` for ``x`` and ``conv2d(x, u)`` for ``g``.
    """
    o, cg = w_shape[:2]
    og = o // groups
    s, p, d = stride, padding, dilation

    def build(xp, gp):
        rn, ry, rz = reduce_axis(gp.shape[0], "rn"), reduce_axis(gp.shape[2], "ry"), reduce_axis(gp.shape[3], "rz")

        def body(co, ci, i, j):
            cin = (co // og) * cg + ci if groups > 1 else ci
            hy = ry * s[0] - p[0] + i * d[0]
            wz = rz * s[1] - p[1] + j * d[1]
            inside: Expr = const(True, "bool")
            if p[0]:
                inside = inside & binop(">=", hy, 0) & binop("<", hy, xp.shape[2])
            if p[1]:
                inside = inside & binop(">=", wz, 0) & binop("<", wz, xp.shape[3])
            return reduce("sum", select(inside, xp[rn, cin, hy, wz], 0.0) * gp[rn, co, ry, rz], [rn, ry, rz])

        return compute(tuple(w_shape), body, "conv_weight_grad")

    out = _op("ConvWeightGrad", (tuple(w_shape), tuple(s), tuple(p), tuple(d), groups), build, [x, g])
    return autograd.attach(out, "ConvWeightGrad", (x, g), lambda u: (
        conv2d_input_grad(g, u, x.shape, s, p, d, groups), conv2d(x, u, None, s, p, d, groups)))


# ---------------------------------------------------------------------- pooling
def _pool_args(x: Tensor, kernel_size, stride, padding, dilation=1):
    k = _pair(kernel_size)
    s = _pair(stride if stride is not None else kernel_size)
    p, d = _pair(padding), _pair(dilation)
    if x.ndim != 4:
        raise ShapeError(f"2-D pooling needs an (N, C, H, W) input, not {x.shape}")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ShapeError(f"pooling: padding {p} must be at most half the kernel {k}")
    shape = (*x.shape[:2], _out_size(x.shape[2], k[0], s[0], p[0], d[0]), _out_size(x.shape[3], k[1], s[1], p[1], d[1]))
    return k, s, p, d, shape


def _window_gather(gp, x_shape, k, s, p, d, fn):
    """``out[n, c, h, w] = sum`` over the windows ``(oy, oz)`` containing ``(h, w)`` (window offset ``(i, j)``)
    of ``fn(oy, oz, i, j, (n, c))``: the transpose of a pooling window's gather."""
    ri, rj = reduce_axis(k[0], "ri"), reduce_axis(k[1], "rj")

    def body(n, c, h, w):
        ok: Expr = const(True, "bool")
        pos = []
        for t, dim, r, a in ((h, 2, ri, 0), (w, 3, rj, 1)):
            u = t + p[a] - r * d[a]
            q = u // s[a] if s[a] > 1 else u
            ok = ok & binop(">=", u, 0) & binop("<", q, gp.shape[dim])
            if s[a] > 1:
                ok = ok & binop("==", u % s[a], 0)
            pos.append(q)
        return reduce("sum", select(ok, fn(pos[0], pos[1], ri, rj, (n, c)), 0.0), [ri, rj])

    return compute(tuple(x_shape), body, "pool_grad")


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1) -> Tensor:
    """2-D max pooling (``F.max_pool2d``; ONNX MaxPool); the gradient goes to the first maximum of each window."""
    k, s, p, d, shape = _pool_args(x, kernel_size, stride, padding, dilation)
    pads = (*p, *p)
    key = (k, s, pads, d)
    out = _op("MaxPool", key, lambda xp: nn_k.pool("MaxPool", xp, k, s, d, pads, 0, shape, "maxpool"), [x])

    def grad(g):
        # the window offset of each window's first maximum, then each element gathers the windows it won
        def first(xp, yp):
            ri, rj = reduce_axis(k[0], "ri"), reduce_axis(k[1], "rj")

            def body(n, c, oy, oz):
                hy, wz = oy * s[0] - p[0] + ri * d[0], oz * s[1] - p[1] + rj * d[1]
                inside = binop(">=", hy, 0) & binop("<", hy, x.shape[2]) & binop(">=", wz, 0) & binop("<", wz, x.shape[3])
                hit = select(inside, binop("==", xp[n, c, hy, wz], yp[n, c, oy, oz]), const(False, "bool"))
                return reduce("min", select(hit, ri * k[1] + rj, k[0] * k[1]), [ri, rj])

            return compute(shape, body, "maxpool_argwin")

        win = _op("MaxPoolArgWindow", key, first, [x.detach(), out.detach()])
        gx = _op("MaxPoolGrad", (tuple(x.shape), *key),
                 lambda gp, wp: _window_gather(gp, x.shape, k, s, p, d, lambda oy, oz, i, j, nc: select(
                     binop("==", wp[(*nc, oy, oz)], i * k[1] + j), gp[(*nc, oy, oz)], 0.0)), [g, win])
        return (gx,)

    return autograd.attach(out, "MaxPool2d", (x,), grad)


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Tensor:
    """2-D average pooling (``F.avg_pool2d``; ONNX AveragePool): divides by the window size, or by the
    elements inside the input when ``count_include_pad`` is False."""
    k, s, p, d, shape = _pool_args(x, kernel_size, stride, padding)
    pads = (*p, *p)
    key = (k, s, pads, bool(count_include_pad))
    out = _op("AveragePool", key, lambda xp: nn_k.pool("AveragePool", xp, k, s, d, pads, int(count_include_pad),
                                                       shape, "avgpool"), [x])
    # 1 / (elements each window averages): data-independent, computed on the host
    counts = np.ones((1, 1, *shape[2:]), np.float32)
    for a in (0, 1):
        n = x.shape[2 + a]
        lo = np.arange(shape[2 + a]) * s[a] - p[a]
        hi = lo + k[a]
        c = np.minimum(hi, n + (p[a] if count_include_pad else 0)) - np.maximum(lo, -p[a] if count_include_pad else 0)
        counts *= c.reshape((-1, 1) if a == 0 else (1, -1))
    inv = tensor.tensor(1.0 / counts)

    def grad(g):
        gs = g * inv
        return (_op("AvgPoolGrad", (tuple(x.shape), k, s, pads),
                    lambda gp: _window_gather(gp, x.shape, k, s, p, d,
                                              lambda oy, oz, i, j, nc: gp[(*nc, oy, oz)]), [gs]),)

    return autograd.attach(out, "AvgPool2d", (x,), grad)


__all__ = ["avg_pool2d", "batch_norm", "conv2d", "conv2d_input_grad", "conv2d_weight_grad", "cross_entropy",
           "dropout", "linear", "log_softmax", "max_pool2d", "mse_loss", "one_hot", "softmax"]
