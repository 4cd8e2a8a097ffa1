"""Train steps of train-step packages in the native runtime (format 1.3 ``training``; docs/training.md).

:class:`TrainingMixin` gives :class:`kiln.runtime.native.Session` ``train_step``, ``state`` and
``export_weights``. A train step writes the inputs (model inputs and labels), records the train plan's
dispatches in one compute pass, then copies every ``update`` buffer over its state buffer and the
loss to a mappable buffer, all in one submission; the weights and optimizer state never leave the device.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError, PackageError
from kiln.package.format import atomic_path, from_storage
from kiln.runtime import gpu
from kiln.runtime.feeds import storage_feeds


class TrainingMixin:
    """Training methods of a native session (expects ``manifest``, ``device``, ``buffers``, ``pipelines``)."""

    def _init_training(self, tgt: dict[str, Any]) -> None:
        """Bind groups of the train plan and the readback buffer of its outputs (no-op for inference packages)."""
        self.training: dict[str, Any] | None = self.manifest.get("training")
        self.train_steps = []
        if self.training is None:
            return
        if "train_plan" not in tgt:
            raise PackageError(f"{self.path}: the package has a training section but its target has no train_plan")
        dev = self.device
        for s in tgt["train_plan"]:
            pipeline, layout = self.pipelines[s["kernel"]]
            group = dev.create_bind_group(layout=layout, entries=[
                {"binding": i, "resource": {"buffer": self.buffers[bid], "offset": 0, "size": self.buffers[bid].size}}
                for i, bid in enumerate(s["buffers"])])
            self.train_steps.append((pipeline, group, tuple(s["dispatch"])))
        self.train_readback = gpu.Readback(dev, [self.buffers[o["buffer"]].size for o in self.training["outputs"]])

    def _need_training(self) -> dict[str, Any]:
        if self.training is None:
            raise KilnError(f"{self.path}: not a train-step package; compile it with --train (kiln compile --help)")
        return self.training

    @property
    def train_inputs(self) -> list[dict[str, Any]]:
        """Input descriptions of a train step (the model's inputs and the labels), from the manifest."""
        return self._need_training()["inputs"]

    def train_step(self, feeds: dict[str, np.ndarray], return_outputs: bool = False) -> float | dict[str, np.ndarray]:
        """Run one train step: forward, loss, backward and the optimizer's update of the trainable weights.

        Args:
            feeds: input name -> array, for every entry of :attr:`train_inputs` (model inputs and labels:
                class indices int64 [N] for cross-entropy, targets for mse), of exactly that dtype and shape.
            return_outputs: return every training output (``loss``, and ``grad/<weight>`` in packages
                compiled with gradient outputs) instead of the loss alone.

        Returns:
            The loss before the update (a float), or output name -> array.

        Raises:
            KilnError: not a train-step package.
            ShapeError: an unknown, missing, wrongly shaped or typed input.
        """
        training = self._need_training()
        with self._device_work("train step"), self._lock:  # (a step owns the session's buffers, as a run does)
            return self._train_step(training, feeds, return_outputs)

    def _train_step(self, training: dict[str, Any], feeds: dict[str, np.ndarray],
                    return_outputs: bool) -> float | dict[str, np.ndarray]:
        dev = self.device
        for spec, a in storage_feeds(training["inputs"], feeds):
            if a.size:
                dev.queue.write_buffer(self.buffers[spec["buffer"]], 0, memoryview(a.reshape(-1)).cast("B"))
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        gpu.record_dispatches(cpass, self.train_steps)
        cpass.end()
        for s in training["state"]:
            enc.copy_buffer_to_buffer(self.buffers[s["update"]], 0, self.buffers[s["buffer"]], 0, s["bytes"])
        outs = training["outputs"]
        self.train_readback.copy(enc, [self.buffers[o["buffer"]] for o in outs])
        dev.queue.submit([enc.finish()])
        results = dict(zip((o["name"] for o in outs), self.train_readback.read(
            lambda i, data: from_storage(data, outs[i]["dtype"], outs[i]["shape"]))))
        return results if return_outputs else float(results[training["loss"]["output"]])

    def state(self, optimizer: bool = False) -> dict[str, np.ndarray]:
        """The current trainable weights (and, with ``optimizer``, the optimizer state), read from the device.

        Returns:
            State name (the ONNX initializer name for weights) -> a new float32 array of its shape.
        """
        out = {}
        with self._device_work("state read"), self._lock:
            for s in self._need_training()["state"]:
                if s["kind"] == "param" or optimizer:
                    raw = self.device.queue.read_buffer(self.buffers[s["buffer"]], 0, s["bytes"])
                    out[s["name"]] = from_storage(raw, s["dtype"], s["shape"])
        return out

    def export_weights(self, path: str | os.PathLike, optimizer: bool = False, force: bool = False) -> Path:
        """Write the current trainable weights (and optimizer state with ``optimizer``) as a safetensors file,
        keyed by their ONNX initializer names.

        Raises:
            KilnError: not a train-step package.
            FileExistsError: ``path`` exists and ``force`` is not set.
            KilnError: the file cannot be written (the previous one is kept).
        """
        from safetensors.numpy import save_file

        path = Path(path)
        if path.exists() and not force:
            raise FileExistsError(f"{path} already exists; pass force=True to replace it")
        state = {k: np.ascontiguousarray(v) for k, v in self.state(optimizer).items()}
        from safetensors import SafetensorError

        try:
            with atomic_path(path) as tmp:  # an interrupted export leaves the previous file as it was
                save_file(state, str(tmp), metadata={"format": "pt", "source": "kiln train step"})
        except SafetensorError as e:
            raise KilnError(f"cannot write {path}: {str(e).split('I/O error: ')[-1]} (nothing was replaced)") from None
        return path
