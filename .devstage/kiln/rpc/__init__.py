"""Kiln RPC: run and time packages on WebGPU devices in browser tabs, driven from Python.

``kiln serve --rpc`` (or :class:`RpcServer`) starts a WebSocket server; browser tabs join it by
opening its page, and Python programs drive them with :func:`connect`::

    import kiln.rpc
    remote = kiln.rpc.connect("ws://127.0.0.1:9090", token)
    remote.load("build/mobilenet_v2")
    outputs = remote.run({"input": x})

The protocol (framing, message types, limits, security) is in docs/rpc-protocol.md.
"""

from __future__ import annotations

from kiln.rpc.client import Device, Remote, RemotePackage, Timing, connect
from kiln.rpc.server import DEFAULT_PORT, RpcServer

__all__ = ["DEFAULT_PORT", "Device", "Remote", "RemotePackage", "RpcServer", "Timing", "connect"]
