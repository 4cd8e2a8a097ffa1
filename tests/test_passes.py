"""Unit tests of the IR, the passes and the memory plan (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MOBILENET

from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp
from kiln.ir.graph import Builder, Graph, Value
from kiln.ir.printer import format_graph
from kiln.ir.verify import VerifyError, verify
from kiln.passes.fusion import fuse
from kiln.passes.manager import optimize
from kiln.passes.memory_plan import plan_memory


def small_graph(rng):
    g = Graph(name="t")
    x = Value("x", "float32", (1, 3, 8, 8))
    g.inputs.append(x)
    b = Builder(g)
    w = b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    y = b.op("Conv", [x, w], strides=(1, 1), dilations=(1, 1), pads=(1, 1, 1, 1), group=1)
    scale = b.op("Sqrt", [b.const(np.full((4, 1, 1), 4.0, np.float32), "s")])  # folds to a constant
    y = b.op("Add", [y, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32), "bias")])
    y = b.op("Mul", [y, scale])
    y = b.op("Clip", [y], min=0.0, max=6.0)
    r = b.op("Reshape", [y], shape=(1, 256))
    g.outputs.append(b.op("Relu", [r]))
    return g


def test_passes_preserve_interpreter_results(rng):
    g = small_graph(rng)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = interp.run(g, {"x": x})
    fired = optimize(g)
    assert "const_fold" in fired and "fold_scale" in fired
    assert [n.op for n in g.nodes] == ["Conv", "Add", "Clip", "Reshape", "Relu"]
    after = interp.run(g, {"x": x})
    np.testing.assert_allclose(after[g.outputs[0].name], before[g.outputs[0].name], rtol=1e-5, atol=1e-5)


def test_fusion_groups_elementwise_chain_and_aliases_reshape(rng):
    g = small_graph(rng)
    optimize(g)
    groups = fuse(g)
    assert [[n.op for n in grp.nodes] for grp in groups] == [["Conv", "Add", "Clip"], ["Reshape"], ["Relu"]]
    assert groups[1].alias


def test_memory_plan_shares_buffers_by_liveness():
    graph = import_model(MOBILENET)
    optimize(graph)
    groups = fuse(graph)
    plan = plan_memory(graph, groups)
    acts = [b for b in plan.buffers if b.kind == "activation"]
    assert plan.bytes("activation") < plan.unshared_bytes / 2
    assert len(acts) < len([g for g in groups if not g.alias]) / 4
    # no two values that are live at the same step share a buffer
    step_of = {}
    for i, grp in enumerate(groups):
        if not grp.alias:
            step_of[id(grp.output)] = i
    for i, grp in enumerate(groups):
        if grp.alias:
            continue
        read = {plan.of[id(v)] for v in grp.inputs if id(v) in plan.of}
        assert plan.of[id(grp.output)] not in read, f"kernel {i} reads and writes one buffer"


def test_verify_catches_broken_graphs(rng):
    g = small_graph(rng)
    verify(g)
    g.nodes[0].outputs[0].shape = (9, 9)
    with pytest.raises(VerifyError, match="shape rule"):
        verify(g)
    g = small_graph(rng)
    g.nodes = g.nodes[::-1]
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)


def test_printer_shows_ops_shapes_and_symbolic_inputs():
    text = format_graph(import_model(MOBILENET))
    assert text.startswith("graph ")
    assert "%input: float32['N', 3, 224, 224]" in text
    assert "Conv(" in text and "float32[1, 32, 112, 112]" in text
