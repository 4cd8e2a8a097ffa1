"""ONNX operator converters, one module per family; importing this package registers them all."""

from kiln.frontend.onnx.ops import (  # noqa: F401
    attention,
    contrib_quant,
    einsum,
    elementwise,
    indexing,
    indexing2,
    linalg,
    logic,
    loss,
    nn,
    norm,
    qlinear,
    quant,
    reduce,
    resample,
    rnn,
    roi,
    selection,
    signal,
    tensor,
)
