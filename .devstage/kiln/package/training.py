"""The ``training`` section of a train-step package's manifest (format 1.3; docs/package-format.md).

A train-step package is compiled from one graph (:class:`kiln.train.TrainGraph`) holding forward,
loss, backward and optimizer update. Its buffers serve two plans: the inference plan (the steps the
model's outputs depend on) and the train plan (every step). Trainable weights are ``weight`` buffers
marked ``trainable`` (their initial values in the weights file, so a runtime that knows nothing of
training still runs inference); optimizer state is ``state`` buffers (zeros initially); each state's
next value is an ``update`` buffer that the runtime copies over the state after each train step.
"""

from __future__ import annotations

from typing import Any

from kiln.package.format import STORAGE


def _io(v, buffer: int) -> dict[str, Any]:
    return {"name": v.name, "dtype": v.dtype, "storage": STORAGE.get(v.dtype, v.dtype), "shape": list(v.shape),
            "symbolic_shape": list(v.sym_shape) if v.sym_shape else list(v.shape), "buffer": buffer}


def param_weights(compiled) -> dict[int, tuple[str, Any, str]]:
    """Buffer id -> ``(tensor name, initial array, dtype)`` of every trainable weight (for the weights file)."""
    tg = compiled.training
    return {compiled.plan.of[id(s.value)]: (s.name, s.init, s.value.dtype) for s in tg.state if s.kind == "param"}


def io_lists(compiled) -> tuple[list, list]:
    """The manifest's ``inputs`` and ``outputs`` values: the model's own (what inference reads and returns)."""
    graph, tg = compiled.graph, compiled.training
    if tg is None:
        return graph.inputs, graph.outputs
    return ([v for v in graph.inputs if v.name in tg.model_inputs],
            [v for v in graph.outputs if v.name in tg.forward_outputs])


def training_manifest(compiled, buffers: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``training`` section; relabels ``buffers`` entries (state, update) in place."""
    graph, plan, tg = compiled.graph, compiled.plan, compiled.training
    outputs = {v.name: v for v in graph.outputs}
    state = []
    for s in tg.state:
        bid = plan.of[id(s.value)]
        upd = plan.of[id(outputs[tg.update_name(s)])]
        if s.kind == "param":
            buffers[bid]["trainable"] = True
        else:
            buffers[bid]["kind"] = "state"
        buffers[bid]["state"] = s.name
        buffers[upd]["kind"] = "update"
        buffers[upd]["state"] = s.name
        state.append({"name": s.name, "kind": s.kind, "dtype": s.value.dtype, "shape": list(s.value.shape),
                      "buffer": bid, "update": upd, "bytes": buffers[bid]["bytes"]})
    inputs = [v for v in graph.inputs if v.name in tg.model_inputs or v.name == tg.labels]
    outs = [outputs[tg.loss]] + [outputs[n] for n in tg.gradient_outputs]
    return {
        "inputs": [_io(v, plan.of[id(v)]) for v in inputs],
        "outputs": [_io(v, plan.of[id(v)]) for v in outs],
        "labels": tg.labels,
        "loss": {"name": tg.options.loss, "output": tg.loss, "prediction": tg.options.output or tg.forward_outputs[0]},
        "optimizer": tg.options.optimizer.to_json(),
        "trainable": tg.trainable,
        "state": state,
    }
