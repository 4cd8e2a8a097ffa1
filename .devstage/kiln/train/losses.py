"""Losses of train-step graphs, as IR ops: each gives the loss and its gradient with respect to the prediction.

A loss returns the gradient next to the value (PyTorch's fused ``cross_entropy`` backward, ``softmax -
onehot``) instead of leaving it to :mod:`kiln.passes.autodiff`: it is one fused expression, and it keeps
the max subtracted for stability out of the gradient by construction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.errors import ShapeError
from kiln.ir.graph import Builder, Value


def cross_entropy(b: Builder, logits: Value, labels: Value) -> tuple[Value, Value]:
    """Mean softmax cross-entropy of ``logits`` float32 [N, C] against class indices ``labels`` int [N]
    (``torch.nn.functional.cross_entropy``, reduction ``mean``): ``mean_n(logsumexp(z_n) - z_n[y_n])``.

    Returns:
        ``(loss float32 [], d loss / d logits = (softmax(z) - onehot(y)) / N)``. A label outside
        ``[0, C)`` matches no class (its row adds ``logsumexp`` to the loss and pushes every logit down).

    Raises:
        ShapeError: logits not 2-D, or labels not [N].
    """
    if len(logits.shape) != 2 or tuple(labels.shape) != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: needs logits [N, C] and labels [N], got {list(logits.shape)} and "
                         f"{list(labels.shape)}")
    n, c = logits.shape
    m = b.op("ReduceMax", [logits], axes=(1,), keepdims=1)
    shifted = b.op("Sub", [logits, m])
    e = b.op("Exp", [shifted])
    total = b.op("ReduceSum", [e], axes=(1,), keepdims=1)
    logp = b.op("Sub", [shifted, b.op("Log", [total])])
    classes = b.const(np.arange(c).reshape(1, c), name="classes", dtype=labels.dtype)
    hot = b.op("Cast", [b.op("Equal", [b.op("Reshape", [labels], shape=(n, 1)), classes])], to=logits.dtype)
    picked = b.op("ReduceSum", [b.op("Mul", [logp, hot])], axes=(0, 1), keepdims=0)
    loss = b.op("Mul", [picked, b.const(np.array(-1.0 / n, np.float32), name="c")])
    grad = b.op("Mul", [b.op("Sub", [b.op("Div", [e, total]), hot]), b.const(np.array(1.0 / n, np.float32), name="c")])
    return loss, grad


def mse(b: Builder, pred: Value, target: Value) -> tuple[Value, Value]:
    """Mean squared error ``mean((pred - target)^2)`` (``torch.nn.functional.mse_loss``) over every element.

    Returns:
        ``(loss float32 [], d loss / d pred = 2 (pred - target) / numel)``.

    Raises:
        ShapeError: ``target`` not of ``pred``'s shape.
    """
    if tuple(target.shape) != tuple(pred.shape) or target.dtype != pred.dtype:
        raise ShapeError(f"mse: target {target.dtype}{list(target.shape)} must match the prediction "
                         f"{pred.dtype}{list(pred.shape)}")
    d = b.op("Sub", [pred, target])
    loss = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=tuple(range(len(pred.shape))), keepdims=0)
    grad = b.op("Mul", [d, b.const(np.array(2.0 / max(1, pred.size), np.float32), name="c")])
    return loss, grad


#: loss name -> (builder function, labels dtype or None for the prediction's, what the labels are)
LOSSES: dict[str, tuple[Callable[[Builder, Value, Value], tuple[Value, Value]], str | None, str]] = {
    "cross_entropy": (cross_entropy, "int64", "class indices int64 [N]"),
    "mse": (mse, None, "targets of the prediction's shape"),
}
