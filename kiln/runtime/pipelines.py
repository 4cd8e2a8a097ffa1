"""Compute pipelines of the native runtime: created concurrently, cached per device by WGSL source.

wgpu-native (0.32 era) does not implement ``wgpuDeviceCreateComputePipelineAsync`` (wgpu-py's
``create_compute_pipeline_async`` falls back to the blocking call), so :meth:`PipelineCache.get_many`
creates the missing shader modules and pipelines on a thread pool instead: wgpu-native's device is
thread-safe, wgpu-py keeps its error capture per thread, and cffi releases the GIL during the
calls, so the shader compilers (naga, then the driver's) run in parallel.

Every device has one :class:`PipelineCache` (:func:`pipeline_cache`) keyed by the SHA-256 of the
WGSL source, the entry point and the binding layout, so a second session of the same package, a
package sharing kernels, or eager mode reuses what an earlier one compiled.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import PackageError, one_line

_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


@dataclass(frozen=True)
class KernelSpec:
    """What a compute pipeline is made from.

    Attributes:
        source: WGSL text.
        entry_point: the name of the shader's compute entry point.
        access: per binding of bind group 0 (binding order), ``"read"`` (read-only storage),
            ``"read_write"`` (storage) or ``"uniform"`` (a uniform buffer: the run-time dims of
            docs/dynamic-shapes.md); ``None`` for wgpu's automatic layout.
        label: a name for errors and debuggers.
        fallback: WGSL compiled instead if ``source`` does not compile (a kernel's plain form where ``source`` is
            its subgroup form, :mod:`kiln.runtime.subgroups`), with a warning.
    """

    source: str
    entry_point: str = "main"
    access: tuple[str, ...] | None = None
    label: str = ""
    fallback: str | None = None

    def key(self) -> tuple[str, str, tuple[str, ...] | None]:
        """The cache key: SHA-256 of the source, the entry point, the binding layout."""
        return hashlib.sha256(self.source.encode()).hexdigest(), self.entry_point, self.access


@dataclass
class CachedPipeline:
    """A compiled pipeline and the layout of its bind group 0."""

    pipeline: Any
    layout: Any


class PipelineCache:
    """Shader modules and compute pipelines of one wgpu device, keyed by :meth:`KernelSpec.key`.

    Attributes:
        hits: pipelines served from the cache.
        misses: pipelines compiled.
        modules: shader modules compiled (one per distinct source).
    """

    def __init__(self, device):
        self._device = weakref.ref(device)
        self._pipelines: dict[tuple, CachedPipeline] = {}
        self._modules: dict[str, Any] = {}
        self._layouts: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.modules = 0

    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "modules", "pipelines"}``: counters since the device was made, and pipelines held."""
        return {"hits": self.hits, "misses": self.misses, "modules": self.modules, "pipelines": len(self._pipelines)}

    def _layout(self, access: tuple[str, ...]):
        import wgpu

        with self._lock:
            if access not in self._layouts:
                dev = self._device()
                types = {"read": wgpu.BufferBindingType.read_only_storage, "uniform": wgpu.BufferBindingType.uniform}
                entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                            "buffer": {"type": types.get(a, wgpu.BufferBindingType.storage)}}
                           for i, a in enumerate(access)]
                group = dev.create_bind_group_layout(entries=entries)
                self._layouts[access] = group, dev.create_pipeline_layout(bind_group_layouts=[group])
            return self._layouts[access]

    def _compile(self, spec: KernelSpec, digest: str) -> CachedPipeline:
        dev = self._device()
        with self._lock:
            module = self._modules.get(digest)
        if module is None:
            module = dev.create_shader_module(label=spec.label, code=spec.source)
            with self._lock:
                kept = self._modules.setdefault(digest, module)
                if kept is module:
                    self.modules += 1
                module = kept
        if spec.access is None:
            pipeline = dev.create_compute_pipeline(label=spec.label, layout="auto",
                                                   compute={"module": module, "entry_point": spec.entry_point})
            return CachedPipeline(pipeline, pipeline.get_bind_group_layout(0))
        group, layout = self._layout(spec.access)
        pipeline = dev.create_compute_pipeline(label=spec.label, layout=layout,
                                               compute={"module": module, "entry_point": spec.entry_point})
        return CachedPipeline(pipeline, group)

    def get(self, spec: KernelSpec) -> CachedPipeline:
        """The pipeline of ``spec``, compiled now unless cached. Raises as :meth:`get_many`."""
        return self.get_many([spec], jobs=1)[0]

    def get_many(self, specs: Sequence[KernelSpec], jobs: int | None = None) -> list[CachedPipeline]:
        """The pipelines of ``specs`` (in order), compiling the missing ones concurrently on ``jobs``
        threads (default: the CPU count, at most 8; 1 compiles in this thread).

        Raises:
            PackageError: a kernel does not compile on this device (naga's or the driver's message).
        """
        keys = [s.key() for s in specs]
        out: list[CachedPipeline | None] = []
        todo: dict[tuple, KernelSpec] = {}
        with self._lock:
            for spec, key in zip(specs, keys):
                hit = self._pipelines.get(key)
                out.append(hit)
                if hit is not None:
                    self.hits += 1
                elif key not in todo:
                    todo[key] = spec
                else:
                    self.hits += 1  # the same kernel twice in one call: compiled once
        if todo:
            jobs = jobs or min(8, os.cpu_count() or 1)

            def build(item):
                key, spec = item
                try:
                    return key, self._compile(spec, key[0])
                except Exception as e:  # wgpu's GPUValidationError and friends carry the compiler's message
                    if spec.fallback is not None:
                        warnings.warn(f"kernel {spec.label}'s subgroup form does not compile ({one_line(e)}): "
                                      "running its plain form", RuntimeWarning, stacklevel=2)
                        plain = replace(spec, source=spec.fallback, fallback=None)
                        return key, build((plain.key(), plain))[1]
                    raise PackageError(f"kernel {spec.label or key[0][:12]} does not compile on this device: "
                                       f"{one_line(e)}") from e

            items = list(todo.items())
            if jobs <= 1 or len(items) == 1:
                built = [build(i) for i in items]
            else:
                with ThreadPoolExecutor(max_workers=min(jobs, len(items)), thread_name_prefix="kiln-pipelines") as ex:
                    built = list(ex.map(build, items))
            with self._lock:
                for key, cached in built:
                    self._pipelines.setdefault(key, cached)
                    self.misses += 1
            out = [o if o is not None else self._pipelines[k] for o, k in zip(out, keys)]
        return out  # type: ignore[return-value]

    def clear(self) -> None:
        """Forget every cached pipeline and module (counters stay)."""
        with self._lock:
            self._pipelines.clear()
            self._modules.clear()


def pipeline_cache(device) -> PipelineCache:
    """The :class:`PipelineCache` of ``device`` (made on first use, dropped with the device)."""
    with _caches_lock:
        cache = _caches.get(device)
        if cache is None:
            cache = _caches[device] = PipelineCache(device)
        return cache
