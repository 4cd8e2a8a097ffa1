"""Primitives of run-time shape values (docs/dynamic-shapes.md).

``SymConst`` is a small tensor of size expressions (a shape that folding could not finish at
compile time) written by a kernel from the dims uniform; ``Iota`` is ONNX Range of run-time length:
``out[i] = start + i * delta``, ``start`` possibly a size expression. Neither has inputs. Their numpy
semantics need the run-time dims, so the interpreter refuses them (KilnError), but for an Iota of static length and
start (a counter of device-side random draws).

``Compact`` is stream compaction, the primitive of data-dependent shapes (NonZero, Compress, Unique;
docs/dynamic-shapes.md *Data-dependent shapes*): ``out[.., pos[j], ..] = data[.., j, ..]`` along ``axis`` for
every ``j`` with ``keep[j] != 0``, where the ``pos`` of the kept ``j`` are ``0 .. count - 1``, each once (the exclusive
prefix count of ``keep``, or another order: Unique's sorted places), and the output's extent along ``axis`` is the
attribute ``count``, a run-time dim bound from the count the graph computes.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.ir.registry import register


def _needs_dims(name):
    def evaluate(xs, a):
        raise KilnError(f"{name} needs the run-time dims; the numpy interpreter runs static graphs only")
    return evaluate


register("SymConst", "generator", lambda ts, a: [(a["dtype"], tuple(a["shape"]))], _needs_dims("SymConst"))
def _iota_eval(xs, a):
    if not all(isinstance(d, (int, np.integer)) for d in (*a["shape"], a["start"])):
        return _needs_dims("Iota")(xs, a)
    return [(a["start"] + np.arange(int(np.prod(a["shape"])), dtype=np.int64) * a["delta"]).astype(a["dtype"])
            .reshape(a["shape"])]


register("Iota", "generator", lambda ts, a: [(a["dtype"], tuple(a["shape"]))], _iota_eval)


def _compact_infer(ts, a):
    (dt, shape), (_, keep), (_, pos) = ts
    ax = a["axis"]
    if not 0 <= ax < len(shape) or len(keep) != 1 or len(pos) != 1 or keep[0] != shape[ax] or pos[0] != shape[ax]:
        raise ShapeError(f"Compact: keep {list(keep)} and pos {list(pos)} must be 1-D over axis {ax} of {list(shape)}")
    return [(dt, tuple(a["count"] if d == ax else n for d, n in enumerate(shape)))]


def _compact_eval(xs, a):
    data, keep, pos = xs
    kept = np.flatnonzero(np.asarray(keep))
    order = np.argsort(np.asarray(pos)[kept], kind="stable")
    return [np.ascontiguousarray(np.take(data, kept[order], axis=a["axis"]))]


# out[.., pos[j], ..] = data[.., j, ..] where keep[j] (the kept ``pos`` are 0 .. count - 1, each once)
register("Compact", "gather", _compact_infer, _compact_eval)
