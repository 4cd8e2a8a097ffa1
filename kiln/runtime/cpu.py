"""Native execution of a package's ``cpu`` target: its C kernels built into a shared library for this machine.

The package holds C source (``targets.cpu.source``, SHA-256 checked), not a binary: at load it is compiled
by clang through the ``ziglang`` wheel for the host CPU (``-O3 -march=native``) into a shared library,
cached under ``$KILN_CACHE`` (default ``~/.cache/kiln``) by the SHA-256 of source, flags and compiler, so
only the first load of a package on a machine compiles (``kiln compile --target cpu`` already fills the
cache of the machine it runs on). The runtime reads packages only; it never imports the compiler.

Every buffer of the memory plan lives at ``targets.cpu.memory.offsets[id]`` of one 64-byte-aligned numpy
arena. One call of the library's ``kiln_run(arena, first, last, threads, dims)`` runs plan steps
``[first, last)``: with ``threads`` > 1 it splits each step's tiles into contiguous ranges, one a thread, over a
pool of POSIX threads that the library starts on the first run needing them and keeps (they spin briefly
for the next run, then sleep; a forked child starts its own), with a barrier between steps. Runs of one
library (all sessions of one package) are serialised.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError, PackageError, one_line
from kiln.runtime.arena import ArenaSession

#: clang flags of the shared library: the host's vector units, multiply-adds fused (FMA), no errno (math calls
#: become instructions), wrap-around signed arithmetic (ONNX integer semantics), GNU C (statement expressions
#: of the vector helpers), POSIX threads
CFLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fwrapv",
          "-std=gnu11", "-g0"]

#: bytes of alignment of the arena (and so of every buffer, whose offsets are multiples of 64)
ALIGN = 64


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cache_dir() -> Path:
    """Where built libraries are kept: ``$KILN_CACHE/cpu`` (default ``~/.cache/kiln/cpu``)."""
    root = os.environ.get("KILN_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                        "kiln")
    return Path(root) / "cpu"


def _zig() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise KilnError("the cpu target needs the ziglang package (pip install ziglang) to build its kernels") from None
    return [sys.executable, "-m", "ziglang"]


def build_library(source: str, progress: bool = False, flags: list[str] | None = None, libs: tuple[str, ...] = ("-lm",),
                  compiler: list[str] | None = None, prefix: str = "kiln", what: str = "the cpu kernels") -> Path:
    """The shared library of C ``source`` for this machine, from the cache or compiled now (seconds to a
    minute for a large model); writes are atomic, so concurrent builds of one source are safe.

    Args:
        source: the C source.
        progress: say on stderr that it builds.
        flags: compiler flags (default :data:`CFLAGS`).
        libs: libraries linked, after the source.
        compiler: the compiler command (default the ``ziglang`` wheel's clang).
        prefix: the cached file's name starts with it.
        what: the code, named in errors.

    Raises:
        KilnError: the C compiler failed (its message attached) or ziglang is missing.
    """
    if compiler is None:
        compiler = _zig() + ["cc"]
        import ziglang

        ident = getattr(ziglang, "__version__", "")
    else:
        ident = " ".join(compiler)
    flags = CFLAGS if flags is None else flags
    key = hashlib.sha256("\0".join([source, *flags, *libs, ident]).encode()).hexdigest()
    out = cache_dir() / f"{prefix}-{key[:32]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"kiln: building the cpu kernels for this machine ({len(source) // 1024} KiB of C)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="kiln-cpu-", dir=out.parent) as tmp:
        src, lib = Path(tmp) / "kernels.c", Path(tmp) / "kernels.so"
        src.write_text(source)
        proc = subprocess.run([*compiler, *flags, "-o", str(lib), str(src), *libs], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise KilnError(f"the C compiler failed on {what}: {one_line(proc.stderr.strip(), 1500)}")
        os.replace(lib, out)
    return out


class CpuSession(ArenaSession):
    """A loaded package running its ``cpu`` target natively (the same API as :class:`kiln.runtime.native.Session`).

    Args:
        package: package directory (made by ``kiln compile --target ...,cpu``).
        target: must be ``cpu``.
        verify: check the weights' and the C source's SHA-256 against the manifest.
        poison: fill activation and output buffers with NaN at load and the outputs before every
            run, so an element a kernel forgets to write shows up as NaN (for tests).
        threads: threads a run uses (default: every core this process may run on).

    Raises:
        PackageError: missing, malformed, corrupted or newer-format package, or one without a ``cpu`` target.
        KilnError: the kernels do not compile on this machine.
    """

    def __init__(self, package: str | os.PathLike, target: str = "cpu", verify: bool = True, poison: bool = False,
                 threads: int | None = None):
        tgt = self._open(package, "cpu", target, "compile it with --target cpu")
        source_path = self._check_file(tgt["source"], tgt["sha256"], "cpu kernel source", verify)
        self.threads = max(1, int(threads if threads is not None else available_cores()))
        try:
            source = source_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise PackageError(f"{source_path}: the cpu kernel source is not UTF-8 text (byte {e.start})") from None
        self.lib = ctypes.CDLL(str(build_library(source)))
        self.lib.kiln_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p]
        self.lib.kiln_run.restype = ctypes.c_int
        layout = tgt["memory"]
        self._allocate(int(layout["bytes"]))
        self.offsets: list[int] = layout["offsets"]
        self._moved()
        self.kernel_names = [k["name"] for k in tgt["kernels"]]
        if self.lib.kiln_steps() != len(tgt["plan"]):
            raise PackageError(f"{source_path}: the library has {self.lib.kiln_steps()} steps, the plan "
                               f"{len(tgt['plan'])}")
        self._dims = np.zeros(32, np.int32)  # the run-time dims kiln_run hands the kernels
        self._load(poison)

    def adapter_info(self) -> dict[str, Any]:
        """What runs the kernels, in the keys :meth:`kiln.runtime.native.Session.adapter_info` uses."""
        import platform

        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return {"device": f"{platform.processor() or platform.machine()}", "backend_type": f"cpu (C, {threads})"}

    def _allocate(self, nbytes: int) -> None:
        """A zeroed arena of ``nbytes`` (:attr:`mem`, 64-byte aligned) holding the old one's bytes, if any."""
        raw = np.zeros(nbytes + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        mem = raw[start:start + nbytes]
        if hasattr(self, "mem"):
            mem[:self.mem.size] = self.mem
        self._raw, self.mem = raw, mem
        self._ptr = ctypes.c_void_p(self.mem.ctypes.data)

    def _grow_memory(self, nbytes: int) -> None:
        self._allocate(nbytes)

    def _moved(self) -> None:
        self._offsets = np.asarray(self.offsets, np.int64)  # where kiln_run finds the growable buffers

    def _set_dims(self, words: np.ndarray) -> None:
        self._dims[:len(words)] = words

    def _call(self, first: int, last: int) -> None:
        # (returns the threads it could start)
        self.lib.kiln_run(self._ptr, first, last, self.threads, self._dims.ctypes.data, self._offsets.ctypes.data)

    def _compute_range(self, first: int, last: int) -> None:
        if first < last:
            self._call(first, last)

    def _run_step(self, i: int) -> None:
        self._call(i, i + 1)
