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

from kiln.ir import dtypes, ops
from kiln.ir.graph import Graph, Node, Value
from kiln.passes.fusion import Group


def needs_buffer(node: Node, v: Value) -> bool:
    """Whether constant ``v`` read by ``node`` lives in a buffer (scalars of elementwise ops become literals)."""
    return v.size != 1 or ops.kind(node.op) not in ("binary", "ternary")


def storage_bytes(v: Value) -> int:
    """Bytes ``v`` takes in a WebGPU buffer (its dtype's storage element type, see ``package.format.STORAGE``);
    for a shape with run-time dims, the most it takes for any dims in bounds (:func:`kiln.te.symbolic.upper`)."""
    size = v.size
    if not isinstance(size, int):
        from kiln.te import symbolic

        size = symbolic.upper(size)
    return size * dtypes.storage_itemsize(v.dtype)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 4 (WebGPU storage bindings), at least 4."""
    return max(4, (nbytes + 3) // 4 * 4)


@dataclass
class Buffer:
    """A device buffer of the plan.

    Attributes:
        id: index in :attr:`MemoryPlan.buffers`.
        kind: ``input``, ``output``, ``weight`` or ``activation``.
        nbytes: size (a multiple of 4).
        values: names of the values stored in it over the run.
    """

    id: int
    kind: str
    nbytes: int
    values: list[str] = field(default_factory=list)


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

    def bytes(self, kind: str) -> int:
        """Total bytes of buffers of ``kind``."""
        return sum(b.nbytes for b in self.buffers if b.kind == kind)


def plan_memory(graph: Graph, groups: list[Group]) -> MemoryPlan:
    """Assign every value the kernels touch to a buffer (see the module docstring)."""
    buffers: list[Buffer] = []
    of: dict[int, int] = {}

    def new(kind: str, v: Value) -> int:
        b = Buffer(len(buffers), kind, aligned(storage_bytes(v)), [v.name])
        buffers.append(b)
        of[id(v)] = b.id
        return b.id

    for v in graph.inputs:
        new("input", v)
    root: dict[int, Value] = {}
    for g in groups:
        if g.alias:
            src = g.inputs[0]
            root[id(g.output)] = root.get(id(src), src)
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
            r = g.output
            if id(r) not in of:
                start[id(r)] = end[id(r)] = step
                vals[id(r)] = r
    unshared = sum(aligned(storage_bytes(vals[k])) for k in start)
    slots: list[tuple[Buffer, list[tuple[int, int]]]] = []
    for key in sorted(start, key=lambda k: (-storage_bytes(vals[k]), start[k])):
        v, lo, hi = vals[key], start[key], end[key]
        size = aligned(storage_bytes(v))
        free = [(b, iv) for b, iv in slots if all(hi < a or lo > z for a, z in iv)]
        fits = [s for s in free if s[0].nbytes >= size]
        if fits:
            b, iv = min(fits, key=lambda s: s[0].nbytes)
        elif free:
            b, iv = max(free, key=lambda s: s[0].nbytes)
            b.nbytes = size
        else:
            b = Buffer(len(buffers), "activation", size)
            buffers.append(b)
            iv = []
            slots.append((b, iv))
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
    return MemoryPlan(buffers, of, unshared)
