"""Schedules: how a tensor expression is mapped onto parallel invocations.

A schedule's fields are its knobs (the auto-tuner's search space). The default
schedule gives one invocation per output element, ``workgroup_size``
invocations per workgroup over the flattened output, and runs reductions as
serial loops inside each invocation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Knobs of the flat one-element-per-invocation schedule.

    Attributes:
        workgroup_size: invocations per workgroup (the WebGPU workgroup size; at most the
            device's ``maxComputeInvocationsPerWorkgroup``, 256 by default).
        max_groups_x: workgroups along x before the dispatch wraps into y
            (``maxComputeWorkgroupsPerDimension``, 65535 by default).
    """

    workgroup_size: int = 64
    max_groups_x: int = 65535

    def dispatch(self, total: int) -> tuple[int, int, int]:
        """Workgroup counts ``(x, y, z)`` covering ``total`` invocations."""
        groups = max(1, -(-total // self.workgroup_size))
        if groups <= self.max_groups_x:
            return (groups, 1, 1)
        return (self.max_groups_x, -(-groups // self.max_groups_x), 1)
