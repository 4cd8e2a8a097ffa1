"""Eager tensors on WebGPU with reverse-mode autodiff (see docs/eager.md).

::

    import kiln
    x = kiln.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = (x @ x).relu().sum()
    y.backward()
    x.grad.numpy()

Every op runs a kernel generated from the compiler's tensor expressions on one shared wgpu
device; tensors stay on the device until ``.numpy()``. :func:`stats` shows the kernel cache.
"""

from __future__ import annotations

from kiln.eager import functional
from kiln.eager.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from kiln.eager.kernels import set_specialize_after, stats
from kiln.eager.ops import (
    argmax,
    argmin,
    cat,
    expand,
    flatten,
    matmul,
    max,
    mean,
    min,
    permute,
    reshape,
    squeeze,
    stack,
    sum,
    transpose,
    unsqueeze,
)
from kiln.eager.tensors import (
    Tensor,
    abs,
    arange,
    clamp,
    cos,
    exp,
    full,
    leaky_relu,
    log,
    manual_seed,
    maximum,
    minimum,
    ones,
    ones_like,
    rand,
    randn,
    reciprocal,
    relu,
    sigmoid,
    sin,
    sqrt,
    tanh,
    tensor,
    where,
    zeros,
    zeros_like,
)

softmax = functional.softmax
log_softmax = functional.log_softmax

__all__ = ["Tensor", "abs", "arange", "argmax", "argmin", "cat", "clamp", "cos", "enable_grad", "exp", "expand",
           "flatten", "full", "functional", "is_grad_enabled", "leaky_relu", "log", "log_softmax", "manual_seed",
           "matmul", "max", "maximum", "mean", "min", "minimum", "no_grad", "ones", "ones_like", "permute", "rand",
           "randn", "reciprocal", "relu", "reshape", "set_grad_enabled", "set_specialize_after", "sigmoid", "sin",
           "softmax", "sqrt", "squeeze", "stack", "stats", "sum", "tanh", "tensor", "transpose", "unsqueeze", "where",
           "zeros", "zeros_like"]
