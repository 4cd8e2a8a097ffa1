"""The train-step graph: forward + loss + backward + optimizer update, in the graph IR.

:func:`build_train_graph` imports an ONNX model with its trainable initializers (an fnmatch pattern
over their names) as graph inputs instead of constants, adds a label input and the loss, appends
the backward pass by :func:`kiln.passes.autodiff.gradients` and the optimizer's update
(:mod:`kiln.train.optimizers`). The result is one pure function of the IR

    (model inputs, labels, state) -> (model outputs, loss, [gradients], new state)

that :mod:`kiln.ir.interp` runs with numpy (the executable spec of a train step) and the compiler turns
into a package whose runtimes keep the state (weights, optimizer moments, step count) in device buffers
and copy each new value over the old one after every step (see docs/training.md).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from kiln.errors import KilnError
from kiln.frontend.onnx.importer import import_model
from kiln.ir import dtypes
from kiln.ir.graph import Graph, Value
from kiln.ir.verify import verify
from kiln.passes.autodiff import builder_for, gradients
from kiln.train.losses import LOSSES
from kiln.train.optimizers import OptimizerConfig, State, apply


@dataclass
class TrainOptions:
    """What ``kiln compile --train`` builds.

    Attributes:
        trainable: fnmatch patterns over initializer names (a list, or one comma-separated string):
            ``"classifier.*"``, ``"*"`` for every float initializer.
        loss: ``cross_entropy`` (labels: class indices int64 [N]) or ``mse`` (labels: targets shaped
            like the prediction).
        optimizer: hyperparameters (:class:`~kiln.train.optimizers.OptimizerConfig`).
        output: the model output the loss reads (default: the first).
        labels: name of the new label input.
        gradients: also output each trainable weight's gradient (``grad/<name>``; for tests and tools).
    """

    trainable: str | list[str] = "*"
    loss: str = "cross_entropy"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    output: str | None = None
    labels: str = "labels"
    gradients: bool = False

    def patterns(self) -> list[str]:
        """The trainable patterns as a list."""
        pats = self.trainable.split(",") if isinstance(self.trainable, str) else list(self.trainable)
        return [p.strip() for p in pats if p.strip()]


@dataclass
class TrainGraph:
    """A train-step graph and what its package records.

    Attributes:
        graph: inputs = model inputs, labels, then every state's value; outputs = model outputs, ``loss``,
            gradients (if asked), then every state's update.
        state: trainable weights (``kind="param"``, initializer values) then optimizer state (zeros).
        forward_outputs: names of the model's own outputs (what inference returns).
        model_inputs: names of the model's own inputs.
        loss, labels: names of the loss output and the label input.
        gradient_outputs: names of the gradient outputs (empty unless asked).
        options: what was asked for.
    """

    graph: Graph
    state: list[State]
    forward_outputs: list[str]
    model_inputs: list[str]
    loss: str
    labels: str
    gradient_outputs: list[str]
    options: TrainOptions

    @property
    def trainable(self) -> list[str]:
        """Names of the trainable weights, in state order."""
        return [s.name for s in self.state if s.kind == "param"]

    def update_name(self, state: State) -> str:
        """The graph output holding ``state``'s next value."""
        return f"{state.name}.next"


def trainable_names(model: onnx.ModelProto, patterns: list[str]) -> list[str]:
    """Float initializers of ``model`` whose names match one of ``patterns`` (fnmatch), in file order.

    Raises:
        KilnError: no pattern, or a pattern matching no float initializer (naming a few that exist).
    """
    floats = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    if not patterns:
        raise KilnError("--trainable needs at least one pattern of initializer names (e.g. 'classifier.*')")
    names = [n for n in floats if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in floats)]
    if unmatched:
        sample = ", ".join(floats[-6:])
        raise KilnError(f"trainable pattern{'s' if len(unmatched) > 1 else ''} {', '.join(map(repr, unmatched))} "
                        f"match{'es' if len(unmatched) == 1 else ''} no float32 initializer (the last few are: {sample})")
    return names


def build_train_graph(model: onnx.ModelProto, options: TrainOptions, dims: dict[str, int] | None = None) -> TrainGraph:
    """Build the train-step graph of ``model`` (see the module docstring).

    Raises:
        KilnError: bad patterns, an unknown loss/optimizer, a model output that is not float, or a node
            between the trainable weights and the loss with no gradient rule.
        ShapeError: labels that do not fit the loss.
    """
    if options.loss not in LOSSES:
        raise KilnError(f"unknown loss {options.loss!r}; known: {', '.join(LOSSES)}")
    names = trainable_names(model, options.patterns())
    graph = import_model(model, dims, variables=names)
    model_inputs = [v.name for v in graph.inputs if v.name not in names]
    forward = [v.name for v in graph.outputs]
    if options.output is None:
        pred = graph.outputs[0]
    else:
        pred = next((v for v in graph.outputs if v.name == options.output), None)
        if pred is None:
            raise KilnError(f"the model has no output {options.output!r} (it has {', '.join(forward)})")
    if not dtypes.is_float(pred.dtype):
        raise KilnError(f"the loss needs a float model output, {pred.name!r} is {pred.dtype}")
    if options.labels in {v.name for v in graph.inputs} | set(forward):
        raise KilnError(f"the label input name {options.labels!r} is taken by the model; choose another")
    b = builder_for(graph)
    fn, label_dtype, _ = LOSSES[options.loss]
    labels = Value(b.fresh(options.labels), label_dtype or pred.dtype,
                   (pred.shape[0],) if label_dtype else tuple(pred.shape), sym_shape=None)
    graph.inputs.insert(len(model_inputs), labels)
    if pred.sym_shape:
        labels.sym_shape = (pred.sym_shape[0],) if label_dtype else tuple(pred.sym_shape)
    b.scope = options.loss
    loss, seed = fn(b, pred, labels)
    inits = {t.name: t for t in model.graph.initializer}
    params = [State(n, next(v for v in graph.inputs if v.name == n), kind="param",
                    init=numpy_helper.to_array(inits[n]).astype(np.float32)) for n in names]
    grads = gradients(graph, [(pred, seed)], [p.value for p in params], b)
    opt_state = apply(b, options.optimizer, params, grads)
    state = params + opt_state
    outputs = list(graph.outputs)
    b.fold = False
    loss = b.op("Identity", [loss], name="loss") if loss.producer is None else loss
    loss.name = "loss"
    outputs.append(loss)
    grad_names = []
    if options.gradients:
        for p, g in zip(params, grads):
            g = b.op("Identity", [g]) if g.producer is None or any(g is o for o in outputs) else g
            g.name = f"grad/{p.name}"
            grad_names.append(g.name)
            outputs.append(g)
    tg = TrainGraph(graph, state, forward, model_inputs, "loss", labels.name, grad_names, options)
    for s in state:
        u = s.update
        if u.producer is None or any(u is o for o in outputs):
            u = b.op("Identity", [u])
        u.name = tg.update_name(s)
        outputs.append(u)
    graph.outputs = outputs
    verify(graph)
    return tg
