"""Optimizer updates of train-step graphs, as IR ops (``torch.optim``'s update rules).

An optimizer turns ``(weight, gradient)`` pairs into new weights and declares the state it keeps
between steps (momentum buffers, Adam's moments, the step count) as :class:`State` values: graph
inputs whose new values are graph outputs, which the runtime copies back after every step. All of
it is ordinary IR, fused and compiled like the forward pass; step-dependent scalars (Adam's bias
corrections) are computed on the device from the step-count state, so a train step needs no host
input besides the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.ir.graph import Builder, Value


@dataclass
class State:
    """One persistent buffer of a train step.

    Attributes:
        name: state name (a trainable weight keeps its initializer name; optimizer state is
            ``<param>.<slot>`` such as ``fc.weight.exp_avg``, or ``step``).
        value: the graph input holding its current value.
        update: the value of its next step (becomes a graph output).
        kind: ``param`` (a trainable weight) or ``optimizer``.
        init: initial contents (``None``: zeros).
    """

    name: str
    value: Value
    update: Value | None = None
    kind: str = "optimizer"
    init: np.ndarray | None = None


@dataclass
class OptimizerConfig:
    """Hyperparameters (``torch.optim`` names and defaults, except ``lr``).

    Attributes:
        name: ``sgd``, ``adam`` or ``adamw``.
        lr: learning rate.
        momentum, nesterov: SGD momentum (dampening 0) and Nesterov momentum.
        weight_decay: L2 penalty added to the gradient (SGD, Adam) or decoupled (AdamW).
        betas, eps: Adam's moment decays and denominator term.
    """

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The hyperparameters as the manifest records them."""
        out = {"name": self.name, "lr": self.lr, "weight_decay": self.weight_decay}
        if self.name == "sgd":
            out.update(momentum=self.momentum, nesterov=self.nesterov)
        else:
            out.update(betas=list(self.betas), eps=self.eps)
        return out


OPTIMIZERS = ("sgd", "adam", "adamw")


def _c(b: Builder, x: float) -> Value:
    return b.const(np.array(x, np.float32), name="c")


def _state(b: Builder, name: str, like: Value, shape=None) -> State:
    v = Value(b.fresh(name), "float32", tuple(like.shape if shape is None else shape))
    b.graph.inputs.append(v)
    return State(v.name, v)


def apply(b: Builder, cfg: OptimizerConfig, params: list[State], grads: list[Value]) -> list[State]:
    """Append the update of every ``params[i]`` by ``grads[i]``; sets each param's ``update``.

    Returns:
        The optimizer's own state (zeros initially), its ``update`` set.

    Raises:
        KilnError: an unknown optimizer or a hyperparameter out of range.
    """
    if cfg.name not in OPTIMIZERS:
        raise KilnError(f"unknown optimizer {cfg.name!r}; known: {', '.join(OPTIMIZERS)}")
    if not cfg.lr > 0 or cfg.momentum < 0 or cfg.weight_decay < 0 or not all(0 <= x < 1 for x in cfg.betas) \
            or cfg.eps < 0 or (cfg.nesterov and cfg.momentum <= 0):
        raise KilnError(f"optimizer hyperparameters out of range: {cfg.to_json()} (lr > 0, momentum >= 0, "
                        "weight_decay >= 0, 0 <= betas < 1, eps >= 0; nesterov needs momentum)")
    states: list[State] = []
    step = None
    if cfg.name in ("adam", "adamw"):
        step = _state(b, "step", params[0].value, shape=(1,))
        step.update = b.op("Add", [step.value, _c(b, 1.0)])
        states.append(step)
        b1, b2 = cfg.betas
        bc1 = b.op("Sub", [_c(b, 1.0), b.op("Pow", [_c(b, b1), step.update])])
        step_size = b.op("Div", [_c(b, cfg.lr), bc1])
        bc2_sqrt = b.op("Sqrt", [b.op("Sub", [_c(b, 1.0), b.op("Pow", [_c(b, b2), step.update])])])
    for p, g in zip(params, grads):
        b.scope = f"{cfg.name}_{p.name}"
        w = p.value
        if cfg.weight_decay and cfg.name != "adamw":
            g = b.op("Add", [g, b.op("Mul", [w, _c(b, cfg.weight_decay)])])
        if cfg.name == "sgd":
            d = g
            if cfg.momentum:
                buf = _state(b, f"{p.name}.momentum_buffer", w)
                buf.update = b.op("Add", [b.op("Mul", [buf.value, _c(b, cfg.momentum)]), g])
                states.append(buf)
                d = b.op("Add", [g, b.op("Mul", [buf.update, _c(b, cfg.momentum)])]) if cfg.nesterov else buf.update
            p.update = b.op("Sub", [w, b.op("Mul", [d, _c(b, cfg.lr)])])
            continue
        if cfg.name == "adamw" and cfg.weight_decay:
            w = b.op("Mul", [w, _c(b, 1.0 - cfg.lr * cfg.weight_decay)])
        m, v = _state(b, f"{p.name}.exp_avg", p.value), _state(b, f"{p.name}.exp_avg_sq", p.value)
        m.update = b.op("Add", [b.op("Mul", [m.value, _c(b, b1)]), b.op("Mul", [g, _c(b, 1.0 - b1)])])
        v.update = b.op("Add", [b.op("Mul", [v.value, _c(b, b2)]), b.op("Mul", [b.op("Mul", [g, g]), _c(b, 1.0 - b2)])])
        states += [m, v]
        denom = b.op("Add", [b.op("Div", [b.op("Sqrt", [v.update]), bc2_sqrt]), _c(b, cfg.eps)])
        p.update = b.op("Sub", [w, b.op("Mul", [step_size, b.op("Div", [m.update, denom])])])
    b.scope = ""
    return states
