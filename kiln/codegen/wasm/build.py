"""The compiler driver's WebAssembly half: fused groups -> C kernels -> one ``.wasm`` module and its plan.

The groups, the memory plan and the buffers are the ones the WebGPU target uses (a package's
weights and buffers serve every target); only the schedules (:func:`kiln.codegen.wasm.wasm_schedule`)
and the code differ.
"""

from __future__ import annotations

import hashlib

from kiln.codegen import c, wasm
from kiln.errors import KilnError
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.lower import lower


def build_wasm(groups: list[Group], plan: MemoryPlan, progress: bool = False, threads: bool = True) -> wasm.WasmProgram:
    """Generate, deduplicate and compile the kernels of every non-alias group.

    Args:
        groups: fused groups in execution order.
        plan: the memory plan (buffer ids and sizes).
        progress: show a progress bar on stderr.
        threads: also build the shared-memory variant for workers.

    Raises:
        KilnError: a group the kernels do not support, or the C compiler failed.
    """
    from kiln.compiler import group_expr

    kernels: list[wasm.WasmKernel] = []
    sources: list[str] = []
    by_source: dict[str, int] = {}
    steps: list[wasm.WasmStep] = []
    work = [g for g in groups if not g.alias and g.output.size]
    it = work
    if progress:
        from rich.progress import track

        it = track(work, description="generating wasm kernels", transient=True)
    for g in it:
        final = group_expr(g)
        sched = wasm.wasm_schedule(final)
        k = lower(final, sched, name=g.name)
        desc = " -> ".join(n.op for n in g.nodes) + f" {list(g.output.shape)}"
        src, vectorized = c.render(k, "KILN_NAME", wasm.grid_shape(final.shape, sched), desc)
        digest = hashlib.sha256(src.encode()).hexdigest()
        if digest not in by_source:
            export = f"k{len(kernels):03d}_{g.name}"[:64]
            export = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in export)
            by_source[digest] = len(kernels)
            sources.append(src.replace("KILN_NAME", export))
            kernels.append(wasm.WasmKernel(export, export, len(k.params), [n.op for n in g.nodes],
                                           sched.to_json(), vectorized))
        bufs = [plan.of[id(t.attrs["value"])] for t in k.inputs] + [plan.of[id(g.output)]]
        steps.append(wasm.WasmStep(by_source[digest], bufs, k.total, g.nodes[0].name))
    layout = wasm.plan_layout([b.nbytes for b in plan.buffers])
    source = c.PRELUDE + "\n" + "\n".join(sources)
    module, *rest = wasm.compile_modules(source, layout.pages, (False, True) if threads else (False,))
    top = wasm.heap_base(module)
    if top > wasm.ARENA:
        raise KilnError(f"the wasm module's stack and data end at {top}, past the buffer arena at {wasm.ARENA}")
    threaded = rest[0] if rest else None
    return wasm.WasmProgram(source, module, layout, kernels, steps, threaded)
