"""Subgroups on a WebGPU device: whether kernels may run their subgroup forms.

A kernel that combines a reduction's partial values across lanes (row kernels, split-K products, matrix-vector
products) has, where the compiler made one, a second WGSL form (``targets.webgpu.kernels[].subgroups``, package
format 1.14) that shuffles values between the lanes of a subgroup (``subgroupShuffleXor``, WGSL §17.12) instead of
passing them through workgroup memory, with fewer barriers. It needs WebGPU's ``subgroups`` feature (wgpu's
``subgroup``) and one more property that WGSL does not promise: that a workgroup's invocations fill subgroups in
``local_invocation_index`` order (invocation ``i`` is lane ``i % size`` of subgroup ``i / size``), with sizes from
4 to 128. :func:`usable` checks both once per device with the probe kernel the package holds
(``targets.webgpu.subgroup_probe``, made by the compiler: ``kiln.codegen.webgpu.wgsl.SUBGROUP_PROBE``).

Whether a session runs them (``kiln.load(..., subgroups=...)``): ``True`` wherever the device can, ``False`` never,
``None`` (the default) as environment variable ``KILN_SUBGROUPS`` says (``1`` or ``0``) or, unset, on GPUs only: a
CPU adapter (Mesa's lavapipe, SwiftShader) emulates the shuffles, and there they made SmolLM2's decode step 1.2x
slower (``python -m bench.subgroups`` on lavapipe).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from kiln.runtime.gpu import run_words
from kiln.runtime.pipelines import KernelSpec

#: wgpu's name of WebGPU's ``subgroups`` feature
FEATURE = "subgroup"
#: words the probe writes (a workgroup of 256 invocations)
PROBE_WORDS = 256
#: environment variable: ``1`` runs kernels' subgroup forms wherever the device can, ``0`` never (unset: on GPUs)
ENV = "KILN_SUBGROUPS"
_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def usable(device, wanted: bool | None = None, probe: str | None = None) -> bool:
    """Whether ``device`` (a wgpu device) runs kernels' subgroup forms: they are wanted (``wanted``, module
    docstring), it has the feature, and the package's ``probe`` (WGSL text; module docstring) finds subgroups of 4
    to 128 lanes filled in invocation order. The probe runs once per device (one dispatch and a 1 KiB read); none
    given, or any error in it, means no."""
    if wanted is None:
        flag = os.environ.get(ENV, "")
        wanted = flag == "1" if flag in ("0", "1") else device.adapter.info.get("adapter_type") != "CPU"
    if not wanted or FEATURE not in device.features:
        return False
    with _lock:
        if device not in _checked and probe is not None:
            _checked[device] = _probe(device, probe)
        return _checked.get(device, False)


def _probe(device, probe: str) -> bool:
    try:
        words = run_words(device, for_naga(probe), PROBE_WORDS)
    except Exception:  # noqa: BLE001  (a driver that cannot compile or run it: the plain forms then)
        return False
    sizes = words >> 8
    n = int(sizes[0])
    return bool((words & 0xFF).all() and (sizes == n).all() and 4 <= n <= 128 and n & (n - 1) == 0)


#: the WGSL directive of the subgroup forms (WGSL §4.1.2), which browsers require and naga (wgpu-native, v27) does
#: not parse yet: it enables the builtins by the device's feature alone
ENABLE = "enable subgroups;"


def for_naga(source: str) -> str:
    """WGSL ``source`` as wgpu-native's shader compiler takes it: without the :data:`ENABLE` directive."""
    return source.replace(ENABLE + "\n", "", 1)


def forms_run(kernels: list[dict[str, Any]], use: bool) -> list[dict[str, Any]]:
    """The WebGPU kernel entries as run: with ``use``, those with a subgroup form carry its ``loop_iterations``
    (what :class:`~kiln.runtime.loop_limit.LoopLimit` checks)."""
    if not use:
        return kernels
    return [{**k, "loop_iterations": k["subgroups"].get("loop_iterations", 0)} if "subgroups" in k else k
            for k in kernels]


def kernel_spec(kernel: dict[str, Any], read: Callable[[str], str], use: bool) -> KernelSpec:
    """What to compile for WebGPU kernel entry ``kernel`` (``read``: a package file's text): with ``use``, its
    subgroup form where it has one (for naga), the plain form the fallback; else the plain form."""
    access = tuple(b["access"] for b in sorted(kernel["bindings"], key=lambda b: b["binding"]))
    access += ("uniform",) if "dims_binding" in kernel else ()  # (the run-time dims, docs/dynamic-shapes.md)
    plain = read(kernel["source"])
    if use and "subgroups" in kernel:
        return KernelSpec(for_naga(read(kernel["subgroups"]["source"])), kernel["entry_point"], access,
                          kernel["name"], fallback=plain)
    return KernelSpec(plain, kernel["entry_point"], access, kernel["name"])
