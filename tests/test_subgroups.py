"""Kernels' subgroup forms (WebGPU ``subgroups``; kiln.te.loops.Subgroups, kiln.runtime.subgroups): lane combines
shuffled inside subgroups compute what the plain forms compute, natively and in Chromium, and a runtime falls back
to the plain forms cleanly."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.codegen.webgpu.wgsl import SUBGROUP_PROBE, SUBGROUP_PROBE_FILE
from kiln.runtime import gpu, subgroups
from kiln.runtime.pipelines import KernelSpec, pipeline_cache
from tests.browser import evaluate_in_package


def _model(path, rng):
    """LayerNormalization over 384 (a row kernel), a MatMul of 1024 terms (split over lanes), a Softmax over 96 and a
    ReduceMax (one workgroup combining 3 x 96 values): every kind of lane combine the WebGPU target lowers."""
    n = helper.make_node
    w = (rng.standard_normal((384, 1024)) * 0.05).astype(np.float32)
    v = (rng.standard_normal((1024, 96)) * 0.05).astype(np.float32)
    graph = helper.make_graph(
        [n("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1), n("MatMul", ["ln", "w"], ["h"]),
         n("MatMul", ["h", "v"], ["s"]), n("Softmax", ["s"], ["y"], axis=-1),
         n("ReduceMax", ["s"], ["m"], keepdims=0)], "lanes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 384])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 96]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [])],
        [numpy_helper.from_array((1 + rng.standard_normal(384) * 0.1).astype(np.float32), "g"),
         numpy_helper.from_array((rng.standard_normal(384) * 0.1).astype(np.float32), "b"),
         numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.save(model, path)
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    d = tmp_path_factory.mktemp("subgroups")
    model = _model(d / "lanes.onnx", np.random.default_rng(7))
    return kiln.compile(str(d / "lanes.onnx"), str(d / "pkg"), target="webgpu", force=True), model


def _usable() -> bool:
    return subgroups.usable(gpu.shared_device(), True, SUBGROUP_PROBE)


def test_kernels_that_combine_lanes_carry_a_subgroup_form(package):
    pkg, _ = package
    target = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]
    kernels = target["kernels"]
    forms = [k for k in kernels if "subgroups" in k]
    # the probe a runtime checks a device with comes in the package, from the compiler
    assert target["subgroup_probe"] == SUBGROUP_PROBE_FILE and (pkg / SUBGROUP_PROBE_FILE).read_text() == SUBGROUP_PROBE
    assert len(forms) >= 3, [k["name"] for k in kernels]
    for k in kernels:
        plain = (pkg / k["source"]).read_text()
        assert "subgroup" not in plain
        if "subgroups" not in k:
            assert "workgroupBarrier" not in plain
            continue
        form = (pkg / k["subgroups"]["source"]).read_text()
        assert form.count("enable subgroups;") == 1 and "subgroupShuffleXor" in form
        # the same work but for the combines: fewer barriers, the same loads of the inputs
        assert form.count("workgroupBarrier") < plain.count("workgroupBarrier")
        assert set(re.findall(r"\bin\d+\[", form)) == set(re.findall(r"\bin\d+\[", plain))
    # a group of lanes wider than a subgroup combines its subgroups' values in a loop, counted for llvmpipe's limit
    # in the form's own loop_iterations (kiln.runtime.loop_limit checks the form that runs)
    assert any(k["subgroups"].get("loop_iterations", 0) > k.get("loop_iterations", 0) for k in forms)
    ran = subgroups.forms_run(kernels, True)
    assert [k.get("loop_iterations", 0) for k in ran] == [
        k["subgroups"].get("loop_iterations", 0) if "subgroups" in k else k.get("loop_iterations", 0) for k in kernels]
    assert subgroups.forms_run(kernels, False) == kernels


@pytest.mark.parametrize("wanted", [True, False])
def test_subgroup_and_plain_forms_match_onnxruntime(package, wanted):
    pkg, model = package
    if wanted and not _usable():
        pytest.skip("this adapter runs no subgroup forms")
    session = kiln.load(pkg, subgroups=wanted)
    assert session.subgroups is wanted
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((3, 384)).astype(np.float32) * 2
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = session.run({"x": x})
        np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got["m"], want[1], rtol=1e-5, atol=1e-6)


def test_probe_and_switch(monkeypatch):
    device = gpu.shared_device()
    if subgroups.FEATURE not in device.features:
        assert not subgroups.usable(device, True, SUBGROUP_PROBE)
        return
    # lavapipe and every Vulkan GPU seen fill subgroups in order
    assert subgroups.usable(device, True, SUBGROUP_PROBE)
    assert not subgroups.usable(device, False, SUBGROUP_PROBE)
    cpu = device.adapter.info.get("adapter_type") == "CPU"
    monkeypatch.delenv(subgroups.ENV, raising=False)
    # by default on GPUs only (CPU adapters emulate the shuffles)
    assert subgroups.usable(device, probe=SUBGROUP_PROBE) is not cpu
    monkeypatch.setenv(subgroups.ENV, "0")
    assert not subgroups.usable(device, probe=SUBGROUP_PROBE)
    monkeypatch.setenv(subgroups.ENV, "1")
    assert subgroups.usable(device, probe=SUBGROUP_PROBE)


def test_a_subgroup_form_that_does_not_compile_falls_back_to_the_plain_form(package):
    pkg, _ = package
    kernel = next(k for k in json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]
                  if "subgroups" in k)
    plain = (pkg / kernel["source"]).read_text()
    access = tuple(b["access"] for b in kernel["bindings"])
    broken = KernelSpec(plain.replace("fn main(", "fn main(@builtin(nonsense) x: u32, "), "main", access, "broken",
                        fallback=plain)
    with pytest.warns(RuntimeWarning, match="subgroup form does not compile"):
        got = pipeline_cache(gpu.shared_device()).get(broken)
    assert got.pipeline is not None


def test_subgroup_forms_in_chromium(browser, package):
    pkg, model = package
    x = np.random.default_rng(3).standard_normal((3, 384)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = evaluate_in_package(browser, pkg, """async (x) => {
      const kiln = await import('./kiln.js');
      const {subgroupsUsable} = await import('./subgroups.js');
      const session = await kiln.load('./', {target: 'webgpu', subgroups: true});
      const out = await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), [3, 384])});
      const probe = await (await fetch('./kernels/subgroup-probe.wgsl')).text();
      const usable = await subgroupsUsable(session.device, probe);
      session.destroy();
      return {usable, y: Array.from(out.y.data), m: Array.from(out.m.data)};
    }""", x.ravel().tolist())
    assert got["usable"], "Chromium's SwiftShader adapter has subgroups: the subgroup forms should run"
    np.testing.assert_allclose(np.reshape(got["y"], (3, 96)), want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["m"][0], want[1], rtol=1e-5, atol=1e-6)
