"""Check one ONNX operator through Kiln against onnxruntime (CPU) and Kiln's own interpreter."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp

#: the targets :func:`check_op` runs on unless a test says otherwise: ``KILN_OP_TARGETS`` (a comma list)
#: or webgpu; tests/test_wasm.py runs its per-op tests with ("wasm",), tests/test_cpu.py with ("cpu",),
#: tests/test_webgl2.py with ("webgl2",).
#: ``webgpu``, ``wasm`` and ``cpu`` run natively (wgpu-py, wasmtime, a shared library); ``webgl2`` and
#: ``browser:NAME`` (``browser:webgpu``,
#: ``browser:wasm``) run kiln.js in headless Chromium: ``KILN_OP_TARGETS=webgl2 pytest tests/test_ops.py`` runs
#: every per-op test on WebGL2
TARGETS: tuple[str, ...] = tuple(os.environ.get("KILN_OP_TARGETS", "webgpu").split(","))

#: targets with a native runtime (the others run in the browser)
NATIVE_TARGETS = ("webgpu", "wasm", "cpu")

#: fp16 compute (``kiln compile --precision fp16``) natively on WebGPU: the one-node model is wrapped by
#: :func:`fp16_model` so that the node reads and writes f16 activations, and compared with onnxruntime's
#: fp32 run of the same wrapped model within :data:`FP16_TOLERANCE`
FP16 = "webgpu-fp16"

#: fp16's ``(rtol, atol)``: atol is a fraction of the output's largest magnitude (at least 1). f16 has an
#: 11-bit significand: the op's inputs, weights and result are each rounded once to 2^-11 relative (a dot
#: product's error then scales with the sum of |terms|, hence the magnitude-relative atol)
FP16_TOLERANCE = (5e-3, 5e-3)


def fp16_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (one node) with every float input read through ``Neg(Neg(x))`` and every float output
    written through ``Neg``, each intermediate read twice (an extra ``Abs`` output), so that fusion keeps
    them apart: the node then reads and writes f16 activations in an fp16 package instead of the model's
    f32 inputs and outputs (which stay f32), and computes in f16 where :mod:`kiln.te.half` says."""
    g = model.graph
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16}
    node = g.node[0]
    nodes, outputs = [], []
    renamed = {}
    for v in g.input:
        if v.type.tensor_type.elem_type in floats:
            renamed[v.name] = f"{v.name}_h"
            nodes += [helper.make_node("Neg", [v.name], [f"{v.name}_n"]),
                      helper.make_node("Neg", [f"{v.name}_n"], [f"{v.name}_h"]),
                      helper.make_node("Abs", [f"{v.name}_h"], [f"{v.name}_aux"])]
            outputs.append(helper.make_tensor_value_info(f"{v.name}_aux", v.type.tensor_type.elem_type, None))
    core = helper.make_node(node.op_type, [renamed.get(i, i) for i in node.input], [f"{o}_core" for o in node.output],
                            name=node.name, domain=node.domain or None)
    core.attribute.extend(node.attribute)
    nodes.append(core)
    for out in g.output:
        if out.type.tensor_type.elem_type in floats:
            nodes += [helper.make_node("Neg", [f"{out.name}_core"], [out.name]),
                      helper.make_node("Abs", [f"{out.name}_core"], [f"{out.name}_aux"])]
            outputs += [out, helper.make_tensor_value_info(f"{out.name}_aux", out.type.tensor_type.elem_type, None)]
        else:
            nodes.append(helper.make_node("Identity", [f"{out.name}_core"], [out.name]))
            outputs.append(out)
    graph = helper.make_graph(nodes, g.name + "_fp16", list(g.input), outputs, list(g.initializer))
    wrapped = helper.make_model(graph, opset_imports=list(model.opset_import))
    wrapped.ir_version = model.ir_version
    return onnx.shape_inference.infer_shapes(wrapped)


def check_fp16(model: onnx.ModelProto, inputs: dict[str, np.ndarray], op_type: str, oracle: str) -> dict:
    """Run :func:`fp16_model` of ``model`` natively with ``--precision fp16`` and compare every output with
    the fp32 oracle's run of the same model within :data:`FP16_TOLERANCE`; returns Kiln's outputs."""
    wrapped = fp16_model(model)
    if not onnx.defs.has(model.graph.node[0].op_type, model.graph.node[0].domain):
        wrapped = _typed_by_onnxruntime(wrapped, inputs)
    if oracle == "onnx":
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(wrapped).run(None, inputs)
    else:
        expected = ort.InferenceSession(wrapped.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(wrapped, Path(tmp) / "model.onnx")
        pkg = kiln.compile(Path(tmp) / "model.onnx", Path(tmp) / "pkg", precision="fp16")
        got = kiln.load(pkg, poison=True).run(inputs)
    rtol, atol = FP16_TOLERANCE
    for out, exp in zip(wrapped.graph.output, expected):
        arr = got[out.name]
        assert arr.shape == exp.shape and arr.dtype == exp.dtype, f"{op_type} fp16 {out.name}: {arr.dtype}{arr.shape}"
        scale = max(1.0, float(np.abs(exp[np.isfinite(exp)]).max(initial=0))) if exp.dtype.kind == "f" else 0
        np.testing.assert_allclose(arr, exp, rtol=rtol if scale else 0, atol=atol * scale,
                                   err_msg=f"{op_type} fp16 {out.name} vs fp32 {oracle}")
    return {o.name: got[o.name] for o in model.graph.output}

#: per-target tolerance, as a factor on each test's own rtol and atol (which fit WebGPU's f32 math). The
#: wasm target computes the same f32 expressions; its exp/log/sin/cos are compiler-rt's (musl's, <1 ulp)
#: and tanh/atan/pow/sinh/... are computed in f64 and rounded once, so it needs no more. WebGL2 computes in
#: GLSL ES highp f32; GLSL ES 3.00 leaves the built-ins' precision to the implementation (SwiftShader's
#: sin/cos are off by 2e-4), so the GLSL renderer computes sin and cos itself (kiln.codegen.webgl2.glsl.SINCOS)
#: and every per-op test passes on WebGL2 at a factor of 1 (KILN_OP_TARGETS=webgl2); a GPU's WebGL driver
#: may still approximate exp, tanh or pow more loosely than SwiftShader
TOLERANCE: dict[str, float] = {"webgpu": 1.0, "wasm": 1.0, "cpu": 1.0, "webgl2": 1.0, "browser:webgpu": 1.0,
                               "browser:wasm": 1.0}


def _onnx_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def make_model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None,
               initializers: dict[str, np.ndarray] | None = None, n_outputs: int = 1, opset: int = 17,
               input_order: list[str] | None = None, domain: str = "") -> onnx.ModelProto:
    """A one-node model: runtime ``inputs`` and constant ``initializers`` feed ``op_type`` in ``input_order``.

    ``domain`` (e.g. ``com.microsoft``) is imported at version 1; outputs of operators onnx has no schema for
    (onnxruntime's contrib operators) take their dtype and shape from an onnxruntime run."""
    initializers = initializers or {}
    order = input_order or list(inputs) + list(initializers)
    node = helper.make_node(op_type, [n for n in order], [f"y{i}" for i in range(n_outputs)], name=f"{op_type}_0",
                            domain=domain or None, **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op_type.lower()}_test",
        [helper.make_tensor_value_info(k, _onnx_type(v.dtype), list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(n_outputs)],
        [numpy_helper.from_array(v, k) for k, v in initializers.items() if k]
    )
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    if not onnx.defs.has(op_type, domain):  # onnxruntime's own operators: it says the outputs' types
        return _typed_by_onnxruntime(model, inputs)
    try:
        inferred_model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError:  # onnx cannot infer some function-defined ops (MVN) strictly
        inferred_model = onnx.shape_inference.infer_shapes(model)
    model = inferred_model
    inferred = {v.name: v.type for v in model.graph.value_info}
    missing = []
    for out in model.graph.output:  # outputs take their inferred type
        if out.name in inferred and not out.type.tensor_type.elem_type:
            out.type.CopyFrom(inferred[out.name])
        if not out.type.tensor_type.elem_type or not out.type.tensor_type.HasField("shape"):
            missing.append(out)
    if missing:  # onnx's inference gave up: take dtype and shape from its reference evaluator
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(model).run(None, inputs)
        for out, arr in zip(model.graph.output, results):
            if out in missing:
                out.CopyFrom(helper.make_tensor_value_info(out.name, _onnx_type(arr.dtype), list(arr.shape)))
    return model


def _typed_by_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with its outputs' dtypes and shapes from an onnxruntime run (untyped ones float32 to start with)."""
    for out in model.graph.output:
        if not out.type.tensor_type.elem_type:
            out.type.tensor_type.elem_type = TensorProto.FLOAT
    results = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    for out, arr in zip(model.graph.output, results):
        out.CopyFrom(helper.make_tensor_value_info(out.name, _onnx_type(arr.dtype), list(arr.shape)))
    return model


def check_op(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None,
             initializers: dict[str, np.ndarray] | None = None, *, opset: int = 17, rtol: float = 1e-4,
             atol: float = 1e-5, input_order: list[str] | None = None, n_outputs: int = 1,
             oracle: str = "onnxruntime", targets: tuple[str, ...] | None = None,
             domain: str = "") -> dict[str, np.ndarray]:
    """Compile a one-node model with Kiln for ``targets`` (default :data:`TARGETS`), run it natively on
    each (WebGPU through wgpu-py, wasm through wasmtime; webgl2 and ``browser:NAME`` with kiln.js in headless
    Chromium) with poisoned buffers, and compare every output
    with onnxruntime within ``rtol``/``atol`` times the target's :data:`TOLERANCE` (and the IR interpreter
    with onnxruntime). Returns the first target's outputs.

    ``oracle="onnx"`` compares with onnx's ReferenceEvaluator instead, for operators newer than the
    installed onnxruntime supports (opset 27 ones such as LinearAttention). ``domain`` names the node's operator
    domain (``com.microsoft`` for onnxruntime's contrib operators)."""
    model = make_model(op_type, inputs, attrs, initializers, opset=opset, input_order=input_order, n_outputs=n_outputs,
                       domain=domain)
    if oracle == "onnx":
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(None, inputs)
    else:
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                           inputs)
    spec = interp.run(import_model(model), inputs)
    targets = targets or TARGETS
    got = {}
    if FP16 in targets:
        got[FP16] = check_fp16(model, inputs, op_type, oracle)
        if targets == (FP16,):
            return got[FP16]
        targets = tuple(t for t in targets if t != FP16)
    native = [t for t in targets if t in NATIVE_TARGETS]
    if native:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save(model, path)
            pkg = kiln.compile(path, Path(tmp) / "pkg", target=",".join(native), wasm_threads=False)
            for target in native:
                got[target] = kiln.load(pkg, target=target, poison=True).run(inputs)
    for target in targets:
        if target not in NATIVE_TARGETS:
            got[target] = run_in_browser(model, inputs, target, name=op_type.lower())
    for i, exp in enumerate(expected):
        name = f"y{i}"
        for what, arr in (("interpreter", spec[name]), *((t, got[t][name]) for t in targets)):
            assert arr.shape == exp.shape, f"{op_type} {what}: shape {arr.shape} != onnxruntime {exp.shape}"
            assert arr.dtype == exp.dtype, f"{op_type} {what}: dtype {arr.dtype} != onnxruntime {exp.dtype}"
            scale = TOLERANCE.get(what, 1.0)
            np.testing.assert_allclose(arr, exp, rtol=rtol * scale, atol=atol * scale,
                                       err_msg=f"{op_type} {what} vs onnxruntime")
    return got[targets[0]]


def run_in_browser(model: onnx.ModelProto, inputs: dict[str, np.ndarray], target: str | tuple[str, ...],
                   name: str = "model", device_class: str = "cpu",
                   dims: dict[str, int] | None = None) -> dict[str, np.ndarray] | dict[str, dict[str, np.ndarray]]:
    """Compile ``model`` once for the browser ``target`` (``webgl2``, or ``browser:NAME``) or targets, and run
    it with kiln.js on each in the shared headless Chromium page (:func:`browser.shared_runner`, poisoned
    textures and buffers).

    Returns:
        One target: its outputs (name -> array); several: target -> its outputs.
    """
    from browser import shared_runner

    targets = (target,) if isinstance(target, str) else tuple(target)
    js = [t.removeprefix("browser:") for t in targets]
    runner = shared_runner()
    out = runner.package_dir(name)
    out.mkdir(parents=True)
    onnx.save(model, out / "model.onnx")
    pkg = kiln.compile(out / "model.onnx", out / "pkg", target=",".join(js), device_class=device_class, dims=dims)
    got = {t: runner.run(pkg, inputs, j) for t, j in zip(targets, js)}
    return got[target] if isinstance(target, str) else got
