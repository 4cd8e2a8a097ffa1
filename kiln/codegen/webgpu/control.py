"""Compiling graphs with run-time control flow (IR ``If`` and ``Loop`` nodes) into a nested execution plan.

Every graph level (the model, each If branch, each Loop body) is optimised, fused and memory-planned on its
own, with the usual passes; the levels then share one buffer list and one kernel list (shaders deduplicated
by source). A sub-graph's inputs are the enclosing graph's buffers of the values it captures (Loop bodies:
fresh buffers for the iteration number, the condition and the loop-carried values, which the runtime fills);
its activations get buffers of their own, and its outputs are copied into the node's output buffers. The
plan (package format 1.4, docs/package-format.md) holds, besides kernel steps::

    {"copy": [src, dst, bytes]}                          copy_buffer_to_buffer
    {"if": cond_buffer, "then": [steps], "else": [steps]} run one branch; the runtime reads the condition
    {"loop": {...}, "node": name}                        see :func:`_loop_step`
    {"error": message}                                   a branch that cannot run with the compiled shapes

Semantics and costs (a GPU-to-host readback per condition) are in docs/control-flow.md.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.codegen.target import Program
from kiln.codegen.webgpu.build import Kernel, Step, WebGPUKernels
from kiln.ir.graph import Graph, Value
from kiln.passes.fusion import Group, fuse
from kiln.passes.memory_plan import Buffer, MemoryPlan, aligned, plan_memory, storage_bytes


def _nbytes(v: Value) -> int:
    return aligned(storage_bytes(v)) if v.size else 0


class _PlanBuilder:
    """Builds every graph level into one buffer list, one kernel list and a nested plan."""

    def __init__(self, validate: bool, schedule: Callable, max_inputs: int):
        self.schedule, self.max_inputs = schedule, max_inputs
        self.buffers: list[Buffer] = []
        self.of: dict[int, int] = {}
        self.unshared = 0
        self.kernels = WebGPUKernels(validate)
        self.steps: list[Step] = []  # every kernel Step, all levels, in plan order (limits, kiln info)
        self.groups: list[Group] = []

    def buffer(self, kind: str, nbytes: int, names: list[str]) -> int:
        b = Buffer(len(self.buffers), kind, aligned(nbytes), list(names))
        self.buffers.append(b)
        return b.id

    def build(self, graph: Graph, bind: list[int] | None = None) -> list[dict]:
        """Plan ``graph``; ``bind`` gives the global buffers of its inputs (None: the model itself, whose inputs
        and outputs get buffers of their own). Returns its plan steps."""
        groups = fuse(graph, max_inputs=self.max_inputs)
        plan = plan_memory(graph, groups)
        self.groups += groups
        self.unshared += plan.unshared_bytes
        consts: dict[int, Value] = {}
        for g in groups:
            for n in g.nodes:
                for v in n.inputs:
                    if v.is_const and id(v) in plan.of:
                        consts[plan.of[id(v)]] = v
        inputs = {plan.of[id(v)]: k for k, v in enumerate(graph.inputs)}
        local: dict[int, int] = {}
        for b in plan.buffers:
            if b.kind == "weight" and id(consts[b.id]) in self.of:  # a constant another level stores already
                local[b.id] = self.of[id(consts[b.id])]
            elif b.kind == "input" and bind is not None:
                local[b.id] = bind[inputs[b.id]]
            else:
                kind = b.kind if bind is None or b.kind == "weight" else "activation"
                local[b.id] = self.buffer(kind, b.nbytes, b.values)
                if kind == "activation" and b.kind != "activation":  # a sub-graph's result buffer
                    self.unshared += self.buffers[local[b.id]].nbytes
        for key, bid in plan.of.items():
            self.of.setdefault(key, local[bid])
        steps: list[dict] = []
        for g in groups:
            if g.alias or not any(o.size for o in g.nodes[-1].outputs):
                continue
            node = g.nodes[-1]
            if node.op == "If":
                steps.append(self._if_step(node))
            elif node.op == "Loop":
                steps.append(self._loop_step(node))
            else:
                steps.append(self._kernel_step(g))
        return steps

    def _kernel_step(self, g: Group) -> dict:
        step = self.kernels.step(g, self.schedule, MemoryPlan([], self.of, 0))
        self.steps.append(step)
        return {"kernel": step.kernel, "dispatch": list(step.dispatch), "buffers": step.buffers, "node": step.name}

    def _sub(self, graph: Graph | str, bind: list[int], outputs: list[Value]) -> list[dict]:
        """A branch's steps, then copies of its outputs into ``outputs``' buffers."""
        if isinstance(graph, str):
            return [{"error": graph}]
        steps = self.build(graph, bind)
        for src, dst in zip(graph.outputs, outputs):
            if _nbytes(dst) and self.of[id(src)] != self.of[id(dst)]:
                steps.append({"copy": [self.of[id(src)], self.of[id(dst)], _nbytes(dst)]})
        return steps

    def _if_step(self, node) -> dict:
        bind = [self.of[id(v)] for v in node.inputs[1:]]
        return {"if": self.of[id(node.inputs[0])],
                "then": self._sub(node.attrs["then_branch"], bind, node.outputs),
                "else": self._sub(node.attrs["else_branch"], bind, node.outputs), "node": node.name}

    def _loop_step(self, node) -> dict:
        """``{"loop": {trip_count, cond, iteration, cond_in, carried, cond_out, scan, rows, body}}``:

        ``trip_count`` and ``cond``: ``{"buffer": id}``, ``{"value": v}`` (a constant) or null (absent);
        ``iteration``, ``cond_in``: the body's input buffers the runtime writes before each iteration (int32
        iteration number, the condition as int32 0/1), null when the body does not read them; ``carried``:
        ``[initial, body input, body output, loop output, bytes]`` per loop-carried value; ``cond_out``: the
        body's condition output buffer, null when it is a constant true or passes ``cond_in`` through;
        ``scan``: ``[body output, loop output, bytes per iteration]``; ``rows``: iterations the scan outputs
        hold (null without scan outputs).
        """
        a, body = node.attrs, node.attrs["body"]
        ins = list(node.inputs)

        def operand(present: bool) -> dict | None:
            if not present:
                return None
            v = ins.pop(0)
            return {"value": v.const.reshape(-1)[0].item()} if v.is_const else {"buffer": self.of[id(v)]}

        trip, cond = operand(a["has_trip_count"]), operand(a["has_cond"])
        n = a["n_carried"]
        init, captured = ins[:n], ins[n:]
        read = {id(v) for m in body.nodes for v in m.inputs}
        params = [self.buffer("activation", storage_bytes(v), [v.name]) for v in body.inputs[:2 + n]]
        self.unshared += sum(self.buffers[p].nbytes for p in params)
        steps = self.build(body, params + [self.of[id(v)] for v in captured])
        c_out = body.outputs[0]
        src = c_out.producer.inputs[0] if c_out.producer is not None and c_out.producer.op == "Identity" else None
        fixed = src is not None and ((src.is_const and bool(src.const.reshape(-1)[0])) or src is body.inputs[1])
        carried = [[self.of[id(i)], params[2 + k], self.of[id(o)], self.of[id(out)], _nbytes(out)]
                   for k, (i, o, out) in enumerate(zip(init, body.outputs[1:1 + n], node.outputs[:n]))]
        scan = [[self.of[id(o)], self.of[id(out)], _nbytes(o)] for o, out in zip(body.outputs[1 + n:], node.outputs[n:])]
        return {"loop": {"trip_count": trip, "cond": cond,
                         "iteration": params[0] if id(body.inputs[0]) in read else None,
                         "cond_in": params[1] if id(body.inputs[1]) in read else None,
                         "carried": carried, "cond_out": None if fixed else self.of[id(c_out)],
                         "scan": scan, "rows": a.get("scan_rows"), "body": steps}, "node": node.name}


def compile_control(program: Program, validate: bool, schedule: Callable, max_inputs: int
                    ) -> tuple[list[Kernel], list[Step], list[dict]]:
    """Plan every level of ``program.graph`` (which holds run-time If/Loop nodes, already optimised) and build its
    kernels; fills in ``program.groups`` and ``program.plan`` (every level's, sharing one buffer list).

    Returns:
        ``(kernels, every kernel step of every level, the nested plan)`` (JSON-ready, package format 1.4).
    """
    pb = _PlanBuilder(validate, schedule, max_inputs)
    nested = pb.build(program.graph)
    program.groups = pb.groups
    program.plan = MemoryPlan(pb.buffers, pb.of, pb.unshared)
    return pb.kernels.kernels, pb.steps, nested
