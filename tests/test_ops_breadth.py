"""Operators beyond MobileNet's: math, comparisons and logic, indexing and data movement, against onnxruntime.

Every case compiles a one-node model with Kiln, runs it natively on WebGPU with poisoned buffers
and compares with onnxruntime (CPU) and Kiln's interpreter, on fresh random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from opcheck import check_op


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def i64(rng, *shape, lo=-9, hi=10):
    return rng.integers(lo, hi, size=shape).astype(np.int64)


def shape_of(rng, rank_lo=1, rank_hi=4):
    return tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(rank_lo, rank_hi + 1))))


# ----------------------------------------------------------------------------- unary math and activations
UNARY = {
    "Tan": (-1.2, 1.2), "Asin": (-0.99, 0.99), "Acos": (-0.99, 0.99), "Atan": (-5, 5), "Sinh": (-4, 4),
    "Cosh": (-4, 4), "Asinh": (-5, 5), "Acosh": (1.01, 6), "Atanh": (-0.95, 0.95), "Sign": (-2, 2),
    "Round": (-4, 4), "Softplus": (-30, 30), "Softsign": (-5, 5), "Mish": (-12, 8), "IsNaN": (-1, 1),
    "IsInf": (-1, 1),
}


@pytest.mark.parametrize("op", list(UNARY))
def test_unary_math(rng, op):
    lo, hi = UNARY[op]
    x = f32(rng, *shape_of(rng), lo=lo, hi=hi)
    if op in ("IsNaN", "IsInf"):
        x.flat[:: 3] = np.nan
        x.flat[1:: 4] = np.inf
        x.flat[2:: 5] = -np.inf
    check_op(op, {"x": x}, opset=18, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,attrs", [("Elu", {"alpha": 0.7}), ("Selu", {}), ("Celu", {"alpha": 1.5}),
                                      ("ThresholdedRelu", {"alpha": 0.3}), ("Shrink", {"bias": 0.2, "lambd": 0.6}),
                                      ("Gelu", {}), ("Gelu", {"approximate": "tanh"})])
def test_activation(rng, op, attrs):
    check_op(op, {"x": f32(rng, 3, 17, lo=-4, hi=4)}, attrs, opset=20, rtol=1e-4, atol=1e-5)


def test_prelu_broadcast_slope(rng):
    check_op("PRelu", {"x": f32(rng, 2, 3, 4, 5)}, {}, {"slope": f32(rng, 3, 1, 1, lo=0, hi=0.5)})


def test_not(rng):
    check_op("Not", {"x": rng.integers(0, 2, size=(4, 5)).astype(bool)})


# ----------------------------------------------------------------------------- comparisons, logic, Where
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_comparison(rng, op, dtype):
    if dtype == "float32":
        a, b = f32(rng, 3, 4).round(1), f32(rng, 4).round(1)
    else:
        a, b = i64(rng, 3, 4, lo=0, hi=4), i64(rng, 4, lo=0, hi=4)
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(rng, op):
    check_op(op, {"a": rng.integers(0, 2, size=(2, 3, 4)).astype(bool), "b": rng.integers(0, 2, size=(3, 1)).astype(bool)})


def test_where_broadcasts_three_ways(rng):
    check_op("Where", {"c": rng.integers(0, 2, size=(3, 1, 5)).astype(bool), "x": f32(rng, 4, 5), "y": f32(rng, 3, 4, 1)})


def test_where_with_scalar_branch_and_int64(rng):
    check_op("Where", {"c": rng.integers(0, 2, size=(2, 6)).astype(bool), "x": i64(rng, 2, 6)}, {},
             {"y": np.array(-7, np.int64)})


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod(rng, fmod):
    if fmod:
        check_op("Mod", {"a": f32(rng, 3, 5, lo=-9, hi=9), "b": f32(rng, 5, lo=1, hi=4)}, {"fmod": 1})
    else:
        b = i64(rng, 3, 5, lo=1, hi=6) * rng.choice([-1, 1], size=(3, 5))
        check_op("Mod", {"a": i64(rng, 3, 5, lo=-20, hi=20), "b": b.astype(np.int64)})


def test_bitwise_and_integer_pow(rng):
    a, b = rng.integers(-100, 100, (4, 4)).astype(np.int32), rng.integers(-100, 100, (4,)).astype(np.int32)
    check_op("BitwiseAnd", {"a": a, "b": b}, opset=18)
    check_op("BitwiseNot", {"a": a}, opset=18)
    check_op("Pow", {"a": i64(rng, 3, 4, lo=-5, hi=6), "b": i64(rng, 3, 4, lo=0, hi=4)}, opset=15)


def test_mean_and_castlike(rng):
    check_op("Mean", {"a": f32(rng, 3, 4), "b": f32(rng, 4), "c": f32(rng, 1, 4)})
    check_op("CastLike", {"x": f32(rng, 3, 4, lo=-50, hi=50), "like": i64(rng, 1)}, opset=15)


# ----------------------------------------------------------------------------- Gather and friends
def test_gather_embedding_lookup(rng):
    ids = i64(rng, 2, 7, lo=-30, hi=30)
    check_op("Gather", {"ids": ids}, {"axis": 0}, {"table": f32(rng, 30, 16)}, input_order=["table", "ids"])


@pytest.mark.parametrize("axis", [1, -1])
def test_gather_runtime_data_and_indices(rng, axis):
    x = f32(rng, 3, 5, 4)
    idx = rng.integers(-x.shape[axis], x.shape[axis], size=(2, 3)).astype(np.int64)
    check_op("Gather", {"x": x, "idx": idx}, {"axis": axis})


def test_gather_scalar_index(rng):
    check_op("Gather", {"x": f32(rng, 4, 6)}, {"axis": 1}, {"i": np.array(-2, np.int64)})


def test_gather_elements(rng):
    x = f32(rng, 3, 4)
    check_op("GatherElements", {"x": x, "i": rng.integers(-3, 3, size=(5, 4)).astype(np.int64)}, {"axis": 0})


# ----------------------------------------------------------------------------- Slice, Split, Expand, Tile, Pad
SLICES = [([1, 0], [3, 10], [0, 1], None), ([-1], [-100], [1], [-2]), ([0, 1], [2**62, -1], [2, 1], [1, 2]),
          ([4, 0, 1], [0, 2, 3], [0, 1, 2], [-1, 1, 1])]


@pytest.mark.parametrize("case", SLICES, ids=lambda c: f"starts{c[0]}_steps{c[3]}")
def test_slice(rng, case):
    starts, ends, axes, steps = case
    inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64), "axes": np.array(axes, np.int64)}
    if steps:
        inits["steps"] = np.array(steps, np.int64)
    check_op("Slice", {"x": f32(rng, 5, 4, 6)}, {}, inits)


def test_split_outputs(rng):
    check_op("Split", {"x": f32(rng, 2, 7)}, {"axis": 1}, {"split": np.array([2, 5], np.int64)}, n_outputs=2)
    check_op("Split", {"x": f32(rng, 7, 3)}, {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3)


def test_expand_and_tile(rng):
    check_op("Expand", {"x": f32(rng, 3, 1)}, {}, {"shape": np.array([2, 1, 4], np.int64)})
    check_op("Tile", {"x": f32(rng, 2, 3)}, {}, {"r": np.array([3, 2], np.int64)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes(rng, mode):
    inits = {"pads": np.array([1, 2, 0, 3, 2, 1], np.int64)}
    if mode == "constant":
        inits["value"] = np.array(1.5, np.float32)
    check_op("Pad", {"x": f32(rng, 4, 5, 3)}, {"mode": mode}, inits, opset=19)


def test_pad_negative_crops(rng):
    check_op("Pad", {"x": f32(rng, 4, 5)}, {}, {"pads": np.array([-1, 2, 1, -2], np.int64)})


@pytest.mark.parametrize("upper,k", [(1, 0), (0, -1), (1, 2)])
def test_trilu(rng, upper, k):
    check_op("Trilu", {"x": f32(rng, 2, 4, 5)}, {"upper": upper}, {"k": np.array(k, np.int64)})


# ----------------------------------------------------------------------------- ArgMax/ArgMin, CumSum, OneHot, layout
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 1), (1, 1, 1)])
def test_arg_reduce(rng, op, axis, keepdims, last):
    x = rng.integers(0, 4, size=(3, 5, 4)).astype(np.float32)  # ties, so first/last index matters
    check_op(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(rng, exclusive, reverse):
    check_op("CumSum", {"x": f32(rng, 3, 6)}, {"exclusive": exclusive, "reverse": reverse},
             {"axis": np.array(1, np.int64)})


def test_onehot(rng):
    check_op("OneHot", {"i": i64(rng, 2, 3, lo=-5, hi=5)}, {"axis": 1},
             {"depth": np.array(5, np.int64), "values": np.array([0.5, 2.0], np.float32)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(rng, mode):
    check_op("DepthToSpace", {"x": f32(rng, 1, 8, 2, 3)}, {"blocksize": 2, "mode": mode})
    check_op("SpaceToDepth", {"x": f32(rng, 1, 2, 4, 6)}, {"blocksize": 2})


def test_int64_cast_to_bool_output(rng):
    check_op("Cast", {"x": i64(rng, 3, 3, lo=-1, hi=2)}, {"to": TensorProto.BOOL})


# ----------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization(rng, axis):
    x = f32(rng, 2, 5, 8, lo=-3, hi=3)
    norm = x.shape[axis:]
    check_op("LayerNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-3},
             {"scale": f32(rng, *norm), "bias": f32(rng, *norm)}, atol=1e-5)


def test_layer_normalization_optional_outputs(rng):
    x = f32(rng, 3, 7, lo=-3, hi=3)
    check_op("LayerNormalization", {"x": x}, {}, {"scale": f32(rng, 7)}, n_outputs=3, atol=1e-5)


def test_instance_and_group_normalization(rng):
    c = 6
    check_op("InstanceNormalization", {"x": f32(rng, 2, c, 4, 5)}, {"epsilon": 1e-4},
             {"scale": f32(rng, c), "bias": f32(rng, c)}, atol=1e-5)
    check_op("GroupNormalization", {"x": f32(rng, 2, c, 3, 3)}, {"num_groups": 3},
             {"scale": f32(rng, c), "bias": f32(rng, c)}, opset=21, atol=1e-5)


def test_lrn_mvn_lp_normalization(rng):
    check_op("LRN", {"x": f32(rng, 2, 7, 3, 3)}, {"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, atol=1e-5)
    check_op("MeanVarianceNormalization", {"x": f32(rng, 2, 3, 4, 5)}, atol=1e-5)
    check_op("LpNormalization", {"x": f32(rng, 3, 6)}, {"p": 1, "axis": 0})
    check_op("LpNormalization", {"x": f32(rng, 3, 6)}, {"p": 2, "axis": -1})


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
                                "ReduceProd"])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), (None, 1)])
def test_reduce_composites(rng, op, axes, keepdims):
    x = f32(rng, 3, 4, 5, lo=0.5, hi=1.5) if op in ("ReduceLogSum", "ReduceProd") else f32(rng, 3, 4, 5, lo=-3, hi=3)
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    check_op(op, {"x": x}, {"keepdims": keepdims}, inits, opset=18, rtol=1e-4, atol=1e-5)


def test_reduce_integer_sum_and_mean(rng):
    check_op("ReduceSum", {"x": i64(rng, 3, 4)}, {"keepdims": 0}, {"axes": np.array([1], np.int64)})
    check_op("ReduceMax", {"x": i64(rng, 3, 4)}, {"keepdims": 1, "axes": [0]})


# ----------------------------------------------------------------------------- Resize, ConvTranspose
RESIZES = [
    # (name, attrs, scales or None, sizes or None, input shape)
    ("nearest_up_asymmetric_floor", {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                     "nearest_mode": "floor"}, [1, 1, 2, 2], None, (1, 2, 3, 4)),
    ("nearest_half_pixel_prefer_floor", {"mode": "nearest"}, [1, 1, 1.7, 0.6], None, (2, 1, 5, 6)),
    ("nearest_sizes_prefer_ceil", {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, None, [1, 2, 7, 3],
     (1, 2, 4, 5)),
    ("linear_half_pixel", {"mode": "linear"}, [1, 1, 2, 2], None, (1, 3, 4, 5)),
    ("linear_align_corners", {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None,
     [1, 1, 6, 3], (1, 1, 4, 5)),
    ("linear_pytorch_down", {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     [1, 1, 0.5, 0.75], None, (1, 2, 6, 8)),
    ("cubic_half_pixel", {"mode": "cubic"}, [1, 1, 1.5, 2], None, (1, 1, 4, 4)),
    ("cubic_exclude_outside", {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, [1, 1, 0.8, 1.6],
     None, (1, 1, 5, 5)),
]


@pytest.mark.parametrize("case", RESIZES, ids=[c[0] for c in RESIZES])
def test_resize(rng, case):
    _, attrs, scales, sizes, shape = case
    inits = {"roi": np.array([], np.float32)}
    inits["scales"] = np.array(scales if scales else [], np.float32)
    if sizes:
        inits["sizes"] = np.array(sizes, np.int64)
    check_op("Resize", {"x": f32(rng, *shape)}, attrs, inits, opset=13, atol=1e-5,
             input_order=["x", "roi", "scales"] + (["sizes"] if sizes else []))


@pytest.mark.parametrize("mode,attrs,scales,roi", [
    ("linear", {"antialias": 1}, [1, 1, 0.6, 0.35], None),
    ("cubic", {"antialias": 1, "cubic_coeff_a": -0.5}, [1, 1, 0.5, 0.8], None),
    ("cubic", {"antialias": 1, "exclude_outside": 1}, [1, 1, 0.4, 1.5], None),
    ("linear", {"coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.5},
     [1, 1, 1.5, 0.7], [0, 0, -0.2, 0.3, 1, 1, 0.9, 1.3]),
    ("cubic", {"coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 0.8, 1.25],
     [0, 0, 0.1, 0.2, 1, 1, 0.7, 0.95]),
])
def test_resize_antialias_and_crop(rng, mode, attrs, scales, roi):
    """Antialiased and tf_crop_and_resize Resize, computed as one matrix product per axis."""
    inits = {"roi": np.array(roi or [], np.float32), "scales": np.array(scales, np.float32)}
    check_op("Resize", {"x": f32(rng, 1, 2, 9, 11)}, {"mode": mode, **attrs}, inits, opset=19, atol=1e-5,
             input_order=["x", "roi", "scales"])


@pytest.mark.parametrize("attrs,image,block", [
    ({}, [5, 6], [2, 3]),
    ({"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}, [6, 5], [3, 2]),
])
def test_col2im(rng, attrs, image, block):
    nsp = len(image)
    s, d = attrs.get("strides", [1] * nsp), attrs.get("dilations", [1] * nsp)
    p = attrs.get("pads", [0] * 2 * nsp)
    blocks = np.prod([(image[i] + p[i] + p[nsp + i] - ((block[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(nsp)])
    check_op("Col2Im", {"x": f32(rng, 2, 3 * int(np.prod(block)), int(blocks))}, attrs,
             {"image_shape": np.array(image, np.int64), "block_shape": np.array(block, np.int64)}, opset=18)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "dilations": [2, 1], "storage_order": 1},
])
def test_max_pool_indices(rng, attrs):
    check_op("MaxPool", {"x": f32(rng, 2, 3, 7, 8)}, attrs, n_outputs=2, opset=12, rtol=0, atol=0)


def test_max_unpool(rng):
    # indices as MaxPool(kernel 2, stride 2) gives them: one position per window, flat over the whole output
    n, c, h, w = 2, 3, 3, 4
    dy, dx = rng.integers(0, 2, size=(2, n, c, h, w))
    rows, cols = np.arange(h)[:, None] * 2 + dy, np.arange(w)[None, :] * 2 + dx
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :])[..., None, None] * (2 * h * 2 * w)
    idx = (base + rows * 2 * w + cols).astype(np.int64)
    check_op("MaxUnpool", {"x": f32(rng, n, c, h, w), "i": idx}, {"kernel_shape": [2, 2], "strides": [2, 2]},
             opset=11, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (5, 5), (2, 1, 2, 2)])
def test_det(rng, shape):
    check_op("Det", {"x": f32(rng, *shape)}, opset=11, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,complex_in,length", [
    ({"axis": 1}, False, None), ({"axis": 2, "onesided": 1}, False, None), ({"axis": 1, "inverse": 1}, True, None),
    ({"axis": 1}, True, 12), ({"axis": 2, "inverse": 1, "onesided": 1}, True, None), ({"axis": 1}, False, 6),
])
def test_dft(rng, attrs, complex_in, length):
    x = f32(rng, 2, 9, 7, 2 if complex_in else 1)
    inits = {} if length is None else {"n": np.array(length, np.int64)}
    check_op("DFT", {"x": x}, attrs, inits, opset=17, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [False, True])
def test_stft(rng, window):
    inits = {"step": np.array(3, np.int64)}
    if window:
        inits["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype(np.float32)
    else:
        inits.update(w=None, n=np.array(8, np.int64))
    order = ["x", "step", "w"] + ([] if window else ["n"])
    check_op("STFT", {"x": f32(rng, 2, 30, 1)}, None, {k: v for k, v in inits.items() if v is not None}, opset=17,
             rtol=1e-4, atol=1e-4, input_order=[o if inits.get(o) is not None or o == "x" else "" for o in order])


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 100.0, 7000.0)])
def test_mel_weight_matrix(args):
    mels, n, rate, lo, hi = args
    consts = {"m": np.array(mels, np.int32), "n": np.array(n, np.int32), "r": np.array(rate, np.int32),
              "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
    check_op("MelWeightMatrix", {}, None, consts, opset=17, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode,coord", [("avg", "half_pixel"), ("avg", "output_half_pixel"), ("max", "half_pixel")])
def test_roi_align(rng, mode, coord):
    x = f32(rng, 2, 3, 9, 11)
    corner = rng.uniform(-1.5, 7, size=(5, 2))
    rois = np.concatenate([corner, corner + rng.uniform(0.3, 6, size=(5, 2))], axis=1).astype(np.float32)
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "output_height": 3, "output_width": 4,
             "sampling_ratio": 2, "spatial_scale": 0.9}
    check_op("RoiAlign", {"x": x, "rois": rois, "bi": np.array([0, 1, 1, 0, 1], np.int64)}, attrs, opset=16,
             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group,offset_group,masked", [(1, 1, False), (2, 2, True), (1, 3, True)])
def test_deform_conv(rng, group, offset_group, masked):
    n, c, h, w, oc, k = 2, 6, 7, 8, 4, 3
    attrs = {"group": group, "offset_group": offset_group, "pads": [1, 0, 1, 1], "strides": [1, 2],
             "dilations": [1, 1], "kernel_shape": [k, k]}
    oh, ow = (h + 2 - k) // 1 + 1, (w + 1 - k) // 2 + 1
    feeds = {"x": f32(rng, n, c, h, w), "w": f32(rng, oc, c // group, k, k),
             "off": f32(rng, n, offset_group * 2 * k * k, oh, ow, lo=-2, hi=2), "bias": f32(rng, oc)}
    if masked:
        feeds["mask"] = f32(rng, n, offset_group * k * k, oh, ow, lo=0, hi=1)
    check_op("DeformConv", feeds, attrs, opset=19, rtol=1e-4, atol=1e-5)


CONV_T = [
    # (name, cin, cout, k, attrs)
    ("stride2", 3, 4, 3, {"strides": [2, 2]}),
    ("pads_output_padding", 2, 3, 3, {"strides": [2, 3], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}),
    ("group_dilation", 4, 6, 2, {"group": 2, "dilations": [2, 1]}),
    ("output_shape", 2, 2, 3, {"strides": [3, 2], "output_shape": [10, 8]}),
    ("ppocr_det_2x2_s2", 8, 4, 2, {"strides": [2, 2]}),
]


@pytest.mark.parametrize("case", CONV_T, ids=[c[0] for c in CONV_T])
def test_conv_transpose(rng, case):
    _, cin, cout, k, attrs = case
    g = attrs.get("group", 1)
    check_op("ConvTranspose", {"x": f32(rng, 2, cin, 3, 4)}, attrs,
             {"w": f32(rng, cin, cout // g, k, k), "b": f32(rng, cout)}, atol=1e-5)


# ----------------------------------------------------------------------------- 16-bit integers, bit shifts
def test_int16_arithmetic_wraps(rng):
    a = rng.integers(-30000, 30000, size=(3, 4)).astype(np.int16)
    b = rng.integers(-30000, 30000, size=(4,)).astype(np.int16)
    check_op("Add", {"a": a, "b": b})
    check_op("Mul", {"a": a, "b": b})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["uint8"])  # onnxruntime has no uint16 BitShift; onnx's suite covers it
def test_bit_shift(rng, direction, dtype):
    x = rng.integers(0, 200, size=(3, 5)).astype(dtype)
    check_op("BitShift", {"x": x, "y": rng.integers(0, 8, size=(5,)).astype(dtype)}, {"direction": direction})


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (True, 2)])
def test_negative_log_likelihood_loss(rng, reduction, weighted, ignore):
    x = f32(rng, 3, 5, 4, lo=-3, hi=0)
    t = rng.integers(0, 5, size=(3, 4)).astype(np.int64)
    attrs = {"reduction": reduction, **({"ignore_index": ignore} if ignore is not None else {})}
    inits = {"w": f32(rng, 5, lo=0.1, hi=1)} if weighted else {}
    check_op("NegativeLogLikelihoodLoss", {"x": x, "t": t}, attrs, inits, opset=13, atol=1e-5)


def test_softmax_cross_entropy_loss_with_log_prob(rng):
    check_op("SoftmaxCrossEntropyLoss", {"x": f32(rng, 4, 6, lo=-3, hi=3), "t": i64(rng, 4, lo=0, hi=6)},
             {"reduction": "mean"}, opset=13, n_outputs=2, atol=1e-5)


# ----------------------------------------------------------------------------- more indexing
def test_gather_nd_with_batch_dims(rng):
    check_op("GatherND", {"x": f32(rng, 2, 3, 4), "i": rng.integers(0, 3, size=(2, 5, 1)).astype(np.int64)},
             {"batch_dims": 1})
    check_op("GatherND", {"x": f32(rng, 3, 4, 2), "i": rng.integers(-3, 3, size=(4, 2)).astype(np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(rng, reduction):
    x = f32(rng, 4, 5)
    idx = rng.permutation(4)[:3].reshape(3, 1).repeat(5, 1).astype(np.int64) if reduction == "none" \
        else rng.integers(-4, 4, size=(3, 5)).astype(np.int64)
    check_op("ScatterElements", {"x": x, "i": idx, "u": f32(rng, 3, 5)}, {"axis": 0, "reduction": reduction},
             opset=18)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd(rng, reduction):
    idx = rng.permutation(4)[:2].reshape(2, 1).astype(np.int64)
    check_op("ScatterND", {"x": f32(rng, 4, 3, 2), "i": idx, "u": f32(rng, 2, 3, 2)}, {"reduction": reduction},
             opset=18)


def _tensor_scatter_inputs(rng, mode, indices):
    inputs = {"past": f32(rng, 2, 3, 8, 4), "u": f32(rng, 2, 3, 3, 4)}
    if indices:
        inputs["i"] = np.array([2, 5 if mode == "linear" else 7], np.int64)  # circular: rows 7, 0, 1
    return inputs


@pytest.mark.parametrize("mode,indices", [("linear", True), ("linear", False), ("circular", True)])
def test_tensor_scatter_in_place(rng, tmp_path, mode, indices):
    """ONNX TensorScatter-24, the KV-cache update, on webgpu, wasm and cpu: the cache is an input nothing else reads,
    so the kernel writes only the update's rows into the cache's own buffer (the output's buffer is the input's)."""
    import onnx
    from opcheck import make_model

    import kiln
    from kiln.package.format import read_manifest

    inputs = _tensor_scatter_inputs(rng, mode, indices)
    check_op("TensorScatter", inputs, {"axis": -2, "mode": mode}, opset=24, targets=("webgpu", "wasm", "cpu"))
    onnx.save(make_model("TensorScatter", inputs, {"axis": -2, "mode": mode}, opset=24), tmp_path / "m.onnx")
    m = read_manifest(kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg"))
    assert m["outputs"][0]["buffer"] == m["inputs"][0]["buffer"]
    kernel = m["targets"]["webgpu"]["kernels"][m["targets"]["webgpu"]["plan"][0]["kernel"]]
    assert m["targets"]["webgpu"]["plan"][0]["dispatch"][0] * kernel["workgroup_size"][0] < 2 * 3 * 8 * 4


def test_tensor_scatter_copy(rng, tmp_path):
    """TensorScatter whose cache is read by another node too: the update goes to a new buffer (the whole result is
    computed), matching onnxruntime, and the cache input is left as it was."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    import kiln

    inputs = _tensor_scatter_inputs(rng, "circular", True)
    nodes = [helper.make_node("TensorScatter", ["past", "u", "i"], ["y"], axis=2, mode="circular"),
             helper.make_node("Neg", ["past"], ["z"])]
    graph = helper.make_graph(nodes, "scatter_copy",
                              [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                               for k, v in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, inputs["past"].shape)
                               for n in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "m.onnx")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="webgpu,wasm,cpu", wasm_threads=False)
    for target in ("webgpu", "wasm", "cpu"):
        got = kiln.load(pkg, target=target, poison=True).run(inputs)
        np.testing.assert_array_equal(got["y"], want[0], err_msg=target)
        np.testing.assert_array_equal(got["z"], want[1], err_msg=target)


@pytest.mark.parametrize("largest", [1, 0])
def test_topk(rng, largest):
    x = rng.integers(0, 6, size=(3, 7)).astype(np.float32)  # ties
    check_op("TopK", {"x": x}, {"axis": 1, "largest": largest}, {"k": np.array([4], np.int64)}, n_outputs=2)


def test_hardmax_lppool_center_crop_pad(rng):
    check_op("Hardmax", {"x": rng.integers(0, 3, size=(3, 4, 5)).astype(np.float32)}, {"axis": 1})
    check_op("LpPool", {"x": f32(rng, 1, 2, 6, 5)}, {"kernel_shape": [3, 2], "p": 3, "pads": [1, 0, 1, 1]}, opset=18,
             atol=1e-5)
    check_op("CenterCropPad", {"x": f32(rng, 5, 4, 3)}, {"axes": [0, 1]}, {"s": np.array([3, 7], np.int64)},
             opset=18)


def test_window_functions(rng):
    for op in ("HannWindow", "HammingWindow", "BlackmanWindow"):
        check_op(op, {}, {"periodic": 0}, {"n": np.array(10, np.int64)}, atol=1e-6)


# ----------------------------------------------------------------------------- quantisation
def test_quantize_dequantize_per_axis(rng):
    x = f32(rng, 2, 3, 4, lo=-3, hi=3)
    scale, zp = f32(rng, 3, lo=0.01, hi=0.05), rng.integers(-20, 20, size=3).astype(np.int8)
    check_op("QuantizeLinear", {"x": x}, {"axis": 1}, {"s": scale, "z": zp}, opset=13)
    q = rng.integers(0, 256, size=(2, 3, 4)).astype(np.uint8)
    check_op("DequantizeLinear", {"q": q}, {"axis": 1}, {"s": scale, "z": rng.integers(0, 256, 3).astype(np.uint8)},
             opset=13)


def test_dynamic_quantize_linear(rng):
    check_op("DynamicQuantizeLinear", {"x": f32(rng, 3, 8, lo=-2, hi=5)}, n_outputs=3)


# ----------------------------------------------------------------------------- Attention
@pytest.mark.parametrize("causal,gqa,mask", [(0, False, None), (1, False, None), (0, True, "bool"), (1, True, "float")])
def test_attention(rng, causal, gqa, mask):
    b, hq, s, d = 2, 4, 5, 8
    hkv = 2 if gqa else hq
    feeds = {"q": f32(rng, b, hq, s, d), "k": f32(rng, b, hkv, 6, d), "v": f32(rng, b, hkv, 6, d)}
    order = ["q", "k", "v"]
    if mask == "bool":
        feeds["m"] = rng.integers(0, 2, size=(s, 6)).astype(bool)
        order.append("m")
    elif mask == "float":
        feeds["m"] = f32(rng, 1, hq, s, 6)
        order.append("m")
    check_op("Attention", feeds, {"is_causal": causal}, opset=23, atol=1e-5, input_order=order)


def test_attention_3d_with_cache_and_softcap(rng):
    feeds = {"q": f32(rng, 1, 3, 16), "k": f32(rng, 1, 3, 8), "v": f32(rng, 1, 3, 8)}
    inits = {"": np.zeros(0, np.float32), "pk": f32(rng, 1, 2, 2, 4), "pv": f32(rng, 1, 2, 2, 4)}
    check_op("Attention", feeds, {"q_num_heads": 4, "kv_num_heads": 2, "softcap": 2.0}, inits, opset=23, atol=1e-5,
             input_order=["q", "k", "v", "", "pk", "pv"], n_outputs=3)


def test_rotary_embedding(rng):
    x = f32(rng, 2, 3, 4, 8)  # [B, H, S, D]
    pos = rng.integers(0, 6, size=(2, 4)).astype(np.int64)
    inits = {"cos": f32(rng, 6, 3), "sin": f32(rng, 6, 3)}
    check_op("RotaryEmbedding", {"x": x, "pos": pos}, {"rotary_embedding_dim": 6, "interleaved": 1}, inits, opset=23,
             input_order=["x", "cos", "sin", "pos"])


# ----------------------------------------------------------------------------- Einsum
EINSUMS = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,i", [(6,), (6,)]), ("ij->ji", [(3, 5)]),
           ("...ii->...i", [(2, 4, 4)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]), ("ij,jk", [(3, 4), (4, 2)]),
           ("abc->b", [(2, 3, 4)]), ("ab,cb->ac", [(2, 3), (4, 3)])]


@pytest.mark.parametrize("case", EINSUMS, ids=[c[0] for c in EINSUMS])
def test_einsum(rng, case):
    equation, shapes = case
    check_op("Einsum", {f"x{i}": f32(rng, *s) for i, s in enumerate(shapes)}, {"equation": equation}, atol=1e-5)


# ----------------------------------------------------------------------------- recurrent layers
@pytest.mark.parametrize("kind,direction", [("RNN", "forward"), ("GRU", "reverse"), ("LSTM", "bidirectional"),
                                            ("LSTM", "forward")])
def test_recurrent(rng, kind, direction):
    seq, batch, inp, hidden = 4, 2, 3, 5
    dirs = 2 if direction == "bidirectional" else 1
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    inits = {"w": f32(rng, dirs, g * hidden, inp), "r": f32(rng, dirs, g * hidden, hidden),
             "b": f32(rng, dirs, 2 * g * hidden), "": np.zeros(0, np.float32)}
    feeds = {"x": f32(rng, seq, batch, inp), "h0": f32(rng, dirs, batch, hidden)}
    order = ["x", "w", "r", "b", "", "h0"]
    attrs = {"hidden_size": hidden, "direction": direction}
    if kind == "LSTM":
        feeds["c0"] = f32(rng, dirs, batch, hidden)
        order.append("c0")
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    check_op(kind, feeds, attrs, inits, opset=14, atol=1e-5, input_order=order, n_outputs=3 if kind == "LSTM" else 2)


# ----------------------------------------------------------------------------- GridSample, AffineGrid, If
# cubic with border padding: onnxruntime clamps the taps, onnx's reference (which Kiln follows and onnx's
# backend tests check) clamps the coordinate; they differ near the border
GRID_CASES = [(m, p) for m in ("linear", "nearest", "cubic") for p in ("zeros", "border", "reflection")
              if (m, p) != ("cubic", "border")]


@pytest.mark.parametrize("mode,padding", GRID_CASES)
def test_grid_sample(rng, mode, padding):
    grid = f32(rng, 2, 3, 4, 2, lo=-1.3, hi=1.3)
    check_op("GridSample", {"x": f32(rng, 2, 3, 5, 6), "g": grid},
             {"mode": mode, "padding_mode": padding, "align_corners": int(mode == "linear")}, opset=20, atol=1e-5)


def test_affine_grid(rng):
    theta = f32(rng, 2, 2, 3)
    check_op("AffineGrid", {"t": theta}, {"align_corners": 0}, {"size": np.array([2, 3, 4, 5], np.int64)}, opset=20,
             atol=1e-6)


def test_reduce_bool_any_all(rng):
    axes = {"axes": np.array([1], np.int64)}
    check_op("ReduceMax", {"x": rng.integers(0, 2, size=(3, 4)).astype(bool)}, {"keepdims": 0}, axes, opset=20)
    check_op("ReduceMin", {"x": rng.integers(0, 2, size=(3, 4)).astype(bool)}, {"keepdims": 1}, axes, opset=20)


def test_if_with_constant_condition(rng):
    from onnx import helper

    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 4])])
    for cond in (True, False):
        check_op("If", {"x": f32(rng, 3, 4)}, {"then_branch": then_g, "else_branch": else_g},
                 {"c": np.array(cond)}, input_order=["c"])


# ----------------------------------------------------------------------------- Scan, LinearAttention
def test_scan_running_sum(rng):
    from onnx import helper

    body = helper.make_graph(
        [helper.make_node("Add", ["s", "x"], ["s2"]), helper.make_node("Identity", ["s2"], ["y"])], "body",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    check_op("Scan", {"s0": f32(rng, 2), "xs": f32(rng, 5, 2)}, {"body": body, "num_scan_inputs": 1,
                                                                "scan_input_directions": [1]}, opset=16, n_outputs=2)


@pytest.mark.parametrize("rule", ["linear", "gated_delta"])
def test_linear_attention(rng, rule):
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 4, 3
    feeds = {"q": f32(rng, b, t, hq * dk), "k": f32(rng, b, t, hkv * dk), "v": f32(rng, b, t, hkv * dv)}
    order = ["q", "k", "v"]
    if rule == "gated_delta":
        feeds.update(state=f32(rng, b, hkv, dk, dv), decay=f32(rng, b, t, hkv, lo=-1, hi=0),
                     beta=f32(rng, b, t, hkv, lo=0, hi=1))
        order += ["state", "decay", "beta"]
    # onnxruntime does not run opset 27 yet: compare with onnx's reference evaluator
    check_op("LinearAttention", feeds, {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule}, opset=27,
             input_order=order, n_outputs=2, atol=1e-5, oracle="onnx")


def test_cumprod(rng):
    check_op("CumProd", {"x": f32(rng, 3, 5, lo=0.5, hi=1.5)}, {"exclusive": 1, "reverse": 1},
             {"axis": np.array(1, np.int64)}, opset=26, oracle="onnx")


# ----------------------------------------------------------------------------- BitCast, CausalConvWithState, SwiGLU
def test_bitcast(rng):
    x = f32(rng, 3, 4, lo=-100, hi=100)
    y = check_op("BitCast", {"x": x}, {"to": TensorProto.INT32}, opset=26, oracle="onnx")["y0"]
    check_op("BitCast", {"x": y}, {"to": TensorProto.FLOAT}, opset=26, oracle="onnx")
    check_op("BitCast", {"x": rng.integers(-128, 128, size=(5,)).astype(np.int8)}, {"to": TensorProto.UINT8}, opset=26,
             oracle="onnx")


@pytest.mark.parametrize("activation,state", [("none", False), ("silu", True)])
def test_causal_conv_with_state(rng, activation, state):
    feeds = {"x": f32(rng, 2, 3, 6), "w": f32(rng, 3, 1, 4), "b": f32(rng, 3)}
    order = ["x", "w", "b"]
    if state:
        feeds["s"] = f32(rng, 2, 3, 3)
        order.append("s")
    check_op("CausalConvWithState", feeds, {"activation": activation}, opset=27, input_order=order, n_outputs=2,
             oracle="onnx", atol=1e-5)


def test_swiglu(rng):
    check_op("SwiGLU", {"a": f32(rng, 3, 8, lo=-4, hi=4), "b": f32(rng, 3, 8)}, {"alpha": 1.5}, opset=28,
             oracle="onnx")
