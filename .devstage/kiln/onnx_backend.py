"""An ONNX backend (``onnx.backend.base.Backend``) that compiles models with Kiln and runs them natively.

This is how onnx's own backend test suite runs through Kiln (``tests/test_onnx_conformance.py``,
``python -m tools.onnx_coverage``)::

    from kiln.onnx_backend import KilnBackend
    rep = KilnBackend.prepare(model)            # compile to a package in a temporary directory
    outputs = rep.run([x, y])                   # kiln.load(package).run(feeds) on native WebGPU

Two things a web deployment fixes at compile time are fixed here from the first run's feeds:

* symbolic input dims (``N``) are bound to the fed arrays' sizes;
* an input Kiln needs as a compile-time constant (a Reshape's ``shape``, a Slice's ``starts``,
  ...: :class:`~kiln.errors.ConstantInputError`) is baked into the package as a constant
  with the fed value ("specialised"); a run with other values for it compiles again. When the
  value Kiln needs is computed from inputs, every small integer input (at most
  :data:`SMALL_INPUT` elements: shapes, axes, sizes) is baked in.

Without either, :meth:`KilnBackend.prepare` compiles at once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from kiln.errors import ConstantInputError, KilnError
from kiln.frontend.onnx.importer import dim_key

#: most inputs one model may need baked in before the backend gives up
MAX_SPECIALISED = 8
#: integer inputs up to this many elements may be baked in when a compile-time value is computed from inputs
SMALL_INPUT = 64


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _has_symbolic_dims(model: onnx.ModelProto) -> bool:
    for i in _runtime_inputs(model):
        t = i.type.tensor_type
        if t.HasField("shape") and any(not (d.HasField("dim_value") and d.dim_value >= 0) for d in t.shape.dim):
            return True
    return False


class KilnBackendRep(BackendRep):
    """A model prepared by :class:`KilnBackend`: compiled packages, one per specialisation, and their sessions.

    Args:
        model: the ONNX model.
        workdir: where packages are written (kept for the life of this object).
    """

    def __init__(self, model: onnx.ModelProto, workdir: tempfile.TemporaryDirectory):
        self.model = model
        self._workdir = workdir
        self.inputs = [i.name for i in _runtime_inputs(model)]
        self.outputs = [o.name for o in model.graph.output]
        #: names of inputs baked in as constants (grows as compiles ask for them)
        self.specialised: list[str] = []
        self._sessions: dict[tuple, Any] = {}
        #: the session compiled by prepare() (static dims, nothing specialised), if any
        self.eager: Any = None

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple:
        shapes = tuple(tuple(feeds[n].shape) for n in self.inputs if n in feeds)
        values = tuple((n, feeds[n].dtype.str, feeds[n].tobytes()) for n in self.specialised)
        return shapes, values

    def _compile(self, feeds: dict[str, np.ndarray] | None):
        """Compile for ``feeds`` (their dims and specialised values); returns a loaded session."""
        import kiln

        while True:
            model = onnx.ModelProto()
            model.CopyFrom(self.model)
            dims: dict[str, int] = {}
            if feeds is not None:
                for inp in _runtime_inputs(self.model):
                    dim = inp.type.tensor_type.shape.dim
                    for k, d in enumerate(dim):
                        if not (d.HasField("dim_value") and d.dim_value >= 0) and inp.name in feeds:
                            dims[dim_key(inp.name, k, d)] = int(feeds[inp.name].shape[k])
                for name in self.specialised:
                    model.graph.initializer.append(numpy_helper.from_array(np.asarray(feeds[name]), name))
            root = Path(self._workdir.name) / f"pkg{len(self._sessions)}"
            src = root.with_suffix(".onnx")
            onnx.save(model, src)
            try:
                return kiln.load(kiln.compile(src, root, dims=dims, force=True))
            except ConstantInputError as e:
                if feeds is None or len(self.specialised) >= MAX_SPECIALISED:
                    raise
                if e.value in feeds and e.value not in self.specialised:
                    self.specialised.append(e.value)
                    continue
                # a value computed from inputs: bake in every small integer input (shapes, axes, sizes)
                extra = [n for n in self.inputs if n in feeds and n not in self.specialised
                         and feeds[n].dtype.kind in "iu" and feeds[n].size <= SMALL_INPUT]
                if not extra:
                    raise
                self.specialised.extend(extra)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run on ``inputs`` (a list in the model's input order, or a dict by name); outputs in model order.

        Raises:
            KilnError: the model cannot be compiled (unsupported operator, dtype, run-time shape input...).
            ShapeError: wrong number, shape or dtype of inputs.
        """
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(self.inputs):
                raise KilnError(f"model takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(inputs)}")
            feeds = {n: np.asarray(v) for n, v in zip(self.inputs, inputs)}
        key = self._key(feeds)
        session = self.eager or self._sessions.get(key)
        if session is None:
            before = list(self.specialised)
            session = self._compile(feeds)
            if self.specialised != before:
                key = self._key(feeds)
            self._sessions[key] = session
        result = session.run({k: v for k, v in feeds.items() if k not in self.specialised})
        return namedtupledict("Outputs", self.outputs)(*(result[n] for n in self.outputs))


class KilnBackend(Backend):
    """ONNX backend running models through Kiln's compiler and native WebGPU runtime (wgpu-py)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnBackendRep:
        """Compile ``model`` to a package in a temporary directory, ready to run.

        Compilation waits for the first :meth:`KilnBackendRep.run` when the model has symbolic
        input dims or needs an input's value at compile time (see the module docstring).

        Raises:
            KilnError: the model cannot be compiled (unsupported operator or dtype, ...).
        """
        super().prepare(model, device, **kwargs)
        rep = KilnBackendRep(model, tempfile.TemporaryDirectory(prefix="kiln-onnx-"))
        if not _has_symbolic_dims(model):
            try:
                rep.eager = rep._compile(None)
            except ConstantInputError:
                pass  # compiled at the first run, with the input's value baked in
        return rep

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        """Prepare ``model`` and run it once on ``inputs``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Kiln runs on whatever WebGPU adapter wgpu finds; the suite's ``CPU`` device stands for it."""
        return device == "CPU"


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
supports_device = KilnBackend.supports_device
