"""The WebGL2 target: GLSL read as source, and a representative set of the per-op tests run on WebGL2 in
headless Chromium (SwiftShader through ANGLE) against onnxruntime.

The per-op cases are the per-op tests themselves (tests/test_ops.py, test_ops_breadth.py,
test_dtypes.py), called with check_op's targets set to ``("webgl2",)``; every per-op test runs on WebGL2
with ``KILN_OP_TARGETS=webgl2 pytest tests/test_ops.py``. Tolerances per target are
``opcheck.TOLERANCE``.
"""

from __future__ import annotations

import opcheck
import pytest
import test_dtypes
import test_ops
import test_ops_breadth
from browser import CHROMIUM, close_shared_runner

from kiln.codegen.webgl2 import glsl
from kiln.errors import KilnError
from kiln.package.format import VERSION
from kiln.te.compute import compute, inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, Split


def _case(fn, **kwargs):
    name = fn.__name__.removeprefix("test_") + "".join(f"-{v}" if not isinstance(v, (tuple, list)) else f"-{v[0]}"
                                                      for v in kwargs.values())
    return pytest.param(fn, kwargs, id=name)


#: a representative set of the per-op tests: elementwise, broadcast, matmul, conv (grouped, depthwise,
#: strided, dilated), pools, reductions, softmax, data movement, resize, int and bool ops
CASES = [
    _case(test_ops.test_binary_broadcast, op="Add", shapes=test_ops.BROADCASTS[1]),
    _case(test_ops.test_binary_broadcast, op="Div", shapes=test_ops.BROADCASTS[4]),
    _case(test_ops.test_binary_broadcast, op="Max", shapes=test_ops.BROADCASTS[5]),
    *(_case(test_ops.test_unary, op=op) for op in ("Sigmoid", "Tanh", "Exp", "Log", "Erf", "Sin", "Cos", "Floor",
                                                   "HardSwish")),
    _case(test_ops.test_pow),
    _case(test_ops.test_clip_11_runtime_bounds),
    _case(test_ops.test_matmul, sa=(2, 1, 3, 4), sb=(5, 4, 2)),
    _case(test_ops.test_gemm, case=test_ops.GEMM_CASES[1]),
    *(_case(test_ops.test_conv2d, case=c) for c in test_ops.CONV_CASES
      if c[0] in ("3x3_s2_pad1", "depthwise_3x3", "depthwise_s2", "grouped", "dilated")),
    _case(test_ops.test_conv1d),
    *(_case(test_ops.test_pool2d, case=c) for c in test_ops.POOL_CASES[:2]),
    _case(test_ops.test_pool2d, case=next(c for c in test_ops.POOL_CASES if c[1] == "AveragePool")),
    _case(test_ops.test_global_average_pool, shape=(2, 5, 3, 9)),
    _case(test_ops.test_reduce, op="ReduceSum", axes=[0, 2], keepdims=0),
    _case(test_ops.test_reduce, op="ReduceMax", axes=[-1], keepdims=1),
    _case(test_ops.test_softmax_13, axis=1),
    _case(test_ops.test_log_softmax),
    _case(test_ops.test_transpose, perm=[2, 0, 1]),
    _case(test_ops.test_concat),
    _case(test_ops_breadth.test_gather_runtime_data_and_indices, axis=1),
    _case(test_ops_breadth.test_slice, case=test_ops_breadth.SLICES[2]),
    _case(test_ops_breadth.test_pad_modes, mode="reflect"),
    *(_case(test_ops_breadth.test_resize, case=c) for c in test_ops_breadth.RESIZES[:2]),
    _case(test_ops_breadth.test_layer_normalization, axis=-1),
    _case(test_ops_breadth.test_cumsum, exclusive=1, reverse=1),
    _case(test_ops_breadth.test_arg_reduce, op="ArgMax", axis=-1, keepdims=0, last=1),
    _case(test_ops_breadth.test_comparison, op="Less", dtype="int64"),
    _case(test_ops_breadth.test_logic, op="Xor"),
    _case(test_ops_breadth.test_not),
    _case(test_ops_breadth.test_where_with_scalar_branch_and_int64),
    _case(test_ops_breadth.test_mod, fmod=0),
    _case(test_ops_breadth.test_mod, fmod=1),
    _case(test_ops_breadth.test_bitwise_and_integer_pow),
    _case(test_ops_breadth.test_bit_shift, direction="RIGHT", dtype="uint8"),
    _case(test_ops_breadth.test_int16_arithmetic_wraps),
    _case(test_dtypes.test_cast_between_kernel_dtypes, src="float32", dst="float16"),
    _case(test_dtypes.test_cast_between_kernel_dtypes, src="int64", dst="bool"),
]


@pytest.fixture(scope="module")
def on_webgl2():
    """check_op runs on WebGL2 in the shared Chromium page for this module's tests, which is closed after them."""
    saved = opcheck.TARGETS
    opcheck.TARGETS = ("webgl2",)
    yield
    opcheck.TARGETS = saved
    close_shared_runner()


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")
@pytest.mark.parametrize("test,kwargs", CASES)
def test_op_on_webgl2(on_webgl2, rng, test, kwargs):
    test(rng, **kwargs)


# ----------------------------------------------------------------------------- GLSL as source
def _kernel(n_inputs: int, shape=(3, 5)):
    xs = [placeholder(shape, name=f"x{i}") for i in range(n_inputs)]

    def body(*i):
        total = xs[0][i]
        for x in xs[1:]:
            total = total + x[i]
        return total

    return inline(compute(shape, body, "sum"))


def test_glsl_fragment_shader_reads_textures_and_bakes_constants():
    x = placeholder((2, 5000), name="x")
    idx = placeholder((3,), dtype="int32", name="idx")
    out = compute((2, 3), lambda i, j: x[i, idx[j]] * 2.0, "gather")
    src = glsl.render(lower(inline(out), Schedule(), name="gather"), "Gather", width=4096)
    assert src.startswith("#version 300 es\n")
    assert "uniform sampler2D in0;  // float32[10000]: R32F 4096x3" in src
    assert "uniform isampler2D in1;  // int32[3]: R32I 3x1" in src
    assert "texelFetch(in0, ivec2(i & 4095, i >> 12), 0).x" in src  # rows of 4096 texels
    assert "layout(location = 0) out float kiln_out;" in src
    assert "int gid = int(gl_FragCoord.y) * 6 + int(gl_FragCoord.x);" in src
    assert src.count("uniform ") == 2  # no uniforms but the samplers: shapes and strides are literals


def test_glsl_integer_remainder_is_truncated_like_wgsl():
    a = placeholder((4,), dtype="int32", name="a")
    src = glsl.render(lower(inline(compute((4,), lambda i: a[i] % 3, "rem")), Schedule()))
    assert "kiln_out = kiln_rem(v0, 3);" in src and "int kiln_rem(int a, int b) { return a - (a / b) * b; }" in src


def test_glsl_refuses_register_tiles_and_too_many_textures():
    with pytest.raises(KilnError, match="register tiles"):
        glsl.render(lower(_kernel(2, (8, 8)), Schedule(splits=(Split(0, 2),))), node="Add_0")
    too_many = lower(_kernel(glsl.MAX_TEXTURE_IMAGE_UNITS + 1), Schedule())
    with pytest.raises(KilnError, match=r"node 'Sum_7': its kernel reads 17 tensors, more than the 16 textures"):
        glsl.render(too_many, node="Sum_7")
    glsl.render(lower(_kernel(glsl.MAX_TEXTURE_IMAGE_UNITS), Schedule()))  # 16 is fine


def test_texture_layout():
    assert glsl.layout(1) == (1, 1)
    assert glsl.layout(4096) == (4096, 1)
    assert glsl.layout(4097) == (4096, 2)
    assert glsl.layout(10, width=4) == (4, 3)


def test_compile_cli_writes_the_webgl2_target(tmp_path):
    import json

    import numpy as np
    import onnx
    from click.testing import CliRunner

    from kiln.cli import main

    onnx.save(opcheck.make_model("Relu", {"x": np.zeros((2, 3), np.float32)}), tmp_path / "relu.onnx")
    result = CliRunner().invoke(main, ["compile", str(tmp_path / "relu.onnx"), "--target", "webgpu,webgl2",
                                       "-o", str(tmp_path / "pkg")])
    assert result.exit_code == 0, result.output
    assert "webgpu: 1 dispatches, 1 kernels; webgl2: 1 draws, 1 kernels" in result.output
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert list(manifest["targets"]) == ["webgpu", "webgl2"] and manifest["version"] == VERSION
    gl = manifest["targets"]["webgl2"]
    assert gl["extensions"] == ["EXT_color_buffer_float"] and gl["texture_width"] == glsl.TEXTURE_WIDTH
    assert gl["plan"] == [{"kernel": 0, "inputs": [0], "output": 1, "viewport": [6, 1], "node": "Relu_0"}]
    assert [t["format"] for t in gl["textures"]] == ["R32F", "R32F"]
    assert (tmp_path / "pkg" / gl["kernels"][0]["source"]).read_text().startswith("#version 300 es")
    for module in ("kiln.js", "webgl2.js", "wasm.js", "wasm-worker.js"):
        assert (tmp_path / "pkg" / module).is_file(), module
    result = CliRunner().invoke(main, ["compile", str(tmp_path / "relu.onnx"), "--target", "webgpu,webgl3",
                                       "-o", str(tmp_path / "other")])
    assert result.exit_code == 1 and "unknown target 'webgl3'" in result.output


def test_the_native_runtime_refuses_webgl2(tmp_path):
    import kiln

    with pytest.raises(KilnError, match=r"not 'webgl2' \(WebGL2 runs in browsers"):
        kiln.load(tmp_path, target="webgl2")
