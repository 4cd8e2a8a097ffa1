"""The package contract: manifest.json against its JSON Schema (kiln/package/manifest.schema.json), the writer and
the Python runtimes through it, and the JS runtime typed from it (kiln/js/manifest.d.ts, checked by tsc)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from jsonschema import Draft202012Validator
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import kiln
from kiln.errors import PackageError
from kiln.package import manifest as contract
from kiln.package.format import FORMAT, MANIFEST, STORAGE, VERSION, read_manifest, write_manifest
from tools import manifest_types

ROOT = Path(__file__).resolve().parents[1]
TYPECHECK = ROOT / "tools" / "typecheck"
TSC = TYPECHECK / "node_modules" / "typescript" / "bin" / "tsc"
#: the modules that read the manifest, typed against manifest.d.ts and checked by tsc
ANNOTATED = ("package.js", "webgpu.js", "pipelines.js", "webgl2.js", "wasm.js", "dims.js", "control.js", "train.js",
             "kiln.js")


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(path: Path, nodes, inputs, outputs, inits=(), opset=17) -> Path:
    g = helper.make_graph(nodes, path.stem, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


def _classifier(d: Path, rng) -> Path:
    """x [1, 3, 4, 4] -> Flatten -> Gemm -> [1, 1000]: an ImageNet-shaped classifier (preprocess and postprocess)."""
    return _save(d / "classifier.onnx", [helper.make_node("Flatten", ["x"], ["f"]),
                                         helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)],
                 [_vi("x", T.FLOAT, [1, 3, 4, 4])], [_vi("y", T.FLOAT, [1, 1000])],
                 [("w", rng.standard_normal((1000, 48)).astype(np.float32)), ("b", np.zeros(1000, np.float32))])


def _rows(d: Path, rng) -> Path:
    """MatMul -> Softmax -> LayerNormalization over 128: reduce lanes and a row kernel on gpu schedules; an int64
    input stored as int32."""
    n = helper.make_node
    return _save(d / "rows.onnx", [n("MatMul", ["x", "w"], ["h"]), n("Softmax", ["h"], ["s"], axis=-1),
                                   n("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1),
                                   n("Cast", ["k"], ["kf"], to=T.FLOAT), n("Add", ["y", "kf"], ["z"])],
                 [_vi("x", T.FLOAT, ["N", 128]), _vi("k", T.INT64, ["N", 128])], [_vi("z", T.FLOAT, ["N", 128])],
                 [("w", rng.standard_normal((128, 128)).astype(np.float32)), ("g", np.ones(128, np.float32)),
                  ("b", np.zeros(128, np.float32))])


def _mlp(d: Path, rng) -> Path:
    """x [4, 3] -> MatMul -> Add -> Tanh -> MatMul -> Add -> Sigmoid -> y [4, 2] (odd-length weights for fp16)."""
    n = helper.make_node
    return _save(d / "mlp.onnx", [n("MatMul", ["x", "w1"], ["h"]), n("Add", ["h", "b1"], ["hb"]),
                                  n("Tanh", ["hb"], ["t"]), n("MatMul", ["t", "w2"], ["o"]),
                                  n("Add", ["o", "b2"], ["ob"]), n("Sigmoid", ["ob"], ["y"])],
                 [_vi("x", T.FLOAT, [4, 3])], [_vi("y", T.FLOAT, [4, 2])],
                 [(name, rng.standard_normal(shape).astype(np.float32))
                  for name, shape in (("w1", (3, 5)), ("b1", (5,)), ("w2", (5, 2)), ("b2", (2,)))])


def _dynamic(d: Path, rng) -> Path:
    """x [batch, seq, 8] -> MatMul -> Relu: run-time dims batch and seq (a multiple of 8)."""
    n = helper.make_node
    return _save(d / "dynamic.onnx", [n("MatMul", ["x", "w"], ["h"]), n("Relu", ["h"], ["y"])],
                 [_vi("x", T.FLOAT, ["batch", "seq", 8])], [_vi("y", T.FLOAT, ["batch", "seq", 4])],
                 [("w", rng.standard_normal((8, 4)).astype(np.float32))])


def _control(d: Path, rng) -> Path:
    """for i in range(M) while go: acc = acc + x * i, rows stacked (a scan output), and then
    If(sum(acc) > t): relu(acc) else -acc: run-time Loop and If steps."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Cast", ["i"], ["fi"], to=T.FLOAT), n("Mul", ["x", "fi"], ["xi"]), n("Add", ["acc_in", "xi"], ["acc_out"]),
         n("Identity", ["acc_out"], ["row"]), n("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("acc_in", T.FLOAT, [2, 3])],
        [_vi("c_out", T.BOOL, []), _vi("acc_out", T.FLOAT, [2, 3]), _vi("row", T.FLOAT, [2, 3])])
    then_g = helper.make_graph([n("Relu", ["acc"], ["r"])], "then", [], [_vi("r", T.FLOAT, [2, 3])])
    else_g = helper.make_graph([n("Neg", ["acc"], ["e"])], "else", [], [_vi("e", T.FLOAT, [2, 3])])
    return _save(d / "control.onnx",
                 [n("Loop", ["M", "go", "acc0"], ["acc", "rows"], body=body),
                  n("ReduceSum", ["acc"], ["s"], keepdims=0), n("Greater", ["s", "t"], ["c"]),
                  n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                 [_vi("x", T.FLOAT, [2, 3]), _vi("acc0", T.FLOAT, [2, 3]), _vi("go", T.BOOL, []),
                  _vi("t", T.FLOAT, [])],
                 [_vi("y", T.FLOAT, [2, 3]), _vi("rows", T.FLOAT, [4, 2, 3])], [("M", np.array(4, np.int64))], opset=16)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Small real packages of every kind the writer makes: every target, gpu schedules, run-time dims, run-time
    control flow, a train step and fp16."""
    from kiln.train import OptimizerConfig, TrainOptions

    d = tmp_path_factory.mktemp("contract")
    rng = np.random.default_rng(0)
    mlp = _mlp(d, rng)
    return {
        "targets": kiln.compile(_classifier(d, rng), d / "targets", target="webgpu,webgl2,wasm,cpu", device_class="cpu"),
        "rows": kiln.compile(_rows(d, rng), d / "rows", dims={"N": 2}),
        "dynamic": kiln.compile(_dynamic(d, rng), d / "dynamic", dims={"batch": (1, 4), "seq": "8..64@16%8"},
                                device_class="cpu"),
        "control": kiln.compile(_control(d, rng), d / "control", device_class="cpu"),
        "train": kiln.compile(mlp, d / "train", device_class="cpu", train=TrainOptions(
            loss="mse", gradients=True, optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9, nesterov=True))),
        "fp16": kiln.compile(mlp, d / "fp16", precision="fp16"),
    }


def _load(pkg: Path) -> dict:
    return json.loads((pkg / MANIFEST).read_text())


def _undescribed(instance, node, path="") -> list[str]:
    """JSON paths of the object keys in ``instance`` that schema ``node`` does not name (unknown keys are allowed for
    forward compatibility, so validation alone would not notice a field the writer adds without describing it)."""
    defs = contract.schema()["$defs"]
    while True:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]
        elif "if" in node and "properties" not in node:  # the plan-step dispatch
            node = node["then"] if Draft202012Validator(node["if"]).is_valid(instance) else node.get("else", {})
        elif "anyOf" in node and "properties" not in node:
            node = next(a for a in node["anyOf"] if Draft202012Validator({"$defs": defs, **a}).is_valid(instance))
        else:
            break
    out = []
    if isinstance(instance, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        for key, value in instance.items():
            if key in props:
                out += _undescribed(value, props[key], f"{path}.{key}" if path else key)
            elif isinstance(extra, dict):
                out += _undescribed(value, extra, f"{path}.{key}" if path else key)
            else:
                out.append(f"{path}.{key}" if path else key)
    elif isinstance(instance, list):
        prefix = node.get("prefixItems", [])
        for i, value in enumerate(instance):
            out += _undescribed(value, prefix[i] if i < len(prefix) else node.get("items", {}), f"{path}[{i}]")
    return out


# ----------------------------------------------------------------------------- the schema itself
def test_schema_is_valid_draft_2020_12_and_matches_the_format():
    schema = contract.schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["format"]["const"] == FORMAT
    assert set(schema["required"]) >= {"format", "version", "inputs", "outputs", "buffers", "targets", "weights"}
    from kiln.ir.dtypes import NUMPY

    assert set(schema["$defs"]["Dtype"]["enum"]) == set(NUMPY)  # every dtype the IR has
    assert set(STORAGE.values()) | {"float16"} == set(schema["$defs"]["StorageDtype"]["enum"])

    def described(node, where):  # every property and definition says what it is (the .d.ts JSDoc comes from them)
        if isinstance(node, dict):
            for key, prop in node.get("properties", {}).items():
                ref = prop.get("$ref", "")
                assert "description" in prop or ref, f"{where}.{key} has no description"
                described(prop, f"{where}.{key}")

    for name, d in schema["$defs"].items():
        assert d.get("description"), f"$defs/{name} has no description"
        described(d, name)
    described(schema, "manifest")


def test_schema_is_package_data():
    from importlib import resources

    assert (resources.files("kiln.package") / contract.SCHEMA_FILE).is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"package/*.json"' in pyproject and '"jsonschema>=4.18"' in pyproject


# ----------------------------------------------------------------------------- (a) real packages validate
def test_real_manifests_validate_and_every_field_is_described(packages):
    for name, pkg in packages.items():
        m = read_manifest(pkg)  # validates
        assert m["version"] == VERSION
        contract.validate_manifest(m, name)
        assert _undescribed(m, contract.schema()) == [], name


def test_real_manifests_cover_every_part(packages):
    m = {name: _load(pkg) for name, pkg in packages.items()}
    targets = m["targets"]
    assert list(targets["targets"]) == ["webgpu", "webgl2", "wasm", "cpu"] and targets["targets"]["wasm"]["threads"]
    assert targets["preprocess"]["type"] == "image" and targets["postprocess"]["labels"] == "labels.txt"
    schedules = [k["schedule"] for k in m["rows"]["targets"]["webgpu"]["kernels"]]
    assert any(s.get("rows") for s in schedules) and m["rows"]["targets"]["webgpu"]["device_class"] == "gpu"
    assert {"int64"} <= {i["dtype"] for i in m["rows"]["inputs"]} and m["rows"]["dims"] == {"N": 2}
    dyn = m["dynamic"]
    assert [d["name"] for d in dyn["dynamic_dims"]] == ["batch", "seq"] and dyn["dynamic_dims"][1]["multiple"] == 8
    assert "dims_uniform" in dyn["targets"]["webgpu"] and "dynamic_shape" in dyn["inputs"][0]
    assert all("groups" in s for s in dyn["targets"]["webgpu"]["plan"])
    plan = m["control"]["targets"]["webgpu"]["plan"]
    assert any("loop" in s and s["loop"]["scan"] for s in plan) and any("if" in s for s in plan)
    assert any("copy" in s for s in plan for s in s.get("then", []))
    train = m["train"]
    assert "train_plan" in train["targets"]["webgpu"] and train["training"]["optimizer"]["nesterov"] is True
    assert any(b["kind"] == "update" for b in train["buffers"]) and any(b.get("trainable") for b in train["buffers"])
    assert any(o["name"].startswith("grad/") for o in train["training"]["outputs"])
    assert m["fp16"]["precision"] == "fp16" and m["fp16"]["targets"]["webgpu"]["features"] == ["shader-f16"]


def test_fields_of_tuned_shared_tile_and_error_steps_validate():
    """What real packages above do not show: tuned kernels, shared-tile schedule knobs, dims bindings and the
    error step of a branch the compiler could not build, written by the writer's own serialisers."""
    from kiln.codegen.webgpu.build import Kernel
    from kiln.te.schedule import Schedule, Split

    knobs = Schedule(workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4)), unroll=8, shared_k=8, vector_width=4,
                     prefetch=True).to_json()
    kernel = Kernel("k000_matmul", "", ["read", "read", "read_write"], ["MatMul"], knobs,
                    {"speedup": 1.7, "trials": 64, "adapter": "nvidia | hopper | h100 | 555"}, dims=True).to_json()
    section = {"features": [], "limits": {"maxStorageBuffersPerShaderStage": 3}, "kernels": [kernel],
               "plan": [{"if": 0, "then": [{"error": "the then branch needs a static shape"}],
                         "else": [{"kernel": 0, "dispatch": [1, 1, 1], "buffers": [0, 1, 2], "node": "MatMul_0"}],
                         "node": "If_0"}]}
    contract.validate_section("webgpu", section, "test")
    assert _undescribed(section, contract.schema()["$defs"]["WebGPUTarget"]) == []


def test_older_and_newer_minor_versions_are_read(packages, tmp_path):
    """A 1.0 manifest (no storage, model_dtype, precision, device_class, schedules) and a 1.x manifest with keys and
    a target this runtime does not know are both read (docs/package-format.md, Versioning)."""
    m = _load(packages["targets"])
    old = copy.deepcopy(m)
    old["version"] = "1.0"
    for key in ("precision", "preprocess", "postprocess"):
        old.pop(key)
    del old["targets"]["webgl2"], old["targets"]["wasm"], old["targets"]["cpu"]
    for spec in old["inputs"] + old["outputs"]:
        spec.pop("storage")
    for b in old["buffers"]:
        b.pop("model_dtype", None)
    gpu = old["targets"]["webgpu"]
    gpu.pop("device_class")
    for k in gpu["kernels"]:
        k.pop("schedule")
    contract.validate_manifest(old, "1.0")
    new = copy.deepcopy(m)
    new["version"] = "1.9"
    new["some_1_9_key"] = {"x": 1}
    new["targets"]["webgpu"]["some_1_9_key"] = [1, 2]
    new["targets"]["metal"] = {"library": "kernels/kiln.metallib"}  # a target this runtime does not know
    contract.validate_manifest(new, "1.9")
    copy_dir = tmp_path / "newer"
    shutil.copytree(packages["targets"], copy_dir)
    write_manifest(copy_dir, new)
    assert read_manifest(copy_dir)["some_1_9_key"] == {"x": 1}


# ----------------------------------------------------------------------------- (b) broken manifests are refused
def _broken(pkg: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "broken"
    shutil.copytree(pkg, out)
    m = _load(out)
    edit(m)
    write_manifest(out, m)
    return out


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda m: m["targets"]["webgpu"]["plan"][0].update(kernel="x"),
     "targets.webgpu.plan[0].kernel: 'x' is not of type 'integer'"),
    (lambda m: m["buffers"][1].pop("bytes"), "buffers[1]: 'bytes' is a required property"),
    (lambda m: m.pop("weights"), "'weights' is a required property"),
    (lambda m: m["weights"]["files"][0].update(sha256="00"), "weights.files[0].sha256: '00' does not match"),
    (lambda m: m["targets"]["wasm"]["memory"].update(offsets="all"),
     "targets.wasm.memory.offsets: 'all' is not of type 'array'"),
    (lambda m: m["targets"]["webgl2"]["textures"][0].update(format="RGBA8"),
     "targets.webgl2.textures[0].format: 'RGBA8' is not one of"),
    (lambda m: m["inputs"][0].update(dtype="complex64"), "inputs[0].dtype: 'complex64' is not one of"),
    (lambda m: m["targets"]["webgpu"]["plan"].insert(0, {"barrier": 1}),  # an unknown step kind
     "targets.webgpu.plan[0]: 'kernel' is a required property"),
])
def test_broken_manifest_is_refused_with_one_line(packages, tmp_path, edit, problem):
    pkg = _broken(packages["targets"], tmp_path, edit)
    with pytest.raises(PackageError) as info:
        read_manifest(pkg)
    message = str(info.value)
    assert message.startswith(f"{pkg / MANIFEST}: {problem}"), message
    assert "\n" not in message and len(message) < 400, message


def test_broken_nested_step_names_its_path(packages, tmp_path):
    def edit(m):
        loop = next(s for s in m["targets"]["webgpu"]["plan"] if "loop" in s)
        loop["loop"]["body"][0]["buffers"] = [0, "one"]

    pkg = _broken(packages["control"], tmp_path, edit)
    with pytest.raises(PackageError, match=r"targets\.webgpu\.plan\[\d+\]\.loop\.body\[0\]\.buffers\[1\]: 'one' is not "
                                           r"of type 'integer'$"):
        kiln.load(pkg)


def test_newer_major_version_is_refused_before_the_schema(packages, tmp_path):
    pkg = _broken(packages["targets"], tmp_path, lambda m: m.update(version="2.0", buffers="changed in 2.0"))
    with pytest.raises(PackageError, match="package format 2.0 is newer than this Kiln reads"):
        read_manifest(pkg)


def test_cli_reports_a_broken_manifest_in_one_line(packages, tmp_path):
    pkg = _broken(packages["fp16"], tmp_path, lambda m: m["outputs"][0].update(buffer=-1))
    proc = subprocess.run([sys.executable, "-c", "from kiln.cli import run; run()", "info", str(pkg)], check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"error: {pkg / MANIFEST}: outputs[0].buffer: -1 is less than the minimum of 0"


# ----------------------------------------------------------------------------- (c) the writer refuses bad sections
def _listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_bad_target_section_fails_before_anything_is_written(packages, tmp_path, monkeypatch):
    import kiln.codegen.wasm as wasm_target

    real = wasm_target.section

    def broken(code):
        entry, files = real(code)
        entry["plan"][0]["total"] = "many"
        return entry, files

    monkeypatch.setattr(wasm_target, "section", broken)
    model = _mlp(tmp_path, np.random.default_rng(1))
    out = tmp_path / "pkg"
    with pytest.raises(PackageError) as info:
        kiln.compile(model, out, target="webgpu,wasm")
    assert str(info.value) == (f"{out / MANIFEST} (not written): targets.wasm.plan[0].total: 'many' is not of "
                               "type 'integer'")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]
    existing = tmp_path / "existing"  # --force over a package: it stays as it was
    shutil.copytree(packages["fp16"], existing)
    before = _listing(existing)
    with pytest.raises(PackageError, match="targets.wasm.plan"):
        kiln.compile(model, existing, target="webgpu,wasm", force=True)
    assert _listing(existing) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "mlp.onnx"]  # no temporary directory left


def test_a_bad_manifest_fails_before_it_is_written(tmp_path):
    from kiln.compiler import compile_graph
    from kiln.frontend.onnx.importer import import_model
    from kiln.package.writer import write_package

    model = onnx.load(_mlp(tmp_path, np.random.default_rng(2)))
    compiled = compile_graph(import_model(model), "webgpu", device_class="cpu")
    compiled.program.precision = "fp64"  # the top level is assembled by the writer itself
    out = tmp_path / "pkg"
    with pytest.raises(PackageError, match=r"^.*pkg/manifest\.json \(not written\): precision: 'fp64' is not one of"):
        write_package(compiled, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


# ----------------------------------------------------------------------------- (d) the .d.ts follows the schema
def test_manifest_types_are_generated_from_the_schema():
    text = manifest_types.render(contract.schema())
    assert manifest_types.OUT.read_text() == text, "kiln/js/manifest.d.ts is stale: run python -m tools.manifest_types"
    assert manifest_types.main(["--check"]) == 0
    for name in contract.schema()["$defs"]:
        assert f"export type {name} =" in text or f"export interface {name} {{" in text
    assert "export interface Manifest {" in text and "export type WebGPUStep = KernelStep | CopyStep | IfStep | LoopStep | ErrorStep;" in text


def test_manifest_types_mapping():
    schema = {"title": "Root", "type": "object", "required": ["a"], "properties": {
        "a": {"description": "an */ end", "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
              "minItems": 2, "maxItems": 2},
        "b": {"type": ["integer", "null"]}, "c": {"enum": ["x", "y"]},
        "d": {"type": "array", "items": {"$ref": "#/$defs/E"}},
        "m": {"type": "object", "additionalProperties": {"type": "number"}}},
        "$defs": {"E": {"description": "E.", "anyOf": [{"const": 1}, {"type": "boolean"}]}}}
    text = manifest_types.render(schema)
    assert "  /** an *\\/ end */\n  a: [number, string];" in text
    assert "  b?: number | null;" in text and '  c?: "x" | "y";' in text and "  d?: E[];" in text
    assert "  m?: { [key: string]: number };" in text and "export type E = 1 | boolean;" in text
    with pytest.raises(ValueError, match=r"Root\.n: an object with properties must be a \$defs entry"):
        manifest_types.render({**schema, "properties": {"n": {"type": "object", "properties": {"z": {}}}}})


# ----------------------------------------------------------------------------- (e) tsc checks the annotated JS
def test_annotated_modules_use_the_manifest_types():
    for name in ANNOTATED:
        text = (ROOT / "kiln" / "js" / name).read_text()
        assert text.startswith("// @ts-check\n"), name
        assert "import('./manifest')." in text, name


def test_tsc_type_checks_the_runtime():
    if not TSC.exists() or shutil.which("node") is None:
        pytest.skip(f"TypeScript is not installed: run `npm ci` in {TYPECHECK.relative_to(ROOT)} (setup.sh does)")
    result = subprocess.run(["node", str(TSC), "-p", str(TYPECHECK / "tsconfig.json"), "--pretty", "false"],
                            check=False, capture_output=True, text=True, timeout=300, cwd=TYPECHECK)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    listed = subprocess.run(["node", str(TSC), "-p", str(TYPECHECK / "tsconfig.json"), "--listFilesOnly"],
                            check=False, capture_output=True, text=True, timeout=300, cwd=TYPECHECK).stdout
    assert "kiln/js/manifest.d.ts" in listed and "kiln/js/webgpu.js" in listed
