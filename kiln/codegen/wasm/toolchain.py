"""The WebAssembly target: CPU schedules, the linear-memory layout, and building one ``.wasm`` module.

Kernels are rendered to C (:mod:`kiln.codegen.c`) and compiled by clang through the ``ziglang``
wheel (``zig cc --target=wasm32-freestanding``) with SIMD128, saturating float-to-int
conversions and bulk memory. One module holds every kernel of a package (each an exported
function) and one linear memory:

``[0, ARENA)``            the module's own constant data and clang's stack (``STACK`` bytes); in the threaded module
                          also one stack a worker (``WORKERS`` of ``WORKER_STACK`` bytes)
``[ARENA, ARENA + n)``    the package's buffers, each at its ``offsets[id]`` (16-byte aligned),
``SLACK`` bytes           after the last buffer, so whole-vector loads at a buffer's end stay in memory

The threaded variant is the same code built with ``-matomics -mbulk-memory`` against an
imported shared memory (WebAssembly threads proposal), for runtimes with workers. Every worker instantiates it over
the one memory, and every instance's ``__stack_pointer`` global starts at the same address: the module exports it and
``kiln_worker_stack(i)`` (the C prelude's worker stacks), and each worker's runtime points its instance at its own
stack before running a kernel. Kernels keep nothing on the stack, but libm does: ``sinf``/``cosf`` reduce large
arguments through a stack slot, and two workers sharing one stack corrupted each other's sines (a resampling filter's
taps, found as a flaky Whisper transcript in Chromium).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kiln.codegen.c_kernels import CKernel, CStep
from kiln.codegen.cpu_schedule import cpu_schedule, grid_shape  # noqa: F401  (grid_shape re-exported)
from kiln.codegen.wasm.simd import PRELUDE
from kiln.errors import KilnError
from kiln.package import arena
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule

#: bytes of clang's stack at the bottom of linear memory
STACK = 64 * 1024
#: the most workers a threaded module has stacks for (runtimes refuse more threads)
WORKERS = 16
#: bytes of each worker's stack in the threaded module (sinf's argument reduction takes 576)
WORKER_STACK = 16 * 1024
#: first byte of the buffer arena (the stacks and the module's constant data, up to 64 KiB, lie below it)
ARENA = STACK + WORKERS * WORKER_STACK + 64 * 1024
#: free bytes before the arena's first and after its last buffer (vector loads reach 12 bytes past)
SLACK = 64
#: WebAssembly page size (bytes)
PAGE = 65536
#: the most memory a wasm32 module addresses (65536 pages)
MAX_MEMORY = 4 * 1024**3

#: clang flags of every build: SIMD128, non-trapping float-to-int, no errno (math calls become
#: instructions), wrap-around signed arithmetic (ONNX integer semantics), no debug information and no
#: loop unrolling of clang's own (lowering unrolled the reductions already; both halve compile time), stripped
CFLAGS = ["--target=wasm32-freestanding", "-O3", "-msimd128", "-mnontrapping-fptoint", "-mbulk-memory",
          "-fno-math-errno", "-fwrapv", "-std=c11", "-g0", "-fno-unroll-loops", "-s", "-Wl,--no-entry",
          f"-Wl,-z,stack-size={STACK}",
          "-Wl,--export=__heap_base"]
THREAD_FLAGS = ["-matomics", "-Wl,--shared-memory", "-Wl,--import-memory", "-Wl,--export=__stack_pointer",
                f"-DKILN_WORKERS={WORKERS}", f"-DKILN_WORKER_STACK={WORKER_STACK}"]


#: how far the wasm kernels' long reductions unroll (their largest divisor up to this). V8 keeps a register-tiled
#: product's 16 vector accumulators and an unrolled iteration's operands in 16 xmm registers, so every operand
#: hoisted for a deeper unroll is a spill: in Chromium 156 (one thread, kernels timed alone, ``bench.wasm_profile``)
#: Whisper tiny's encoder took 1749 ms a window at 3 against 1918 at 8 and 1865 at 2 (its 1500x384x1536 product:
#: 57 ms at 3, 66 at 2, 74 at 8, 80 at 4), MobileNetV2 25.5 ms against 28.8 at 8.
WASM_UNROLL = 3


def wasm_schedule(t: Tensor) -> Schedule:
    """The CPU schedule of the lane vectoriser (:func:`kiln.codegen.cpu_schedule.cpu_schedule`, SIMD128's 4 lanes)
    with reductions unrolled by up to :data:`WASM_UNROLL`, and sums read along their rows (``simd_reduce``: a tied
    output projection, attention scores against cached keys) one output a tile. Four a tile, sharing the activation,
    read four weight rows as interleaved streams: in Chromium 156 on this project's AMD EPYC host Whisper tiny's
    output projection (80 MB of float32 a token) took 8.5 ms against 4.1 ms a row a tile, a decode step 13.2 against
    9.0 ms (``bench.wasm_profile``). (The cpu target's native code measured level either way; it keeps four.)"""
    return cpu_schedule(t, 4, unroll=WASM_UNROLL, share_rows=False)


@dataclass
class Layout:
    """Where every buffer lives in linear memory.

    Attributes:
        offsets: buffer id -> byte offset (16-byte aligned).
        bytes: the memory the plan needs, from address 0 to the end of the last buffer's slack.
        grows: some buffers grow at run time (the memory may grow to :data:`GROW_PAGES` pages).
    """

    offsets: list[int]
    bytes: int = 0
    grows: bool = False

    @property
    def pages(self) -> int:
        """64 KiB pages of :attr:`bytes`."""
        return -(-self.bytes // PAGE)

    @property
    def max_pages(self) -> int:
        """The most pages the memory may grow to: :attr:`pages`, or :data:`GROW_PAGES` when buffers grow."""
        return max(self.pages, GROW_PAGES) if self.grows else self.pages


#: the pages a module with growable buffers may grow its memory to (2 GiB: offsets stay positive int32)
GROW_PAGES = 32768
#: buffers' alignment in linear memory (bytes)
ALIGN = 16


def plan_layout(sizes: list[int], grows: list[bool] | None = None) -> Layout:
    """Place buffers of ``sizes`` bytes one after another from :data:`ARENA` (:func:`kiln.package.arena.layout`: in
    buffer-id order, those that ``grows`` last).

    Raises:
        KilnError: the buffers do not fit a wasm32 memory (4 GiB).
    """
    grows = grows or [False] * len(sizes)
    offsets, total = arena.layout(sizes, grows, ARENA + SLACK, ALIGN, SLACK)
    if total > MAX_MEMORY:
        raise KilnError(f"the package needs {total / 2**30:.2f} GiB of linear memory; wasm32 addresses at most 4 GiB")
    return Layout(offsets, total, any(grows))


def _zig() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise KilnError("the wasm target needs the ziglang package (pip install ziglang)") from None
    return [sys.executable, "-m", "ziglang"]


def compile_module(source: str, pages: int, threads: bool = False, max_pages: int | None = None) -> bytes:
    """Compile C ``source`` (kernels exported by name) into a WebAssembly module with ``pages`` pages of memory,
    growable to ``max_pages`` (default ``pages``).

    Single-threaded modules define and export ``memory``; threaded ones import a shared
    ``env.memory`` of ``pages`` pages, at most ``max_pages``.

    Raises:
        KilnError: the C compiler failed (its message attached) or ziglang is missing.
    """
    return compile_modules(source, pages, (threads,), max_pages)[0]


def compile_modules(source: str, pages: int, variants: tuple[bool, ...] = (False, True),
                    max_pages: int | None = None) -> list[bytes]:
    """:func:`compile_module` for each of ``variants`` (``threads`` flags), the compilers running in parallel."""
    base = CFLAGS + [f"-Wl,--initial-memory={pages * PAGE}", f"-Wl,--max-memory={(max_pages or pages) * PAGE}"]
    with tempfile.TemporaryDirectory(prefix="kiln-wasm-") as tmp:
        src = Path(tmp) / "kernels.c"
        src.write_text(source)
        procs = []
        for n, threads in enumerate(variants):
            out = Path(tmp) / f"kernels{n}.wasm"
            cmd = _zig() + ["cc", *base, *(THREAD_FLAGS if threads else []), "-o", str(out), str(src)]
            procs.append((out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        results = []
        for out, proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise KilnError(f"the WebAssembly C compiler failed:\n{err.strip()[-4000:]}")
            results.append(out.read_bytes())
        return results


def warm_up() -> None:
    """Compile a tiny module in both variants, so that zig builds and caches its compiler-rt for them
    (about a minute the first time on a machine; ``setup.sh`` calls this so tests and users do not wait).

    Raises:
        KilnError: the toolchain does not work.
    """
    src = PRELUDE + ('KILN_EXPORT("f") void f(float* x, int n) {\n'
                     '    for (int i = 0; i < n; i++) x[i] = expf(x[i]) + logf(x[i]) + sinf(x[i]) + cosf(x[i])\n'
                     '        + tanf(x[i]) + kiln_tanhf(x[i]) + kiln_powf(x[i], 0.5f);\n}\n')
    compile_modules(src, plan_layout([]).pages)  # (the stacks and the arena's first bytes)


def heap_base(module: bytes) -> int:
    """The first address after the module's constant data and stacks: its exported ``__heap_base`` global's
    ``i32.const`` initialiser, read from the binary (WebAssembly core spec 5.5: the global and export sections), so
    that threaded modules, which import a shared memory, need no instance.

    Raises:
        KilnError: the module exports no ``__heap_base`` global defined by a constant.
    """
    def leb(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = module[at]
            value |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if byte < 0x80:
                return value, at

    globals_at, wanted, imported = None, None, 0
    at = 8
    while at < len(module):
        section, (size, body) = module[at], leb(at + 1)
        if section == 2:  # imports: imported globals come first in the global index space
            count, i = leb(body)
            for _ in range(count):
                for _ in range(2):  # module and field names
                    n, i = leb(i)
                    i += n
                kind, i = module[i], i + 1
                if kind == 0:  # a function: its type index
                    i = leb(i)[1]
                elif kind in (1, 2):  # a table (its element type, then limits) or a memory (limits)
                    flags, i = leb(i + (kind == 1))
                    i = leb(i)[1]
                    i = leb(i)[1] if flags & 1 else i
                elif kind == 3:  # a global: value type and mutability
                    imported, i = imported + 1, i + 2
        elif section == 6:
            globals_at = body
        elif section == 7:
            count, i = leb(body)
            for _ in range(count):
                n, i = leb(i)
                name = module[i:i + n]
                kind, (index, i) = module[i + n], leb(i + n + 1)
                if kind == 3 and name == b"__heap_base":
                    wanted = index - imported
        at = body + size
    if globals_at is not None and wanted is not None and wanted >= 0:
        count, i = leb(globals_at)
        for g in range(count):
            i += 2  # value type, mutability
            if module[i] != 0x41:
                break
            value, i = leb(i + 1)
            if g == wanted:
                return value
            i += 1  # end
    raise KilnError("the wasm module exports no __heap_base global")


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


@dataclass
class WasmProgram:
    """Everything the package's ``targets.wasm`` is written from."""

    source: str
    module: bytes
    layout: Layout
    kernels: list[CKernel]
    steps: list[CStep]
    threads_module: bytes | None = None
    meta: dict = field(default_factory=dict)
