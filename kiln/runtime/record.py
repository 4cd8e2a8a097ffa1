"""Recording a plan's dispatches through wgpu-native's C API from a loop in C.

A decode step of a language model is a few hundred dispatches, each three calls into wgpu-native
(``wgpuComputePassEncoderSetPipeline`` when the pipeline changes, ``wgpuComputePassEncoderSetBindGroup``,
``wgpuComputePassEncoderDispatchWorkgroups``; webgpu.h). Made from Python through cffi they cost about 2 us a
dispatch on a fast host (the interpreter's loop, argument conversion and the GIL given up and taken back around
every call), a third of the host's time a step. :class:`Recorder` makes them from a loop in C instead, walking
arrays of the plan's pipeline and bind group handles and the run's workgroup counts: one call from Python a
compute pass.

The loop is a few lines of C built on first use by the ``ziglang`` wheel's clang (or the system's C compiler) and
cached like the cpu target's kernels (:func:`build`). It is handed wgpu-native's own function
pointers, so it calls the library wgpu-py loaded. Where it cannot be built (no compiler), :func:`recorder` gives
``None`` and the runtime records from Python (:meth:`kiln.runtime.native.Session._encode_raw`); setting
``KILN_RECORD=python`` asks for that too.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError

#: the loop: steps ``[first, last)``, those with no workgroups skipped; returns the dispatches recorded
SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
typedef void (*kiln_set_pipeline)(void *pass, void *pipeline);
typedef void (*kiln_set_group)(void *pass, uint32_t index, void *group, size_t offsets, const uint32_t *offset);
typedef void (*kiln_dispatch)(void *pass, uint32_t x, uint32_t y, uint32_t z);

int kiln_record(void *pass, void *const *pipelines, void *const *groups, const uint32_t *counts, int first, int last,
                void *set_pipeline, void *set_group, void *dispatch) {
    kiln_set_pipeline sp = (kiln_set_pipeline)set_pipeline;
    kiln_set_group sg = (kiln_set_group)set_group;
    kiln_dispatch dw = (kiln_dispatch)dispatch;
    void *last_pipeline = NULL;
    int n = 0;
    for (int i = first; i < last; i++) {
        const uint32_t *c = counts + 3 * (size_t)i;
        if (!c[0]) continue;
        if (pipelines[i] != last_pipeline) {
            sp(pass, pipelines[i]);
            last_pipeline = pipelines[i];
        }
        sg(pass, 0, groups[i], 0, NULL);
        dw(pass, c[0], c[1], c[2]);
        n++;
    }
    return n;
}
"""


class Plan:
    """A plan's pipeline and bind group handles as C arrays for :attr:`recorder`'s loop: :meth:`record` records a pass.
    It holds the wgpu-py objects the addresses belong to (``owners``), so they are not released while it lives."""

    def __init__(self, recorder: Recorder, pipelines: list[int], groups: list[int], owners: Any = None):
        ffi = recorder.ffi
        self.recorder = recorder
        self.owners = owners
        self.pipelines = ffi.new("void *[]", [ffi.cast("void *", p) for p in pipelines])
        self.groups = ffi.new("void *[]", [ffi.cast("void *", g) for g in groups])
        self.steps = len(pipelines)

    def record(self, cpass: Any, counts: np.ndarray, first: int = 0, last: int | None = None) -> int:
        """Record steps ``[first, last)`` (default: to the end) into compute pass ``cpass`` (a wgpu-py compute pass
        encoder) with workgroup counts ``counts`` (uint32, C-contiguous, ``[steps, 3]``; a step whose x count is 0 is
        skipped); returns the dispatches recorded.

        Raises:
            ValueError: ``counts`` of another shape or dtype, or steps outside the plan."""
        last = self.steps if last is None else last
        if counts.dtype != np.uint32 or counts.shape != (self.steps, 3) or not counts.flags.c_contiguous:
            raise ValueError(f"workgroup counts must be C-contiguous uint32 [{self.steps}, 3], not {counts.dtype} "
                             f"{list(counts.shape)}")
        if not 0 <= first <= last <= self.steps:
            raise ValueError(f"steps [{first}, {last}) are not within the plan's {self.steps}")
        r = self.recorder
        ptr = r.ffi.cast("const uint32_t *", counts.ctypes.data)
        return r.lib.kiln_record(r.ffi.cast("void *", r.address(cpass._internal)), self.pipelines, self.groups, ptr,
                                 first, last, *r.functions)


class Recorder:
    """The C loop, loaded: :meth:`plan` turns a plan's handles into arrays once (:class:`Plan`, which records).

    Raises:
        KilnError: the loop does not compile here (:func:`build`).
    """

    def __init__(self) -> None:
        import cffi
        from wgpu.backends.wgpu_native._ffi import ffi as wffi
        from wgpu.backends.wgpu_native._ffi import lib as wlib

        self.ffi = cffi.FFI()
        self.ffi.cdef("int kiln_record(void *pass, void *const *pipelines, void *const *groups, const uint32_t *counts,"
                      " int first, int last, void *set_pipeline, void *set_group, void *dispatch);")
        self.lib = self.ffi.dlopen(str(build()))
        self._wffi = wffi
        #: wgpu-native's three functions, as ``void *`` for the loop
        self.functions = [self.ffi.cast("void *", int(wffi.cast("uintptr_t", wffi.addressof(wlib, name))))
                          for name in ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                                       "wgpuComputePassEncoderDispatchWorkgroups")]

    def address(self, handle: Any) -> int:
        """The address a wgpu-native handle (a cffi pointer of wgpu-py's) holds."""
        return int(self._wffi.cast("uintptr_t", handle))

    def plan(self, handles: list[tuple[Any, Any]], owners: Any = None) -> Plan:
        """C arrays of ``(pipeline, bind group)`` handles, one pair a step (wgpu-py's ``_internal`` pointers), kept with
        ``owners`` (the wgpu-py objects holding them)."""
        return Plan(self, [self.address(p) for p, _ in handles], [self.address(g) for _, g in handles], owners)


#: flags of the loop's library (zig's clang also gets ``-mcpu=baseline``: it targets the host CPU by default, and the
#: cached library may be loaded on another machine sharing the cache)
CFLAGS = ["-O2", "-shared", "-fPIC", "-g0"]


def _compiler() -> list[str]:
    """clang of the ``ziglang`` wheel (a dependency), else the system's C compiler (``cc``, ``gcc`` or ``clang``)."""
    from kiln.runtime.cpu import _zig

    try:
        return _zig() + ["cc"]
    except KilnError:  # (no ziglang)
        pass
    for name in ("cc", "gcc", "clang"):
        if path := shutil.which(name):
            return [path]
    raise KilnError("no C compiler for the dispatch loop (pip install ziglang)")


def build() -> Path:
    """The loop's shared library, from the cache (``$KILN_CACHE/cpu``, beside the cpu target's kernels) or compiled now
    (under a second): :func:`kiln.runtime.cpu.build_library` with :data:`CFLAGS` and :func:`_compiler`.

    Raises:
        KilnError: no C compiler, or it failed (its message attached)."""
    from kiln.runtime.cpu import build_library

    cc = _compiler()
    flags = CFLAGS + (["-mcpu=baseline"] if "ziglang" in cc else [])
    return build_library(SOURCE, flags=flags, libs=(), compiler=cc, prefix="kiln-record",
                         what="the dispatch loop")


@functools.cache
def recorder() -> Recorder | None:
    """The process's :class:`Recorder`, built on first use; ``None`` where it cannot be (no C compiler, wgpu-py
    without its wgpu-native backend) or ``KILN_RECORD=python`` asks for the Python loop."""
    if os.environ.get("KILN_RECORD", "c") == "python":
        return None
    try:
        return Recorder()
    except Exception:  # noqa: BLE001  (any failure to build or load it leaves the Python loop, which always works)
        return None


def counts_array(counts: list[tuple[int, int, int]]) -> np.ndarray:
    """Workgroup counts as the C loop reads them: uint32 ``[steps, 3]``."""
    return np.array(counts, np.uint32).reshape(len(counts), 3)
