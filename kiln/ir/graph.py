"""The graph IR: SSA values, nodes of primitive ops, and graphs.

A :class:`Value` is defined once (by a node, as a graph input, or as a constant)
and carries a dtype and a shape. Shapes are concrete tuples of ints; graph inputs
and outputs also keep the model's symbolic shape (``("N", 3, 224, 224)``) and
``Graph.dims`` records the value each symbol was bound to.

Nodes hold *primitive* ops (see :mod:`kiln.ir.ops`); frontends decompose model
operators into them through :class:`Builder`, which also runs shape inference.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.ir import dtypes

Shape = tuple[int, ...]


@dataclass(eq=False)
class Value:
    """One SSA value: a tensor of ``dtype`` and ``shape``.

    Attributes:
        name: unique name inside its graph.
        dtype: Kiln dtype name (see :mod:`kiln.ir.dtypes`).
        shape: concrete dims.
        const: the data, for constants and weights (``None`` for computed values).
        producer: the node that defines it (``None`` for inputs and constants).
        sym_shape: the model's own shape with symbolic dims, for graph inputs/outputs.
    """

    name: str
    dtype: str
    shape: Shape
    const: np.ndarray | None = None
    producer: Node | None = None
    sym_shape: tuple[int | str, ...] | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes in host memory."""
        return self.size * dtypes.itemsize(self.dtype)

    @property
    def is_const(self) -> bool:
        """True for constants and weights."""
        return self.const is not None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.dtype}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    """One primitive op applied to input values, defining output values."""

    op: str
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.name!r})"


@dataclass(eq=False)
class Graph:
    """A dataflow graph in topological order.

    Attributes:
        nodes: nodes, each after the producers of its inputs.
        inputs: runtime inputs (fed by the user).
        outputs: values returned to the user, in order.
        dims: symbolic dim name -> the concrete value shapes were bound to.
        name: model name.
    """

    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    name: str = "model"

    def consumers(self) -> dict[int, list[Node]]:
        """Map ``id(value)`` -> the nodes that read it (in graph order)."""
        uses: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                uses.setdefault(id(v), []).append(node)
        return uses

    def replace_uses(self, old: Value, new: Value) -> None:
        """Make every reader of ``old`` (nodes and graph outputs) read ``new`` instead.

        If ``old`` is a graph output, ``new`` takes over its name and symbolic shape, so the
        model's interface never changes; ``new`` must then be computed by a node and not
        already be an output (ValueError otherwise: callers keep an Identity instead).
        """
        if any(v is old for v in self.outputs):
            if new.producer is None or any(v is new for v in self.outputs):
                raise ValueError(f"cannot replace graph output %{old.name} by %{new.name}")
            new.name, new.sym_shape = old.name, old.sym_shape
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]


class Builder:
    """Appends primitive nodes to a graph, inferring output dtypes and shapes.

    Frontends call :meth:`op`; shapes come from :mod:`kiln.ir.ops`, so a converter
    never states an output shape by hand. With ``fold=True`` an op whose inputs are all
    constants is evaluated at once (numpy semantics of :mod:`kiln.ir.ops`) and its result
    returned as a constant, so shape computations (``Shape -> Gather -> Concat -> Reshape``)
    are known to later converters that need compile-time values.
    """

    def __init__(self, graph: Graph, fold: bool = False):
        self.graph = graph
        self.fold = fold
        #: set by the ONNX importer: converts a subgraph (If branch) inline, returning its outputs
        self.subgraph = None
        #: set by the ONNX importer: converts a subgraph into a closed Graph of its own (run-time If and Loop)
        self.region = None
        self._names: set[str] = {v.name for v in graph.inputs}
        self._counter = itertools.count()
        self.scope = ""

    def fresh(self, hint: str) -> str:
        """A value name unique in this graph, derived from ``hint``."""
        name = hint or "v"
        while name in self._names:
            name = f"{hint}_{next(self._counter)}"
        self._names.add(name)
        return name

    def const(self, array: np.ndarray | float, name: str = "const", dtype: str | None = None) -> Value:
        """A constant value holding ``array`` (copied; ``dtype`` overrides the array's)."""
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtypes.NUMPY[dtype])
        arr = np.array(arr, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        return Value(self.fresh(name), dtypes.from_numpy(arr.dtype), tuple(arr.shape), const=arr)

    def op(self, op: str, inputs: list[Value], *, name: str = "", nout: int = 1, **attrs: Any) -> Value | list[Value]:
        """Append primitive ``op`` reading ``inputs``; returns its output value (or list when ``nout > 1``).

        Raises:
            ShapeError: when the inputs do not fit the op (from the op's shape rule).
        """
        from kiln.ir import ops

        spec = ops.get(op)
        out_types = spec.infer([(v.dtype, v.shape) for v in inputs], attrs)
        node_name = name or self.scope or op
        if self.fold and inputs and all(v.is_const for v in inputs):
            results = spec.evaluate([v.const for v in inputs], dict(attrs))
            outs = [self.const(r, name=node_name, dtype=dt) for r, (dt, _) in zip(results, out_types)]
            return outs if nout > 1 or len(outs) > 1 else outs[0]
        outs = [Value(self.fresh(f"{node_name}:{i}" if len(out_types) > 1 else node_name), dt, tuple(sh))
                for i, (dt, sh) in enumerate(out_types)]
        node = Node(op, list(inputs), outs, dict(attrs), name=node_name)
        for o in outs:
            o.producer = node
        self.graph.nodes.append(node)
        return outs if nout > 1 or len(outs) > 1 else outs[0]
