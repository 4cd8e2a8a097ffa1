"""Horizontal fusion of lowered kernels: independent kernels run as one dispatch, each over its own range of the
invocations.

A kernel dispatch costs a GPU a few microseconds between dependent dispatches and the host several to encode, whatever
its work: a language model's decode step writes its keys and its values into the KV cache in two small kernels a
layer that read the same projection and write different buffers. :func:`concat` makes one kernel of such kernels:
invocation ``g`` runs the first kernel's body for ``g < total_0``, the second's for ``g - total_0`` below its total,
and so on. Only kernels whose invocations work alone (no reduce lanes, no workgroup memory: not
``LoweredKernel.cooperative``) are concatenated; whether they are independent (no kernel reads or overwrites a buffer
another writes) is the caller's to know (:func:`kiln.codegen.webgpu.build.build_kernels` checks the plan's buffers).

:func:`ride` joins such a kernel to a cooperative one at workgroup granularity instead: the cooperative kernel's
workgroups first, then workgroups running the other's invocations (a decode step's KV-cache write riding on its
attention kernel, :mod:`kiln.passes.split_attention`).
"""

from __future__ import annotations

from kiln.arith.expr import Expr, Var, binop
from kiln.arith.symbolic import ceil_div, simplify
from kiln.te.loops import If, Let, LoweredKernel, Param, rewrite


def concatenable(k: LoweredKernel) -> bool:
    """Whether ``k``'s invocations work alone (no reduce lanes, workgroup memory or vector arrays): such a kernel's
    body can run for any range of a dispatch's invocations."""
    return not k.cooperative and not k.shared and not k.vectors


def concat(kernels: list[LoweredKernel], buffers: list[list[int]], name: str) -> tuple[LoweredKernel, list[int]]:
    """One kernel running each of ``kernels`` (each :func:`concatenable`, all of one workgroup size) over its own range
    of invocations, in order.

    Args:
        kernels: the kernels; independent of each other (none reads or writes a buffer another writes).
        buffers: per kernel, the buffer each of its params is bound to (the plan's buffer ids): a buffer several
            kernels read is bound once.
        name: the new kernel's name.

    Returns:
        ``(kernel, buffers)``: the kernel (its reads first, then each kernel's output, in order; ``inputs`` the
        placeholder of each read) and the buffer of each of its params.

    Raises:
        ValueError: a kernel that is not concatenable, workgroup sizes that differ, or one buffer read as two dtypes.
    """
    if not all(concatenable(k) for k in kernels) or len({k.schedule.workgroup_size for k in kernels}) != 1:
        raise ValueError("concat: kernels need invocations that work alone and one workgroup size")
    params: list[Param] = []
    bound: list[int] = []
    read: dict[int, int] = {}  # buffer -> index of its read param
    renames: list[dict[str, str]] = []
    inputs = []
    for k, bufs in zip(kernels, buffers):
        names = {}
        for j, (p, b) in enumerate(zip(k.params, bufs)):
            if p.access != "read":
                continue
            if b not in read:
                read[b] = len(params)
                params.append(Param(f"in{len(params)}", p.dtype, p.size, "read"))
                bound.append(b)
                inputs.append(k.inputs[j])
            elif params[read[b]].dtype != p.dtype:
                raise ValueError(f"concat: buffer {b} is read as {params[read[b]].dtype} and as {p.dtype}")
            names[p.name] = params[read[b]].name
        renames.append(names)
    for i, (k, bufs) in enumerate(zip(kernels, buffers)):
        for p, b in zip(k.params, bufs):
            if p.access != "read":
                renames[i][p.name] = f"out{len(params)}"
                params.append(Param(renames[i][p.name], p.dtype, p.size, p.access))
                bound.append(b)
    gid = Var("hgid")
    body: list = []
    start: Expr | int = 0
    for i, k in enumerate(kernels):
        end = simplify(start + k.total)
        cond = binop("<", gid, end) if i < len(kernels) - 1 else None
        if i:
            above = binop(">=", gid, start)
            cond = above if cond is None else binop("&&", above, cond)
        inner = [Let(k.gid, binop("-", gid, start) if i else gid), *_renamed(k.body, renames[i])]
        body.append(If(cond, inner) if cond is not None else If(binop(">=", gid, start), inner))
        start = end
    return LoweredKernel(name, params, inputs, simplify(start), gid, body, kernels[0].schedule), bound


def ride(host: LoweredKernel, rider: LoweredKernel, host_buffers: list[int], rider_buffers: list[int],
         name: str) -> tuple[LoweredKernel, list[int]]:
    """One dispatch of cooperative kernel ``host`` followed by workgroups running ``rider``'s invocations.

    Workgroup ``w`` runs ``host``'s body for ``w < groups(host)`` (a condition uniform over the workgroup, so its
    barriers stay in uniform control flow, WGSL §15.2); the workgroups after it run ``rider``'s invocations,
    ``(w - groups(host)) * workgroup_size + local index``, each below ``rider.total``. The rider may write a buffer
    the host reads: it is bound once, ``read_write`` (the caller makes sure the host loads none of the elements the
    rider stores: a decode step's attention reads the row before the cache row its riders write, and discards it).

    Args:
        host: a cooperative kernel (:attr:`~kiln.te.loops.LoweredKernel.cooperative`).
        rider: a :func:`concatenable` kernel (of any workgroup size: its invocations work alone).
        host_buffers, rider_buffers: the buffer each kernel's params are bound to (the plan's buffer ids).
        name: the new kernel's name.

    Returns:
        ``(kernel, buffers)``: the kernel (its reads first, then the host's output and the rider's outputs) and the
        buffer of each of its params.

    Raises:
        ValueError: a host that is not cooperative or a rider that is not concatenable, a buffer the host writes
            that the rider binds, one buffer written twice, or one buffer bound as two dtypes.
    """
    if not host.cooperative or not concatenable(rider):
        raise ValueError("ride: the host must be cooperative and the rider's invocations must work alone")
    sides = ((host, host_buffers), (rider, rider_buffers))
    written = [b for k, bufs in sides for p, b in zip(k.params, bufs) if p.access != "read"]
    hosts = {b for p, b in zip(host.params, host_buffers) if p.access != "read"}
    if len(set(written)) != len(written) or hosts & set(rider_buffers):
        raise ValueError("ride: a buffer is written twice, or the rider binds the host's output")
    params: list[Param] = []
    bound: list[int] = []
    inputs = []
    names: dict[int, str] = {}  # buffer -> its param
    renames: list[dict[str, str]] = [{}, {}]
    for k, bufs in sides:
        for j, (p, b) in enumerate(zip(k.params, bufs)):
            if p.access == "read" and b not in written and b not in names:
                names[b] = f"in{len(params)}"
                params.append(Param(names[b], p.dtype, p.size, "read"))
                bound.append(b)
                inputs.append(k.inputs[j])
    for k, bufs in sides:
        for p, b in zip(k.params, bufs):
            if p.access != "read":
                names[b] = f"out{len(params)}"
                params.append(Param(names[b], p.dtype, p.size, p.access))
                bound.append(b)
    dtype = {p.name: p.dtype for p in params}
    for side, (k, bufs) in enumerate(sides):
        for p, b in zip(k.params, bufs):
            if dtype[names[b]] != p.dtype:
                raise ValueError(f"ride: buffer {b} is bound as {dtype[names[b]]} and as {p.dtype}")
            renames[side][p.name] = names[b]
    wg = host.schedule.workgroup_size
    lid, wid = Var("lid"), Var("wid")
    groups = host.groups
    body = [If(binop("<", wid, groups), _renamed(host.body, renames[0])),
            If(binop(">=", wid, groups), [
                Let(rider.gid, simplify((wid - groups) * wg + lid)),
                If(binop("<", rider.gid, rider.total), _renamed(rider.body, renames[1]))])]
    total = simplify((groups + ceil_div(rider.total, wg)) * (wg // host.lanes))
    return LoweredKernel(name, params, inputs, total, host.gid, body, host.schedule, dict(host.shared),
                         dict(host.vectors)), bound


def _renamed(stmts: list, names: dict[str, str]) -> list:
    """``stmts`` with every buffer parameter ``p`` read or written renamed ``names[p]`` (workgroup arrays, not in
    ``names``, keep theirs)."""
    return rewrite(stmts, lambda x: None, lambda n: names.get(n, n))
