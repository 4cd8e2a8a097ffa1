"""ONNX operator converters, one module per family; importing this package registers them all."""

from kiln.frontend.onnx.ops import elementwise, indexing, logic, nn, norm, reduce, resample, tensor  # noqa: F401
