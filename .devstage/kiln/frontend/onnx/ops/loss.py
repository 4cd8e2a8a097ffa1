"""Loss ONNX operators, decomposed into gathers, masks and reductions: NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.frontend.onnx.ops.nn import _reshape, _softmax_axis
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value


def nll(b: Builder, logp: Value, target: Value, weight: Value | None, reduction: str,
        ignore_index: int | None) -> Value:
    """``-logp[n, target[n, d...], d...]`` (times the class weight), reduced by ``reduction`` (none/sum/mean).

    Positions whose target is ``ignore_index`` count as 0 and are left out of the mean's weight.

    Raises:
        KilnError: an unknown ``reduction``.
    """
    if reduction not in ("none", "sum", "mean"):
        raise KilnError(f"unknown reduction {reduction!r}")
    mask = None
    if ignore_index is not None:
        mask = b.op("Equal", [target, b.const(np.array(ignore_index), dtype=target.dtype)])
        mask = b.op("Not", [mask])
        target = b.op("Where", [mask, target, b.const(np.array(0), dtype=target.dtype)])
    n, rest = logp.shape[0], logp.shape[2:]
    idx = _reshape(b, target, (n, 1, *rest))
    picked = _reshape(b, b.op("GatherElements", [logp, idx], axis=1), (n, *rest))
    loss = b.op("Neg", [picked])
    w = b.op("Gather", [weight, target], axis=0) if weight is not None else None
    if mask is not None:
        m = b.op("Cast", [mask], to=logp.dtype)
        w = m if w is None else b.op("Mul", [w, m])
    if w is not None:
        loss = b.op("Mul", [loss, w])
    axes = tuple(range(len(loss.shape)))
    if reduction == "none":
        return loss
    total = b.op("ReduceSum", [loss], axes=axes, keepdims=0)
    if reduction == "sum":
        return total
    if w is None:
        return b.op("ReduceMean", [loss], axes=axes, keepdims=0)
    return b.op("Div", [total, b.op("ReduceSum", [w], axes=axes, keepdims=0)])


@onnx_op("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(b: Builder, x: Value, target: Value, weight: Value | None = None, *,
                                 ignore_index: int | None = None, reduction: str = "mean") -> Value:
    """ONNX NegativeLogLikelihoodLoss-12/13/22: input [N, C, d...] of log-probabilities, integer targets [N, d...]."""
    return nll(b, x, target, weight, reduction, ignore_index)


@onnx_op("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(b: Builder, scores: Value, labels: Value, weights: Value | None = None, *,
                               ignore_index: int | None = None, reduction: str = "mean") -> list[Value]:
    """ONNX SoftmaxCrossEntropyLoss-12/13: NLL of LogSoftmax(scores, axis=1); the optional second output is
    the log-probabilities."""
    logp = _softmax_axis(b, scores, 1, True)
    return [nll(b, logp, labels, weights, reduction, ignore_index), logp]
