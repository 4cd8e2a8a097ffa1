"""Native execution of plans with control steps (package format 1.4: ``if``, ``loop``, ``copy``, ``error``).

A flat plan is recorded into one command encoder and submitted once (:mod:`kiln.runtime.native`). With
control steps the runtime must know each condition before it records what follows, so it records kernel
steps and copies until the next condition, submits them, reads the condition back (a 4-byte copy to a
mappable buffer: one GPU-to-host round trip per run-time If and per Loop iteration whose condition the body
computes), and goes on with the chosen steps. Conditions and trip counts held by input buffers are read
from the caller's feeds instead, with no readback. Semantics: docs/control-flow.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.package.format import kernel_steps

#: most iterations a Loop with no trip count may run before the runtime gives up (its condition never
#: became false); a guard against hanging, far above what real models run
MAX_ITERATIONS = 1_000_000


def is_control_plan(plan: list[dict[str, Any]]) -> bool:
    """Whether ``plan`` holds control steps (anything besides kernel steps)."""
    return any("kernel" not in s for s in plan)


class ControlPlan:
    """Runs a plan with control steps on a :class:`kiln.runtime.native.Session`'s device and buffers.

    Args:
        session: the session; its ``steps`` are the plan's kernel steps in :attr:`kernel_steps` order
            (pipeline, bind group, dispatch size).
        plan: the target's ``plan`` from the manifest.
    """

    def __init__(self, session, plan: list[dict[str, Any]]):
        import wgpu

        self.session = session
        self.plan = plan
        #: every kernel step, all branches and bodies included, in plan order (the session binds these)
        self.kernel_steps = kernel_steps(plan)
        self._index = {id(s): i for i, s in enumerate(self.kernel_steps)}
        self._staging = session.device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ
                                                     | wgpu.BufferUsage.COPY_DST, label="kiln_condition")
        self.readbacks = 0  # GPU-to-host condition reads in the last run (for tests and docs)
        self._enc = self._pass = None
        self._host: dict[int, np.ndarray] = {}

    def execute(self, enc, feeds: list[tuple[dict, np.ndarray]]):
        """Record and submit the plan, starting with encoder ``enc``; returns the encoder the caller finishes
        (with its output copies) and submits.

        Args:
            feeds: ``(input spec, array in storage form)`` of every input, already written to its buffer.

        Raises:
            KilnError: a branch that cannot run with the compiled shapes was taken, or a Loop ran
                :data:`MAX_ITERATIONS` iterations without its condition becoming false.
            ShapeError: a Loop with scan outputs ran a different number of iterations than they were sized for.
        """
        self._enc, self._pass = enc, None
        self._host = {spec["buffer"]: a for spec, a in feeds}
        self.readbacks = 0
        self._run(self.plan)
        self._end_pass()
        enc, self._enc = self._enc, None
        return enc

    # -------------------------------------------------------------------------- recording
    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def _submit(self) -> None:
        self._end_pass()
        dev = self.session.device
        dev.queue.submit([self._enc.finish()])
        self._enc = dev.create_command_encoder()

    def _copy(self, src: int, dst: int, nbytes: int, dst_offset: int = 0) -> None:
        if nbytes and src != dst:
            self._end_pass()
            bufs = self.session.buffers
            self._enc.copy_buffer_to_buffer(bufs[src], 0, bufs[dst], dst_offset, nbytes)

    def _write(self, buffer: int, value: int) -> None:
        """Write one int32 (an iteration number, a condition) after everything recorded so far."""
        self._submit()  # queue writes land before commands submitted later, so submit what reads the old value
        self.session.device.queue.write_buffer(self.session.buffers[buffer], 0, np.int32(value).tobytes())

    def _read(self, buffer: int) -> int:
        """The first element (int32 storage: bool, int32, int64) of ``buffer`` once what is recorded has run."""
        import wgpu

        if buffer in self._host:
            return int(np.asarray(self._host[buffer]).reshape(-1)[0])
        self._end_pass()
        self._enc.copy_buffer_to_buffer(self.session.buffers[buffer], 0, self._staging, 0, 4)
        self._submit()
        self.readbacks += 1
        self._staging.map_sync(wgpu.MapMode.READ)
        try:
            return int(np.frombuffer(self._staging.read_mapped(copy=True), np.int32)[0])
        finally:
            self._staging.unmap()

    def _operand(self, spec: dict | None, default: int | None) -> int | None:
        if spec is None:
            return default
        return int(spec["value"]) if "value" in spec else self._read(spec["buffer"])

    # -------------------------------------------------------------------------- steps
    def _run(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            if "kernel" in step:
                pipeline, group, (x, y, z) = self.session.steps[self._index[id(step)]]
                if self._pass is None:
                    self._pass = self._enc.begin_compute_pass()
                self._pass.set_pipeline(pipeline)
                self._pass.set_bind_group(0, group)
                self._pass.dispatch_workgroups(x, y, z)
            elif "copy" in step:
                self._copy(*step["copy"])
            elif "if" in step:
                self._run(step["then"] if self._read(step["if"]) else step["else"])
            elif "loop" in step:
                self._loop(step["loop"], step.get("node", "Loop"))
            elif "error" in step:
                raise KilnError(step["error"])
            else:
                raise KilnError(f"unknown plan step {sorted(step)} (a newer package format?)")

    def _loop(self, spec: dict[str, Any], node: str) -> None:
        trips = self._operand(spec["trip_count"], None)
        go = bool(self._operand(spec["cond"], 1))
        carried, scans, rows = spec["carried"], spec["scan"], spec["rows"]
        for init, _, _, out, n in carried:
            self._copy(init, out, n)
        i = 0
        while go and (trips is None or i < trips):
            if i >= MAX_ITERATIONS:
                raise KilnError(f"Loop {node!r}: {MAX_ITERATIONS} iterations and its condition is still true")
            if scans and i >= rows:
                raise ShapeError(f"Loop {node!r}: runs more than the {rows} iterations its scan outputs were sized for")
            for _, body_in, _, out, n in carried:
                self._copy(out, body_in, n)
            if spec["iteration"] is not None:
                self._write(spec["iteration"], i)
            if spec["cond_in"] is not None:
                self._write(spec["cond_in"], int(go))
            self._run(spec["body"])
            for _, _, body_out, out, n in carried:
                self._copy(body_out, out, n)
            for body_out, out, n in scans:
                self._copy(body_out, out, n, dst_offset=i * n)
            if spec["cond_out"] is not None:
                go = bool(self._read(spec["cond_out"]))
            i += 1
        if scans and i != rows:
            raise ShapeError(f"Loop {node!r}: ran {i} iterations but its scan outputs were sized for {rows} at compile "
                             "time (the trip count); a loop whose condition ends it early has data-dependent outputs")
