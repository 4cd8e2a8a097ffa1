"""The loop limit of Mesa's llvmpipe, checked before a kernel runs into it (docs/reliability.md, *Limits*).

llvmpipe, the CPU rasteriser behind Mesa's lavapipe Vulkan driver (what wgpu-py runs on where there is no GPU:
CI machines, containers, servers), ends every shader invocation after ``LP_MAX_TGSI_LOOP_ITERATIONS`` = 65535 loop
iterations, counted over every loop of the shader together (gallivm's ``lp_exec_mask``, one ``looplimiter`` per
shader), and reports nothing: the kernel's results are silently wrong. A package records the iterations each WebGPU
kernel runs per invocation (``targets.webgpu.kernels[].loop_iterations``, format 1.13: an int or a size expression
of run-time dims, :func:`kiln.te.loops.loop_iterations`), so the native runtime refuses, on such an adapter, a kernel
that would exceed the limit: at load for a fixed count, when the run-time dims are bound for the others.
"""

from __future__ import annotations

import itertools
from typing import Any

from kiln.errors import DeviceError
from kiln.runtime.dynamic import compile_json

#: loop iterations in all after which llvmpipe ends a shader invocation (Mesa's gallivm ``lp_limits.h``)
LLVMPIPE_LOOP_LIMIT = 65535


def adapter_loop_limit(info: dict[str, Any]) -> int | None:
    """The loop iterations an invocation may run on the adapter of wgpu ``info`` (``adapter.info``): 65535 on
    llvmpipe (vendor or device names it), None (no limit known) elsewhere."""
    name = f"{info.get('vendor', '')} {info.get('device', '')}".lower()
    return LLVMPIPE_LOOP_LIMIT if "llvmpipe" in name else None


class LoopLimit:
    """The per-invocation loop iterations of a WebGPU target's kernels against an adapter's limit.

    Args:
        kernels: ``targets.webgpu.kernels`` of a manifest.
        info: the adapter's ``info`` (wgpu-py).
        where: the package, named in errors.

    Raises:
        DeviceError: (on construction) a kernel of fixed count over the limit; (:meth:`check`) one of run-time dims.
        PackageError: a malformed ``loop_iterations``.
    """

    def __init__(self, kernels: list[dict[str, Any]], info: dict[str, Any], where: str):
        self.limit = adapter_loop_limit(info)
        self.names = [k["name"] for k in kernels]
        self.device = info.get("device", "?")
        self.where = where
        self._counts = [compile_json(k.get("loop_iterations", 0)) for k in kernels] if self.limit else []
        for i, k in enumerate(kernels if self.limit else ()):
            if isinstance(k.get("loop_iterations", 0), int):
                self._refuse(i, k.get("loop_iterations", 0), None)

    def check(self, plan: list[dict[str, Any]], choice: tuple[int, ...], dispatch: list[tuple[int, int, int]],
              env: dict[str, int], start: int = 0, stop: int | None = None) -> None:
        """Check the kernels plan steps ``start:stop`` run for dims ``env``: step ``i`` runs its kernel
        (``choice[i]`` 0) or ``variants[choice[i] - 1]``'s, unless its ``dispatch[i]`` is empty. (A data-dependent
        dim holds its upper bound in ``env`` until the run reads it back: the steps after that point are checked
        once it has.)

        Raises:
            DeviceError: a kernel over the adapter's limit at these dims.
        """
        if not self.limit:
            return
        for s, c, d in itertools.islice(zip(plan, choice, dispatch), start, stop):
            if d[0]:
                k = s["kernel"] if not c else s["variants"][c - 1]["kernel"]
                self._refuse(k, self._counts[k](env), env)

    def _refuse(self, kernel: int, count: int, env: dict[str, int] | None) -> None:
        if count > self.limit:
            at = f" at dims {env}" if env else ""
            raise DeviceError(
                f"{self.where}: kernel {self.names[kernel]} runs {count} loop iterations in one invocation{at}; this "
                f"adapter ({self.device}) ends an invocation after {self.limit} and would return wrong results: run "
                "it on a GPU, on the package's wasm or cpu target, or with smaller inputs")
