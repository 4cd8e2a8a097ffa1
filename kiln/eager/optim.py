"""Optimizers for eager tensors (``kiln.optim``): SGD (momentum, Nesterov, weight decay), Adam and AdamW.

The update rules are PyTorch's (``torch.optim``, whose documentation gives them as pseudocode).
Each state update is one fused elementwise kernel built from a tensor expression, with the
step-dependent numbers (learning rate, bias corrections) passed as uniforms, so the kernels
compile once and every later step reuses them.
"""

from __future__ import annotations

import math

from kiln.arith.expr import call
from kiln.eager import autograd
from kiln.eager import tensors as _tensor
from kiln.eager.tensors import Tensor


def _run(name: str, fn, operands: list) -> Tensor:
    """One fused elementwise kernel over float32 tensors and scalars (the scalars become uniforms)."""
    return _tensor._run(name, fn, [o if isinstance(o, Tensor) else float(o) for o in operands],
                        ["float32"] * len(operands))


class Optimizer:
    """Base class: holds the parameters and per-parameter state.

    Args:
        params: an iterable of float32 tensors with ``requires_grad`` (``model.parameters()``).
        defaults: hyper-parameters.

    Raises:
        ValueError: no parameters, or a parameter that does not require gradients.
    """

    def __init__(self, params, defaults: dict):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        for p in self.params:
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise ValueError("optimizer parameters must be tensors with requires_grad=True")
        self.defaults = dict(defaults)
        self.state: dict[int, dict] = {id(p): {} for p in self.params}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients (to ``None``, or to zeros)."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = p.grad.detach() * 0.0

    def step(self) -> None:
        """Update every parameter that has a gradient."""
        with autograd.no_grad():
            for p in self.params:
                if p.grad is not None:
                    self._update(p, p.grad.detach(), self.state[id(p)])

    def _update(self, p: Tensor, g: Tensor, state: dict) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent (``torch.optim.SGD``)::

        g = grad + weight_decay * p
        buf = g (first step), else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov), else buf          (with momentum)
        p = p - lr * g
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                                      "nesterov": nesterov})

    def _update(self, p, g, state):
        d = self.defaults
        lr, mom, damp, wd = d["lr"], d["momentum"], d["dampening"], d["weight_decay"]
        if wd:
            g = _run("SgdDecay", lambda g, p, wd: g + wd * p, [g, p, wd])
        if mom:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = g
            else:
                buf = _run("SgdMomentum", lambda b, g, m, k: m * b + k * g, [buf, g, mom, 1.0 - damp])
            state["momentum_buffer"] = buf
            if d["nesterov"]:
                g = _run("SgdNesterov", lambda g, b, m: g + m * b, [g, buf, mom])
            else:
                g = buf
        p.copy_(_run("SgdStep", lambda p, g, lr: p - lr * g, [p, g, lr]))


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015; ``torch.optim.Adam``)::

        g = grad + weight_decay * p
        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    """

    decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Adam betas must be in [0, 1), not {betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def _update(self, p, g, state):
        d = self.defaults
        lr, (b1, b2), eps, wd = d["lr"], d["betas"], d["eps"], d["weight_decay"]
        t = state["step"] = state.get("step", 0) + 1
        if wd and self.decoupled:  # AdamW: p = p (1 - lr wd) before the Adam step
            p.copy_(_run("AdamWDecay", lambda p, k: p * k, [p, 1.0 - lr * wd]))
        elif wd:
            g = _run("SgdDecay", lambda g, p, wd: g + wd * p, [g, p, wd])
        if t == 1:
            state["m"] = _run("AdamM1", lambda g, k: g * k, [g, 1.0 - b1])
            state["v"] = _run("AdamV1", lambda g, k: g * g * k, [g, 1.0 - b2])
        else:
            state["m"] = _run("AdamM", lambda m, g, b, k: b * m + k * g, [state["m"], g, b1, 1.0 - b1])
            state["v"] = _run("AdamV", lambda v, g, b, k: b * v + k * (g * g), [state["v"], g, b2, 1.0 - b2])
        step_size = lr / (1 - b1 ** t)
        inv_c2 = 1 / math.sqrt(1 - b2 ** t)
        p.copy_(_run("AdamStep", lambda p, m, v, s, c, e: p - s * (m / (call("sqrt", v) * c + e)),
                     [p, state["m"], state["v"], step_size, inv_c2, eps]))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019; ``torch.optim.AdamW``, default decay 0.01)."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)


__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]
