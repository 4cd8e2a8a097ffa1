"""Native execution of a package's WebAssembly target through wasmtime.

The runtime reads packages only; it never imports the compiler. At load the module
(``targets.wasm.module``, SHA-256 checked) is compiled by wasmtime's Cranelift with SIMD, one
instance is made, and every weight is written into linear memory at its buffer's offset
(``targets.wasm.memory.offsets``). Each :meth:`WasmSession.run` writes the inputs, calls each
plan step's exported kernel over its tiles ``[0, total)`` and reads the outputs, all through one
numpy view of the memory.

With ``threads`` > 1 the package's threaded module is instantiated once per worker thread over
one shared memory, each instance on the worker's own stack (``kiln_worker_stack``), and each step's tiles are split
into contiguous ranges, one a worker, as the browser runtime does with Web Workers (wasmtime releases the GIL while
wasm runs).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from kiln.errors import KilnError, PackageError, ShapeError, one_line
from kiln.runtime.arena import ArenaSession


def _shared_memory_class():
    """wasmtime's SharedMemory, importable by a Linker (wasmtime-py 50 wraps the pointer once too often)."""
    import wasmtime
    from wasmtime import _ffi as ffi

    class SharedMemory(wasmtime.SharedMemory):
        def _as_extern(self):
            union = ffi.wasmtime_extern_union(sharedmemory=self.ptr())
            return ffi.wasmtime_extern_t(ffi.WASMTIME_EXTERN_SHAREDMEMORY, union)

    return SharedMemory


def _own_stack(instance: Any, store: Any, index: int, module_path: Any) -> None:
    """Point worker ``index``'s instance of a threaded module at its own stack (``kiln_worker_stack``; every
    instance's ``__stack_pointer`` starts at the same address, and libm's ``sinf``/``cosf`` keep values there).

    Raises:
        PackageError: a threaded module without worker stacks (compiled by an older Kiln), or too many threads.
    """
    import wasmtime

    exports = instance.exports(store)
    stack, pointer = exports.get("kiln_worker_stack"), exports.get("__stack_pointer")
    if not isinstance(stack, wasmtime.Func) or not isinstance(pointer, wasmtime.Global):
        raise PackageError(f"{module_path}: the threaded wasm module has no stack for each worker (it was compiled by "
                           "an older Kiln): recompile the package, or load it with threads=1")
    top = stack(store, index)
    if not top:
        raise PackageError(f"{module_path}: the threaded wasm module has stacks for fewer than {index + 1} workers "
                           "(load it with fewer threads)")
    pointer.set_value(store, wasmtime.Val.i32(top))


#: seconds between ticks of the wasm engines' epoch (the resolution of a run's time limit)
TICK_S = 0.25
#: a run's default time limit in seconds: kernels that run longer (a damaged or hostile module's endless loop) are
#: interrupted and the run ends in a KilnError
DEFAULT_RUN_TIMEOUT_S = 600.0
_NEVER = 2**62  #: an epoch deadline never reached
_engines: dict[bool, Any] = {}  #: threads? -> the process's engine of that configuration (never freed)
_engines_lock = threading.Lock()


def _engine(threads: bool):
    """The process's wasmtime Engine for single-threaded (``threads`` False) or threaded modules: SIMD, epoch
    interruption, Cranelift at ``speed``. Engines are thread-safe and meant to be shared; each of the two lives as
    long as the process, and one daemon thread advances their epochs every :data:`TICK_S`. (An engine per session,
    ticked through a weak set, could be ticked while the garbage collector was freeing it: a segmentation fault.)"""
    import wasmtime

    with _engines_lock:
        if threads not in _engines:
            config = wasmtime.Config()
            config.wasm_simd = True
            config.wasm_threads = threads
            config.shared_memory = threads
            config.cranelift_opt_level = "speed"
            config.epoch_interruption = True  # (the run's time limit)
            first = not _engines
            _engines[threads] = wasmtime.Engine(config)
            if first:
                def tick() -> None:
                    while True:
                        time.sleep(TICK_S)
                        for e in list(_engines.values()):
                            e.increment_epoch()

                threading.Thread(target=tick, name="kiln-wasm-epoch", daemon=True).start()
        return _engines[threads]


def _function(exports, name: str):
    """The function ``name`` a wasm instance exports (KeyError: none, or not a function)."""
    import wasmtime

    f = exports[name]
    if not isinstance(f, wasmtime.Func):
        raise KeyError(name)
    return f


class WasmSession(ArenaSession):
    """A loaded package running its ``wasm`` target natively (the same API as :class:`kiln.runtime.native.Session`).

    Args:
        package: package directory (made by ``kiln compile --target ...,wasm``).
        target: must be ``wasm``.
        verify: check the weights' and the module's SHA-256 against the manifest.
        poison: fill activation and output buffers with NaN at load and the outputs before every
            run, so an element a kernel forgets to write shows up as NaN (for tests).
        threads: worker threads (1: the single-threaded module; more, up to 16: the threaded module over a
            shared memory, which the package must have).
        timeout_s: a run's time limit in seconds (default 600; None: none). wasmtime's epoch interruption stops
            kernels that run longer (a damaged or hostile module's endless loop) and the run raises a KilnError
            naming the limit; the session stays usable. The limit is checked every :data:`TICK_S` (0.25 s).

    Raises:
        PackageError: missing, malformed, corrupted or newer-format package, one without a
            ``wasm`` target, or without a threaded module (or one without worker stacks, compiled by an older Kiln)
            when ``threads`` > 1, or more threads than the module has stacks for.
        KilnError: ``timeout_s`` not a finite number of seconds above 0 (nor None).
    """

    def __init__(self, package: str | os.PathLike, target: str = "wasm", verify: bool = True, poison: bool = False,
                 threads: int = 1, timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S):
        import wasmtime

        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
            raise KilnError(f"timeout_s must be a finite number of seconds above 0, or None, not {timeout_s!r}")
        #: a run's time limit (epoch interruption: checked at the kernels' loop heads; None: none)
        self.timeout_s = timeout_s

        tgt = self._open(package, "wasm", target, "compile it with --target webgpu,wasm")
        self.threads = max(1, int(threads))
        if self.threads > 1 and not tgt.get("threads"):
            raise PackageError(f"{self.path}: the package's wasm target has no threaded module")
        entry = tgt["threads"] if self.threads > 1 else tgt
        module_path = self._check_file(entry["module"], entry["sha256"], "wasm module", verify)
        self.engine = _engine(self.threads > 1)
        layout = tgt["memory"]
        try:
            module = wasmtime.Module(self.engine, module_path.read_bytes())
            if self.threads > 1:
                _SharedMemory = _shared_memory_class()
                pages = int(layout["pages"])
                most = int(layout.get("max_pages", pages))  # (format 1.10: growable buffers grow the memory)
                shared = _SharedMemory(self.engine, wasmtime.MemoryType(wasmtime.Limits(pages, most), shared=True))
                self._memory = shared
                self.workers = []
                for index in range(self.threads):
                    store = wasmtime.Store(self.engine)
                    store.set_epoch_deadline(_NEVER)  # (until a run sets its own)
                    linker = wasmtime.Linker(self.engine)
                    linker.define(store, "env", "memory", shared)
                    instance = linker.instantiate(store, module)
                    _own_stack(instance, store, index, module_path)
                    self.workers.append((store, instance))
                self.store, self.instance = self.workers[0]
            else:
                self.store = wasmtime.Store(self.engine)
                self.store.set_epoch_deadline(_NEVER)
                self.instance = wasmtime.Instance(self.store, module, [])
                memory = self.instance.exports(self.store).get("memory")
                if not isinstance(memory, wasmtime.Memory):
                    raise PackageError(f"{module_path}: the wasm module exports no memory")
                self._memory = memory
                if memory.data_len(self.store) < layout["bytes"]:
                    memory.grow(self.store, -(-(layout["bytes"] - memory.data_len(self.store)) // 65536))
        except wasmtime.WasmtimeError as e:
            raise PackageError(f"{module_path}: cannot instantiate the wasm module ({one_line(e)})") from None
        self._map_memory()
        size = self.mem.size
        if size < layout["bytes"]:
            raise PackageError(f"{module_path}: the wasm module's memory holds {size} bytes, the package needs "
                               f"{layout['bytes']}")
        self.offsets: list[int] = layout["offsets"]
        exports = self.instance.exports(self.store)
        self.kernel_names = [k["name"] for k in tgt["kernels"]]
        self._pool = None
        try:  # the module's exports must be what the manifest names (a damaged module may lack them)
            self.functions = [_function(exports, k["export"]) for k in tgt["kernels"]]
            self.steps = [(self.functions[s["kernel"]], tuple(self.offsets[b] for b in s["buffers"]),
                           int(s["total"])) for s in tgt["plan"]]
            if self.threads > 1:
                self._per_worker = [[_function(ex, k["export"]) for k in tgt["kernels"]]
                                    for ex in (inst.exports(st) for st, inst in self.workers)]
                self._worker_steps = self._plan_workers([s["kernel"] for s in tgt["plan"]])
        except KeyError as e:
            raise PackageError(f"{module_path}: the wasm module exports no {e.args[0]!r}, which the manifest "
                               "uses") from None
        if self.threads > 1:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kiln-wasm")
        self._load(poison)
        try:
            self._dims_at = _function(exports, "kiln_dims")(self.store) if self._dyn else 0  # the module's dims array
        except KeyError:
            raise PackageError(f"{module_path}: the wasm module exports no 'kiln_dims', which the package's run-time "
                               "dims need") from None
        except (wasmtime.WasmtimeError, wasmtime.Trap, TypeError) as e:
            raise PackageError(f"{module_path}: the wasm module's kiln_dims failed ({one_line(e)})") from None

    def _plan_workers(self, kernels: list[int]) -> list[list[tuple[Any, Any]]]:
        """Per step, each worker's ``(function, store)`` of kernel ``kernels[step]``."""
        stores = [w[0] for w in self.workers]
        return [[(fns[k], st) for st, fns in zip(stores, self._per_worker)] for k in kernels]

    def _grow_memory(self, nbytes: int) -> None:
        import wasmtime

        pages = -(-(nbytes - self.mem.size) // 65536)
        try:
            self._memory.grow(pages) if self.threads > 1 else self._memory.grow(self.store, pages)
        except wasmtime.WasmtimeError:
            raise ShapeError(f"{self.path}: the run's dims need {nbytes / 2**20:.0f} MiB of wasm memory, more than the "
                             "module can grow to (2 GiB): run smaller inputs") from None
        self._map_memory()

    def _map_memory(self) -> None:
        """:attr:`mem`: a numpy view of the module's whole linear memory (again after it grows)."""
        shared = self.threads > 1
        size = self._memory.data_len() if shared else self._memory.data_len(self.store)
        ptr = self._memory.data_ptr() if shared else self._memory.data_ptr(self.store)
        self.mem = np.ctypeslib.as_array(ptr, shape=(size,))

    def _moved(self) -> None:
        self.steps = [(fn, tuple(self.offsets[b] for b in s["buffers"]), tiles)
                      for (fn, _, tiles), s in zip(self.steps, self.plan)]

    def _set_dims(self, words: np.ndarray) -> None:
        self.mem[self._dims_at:self._dims_at + words.nbytes] = words.view(np.uint8)
        self.steps = [(self.functions[k], ptrs, tiles) for (_, ptrs, _), k, tiles in zip(self.steps, self.kernels,
                                                                                        self.tiles)]
        if self.threads > 1:
            self._worker_steps = self._plan_workers(self.kernels)

    def adapter_info(self) -> dict[str, Any]:
        """What runs the kernels, in the keys :meth:`kiln.runtime.native.Session.adapter_info` uses."""
        import platform

        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return {"device": f"wasmtime on {platform.machine()}", "backend_type": f"wasm (SIMD128, {threads})"}

    def _set_deadline(self) -> None:
        """Interrupt the kernels after :attr:`timeout_s` from now (the epoch ticks every :data:`TICK_S`)."""
        ticks = _NEVER if self.timeout_s is None else min(math.ceil(self.timeout_s / TICK_S) + 1, _NEVER)
        for store in [w[0] for w in self.workers] if self.threads > 1 else [self.store]:
            store.set_epoch_deadline(ticks)

    def _compute_range(self, first: int, last: int) -> None:

        if first == 0:
            self._set_deadline()
        with self._kernel_errors():
            self._compute_steps(first, last)

    @contextlib.contextmanager
    def _kernel_errors(self):
        """wasmtime's failures while kernels run as KilnErrors: the time limit reached, or a damaged module."""
        import wasmtime

        try:
            yield
        except (wasmtime.WasmtimeError, wasmtime.Trap, TypeError) as e:
            if isinstance(e, wasmtime.Trap) and e.trap_code == wasmtime.TrapCode.INTERRUPT:
                raise KilnError(f"{self.path}: the run took longer than its time limit of {self.timeout_s:g} s and "
                                "was stopped (kiln.load(..., timeout_s=...) sets it)") from None
            raise KilnError(f"{self.path}: a wasm kernel failed ({one_line(e)}); the package's module is damaged or "
                            "does not fit its manifest") from None

    def _compute_steps(self, first: int, last: int) -> None:
        if self._pool is None:
            store = self.store
            for fn, ptrs, total in self.steps[first:last]:
                fn(store, *ptrs, 0, total)
            return
        n = self.threads
        for (_, ptrs, total), workers in zip(self.steps[first:last], self._worker_steps[first:last]):
            bounds = [total * w // n for w in range(n + 1)]
            futures = [self._pool.submit(fn, store, *ptrs, bounds[w], bounds[w + 1])
                       for w, (fn, store) in enumerate(workers) if bounds[w + 1] > bounds[w]]
            wait(futures)  # (every worker done before a failure is raised: none may outlive the run)
            for f in futures:
                f.result()

    def close(self) -> None:
        """Stop the worker threads of a threaded session (later runs use one thread)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def _run_step(self, i: int) -> None:
        self._set_deadline()
        fn, ptrs, total = self.steps[i]
        with self._kernel_errors():
            fn(self.store, *ptrs, 0, total)
