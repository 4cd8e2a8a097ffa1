"""Object-detection ONNX operators: NonMaxSuppression (RoiAlign: :mod:`.roi`).

NonMaxSuppression is a sort, a greedy scan and a stream compaction (docs/dynamic-shapes.md, *Data-dependent
shapes*): each box's rank among its class's scores (a comparison count, ties to the lower index, as onnxruntime
and the ONNX reference order them), the boxes scattered into rank order, the greedy selection in that order
(``NmsSelect``, a scan: one invocation per batch and class), the first ``max_output_boxes_per_class`` of those
kept, and the kept ``(batch, class, box)`` triples compacted into an output whose length is a data-dependent dim.
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import ShapeError
from kiln.frontend.onnx.ops.common import const_value
from kiln.frontend.onnx.ops.compaction import compact
from kiln.frontend.onnx.ops.indexing2 import rank_order
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Value


def _coord(b: Builder, boxes: Value, k: int) -> Value:
    """Coordinate ``k`` of every box: ``[B, N, 1]``."""
    return b.op("Gather", [boxes, b.const(np.array([k], np.int64))], axis=2)


def _corners(b: Builder, boxes: Value, center_point_box: int) -> Value:
    """float32 ``[B, N, 4]`` boxes as ``(ymin, xmin, ymax, xmax)``: from ``(x_center, y_center, width, height)``
    when ``center_point_box``, else from either pair of diagonal corners ``(y1, x1, y2, x2)``."""
    c = [_coord(b, boxes, k) for k in range(4)]
    if center_point_box:
        half = b.const(np.float32(0.5))
        hw, hh = b.op("Mul", [c[2], half]), b.op("Mul", [c[3], half])
        parts = [b.op("Sub", [c[1], hh]), b.op("Sub", [c[0], hw]), b.op("Add", [c[1], hh]), b.op("Add", [c[0], hw])]
    else:
        parts = [b.op("Min", [c[0], c[2]]), b.op("Min", [c[1], c[3]]), b.op("Max", [c[0], c[2]]),
                 b.op("Max", [c[1], c[3]])]
    return b.op("Concat", parts, axis=2)


def _scalar(b: Builder, v: Value, name: str, dtype: str) -> Value:
    """Optional input ``v`` (one element) as a ``dtype`` scalar."""
    if not symbolic.is_static(v.shape) or int(np.prod(v.shape)) != 1:
        raise ShapeError(f"NonMaxSuppression: {name} must hold one value, got shape {symbolic.format_shape(v.shape)}")
    v = reshape(b, v, ())
    return v if v.dtype == dtype else b.op("Cast", [v], to=dtype)


@onnx_op("NonMaxSuppression", since=10)
def non_max_suppression(b: Builder, boxes: Value, scores: Value, max_output_boxes_per_class: Value | None = None,
                        iou_threshold: Value | None = None, score_threshold: Value | None = None, *,
                        center_point_box: int = 0) -> Value:
    """ONNX NonMaxSuppression-10/11: per batch and class, greedily the boxes of highest score that overlap no box
    kept before by an intersection over union above ``iou_threshold`` (default 0), of those with a score above
    ``score_threshold`` (if given), at most ``max_output_boxes_per_class`` (default 0: none); int64
    ``[selected, 3]`` rows ``(batch, class, box)`` ordered by batch, class and score. ``boxes`` float32
    ``[B, N, 4]``, ``scores`` float32 ``[B, C, N]``. ``selected`` is a data-dependent dim of at most
    ``B * C * min(N, max_output_boxes_per_class)`` (the maximum counted as ``N`` when it is a run-time value).

    Raises:
        ShapeError: ``boxes`` or ``scores`` are not of those shapes or have run-time dims, or a threshold holds more
            than one value.
    """
    if len(boxes.shape) != 3 or len(scores.shape) != 3 or boxes.shape[2] != 4 or \
            boxes.shape[0] != scores.shape[0] or boxes.shape[1] != scores.shape[2]:
        raise ShapeError(f"NonMaxSuppression: boxes must be [B, N, 4] and scores [B, C, N], got "
                         f"{symbolic.format_shape(boxes.shape)} and {symbolic.format_shape(scores.shape)}")
    if not symbolic.is_static([*boxes.shape, *scores.shape]):
        raise ShapeError(f"NonMaxSuppression: run-time box or class counts ({symbolic.format_shape(scores.shape)}) "
                         "are not supported; bind them with --dim NAME=N")
    B, C, N = scores.shape
    if max_output_boxes_per_class is None:
        limit = 0
    elif max_output_boxes_per_class.is_const:
        limit = max(0, min(int(const_value(max_output_boxes_per_class, "max_output_boxes_per_class")
                               .reshape(-1)[0]), N))
    else:
        limit = None  # a run-time value
    if limit == 0 or N == 0:
        return b.const(np.zeros((0, 3), np.int64), name=b.scope)
    boxes = boxes if boxes.dtype == "float32" else b.op("Cast", [boxes], to="float32")
    scores = scores if scores.dtype == "float32" else b.op("Cast", [scores], to="float32")
    order = rank_order(b, scores, 2)  # the box of each rank, by descending score
    if score_threshold is None:
        ok = b.const(np.ones((B, C, N), np.int32))
    else:
        sorted_scores = b.op("GatherElements", [scores, order], axis=2)
        ok = b.op("Cast", [b.op("Greater", [sorted_scores, _scalar(b, score_threshold, "score_threshold",
                                                                    "float32")])], to="int32")
    threshold = b.const(np.float32(0)) if iou_threshold is None else \
        _scalar(b, iou_threshold, "iou_threshold", "float32")
    keep = b.op("NmsSelect", [_corners(b, boxes, center_point_box), order, ok, threshold])
    if limit is None or limit < N:  # the first ``limit`` kept of each batch and class (the greedy ones, in order)
        most = _scalar(b, max_output_boxes_per_class, "max_output_boxes_per_class", "int32") if limit is None else \
            b.const(np.int32(limit))
        before = b.op("CumSum", [keep], axis=2, exclusive=1, reverse=0)
        keep = b.op("Cast", [b.op("And", [b.op("Cast", [keep], to="bool"), b.op("Less", [before, most])])],
                    to="int32")
    index = np.stack(np.broadcast_arrays(*np.ix_(np.arange(B), np.arange(C), np.zeros(N, np.int64))), -1)
    triples = b.op("Add", [b.const(index.astype(np.int64)),
                           b.op("Mul", [reshape(b, b.op("Cast", [order], to="int64"), (B, C, N, 1)),
                                        b.const(np.array([0, 0, 1], np.int64))])])
    n = B * C * N
    return compact(b, reshape(b, triples, (n, 3)), reshape(b, keep, (n,)), 0,
                   f"{b.scope or 'NonMaxSuppression'}.count", most=B * C * (N if limit is None else limit))
