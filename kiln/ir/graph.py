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

from kiln.arith import symbolic
from kiln.errors import KilnError
from kiln.ir import dtypes, ops
from kiln.ir.shape_fold import fold, materialize_inputs

Shape = tuple[int, ...]


#: the largest constant (bytes) Kiln folds on the host: a WebGPU binding holds at most 2 GiB (gpuweb/gpuweb#6338),
#: so no package runs a bigger tensor, and a malformed model cannot make the compiler allocate more for one
MAX_CONSTANT_BYTES = 1 << 31


def check_constant_size(op: str, node: str, out_types) -> None:
    """Refuse folding ``op`` (node ``node``) into constants of the ``(dtype, shape)`` ``out_types`` when one would
    take more than :data:`MAX_CONSTANT_BYTES` on the host.

    Raises:
        KilnError: naming the node, the size and the bound.
    """
    for dtype, shape in out_types:
        size = int(np.prod([int(d) for d in shape], dtype=object)) * dtypes.itemsize(dtype)
        if size > MAX_CONSTANT_BYTES:
            raise KilnError(f"{op} node {node!r} makes a constant {dtype}{list(shape)} of {size / 2**30:.3g} GiB, "
                            f"beyond the {MAX_CONSTANT_BYTES >> 30} GiB Kiln allows a tensor (a WebGPU binding's "
                            "most); the model is malformed or needs its dims bound smaller")


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
    def size(self) -> Any:
        """Number of elements (a size expression when the shape has run-time dims)."""
        if any(not isinstance(d, (int, np.integer)) for d in self.shape):
            return symbolic.prod(self.shape)
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> Any:
        """Bytes in host memory (a size expression when the shape has run-time dims)."""
        return self.size * dtypes.itemsize(self.dtype)

    @property
    def is_static(self) -> bool:
        """True when every dim is an int (no run-time dims)."""
        return all(isinstance(d, (int, np.integer)) for d in self.shape)

    @property
    def is_shape_const(self) -> bool:
        """True for a constant holding size expressions (an object array: ``Shape`` of a run-time dim)."""
        return self.const is not None and self.const.dtype == object

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
    #: run-time dims (docs/dynamic-shapes.md): name -> its size symbol, in uniform order; empty when static
    size_vars: dict[str, Any] = field(default_factory=dict)
    #: growable run-time dims whose upper bound the import inferred from the model: name -> why (``seq <= 512: a
    #: Slice ends at seq on an axis of 512``)
    inferred_bounds: dict[str, str] = field(default_factory=dict)
    #: run-time dims bound by an input's value rather than by a shape: input name -> dim name (an integer ``[1]``
    #: input such as a decoder's ``past_sequence_length``)
    value_dims: dict[str, str] = field(default_factory=dict)
    #: state: input name -> the output that is its next value (a KV cache updated by an in-place TensorScatter);
    #: packages keep both in one buffer between runs, neither fed nor read back (docs/package-format.md, *State*)
    state: dict[str, str] = field(default_factory=dict)
    #: sums of run-time dims bounded together: ``((dim names), most)`` (a decoder's ``past_sequence + sequence``
    #: fits its cache); runtimes refuse dims beyond
    dim_limits: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    #: data-dependent dims (NonZero's count; docs/dynamic-shapes.md): run-time dim name -> the int32 ``[1]`` value
    #: holding it, computed by the graph (a hidden graph output, kept out of the package's outputs); the runtimes
    #: read it back after the step computing it and bind the dim for the steps after
    data_dims: dict[str, Value] = field(default_factory=dict)

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
        self.data_dims = {k: new if v is old else v for k, v in self.data_dims.items()}


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
        #: bounds the user stated for data-dependent dims (``--dim NonZero_3.count=0..100``): name -> (lo, hi)
        self.data_bounds: dict[str, tuple[int, int]] = {}

    @classmethod
    def beside(cls, graph: Graph) -> Builder:
        """A builder of new nodes for ``graph`` that appends them to a graph of its own (``.graph.nodes``, for a pass
        to splice in where they belong), naming values apart from every value ``graph`` has."""
        b = cls(Graph())
        b._names |= {v.name for n in graph.nodes for v in (*n.inputs, *n.outputs)} | {v.name for v in graph.inputs}
        return b

    def fresh(self, hint: str) -> str:
        """A value name unique in this graph, derived from ``hint``."""
        name = hint or "v"
        while name in self._names:
            name = f"{hint}_{next(self._counter)}"
        self._names.add(name)
        return name

    def data_dim(self, count: Value, most: Any, hint: str) -> Any:
        """A new data-dependent run-time dim (docs/dynamic-shapes.md *Data-dependent shapes*) whose value is the
        element of ``count`` (an int32 ``[1]`` value computed by the graph) at run time, at most ``most`` (a dim:
        its upper bound): the shapes after a NonZero or a Compress. ``count`` becomes a hidden graph output
        (:attr:`Graph.data_dims`). Bounds the user stated for the dim's name (:attr:`data_bounds`) narrow its
        bounds: buffers are planned for the stated ``hi``, and a run whose count exceeds it is a ShapeError.

        Raises:
            KilnError: ``count`` is not a computed int32 ``[1]`` value, ``most`` does not fit in int32, or grows with
                a growable dim (the buffers sized by the count would have no bound).
        """
        if symbolic.grows(most):
            names = ", ".join(s.name for s in symbolic.symbols(most) if s.grow)
            raise KilnError(f"data-dependent dim {hint!r}: its bound {symbolic.to_text(most)} grows with {names}, "
                            f"which have no upper bound; give them one (--dim NAME=LO..HI)")
        hi = symbolic.upper(most)
        if count.dtype != "int32" or tuple(count.shape) != (1,) or count.producer is None:
            raise KilnError(f"data-dependent dim {hint!r}: its count must be a computed int32 [1] value, got "
                            f"%{count.name} {count.dtype}{list(count.shape)}")
        name = hint
        k = 0
        while name in self.graph.size_vars or name in self.graph.dims:
            k += 1
            name = f"{hint}_{k}"
        lo = 0
        if name in self.data_bounds:
            lo, stated = self.data_bounds[name]
            hi = min(int(hi), stated)
            if lo > hi:
                raise KilnError(f"data-dependent dim {name}: stated bounds {lo}..{stated} are above its most, {hi}")
        dim = symbolic.size_var(name, len(self.graph.size_vars), lo, int(hi), int(hi))
        self.graph.size_vars[name] = dim
        self.graph.data_dims[name] = count
        self.graph.outputs.append(count)
        return dim

    def const(self, array: np.ndarray | float, name: str = "const", dtype: str | None = None) -> Value:
        """A constant value holding ``array`` (copied; ``dtype`` overrides the array's).

        An object array of size expressions (a shape with run-time dims, :mod:`kiln.arith.symbolic`) stays one,
        of dtype ``dtype`` (default int64), unless every element simplifies to an int.
        """
        arr = np.asarray(array)
        if arr.dtype == object:
            flat = [symbolic.simplify(x) if not isinstance(x, (bool, np.bool_)) else x for x in arr.reshape(-1)]
            dtype = dtype or "int64"
            if any(symbolic.is_symbolic(x) for x in flat):
                obj = np.empty(len(flat), object)
                obj[:] = flat
                return Value(self.fresh(name), dtype, tuple(arr.shape), const=obj.reshape(arr.shape))
            arr = np.array(flat, dtype=dtypes.NUMPY[dtype]).reshape(arr.shape)
        if dtype is not None:
            arr = arr.astype(dtypes.NUMPY[dtype])
        arr = np.array(arr, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        return Value(self.fresh(name), dtypes.from_numpy(arr.dtype), tuple(arr.shape), const=arr)

    def op(self, op: str, inputs: list[Value], *, name: str = "", nout: int = 1, **attrs: Any) -> Value | list[Value]:
        """Append primitive ``op`` reading ``inputs``; returns its output value (or list when ``nout > 1``).

        Raises:
            ShapeError: when the inputs do not fit the op (from the op's shape rule).
        """
        spec = ops.get(op)
        out_types = spec.infer([(v.dtype, v.shape) for v in inputs], attrs)
        node_name = name or self.scope or op
        static_out = all(all(isinstance(d, (int, np.integer)) for d in sh) for _, sh in out_types)
        if self.fold and inputs and all(v.is_const for v in inputs) and static_out:
            check_constant_size(op, node_name, out_types)
            results = None
            if any(v.is_shape_const for v in inputs):
                results = fold(op, [v.const for v in inputs], dict(attrs), out_types)
            else:
                results = spec.evaluate([v.const for v in inputs], dict(attrs))
            if results is not None:
                outs = [self.const(r, name=node_name, dtype=dt) for r, (dt, _) in zip(results, out_types)]
                return outs if nout > 1 or len(outs) > 1 else outs[0]
        if any(v.is_shape_const for v in inputs):
            inputs = materialize_inputs(self, op, inputs)
        outs = [Value(self.fresh(f"{node_name}:{i}" if len(out_types) > 1 else node_name), dt, tuple(sh))
                for i, (dt, sh) in enumerate(out_types)]
        node = Node(op, list(inputs), outs, dict(attrs), name=node_name)
        for o in outs:
            o.producer = node
        self.graph.nodes.append(node)
        return outs if nout > 1 or len(outs) > 1 else outs[0]
