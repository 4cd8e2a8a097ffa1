"""Compiled training: train-step graphs built by graph-level reverse-mode autodiff (docs/training.md).

``kiln compile MODEL --train --trainable 'classifier.*' --loss cross_entropy --optimizer adam`` and
``kiln.compile(model, out, train=TrainOptions(...))`` build them; :mod:`kiln.train.graph` is the builder,
:mod:`kiln.train.losses` and :mod:`kiln.train.optimizers` the loss and update rules as IR ops, and
:mod:`kiln.passes.autodiff` the backward rules.
"""

from __future__ import annotations

from kiln.train.graph import TrainGraph, TrainOptions, build_train_graph
from kiln.train.losses import LOSSES
from kiln.train.optimizers import OPTIMIZERS, OptimizerConfig, State

__all__ = ["LOSSES", "OPTIMIZERS", "OptimizerConfig", "State", "TrainGraph", "TrainOptions", "build_train_graph"]
