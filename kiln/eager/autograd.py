"""Reverse-mode automatic differentiation of eager tensors.

Each differentiable op that runs while gradients are enabled and has an input with
``requires_grad`` records a :class:`Node` on its result: the inputs and a ``backward`` function
mapping the gradient of the result to the gradients of the inputs. Backward functions are
written with eager ops themselves (micrograd's style: forward and backward side by side, in
:mod:`kiln.eager.tensors`, :mod:`kiln.eager.ops` and :mod:`kiln.eager.functional`), so with
``create_graph=True`` the backward pass is recorded too and gradients can be differentiated
again.

:func:`backward` walks the recorded graph once in reverse topological order, summing the
gradients every use of a tensor contributes (gradients of broadcast operands are summed back
to their shapes by the rules), and accumulates into ``.grad`` of leaf tensors that require
gradients (as ``torch.autograd`` does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from kiln.errors import KilnError

_enabled = True


class Node:
    """The op that made a tensor: its ``inputs`` and ``backward(grad) -> tuple`` of input gradients.

    ``backward`` returns one gradient (a tensor of that input's shape, or ``None``) per input.
    """

    __slots__ = ("backward", "inputs", "name", "versions")

    def __init__(self, name: str, inputs: tuple, backward: Callable):
        self.name = name
        self.inputs = inputs
        self.backward = backward
        self.versions = tuple(getattr(x, "_version", 0) for x in inputs)

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"


def is_grad_enabled() -> bool:
    """True unless inside :class:`no_grad` (or :func:`set_grad_enabled` turned recording off)."""
    return _enabled


def set_grad_enabled(mode: bool) -> bool:
    """Turn recording of new ops on or off; returns the previous setting."""
    global _enabled
    old, _enabled = _enabled, bool(mode)
    return old


class no_grad:
    """Context manager and decorator: ops inside record no graph (parameter updates, evaluation)."""

    def __enter__(self):
        self._old = set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._old)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        return wrapped


class enable_grad(no_grad):
    """Context manager: record ops even inside :class:`no_grad`."""

    def __enter__(self):
        self._old = set_grad_enabled(True)
        return self


def attach(out, name: str, inputs: tuple, backward: Callable):
    """Record ``Node(name, inputs, backward)`` on ``out`` if gradients are enabled and an input needs them.

    Returns ``out`` (for chaining).
    """
    if _enabled and any(getattr(x, "requires_grad", False) for x in inputs):
        out.requires_grad = True
        out._node = Node(name, inputs, backward)
    return out


def _order(root) -> list:
    """Tensors reachable from ``root`` through recorded nodes, in topological order (inputs first)."""
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t._node is not None:
            for x in t._node.inputs:
                if getattr(x, "requires_grad", False) and id(x) not in seen:
                    stack.append((x, False))
    return order


def backward(root, grad=None, create_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires gradients.

    Args:
        root: the tensor to differentiate (a scalar unless ``grad`` is given).
        grad: d(loss)/d(root), the shape of ``root`` (default: 1 for a scalar root).
        create_graph: record the backward ops, so the gradients can be differentiated again.

    Raises:
        ValueError: ``root`` does not require gradients, or is not a scalar and no ``grad`` is given.
    """
    tensor_type = type(root)  # kiln.eager.tensors.Tensor (not imported: tensors record their ops here)
    if not root.requires_grad:
        raise ValueError("backward(): the tensor does not require gradients (no input had requires_grad=True, "
                         "or it was computed under kiln.no_grad())")
    if grad is None:
        if root.size != 1:
            raise ValueError(f"backward(): grad can be implied only for a scalar, not shape {root.shape}")
        grad = tensor_type.from_numpy(np.ones(root.shape, np.float32))
    elif not isinstance(grad, tensor_type):
        grad = tensor_type.from_numpy(grad)
    if tuple(grad.shape) != tuple(root.shape):
        raise ValueError(f"backward(): grad shape {grad.shape} differs from the tensor's {root.shape}")
    old = set_grad_enabled(create_graph)
    try:
        grads = {id(root): grad}
        for t in reversed(_order(root)):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            if t._node is None:
                if t.requires_grad:
                    t.grad = g if t.grad is None else t.grad + g
                continue
            node = t._node
            for x, v in zip(node.inputs, node.versions):
                if getattr(x, "_version", 0) != v:
                    raise KilnError(f"backward(): an input of {node.name} (shape {x.shape}) was modified in place "
                                    "(copy_, an optimizer step) after the forward pass used it; run the forward "
                                    "pass again")
            for x, gx in zip(node.inputs, node.backward(g)):
                if gx is None or not getattr(x, "requires_grad", False):
                    continue
                if tuple(gx.shape) != tuple(x.shape):
                    raise AssertionError(f"{t._node.name} backward gave shape {gx.shape} for an input of {x.shape}")
                prev = grads.get(id(x))
                grads[id(x)] = gx if prev is None else prev + gx
    finally:
        set_grad_enabled(old)
