"""The WebAssembly target's build: fused groups -> C kernels -> one ``.wasm`` module and its plan
(``targets.wasm``, package format 1.2, docs/package-format.md).

The groups, the memory plan and the buffers are the ones every target shares (a package's weights and
buffers serve every target); only the schedules (:func:`kiln.codegen.wasm.toolchain.wasm_schedule`) and the
code differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.codegen.c_kernels import build_c_kernels
from kiln.codegen.wasm import simd
from kiln.codegen.wasm import toolchain as wasm
from kiln.errors import KilnError
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule

#: module, threaded module and C source paths inside a package
MODULE, THREADS_MODULE, SOURCE = "kernels/kiln.wasm", "kernels/kiln-threads.wasm", "kernels/kiln.c"


def build_wasm(groups: list[Group], plan: MemoryPlan, progress: bool = False, threads: bool = True,
               schedule: Callable[[Tensor], Schedule] = wasm.wasm_schedule) -> wasm.WasmProgram:
    """Generate, deduplicate and compile the kernels of every non-alias group.

    Args:
        groups: fused groups in execution order.
        plan: the memory plan (buffer ids and sizes).
        progress: show a progress bar on stderr.
        threads: also build the shared-memory variant for workers.
        schedule: each kernel's schedule (the target's default: :func:`~kiln.codegen.wasm.toolchain.wasm_schedule`).

    Raises:
        KilnError: a group the kernels do not support (naming its node), or the C compiler failed.
    """
    kernels, steps = build_c_kernels(groups, plan, schedule, simd.vectorize, "wasm", progress)
    layout = wasm.plan_layout([b.nbytes for b in plan.buffers], [b.grow is not None for b in plan.buffers])
    source = simd.PRELUDE + "\n" + "\n".join(k.source for k in kernels)
    module, *rest = wasm.compile_modules(source, layout.pages, (False, True) if threads else (False,),
                                         layout.max_pages)
    for built in (module, *rest):
        top = wasm.heap_base(built)
        if top > wasm.ARENA:
            raise KilnError(f"the wasm module's stacks and data end at {top}, past the buffer arena at {wasm.ARENA}")
    threaded = rest[0] if rest else None
    return wasm.WasmProgram(source, module, layout, kernels, steps, threaded)


def section(program: wasm.WasmProgram) -> tuple[dict[str, Any], dict[str, str | bytes]]:
    """``program``'s manifest entry (``targets.wasm``) and its files (module(s) and C source)."""
    files: dict[str, str | bytes] = {MODULE: program.module, SOURCE: program.source}
    threads = None
    if program.threads_module is not None:
        files[THREADS_MODULE] = program.threads_module
        threads = {"module": THREADS_MODULE, "sha256": wasm.sha256(program.threads_module),
                   "bytes": len(program.threads_module)}
    entry = {
        "module": MODULE,
        "sha256": wasm.sha256(program.module),
        "bytes": len(program.module),
        "source": SOURCE,
        "simd": True,
        "threads": threads,
        "memory": {"bytes": program.layout.bytes, "pages": program.layout.pages, "page_bytes": wasm.PAGE,
                   "arena": wasm.ARENA, "offsets": program.layout.offsets, "align": wasm.ALIGN, "slack": wasm.SLACK,
                   **({"max_pages": program.layout.max_pages} if program.layout.grows else {})},
        "kernels": [{"name": k.name, "export": k.name, "params": len(k.params), "ops": k.ops,
                     "schedule": k.schedule, "vectorized": k.vectorized} for k in program.kernels],
        "plan": [s.to_json() for s in program.steps],
    }
    return entry, files
