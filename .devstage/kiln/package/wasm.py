"""The ``targets.wasm`` section of a package (format 1.2; see docs/package-format.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.codegen.wasm import ARENA, PAGE, WasmProgram, sha256

#: module, threaded module and C source paths inside a package
MODULE, THREADS_MODULE, SOURCE = "kernels/kiln.wasm", "kernels/kiln-threads.wasm", "kernels/kiln.c"


def write_wasm_target(program: WasmProgram, root: Path) -> dict[str, Any]:
    """Write ``program``'s module(s) and C source under ``root``; return its manifest entry."""
    (root / "kernels").mkdir(exist_ok=True)
    (root / MODULE).write_bytes(program.module)
    (root / SOURCE).write_text(program.source)
    threads = None
    if program.threads_module is not None:
        (root / THREADS_MODULE).write_bytes(program.threads_module)
        threads = {"module": THREADS_MODULE, "sha256": sha256(program.threads_module),
                   "bytes": len(program.threads_module)}
    return {
        "module": MODULE,
        "sha256": sha256(program.module),
        "bytes": len(program.module),
        "source": SOURCE,
        "simd": True,
        "threads": threads,
        "memory": {"bytes": program.layout.bytes, "pages": program.layout.pages, "page_bytes": PAGE,
                   "arena": ARENA, "offsets": program.layout.offsets},
        "kernels": [{"name": k.name, "export": k.export, "params": k.params, "ops": k.ops,
                     "schedule": k.schedule, "vectorized": k.vectorized} for k in program.kernels],
        "plan": [{"kernel": s.kernel, "buffers": s.buffers, "total": s.total, "node": s.name} for s in program.steps],
    }
