"""Control flow whose condition is known only at run time: ONNX If and Loop as IR ``If``/``Loop`` nodes.

Branches and loop bodies become closed sub-graphs (:meth:`Builder.region`); the compiler builds each into
its own plan steps and the runtimes choose or repeat them at run time (docs/control-flow.md). An If whose
condition folds at compile time is inlined instead (:func:`kiln.frontend.onnx.ops.tensor.if_`).
"""

from __future__ import annotations

import warnings

import numpy as np

from kiln.errors import ConstantInputError, KilnError, ShapeError
from kiln.frontend.onnx.registry import onnx_op
from kiln.ir.graph import Builder, Value

#: int32's largest value: trip counts are stored in 32 bits, so a larger constant M means "no limit"
_INT32_MAX = int(np.iinfo(np.int32).max)


def _union(captures: list[list[tuple[Value, Value]]]) -> list[Value]:
    seen: dict[int, Value] = {}
    for pairs in captures:
        for outer, _ in pairs:
            seen.setdefault(id(outer), outer)
    return list(seen.values())


def runtime_if(b: Builder, cond: Value, then_branch, else_branch) -> list[Value] | Value:
    """ONNX If with a condition computed at run time: both branches as sub-graphs of one IR ``If`` node.

    Both branches must give the same output dtypes and shapes. A branch that cannot be built for the bound
    shapes (its conversion raises ShapeError, as silero_vad's 8 kHz branch does for 16 kHz input lengths)
    is kept as its error message with a warning: taking it at run time raises that error.

    Raises:
        ShapeError: the condition is not one element, or the branches' outputs differ, or neither
            branch can be built.
    """
    if cond.size != 1:
        raise ShapeError(f"If: the condition must hold one element, got shape {list(cond.shape)}")
    graphs: list = []
    captures: list[list[tuple[Value, Value]]] = []
    errors = []
    for which, proto in (("then", then_branch), ("else", else_branch)):
        try:
            g, caps = b.region(proto, [])
        except ShapeError as e:
            errors.append(e)
            g, caps = f"If {b.scope!r}: the {which} branch cannot run with the compiled shapes ({e})", []
            warnings.warn(g + "; taking it at run time raises an error", stacklevel=2)
        graphs.append(g)
        captures.append(caps)
    if len(errors) == 2:
        raise errors[0]
    outer = _union(captures)
    for g, caps in zip(graphs, captures):
        if isinstance(g, str):
            continue
        mine = {id(o): i for o, i in caps}
        g.inputs = [mine.get(id(o)) or Value(b.fresh(f"{o.name}_unused"), o.dtype, o.shape) for o in outer]
    return b.op("If", [cond, *outer], then_branch=graphs[0], else_branch=graphs[1])


#: most iterations a Loop with a constant trip count is unrolled over (longer loops run at run time)
MAX_UNROLL = 64


def _unroll(b: Builder, m: Value | None, cond: Value | None, carried: list[Value], body) -> list[Value] | None:
    """A Loop whose trip count is a constant of at most :data:`MAX_UNROLL` and whose condition is constant in
    every iteration, converted inline once per iteration (the iteration number a constant in each, so indexing
    by it folds); its scan outputs are stacked with Concat. Returns None, leaving the graph as it was, when the
    loop is not such a loop."""
    if m is None or not m.is_const or (cond is not None and not cond.is_const):
        return None
    trips = int(m.const.reshape(-1)[0])
    if trips > MAX_UNROLL:
        return None
    mark = len(b.graph.nodes)
    go = bool(cond.const.reshape(-1)[0]) if cond is not None else True
    values, scans = list(carried), []
    try:
        for i in range(trips):
            if not go:
                break
            outs = b.subgraph(body, [b.const(np.array(i, np.int64), name="iteration_num"),
                                     b.const(np.array(go), name="cond"), *values])
            if not outs[0].is_const:
                raise _NotUnrollable
            go = bool(outs[0].const.reshape(-1)[0])
            values = outs[1:1 + len(carried)]
            scans.append(outs[1 + len(carried):])
    except (_NotUnrollable, KilnError):  # a condition computed at run time, or a body that needs it: run-time Loop
        del b.graph.nodes[mark:]
        return None
    n_scan = len(body.output) - 1 - len(carried)
    if n_scan and not scans:
        raise ShapeError("Loop: runs no iteration, so Kiln cannot tell the shapes of its (empty) scan outputs")
    stacked = []
    for k in range(n_scan):
        rows = [b.op("Reshape", [s[k]], shape=(1, *s[k].shape)) for s in scans]
        stacked.append(rows[0] if len(rows) == 1 else b.op("Concat", rows, axis=0))
    return [*values, *stacked]


class _NotUnrollable(Exception):
    pass


@onnx_op("Loop", since=1)
def loop(b: Builder, m: Value | None, cond: Value | None, *v_initial: Value, body) -> list[Value] | Value:
    """ONNX Loop-1/11/13/16/19/21 run at run time: ``for i in range(M) while cond``, the body's loop-carried
    values fed back each iteration, its scan outputs stacked along a new first axis.

    Loop-carried values must keep their dtype and shape; scan outputs need M known at compile time (a loop
    that stops early through its condition then fails at run time, naming the iteration count). A constant
    M beyond int32's range (exporters write INT64_MAX for "while" loops) counts as no trip count.

    Raises:
        KilnError: neither M nor cond is given (the loop would never end).
        ShapeError: a loop-carried value changes shape.
        ConstantInputError: scan outputs with a trip count known only at run time.
    """
    if m is not None and m.is_const and int(m.const.reshape(-1)[0]) > _INT32_MAX:
        m = None
    if m is None and cond is None:
        raise KilnError("Loop: neither a trip count M nor a condition is given; the loop would never end")
    unrolled = _unroll(b, m, cond, list(v_initial), body)
    if unrolled is not None:
        return unrolled
    params = [Value(b.fresh("iteration_num"), "int64", ()), Value(b.fresh("cond_in"), "bool", ()),
              *[Value(b.fresh(f"{v.name}_carried"), v.dtype, v.shape) for v in v_initial]]
    graph, caps = b.region(body, params)
    n = len(v_initial)
    rows = None
    if len(graph.outputs) > 1 + n:
        if m is None or not m.is_const:
            raise ConstantInputError("Loop: scan outputs need a trip count M known at compile time (their size "
                                     "depends on data otherwise)", m.name if m is not None else None)
        rows = max(int(m.const.reshape(-1)[0]), 0)
        if cond is not None and cond.is_const and not bool(cond.const.reshape(-1)[0]):
            rows = 0
    inputs = [x for x in (m, cond) if x is not None] + list(v_initial) + [o for o, _ in caps]
    return b.op("Loop", inputs, body=graph, has_trip_count=m is not None, has_cond=cond is not None, n_carried=n,
                scan_rows=rows)
