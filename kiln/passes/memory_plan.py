"""Memory planning: activations share buffers by liveness.

Every kernel-produced value gets a live interval ``[def, last use]`` over the
kernel sequence (a reshape alias extends its source's interval). Intervals are
assigned to shared buffers greedily by size, largest first, each to the smallest
buffer that is free for its whole interval (growing the largest free one if none
is big enough): the "greedy by size" strategy of TFLite's GPU delegate for shared
objects. Graph inputs and outputs get buffers of their own so the runtime can
write and read them at any time; weights get one buffer each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.arith import symbolic
from kiln.arith.expr import call, const
from kiln.errors import KilnError
from kiln.ir import dtypes, ops
from kiln.ir.graph import Graph, Node, Value
from kiln.package.format import STORAGE
from kiln.passes.fusion import FUSIBLE, Group


def needs_buffer(node: Node, v: Value) -> bool:
    """Whether constant ``v`` read by ``node`` lives in a buffer (scalars of elementwise ops become literals)."""
    return v.size != 1 or ops.kind(node.op) not in ("binary", "ternary")


def max_size(v: Value) -> int:
    """Elements of ``v``; for a shape with run-time dims, the most for any dims in bounds
    (:func:`kiln.arith.symbolic.upper`), or, for one that grows with a growable dim, its size at the dims' lower
    bounds (the buffer's first size; it grows at run time: :func:`kiln.arith.symbolic.planned`)."""
    size = v.size
    if not isinstance(size, int):
        size = symbolic.planned(size)
    return size


def storage_bytes(v: Value) -> int:
    """Bytes ``v`` takes in a WebGPU buffer (its dtype's storage element type, see ``package.format.STORAGE``);
    for a shape with run-time dims, the most it takes for any dims in bounds (:func:`max_size`)."""
    return max_size(v) * dtypes.itemsize(STORAGE.get(v.dtype, v.dtype))


def fits_half(a) -> bool:
    """Whether every finite value of array ``a`` is within f16's range (|x| <= 65504): fp16 compute
    stores such weights as f16 and keeps the others (an attention mask's -3.4e38, say) in f32."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    return finite.size == 0 or float(np.abs(finite).max()) <= 65504.0


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 4 (WebGPU storage bindings), at least 4."""
    return max(4, (nbytes + 3) // 4 * 4)


def aligned_expr(nbytes: Any) -> Any:
    """:func:`aligned` of a size expression (bytes of a growable value)."""
    e = symbolic.simplify((symbolic._expr(nbytes) + 3) // 4 * 4)
    return symbolic.simplify(call("max", symbolic._expr(e), const(4, "int32")))


@dataclass
class Buffer:
    """A device buffer of the plan.

    Attributes:
        id: index in :attr:`MemoryPlan.buffers`.
        kind: ``input``, ``output``, ``weight``, ``activation`` or ``state`` (an input the runtime keeps between
            runs, updated in place: :attr:`Graph.state`).
        nbytes: size (a multiple of 4); for a growable buffer, its first size (the growable dims at their lower
            bounds).
        values: names of the values stored in it over the run.
        grow: for a buffer whose size grows with a growable dim (docs/dynamic-shapes.md, *Growable buffers*), its
            bytes as a size expression (a multiple of 4): the runtimes make it at least that large for the run's
            dims; None for a buffer of fixed size.
    """

    id: int
    kind: str
    nbytes: int
    values: list[str] = field(default_factory=list)
    grow: Any = None

    def take(self, nbytes: int, grow: Any = None) -> None:
        """Make the buffer large enough for a value of ``nbytes`` (its first size) and, when it grows, ``grow``
        bytes (a size expression): the buffer's :attr:`grow` becomes the larger of the two expressions."""
        if grow is not None or self.grow is not None:
            a = self.grow if self.grow is not None else self.nbytes
            b = grow if grow is not None else nbytes
            self.grow = symbolic.max_of(symbolic.max_terms(a) + symbolic.max_terms(b))
        self.nbytes = max(self.nbytes, nbytes)


@dataclass
class MemoryPlan:
    """Value -> buffer assignment.

    Attributes:
        buffers: all buffers.
        of: ``id(value)`` -> buffer id (aliases included).
        unshared_bytes: activation bytes if every activation had its own buffer.
    """

    buffers: list[Buffer]
    of: dict[int, int]
    unshared_bytes: int
    #: ``id(value)`` of the values stored as f16 (fp16 compute: float weights and activations)
    half: set[int] = field(default_factory=set)

    def storage(self, v: Value) -> str:
        """The element type ``v``'s buffer holds: ``float16`` for an f16-stored value, else its
        dtype's (``package.format.STORAGE``)."""
        return "float16" if id(v) in self.half else STORAGE.get(v.dtype, v.dtype)

    def bytes(self, kind: str) -> int:
        """Total bytes of buffers of ``kind``."""
        return sum(b.nbytes for b in self.buffers if b.kind == kind)


def mark_in_place(graph: Graph, enabled: bool = True) -> None:
    """Set ``in_place=1`` on every ``TensorScatter`` that may write into its cache's buffer (``in_place=0`` on all
    unless ``enabled``: a target without partial writes): the cache is a graph input nothing else reads but the
    scatter and what it depends on (they run before it: a run counter's ``counter + 1``), and no
    kernel fuses the result away (its readers are not elementwise). The kernel then writes only the update's rows
    (:func:`kiln.kernels.index.tensor_scatter`) and :func:`plan_memory` gives the result the input's buffer.

    Raises:
        KilnError: ``enabled`` and a state pair (:attr:`Graph.state`) whose output is not such a scatter of its input.
    """
    uses = graph.consumers()
    inputs = {id(v) for v in graph.inputs}
    outputs = {id(v) for v in graph.outputs}
    done = {}
    for node in graph.nodes:
        if node.op == "TensorScatter":
            past, out = node.inputs[0], node.outputs[0]
            ok = enabled and id(past) in inputs and id(past) not in outputs and \
                _read_only_before(node, uses.get(id(past), [])) and \
                all(ops.kind(n.op) not in FUSIBLE for n in uses.get(id(out), []))
            node.attrs["in_place"] = int(ok)
            if ok:
                done[past.name] = out.name
    for name, update in graph.state.items() if enabled else ():  # (disabled: the runtime copies it back)
        if done.get(name) != update:
            raise KilnError(f"state {name!r}: its next value {update!r} is not an in-place TensorScatter of it")


def _read_only_before(node, readers) -> bool:
    """Whether every reader of a scatter's cache but ``node`` itself is one ``node`` depends on (so it runs first)."""
    others = [n for n in readers if n is not node]
    if not others:
        return True
    before = _ancestors(node)
    return all(id(n) in before for n in others)


def _ancestors(node) -> set[int]:
    """``id`` of every node ``node`` depends on (its inputs' producers, transitively)."""
    seen: set[int] = set()
    todo = [v.producer for v in node.inputs if v.producer is not None]
    while todo:
        n = todo.pop()
        if id(n) not in seen:
            seen.add(id(n))
            todo += [v.producer for v in n.inputs if v.producer is not None]
    return seen


#: ops whose result equals one of their input's elements (a maximum of maxima is an element's value)
_SELECTING = ("ReduceMax", "ReduceMin", "Reshape", "Identity")


def _compared_exactly(graph: Graph) -> set[int]:
    """``id`` of the values an ``ArgMax``/``ArgMin`` compares its input with (its second input), and of the values
    they select from (a split reduction's parts' maxima): kept f32 by :func:`plan_memory`'s ``half``."""
    todo = [n.inputs[1] for n in graph.nodes if n.op in ("ArgMax", "ArgMin") and len(n.inputs) == 2]
    exact: set[int] = set()
    while todo:
        v = todo.pop()
        if id(v) in exact:
            continue
        exact.add(id(v))
        if v.producer is not None and v.producer.op in _SELECTING:
            todo += v.producer.inputs[:1]
    return exact


def plan_memory(graph: Graph, groups: list[Group], half: bool = False) -> MemoryPlan:
    """Assign every value the kernels touch to a buffer (see the module docstring).

    With ``half`` (fp16 compute) float weights and activations are stored as f16, 2 bytes an
    element (buffer sizes still rounded up to 4 bytes), except weights with finite values beyond
    f16's range (see :func:`fits_half`); model inputs and outputs keep their storage type, so the
    first and last kernels convert them. The maximum (minimum) an ``ArgMax`` (``ArgMin``) compares its input with
    keeps f32: rounded to f16 it would equal no element of an f32 input (a language model's f32 logits), and the
    arg max would be its "not found" index.
    """
    buffers: list[Buffer] = []
    of: dict[int, int] = {}
    io = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs}
    exact = _compared_exactly(graph)
    halves: set[int] = set()

    def nbytes(v: Value) -> int:
        if half and dtypes.is_float(v.dtype) and id(v) not in io | exact and \
                (not v.is_const or fits_half(v.const)):
            halves.add(id(v))
            return max_size(v) * 2
        return storage_bytes(v)

    def grows(v: Value) -> Any:  # the aligned bytes of a value that grows with a growable dim, else None
        if not symbolic.grows(v.size):
            return None
        item = 2 if id(v) in halves else dtypes.itemsize(STORAGE.get(v.dtype, v.dtype))
        return aligned_expr(symbolic.simplify(symbolic._expr(v.size) * item))

    def new(kind: str, v: Value) -> int:
        if kind in ("input", "output", "state"):
            io.add(id(v))
        b = Buffer(len(buffers), kind, aligned(nbytes(v)), [v.name], grows(v))
        buffers.append(b)
        of[id(v)] = b.id
        return b.id

    state = set(graph.state)
    for v in graph.inputs:
        new("state" if v.name in state else "input", v)
    root: dict[int, Value] = {}
    for g in groups:
        if g.alias:
            src = g.inputs[0]
            root[id(g.output)] = root.get(id(src), src)
        elif g.nodes[-1].op == "TensorScatter" and g.nodes[-1].attrs.get("in_place"):
            # an in-place cache update: the result is the cache's own buffer
            root[id(g.output)] = src = g.nodes[-1].inputs[0]
            of[id(g.output)] = of[id(src)]
            buffers[of[id(src)]].values.append(g.output.name)
    for v in graph.outputs:
        r = root.get(id(v), v)
        if id(r) not in of and not r.is_const:
            new("output", r)
    for g in groups:
        for node in g.nodes:
            for v in node.inputs:
                if v.is_const and id(v) not in of and needs_buffer(node, v):
                    new("weight", v)
    # activation live intervals over the kernel sequence
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    vals: dict[int, Value] = {}
    for step, g in enumerate(groups):
        for v in g.inputs:
            r = root.get(id(v), v)
            if id(r) in start:
                end[id(r)] = step
        if not g.alias:
            last = g.nodes[-1]  # a control-flow group (If, Loop) writes every output of its node
            for r in last.outputs if ops.kind(last.op) == "control" else [g.output]:
                if id(r) not in of:  # (a value an alternative group computes again lives from its first producer)
                    start.setdefault(id(r), step)
                    end[id(r)] = step
                    vals[id(r)] = r
    unshared = sum(aligned(nbytes(vals[k])) for k in start)
    slots: list[tuple[Buffer, list[tuple[int, int]]]] = []
    for key in sorted(start, key=lambda k: (-nbytes(vals[k]), start[k])):
        v, lo, hi = vals[key], start[key], end[key]
        size = aligned(nbytes(v))
        free = [(b, iv) for b, iv in slots if all(hi < a or lo > z for a, z in iv)]
        fits = [s for s in free if s[0].nbytes >= size]
        if fits:
            b, iv = min(fits, key=lambda s: s[0].nbytes)
        elif free:
            b, iv = max(free, key=lambda s: s[0].nbytes)
        else:
            b = Buffer(len(buffers), "activation", size)
            buffers.append(b)
            iv = []
            slots.append((b, iv))
        b.take(size, grows(v))
        iv.append((lo, hi))
        b.values.append(v.name)
        of[key] = b.id
    for g in groups:
        if g.alias:
            src = g.inputs[0]
            r = root.get(id(src), src)
            if id(r) in of:
                of[id(g.output)] = of[id(r)]
                if g.output.name not in buffers[of[id(r)]].values:
                    buffers[of[id(r)]].values.append(g.output.name)
                if id(r) in halves:
                    halves.add(id(g.output))
    return MemoryPlan(buffers, of, unshared, halves)
