"""Map an IR node to its tensor expression; the one place kernels are chosen per primitive."""

from __future__ import annotations

from typing import Any

from kiln.ir import dtypes, ops
from kiln.kernels import elementwise, grad, index, layout, nn, quant, resample
from kiln.kernels.elementwise import Operand
from kiln.te.compute import Tensor


def build(op: str, inputs: list[Operand], attrs: dict[str, Any], out_shape: tuple[int, ...], name: str) -> Tensor:
    """The tensor expression of primitive ``op`` over ``inputs`` (tensors, or scalar literals for binary ops).

    Raises:
        NotImplementedError: for a primitive with no expression yet (a compiler gap, reported with the op name).
    """
    k = ops.kind(op)
    if k == "elementwise":
        return elementwise.unary(op, inputs[0], attrs, name)
    if k == "binary":
        return elementwise.binary(op, inputs[0], inputs[1], out_shape, name)
    if op == "Where":
        return elementwise.where(inputs[0], inputs[1], inputs[2], out_shape, name)
    if op == "Conv":
        return nn.conv(inputs[0], inputs[1], attrs["strides"], attrs["dilations"], attrs["pads"], attrs["group"],
                       out_shape, name)
    if op == "MatMul":
        return nn.matmul(inputs[0], inputs[1], out_shape, name)
    if k == "pool":
        return nn.pool(op, inputs[0], attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["pads"],
                       attrs.get("count_include_pad", 0), out_shape, name)
    if k == "reduce":
        return nn.reduction(op, inputs[0], attrs["axes"], attrs["keepdims"], out_shape, name)
    if op == "Reshape":
        return layout.reshape(inputs[0], out_shape, name)
    if op == "Transpose":
        return layout.transpose(inputs[0], list(attrs["perm"]), out_shape, name)
    if op == "Concat":
        return layout.concat(list(inputs), attrs["axis"], out_shape, name)
    if op == "Resize":
        return resample.resize(inputs[0], attrs, out_shape, name)
    if op == "GridCoords":
        return resample.grid_coords(inputs[0], attrs, name)
    if op == "GridSample":
        return resample.grid_sample(inputs[0], inputs[1], attrs, out_shape, name)
    if op == "ConvTranspose":
        return resample.conv_transpose(inputs[0], inputs[1], attrs, out_shape, name)
    if op == "ConvWeightGrad":
        return grad.conv_weight_grad(inputs[0], inputs[1], attrs, name)
    if op == "PoolGradSum":
        return grad.pool_grad_sum(inputs[0], attrs, name)
    if op == "MaxPoolArgWindow":
        return grad.maxpool_arg_window(inputs[0], inputs[1], attrs, name)
    if op == "MaxPoolGrad":
        return grad.maxpool_grad(inputs[0], inputs[1], attrs, name)
    if op == "MatMulNBits":
        return quant.matmul_nbits(inputs[0], inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None, attrs,
                                  out_shape, name)
    if op == "GatherBlockQuantized":
        return quant.gather_block_quantized(inputs[0], inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None,
                                            attrs, out_shape, name)
    if op == "SymConst":
        return index.sym_const(attrs["values"], out_shape, _expr_dtype(attrs["dtype"]), name)
    if op == "Iota":
        return index.iota(out_shape, attrs["start"], attrs["delta"], _expr_dtype(attrs["dtype"]), name)
    if op in _INDEX:
        return _INDEX[op](inputs, attrs, out_shape, name)
    raise NotImplementedError(f"no tensor expression for primitive {op}")


def _expr_dtype(dtype: str) -> str:
    return dtypes.expr_dtype(dtype)


_INDEX = {
    "Gather": lambda xs, a, shape, name: index.gather(xs[0], xs[1], a["axis"], shape, name),
    "GatherElements": lambda xs, a, shape, name: index.gather_elements(xs[0], xs[1], a["axis"], shape, name),
    "Slice": lambda xs, a, shape, name: index.slice_(xs[0], a["starts"], a["steps"], shape, name),
    "Expand": lambda xs, a, shape, name: index.expand(xs[0], shape, name),
    "Tile": lambda xs, a, shape, name: index.tile(xs[0], shape, name),
    "Pad": lambda xs, a, shape, name: index.pad(xs[0], a["pads"], a["mode"], a["value"], shape, name),
    "Trilu": lambda xs, a, shape, name: index.trilu(xs[0], a["upper"], a["k"], name),
    "ArgMax": lambda xs, a, shape, name: index.argreduce("ArgMax", xs[0], xs[1], a["axis"], a["keepdims"],
                                                         a["select_last_index"], shape, name),
    "ArgMin": lambda xs, a, shape, name: index.argreduce("ArgMin", xs[0], xs[1], a["axis"], a["keepdims"],
                                                         a["select_last_index"], shape, name),
    "CumSum": lambda xs, a, shape, name: index.cumulative("sum", xs[0], a["axis"], a["exclusive"], a["reverse"], name),
    "OneHot": lambda xs, a, shape, name: index.onehot(xs[0], xs[1], a["depth"], a["axis"], shape, name),
    "CumProd": lambda xs, a, shape, name: index.cumulative("prod", xs[0], a["axis"], a["exclusive"], a["reverse"], name),
    "GatherND": lambda xs, a, shape, name: index.gather_nd(xs[0], xs[1], a["batch_dims"], shape, name),
    "ScatterElements": lambda xs, a, shape, name: index.scatter_elements(xs[0], xs[1], xs[2], a["axis"],
                                                                         a["reduction"], name),
    "ScatterND": lambda xs, a, shape, name: index.scatter_nd(xs[0], xs[1], xs[2], a["reduction"], name),
    "TensorScatter": lambda xs, a, shape, name: index.tensor_scatter(
        xs[0], xs[1], xs[2] if len(xs) > 2 else None, a["axis"], a["mode"], bool(a.get("in_place")), shape, name),
    "Compact": lambda xs, a, shape, name: index.compact(xs[0], xs[1], xs[2], a["axis"], shape, name),
    "NmsSelect": lambda xs, a, shape, name: index.nms_select(xs[0], xs[1], xs[2], xs[3], shape, name),
    "TopKIndices": lambda xs, a, shape, name: index.topk_indices(xs[0], a["axis"], a["k"], a["largest"], shape,
                                                                 name),
}
