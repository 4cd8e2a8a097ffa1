"""Sessions over one byte arena: the CPU runtimes (wasm through wasmtime, cpu through a shared library).

Every buffer of the package's memory plan lives at ``offsets[id]`` of one contiguous memory (a wasm linear
memory, or a numpy array handed to native code); weights are written there once at load, inputs before each
run, outputs read after it. Subclasses provide the memory and how plan step ``i`` runs.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import PackageError
from kiln.package import arena
from kiln.package.format import from_storage, read_manifest, read_weights, sha256_file, verify_weights
from kiln.runtime import dynamic
from kiln.runtime.feeds import storage_feeds
from kiln.runtime.generate import GenerationMixin
from kiln.runtime.timing import wall_clock_ms, warm


class ArenaSession(GenerationMixin):
    """The shared part of the CPU sessions (the same API as :class:`kiln.runtime.native.Session`; threads as there: the
    runs of one session take turns).

    Subclasses set :attr:`path`, :attr:`manifest`, :attr:`target`, :attr:`mem` (a uint8 numpy view of the
    arena), :attr:`offsets` (buffer id -> byte offset), :attr:`kernel_names`, then call :meth:`_load`; and
    implement :meth:`_compute_range` (steps ``[first, last)``), :meth:`_run_step` (step ``i`` alone) and, for packages with
    run-time dims, :meth:`_set_dims` (the dims the kernels read and each step's tiles).
    """

    path: Path
    manifest: dict[str, Any]
    target: str
    mem: np.ndarray
    offsets: list[int]
    kernel_names: list[str]

    def _open(self, package: str | os.PathLike, target: str, asked: str, hint: str) -> dict[str, Any]:
        """Read the manifest of ``package`` (sets :attr:`path`, :attr:`target`, :attr:`manifest`) and return its
        ``target`` section; ``asked`` is the target the caller asked for, ``hint`` how to compile one in.

        Raises:
            PackageError: a missing, malformed or newer-format package, or one without ``target``.
        """
        self.path = Path(package)
        self.target = target
        self.manifest = read_manifest(self.path)
        if asked != target or target not in self.manifest["targets"]:
            raise PackageError(f"{self.path}: package has no {target!r} target (has: "
                               f"{', '.join(self.manifest['targets'])}); {hint}")
        return self.manifest["targets"][target]

    def _check_file(self, relative: str, sha256: str, what: str, verify: bool) -> Path:
        """The package file ``relative`` (a module or source ``what``), and with ``verify`` the weights' and its
        SHA-256 checked against the manifest.

        Raises:
            PackageError: the file is missing, or a checksum differs (a corrupted or edited package).
        """
        path = self.path / relative
        if not path.exists():
            raise PackageError(f"{self.path}: {what} {relative} is missing")
        if verify:
            verify_weights(self.path, self.manifest)
            if sha256_file(path) != sha256:
                raise PackageError(f"{path}: checksum mismatch (corrupted or edited {what.split()[-1]})")
        return path

    def _load(self, poison: bool) -> None:
        """Write every weight at its buffer's offset; with ``poison``, fill activations and outputs with NaN."""
        self._grown: dict[int, int] = {}  # growable buffers' bytes for the current dims
        self._lock = threading.RLock()
        for b, data in read_weights(self.path, self.manifest):
            self._view(b["id"], data.nbytes)[:] = data.reshape(-1).view(np.uint8)
        self.poison = poison
        self._dyn = dynamic.is_dynamic(self.manifest)
        self._dims_env: dict[str, int] | None = None
        self._sizes: dynamic.StepSizes | None = None  # the plan's tiles expressions, compiled at the first run
        self._shapes: dict[str, list[int]] = {}
        #: data-dependent dims (format 1.9): where a run stops to read counts, and each dim's entry
        self._binds = dynamic.bind_points(self.plan)
        self._counts = dynamic.count_dims(self.manifest)
        self._grow = dynamic.GrowSizes(self.manifest)  # buffers that grow with growable dims (format 1.10)
        self.tiles = [int(s["total"]) for s in self.plan]  # each step's tiles in the last run
        self.kernels = [int(s["kernel"]) for s in self.plan]  # each step's kernel in the last run (or a variant's)
        if poison:
            for b in self.manifest["buffers"]:
                if b["kind"] in ("activation", "output"):
                    self._fill_nan(b["id"])

    def _view(self, buffer_id: int, nbytes: int | None = None) -> np.ndarray:
        """The bytes of buffer ``buffer_id`` in the arena (a writable view; a growable buffer's run-time size)."""
        start = self.offsets[buffer_id]
        if nbytes is None:
            nbytes = self._grown.get(buffer_id, self.manifest["buffers"][buffer_id]["bytes"])
        return self.mem[start:start + nbytes]

    def _fill_nan(self, buffer_id: int) -> None:
        self._view(buffer_id).view(np.float32)[:] = np.nan

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Input descriptions from the manifest: name, dtype, shape, symbolic_shape."""
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """Output descriptions from the manifest."""
        return self.manifest["outputs"]

    @property
    def plan(self) -> list[dict[str, Any]]:
        """The target's plan steps (kernel, buffers, total tiles, node)."""
        return self.manifest["targets"][self.target]["plan"]

    def _compute(self) -> None:
        """Run every plan step."""
        self._compute_range(0, len(self.plan))

    def _compute_range(self, first: int, last: int) -> None:
        """Run plan steps ``[first, last)`` in order."""
        raise NotImplementedError

    def _compute_binding(self) -> dict[str, list[int]]:
        """Run the plan of a package with data-dependent dims (docs/dynamic-shapes.md): up to each step that computes
        counts, read them from the arena, bind the dims (the kernels' dims and the later steps' tiles) and go on;
        returns the outputs' shapes.

        Raises:
            ShapeError: a count outside its dim's bounds.
        """
        env = dict(self._dims_env)
        start = 0
        for stop, names in self._binds:
            self._compute_range(start, stop)
            for name in names:
                spec = self._counts[name]
                env[name] = dynamic.check_count(spec, int(self._view(spec["count"], 4).view(np.int32)[0]))
            self._apply_dims(env)
            start = stop
        self._compute_range(start, len(self.plan))
        return dynamic.output_shapes(self.manifest, env)

    def _set_dims(self, words: np.ndarray) -> None:
        """Make the kernels read run-time dims ``words`` (int32, dim ``index`` in word ``index``);
        :attr:`tiles` and :attr:`kernels` hold the steps' tiles and kernels for them."""
        raise NotImplementedError

    def _bind_dims(self, feeds: dict[str, np.ndarray]) -> dict[str, list[int]]:
        """Bind a package's run-time dims from the fed shapes (docs/dynamic-shapes.md) and, when they changed,
        pass them to the kernels and evaluate each step's tiles; returns each output's shape.

        Raises:
            ShapeError: as :func:`kiln.runtime.dynamic.bind_dims`.
        """
        env = dynamic.bind_dims(self.manifest, feeds)
        if env != self._dims_env:
            if self._grow:
                self._relayout(env)
            self._apply_dims(env)
            self._dims_env, self._shapes = env, dynamic.output_shapes(self.manifest, env)
        return self._shapes

    def _relayout(self, env: dict[str, int]) -> None:
        """Lay the growable buffers (format 1.10, docs/dynamic-shapes.md *Growable buffers*) out for dims ``env``
        (:func:`kiln.package.arena.regrow`: after the fixed ones, which never move), growing the memory when they
        need more of it.

        Raises:
            ShapeError: a buffer over 2 GiB, or more memory than the target can have.
        """
        self._grown = self._grow(env)
        offsets, total = arena.regrow(self.manifest["targets"][self.target]["memory"], self._grown)
        if total > self.mem.size:
            self._grow_memory(dynamic.grown(self.mem.size, total))
        if offsets != self.offsets:
            self.offsets = offsets
            self._moved()
            if self.poison:
                for b in self.manifest["buffers"]:
                    if "grow" in b and b["kind"] in ("activation", "output"):
                        self._fill_nan(b["id"])

    def _grow_memory(self, nbytes: int) -> None:
        """Make the arena at least ``nbytes`` long, keeping its contents (:attr:`mem` then views the new memory).

        Raises:
            ShapeError: the target's memory cannot grow that far.
        """
        raise NotImplementedError

    def _moved(self) -> None:
        """Buffers moved (:attr:`offsets` changed): point the steps at them."""
        raise NotImplementedError

    def _apply_dims(self, env: dict[str, int]) -> None:
        """Evaluate each step's tiles and kernel for dims ``env`` and pass the dims to the kernels."""
        if self._sizes is None:
            self._sizes = dynamic.StepSizes(self.plan, "tiles")
        choice, tiles = self._sizes(env)  # (a variant scheduled for these dims, or the step)
        steps = [s["variants"][c - 1] if c else s for s, c in zip(self.plan, choice)]
        self.kernels = [int(s["kernel"]) for s in steps]
        self.tiles = [int(s["total"]) if t is None else t for s, t in zip(steps, tiles)]
        self._set_dims(np.frombuffer(dynamic.dims_words(self.manifest, env), np.int32))

    def _run_step(self, i: int) -> None:
        raise NotImplementedError

    def _move_rows(self, moves: list[tuple[int, int, list[tuple[int, int]]]]) -> None:
        """Copy state entries within their buffers (:func:`kiln.runtime.generate.state_row_moves`)."""
        with self._lock:
            for buffer, row, pairs in moves:
                view = self._view(buffer)
                entries = view[:len(view) // row * row].reshape(-1, row)
                dst, src = zip(*pairs)
                entries[list(dst)] = entries[list(src)]  # (the sources are read before any is written)

    def close(self) -> None:
        """Release worker threads (a closed session still runs, on one thread)."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array of the manifest's dtype and shape).

        Returns:
            Output name -> a new numpy array (of its run-time shape in a package with run-time dims).

        Raises:
            ShapeError: an unknown, missing, wrongly shaped or wrongly typed input, or an int64
                input value that does not fit in int32; for run-time dims, a value outside its bounds or
                inputs that disagree on one.
        """
        checked = storage_feeds(self.inputs, feeds)
        with self._lock:  # (one run at a time: a run owns the arena from its inputs to its outputs)
            return self._run(feeds, checked)

    def _run(self, feeds: dict[str, np.ndarray], checked: list) -> dict[str, np.ndarray]:
        shapes = self._bind_dims(feeds) if self._dyn else {}
        for spec, a in checked:
            if a.size:  # (at its actual size: kernels index a run-time shape with run-time strides)
                self._view(spec["buffer"], a.nbytes)[:] = a.reshape(-1).view(np.uint8)
        if self.poison:
            for o in self.outputs:  # (not an input's buffer updated in place: an in-place TensorScatter)
                if self.manifest["buffers"][o["buffer"]]["kind"] == "output":
                    self._fill_nan(o["buffer"])
        if self._binds:
            shapes = self._compute_binding()
        else:
            self._compute()
        return {o["name"]: from_storage(self._view(o["buffer"]), o["dtype"], shapes.get(o["name"], o["shape"]))
                for o in self.outputs}

    def benchmark(self, feeds: dict[str, np.ndarray], repeat: int = 20, warmup: int = 3,
                  warmup_s: float = 0.0) -> list[float]:
        """Wall-clock milliseconds of ``repeat`` full runs (inputs written, kernels, outputs read) after ``warmup``
        runs and at least ``warmup_s`` seconds of them (:func:`kiln.runtime.timing.warm`)."""
        return wall_clock_ms(lambda: self.run(feeds), repeat, warmup, warmup_s)

    def profile(self, feeds: dict[str, np.ndarray], repeat: int = 10, warmup_s: float = 0.0) -> list[dict[str, Any]]:
        """Milliseconds of every plan step (wall clock around each), median over ``repeat`` runs after one
        warm-up run (and more until ``warmup_s`` seconds have passed); rows as
        :meth:`kiln.runtime.native.Session.profile` returns them."""
        with self._lock:  # (the profile's runs and dispatches use the session's buffers)
            warm(lambda: self.run(feeds), 0, warmup_s)
            return self._profile(feeds, repeat)

    def _profile(self, feeds: dict[str, np.ndarray], repeat: int) -> list[dict[str, Any]]:
        self.run(feeds)
        plan = self.plan
        samples: list[list[float]] = [[] for _ in plan]
        for _ in range(repeat):
            for i in range(len(plan)):
                t0 = time.perf_counter()
                self._run_step(i)
                samples[i].append((time.perf_counter() - t0) * 1e3)
        return [{"step": s.get("node", str(i)), "kernel": self.kernel_names[self.kernels[i]], "dispatch": [self.tiles[i], 1, 1],
                 "ms": float(np.median(samples[i])), "clock": "wall"} for i, s in enumerate(plan)]
