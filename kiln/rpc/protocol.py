"""The Kiln RPC wire format: framing, limits and field checks shared by the server and the client.

Every message is one binary WebSocket message (docs/rpc-protocol.md has the full protocol)::

    offset 0   4 bytes   magic b"KRPC"
    offset 4   u32 LE    H, the header's length in bytes (1 <= H <= MAX_HEADER_BYTES)
    offset 8   H bytes   the header: a UTF-8 JSON object with "type" (str), "id" (int) and
                         "blobs" (the byte length of each blob, in order)
               zero padding to a multiple of 8 bytes
               the blobs, each starting at a multiple of 8 bytes and zero-padded to one

Tensors travel as blobs of raw little-endian, row-major elements; the header describes them
(``{"name", "dtype", "shape"}``), so JavaScript can view a blob as a typed array without copying.
Every check here raises :class:`~kiln.errors.ProtocolError`; a peer that sends a message failing
one has its connection closed.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import ProtocolError

#: the first 4 bytes of every message
MAGIC = b"KRPC"
#: protocol version, sent in ``hello`` (devices) and checked by the server
PROTOCOL_VERSION = 1
#: most bytes of a JSON header
MAX_HEADER_BYTES = 1 << 20
#: most blobs in one message (files of a package, or tensors)
MAX_BLOBS = 4096
#: most dimensions of a tensor
MAX_DIMS = 8
#: most characters of a name (tensor, file path, error kind)
MAX_NAME_CHARS = 256
#: most characters of an error message kept from a peer
MAX_MESSAGE_CHARS = 4096
#: most timed runs (``repeat``) and untimed runs (``warmup``) of one ``time`` request
MAX_REPEAT = 1000
MAX_WARMUP = 100
#: default limit of one whole message, in bytes (a package upload is one message)
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
#: element types a tensor may have, with their numpy dtypes (all little-endian)
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "int32": np.dtype("<i4"),
    "uint32": np.dtype("<u4"),
}
#: clocks a ``timing`` reply may name
CLOCKS = ("timestamp-query", "wall")

_PREFIX = struct.Struct("<4sI")
_TYPE = re.compile(r"[a-z]{1,32}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_MAX_ID = 2**53 - 1  # exact in JavaScript numbers


def align8(n: int) -> int:
    """``n`` rounded up to a multiple of 8."""
    return (n + 7) & ~7


@dataclass(frozen=True)
class Message:
    """A decoded message.

    Attributes:
        header: the JSON header (a dict with at least ``type``, ``id`` and ``blobs``).
        blobs: one read-only memoryview of bytes per entry of ``header["blobs"]``, viewing the received data.
    """

    header: dict[str, Any]
    blobs: list[memoryview]

    @property
    def type(self) -> str:
        """The message type, e.g. ``"run"``."""
        return self.header["type"]

    @property
    def id(self) -> int:
        """The request id a reply answers (0 for messages that answer nothing)."""
        return self.header["id"]


def encode(header: dict[str, Any], blobs: Sequence[bytes | bytearray | memoryview] = ()) -> bytes:
    """Frame a header and its blobs as one message.

    Args:
        header: JSON-serialisable dict with ``type`` and ``id``; ``blobs`` is set here to the blobs' lengths.
        blobs: byte strings (or buffers) to append, in order.

    Returns:
        The message bytes (``8 + align8(H) + sum(align8(len(blob)))`` bytes).

    Raises:
        ProtocolError: the header is not JSON-serialisable (NaN or infinity included), too long,
            or there are more than :data:`MAX_BLOBS` blobs.
    """
    views = [memoryview(b).cast("B") for b in blobs]
    if len(views) > MAX_BLOBS:
        raise ProtocolError(f"{len(views)} blobs in one message; the limit is {MAX_BLOBS}")
    try:
        text = json.dumps({**header, "blobs": [v.nbytes for v in views]}, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"cannot encode a {header.get('type')!r} header: {e}") from None
    head = text.encode()
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(head)} bytes; the limit is {MAX_HEADER_BYTES}")
    parts: list[bytes | memoryview] = [_PREFIX.pack(MAGIC, len(head)), head, bytes(align8(len(head)) - len(head))]
    for v in views:
        parts += [v, bytes(align8(v.nbytes) - v.nbytes)]
    return b"".join(parts)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(data: bytes | bytearray | memoryview | str) -> Message:
    """Parse and check one received message.

    Args:
        data: the WebSocket message (a ``str`` means a text message, which the protocol does not use).

    Returns:
        The :class:`Message`; its blobs view ``data`` without copying.

    Raises:
        ProtocolError: a text message, a bad magic or header length, a header that is not a JSON
            object with a lowercase ``type``, an integer ``id`` and a list of blob lengths, or a
            message whose length differs from what the header implies.
    """
    if isinstance(data, str):
        raise ProtocolError("text message (the protocol uses binary messages only)")
    view = memoryview(data).cast("B").toreadonly()
    if view.nbytes < _PREFIX.size:
        raise ProtocolError(f"message of {view.nbytes} bytes is shorter than the 8-byte prefix")
    magic, size = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if not 1 <= size <= MAX_HEADER_BYTES or _PREFIX.size + size > view.nbytes:
        raise ProtocolError(f"bad header length {size} in a message of {view.nbytes} bytes")
    try:
        header = json.loads(bytes(view[8:8 + size]).decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"header is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    kind = header.get("type")
    if not isinstance(kind, str) or not _TYPE.match(kind):
        raise ProtocolError(f"bad message type {str(kind)[:40]!r}")
    integer(header, "id", 0, _MAX_ID)
    lengths = header.get("blobs", [])
    if not isinstance(lengths, list) or len(lengths) > MAX_BLOBS:
        raise ProtocolError(f"'blobs' must be a list of at most {MAX_BLOBS} lengths")
    offset = _PREFIX.size + align8(size)
    blobs = []
    for n in lengths:
        if type(n) is not int or n < 0 or offset + n > view.nbytes:
            raise ProtocolError(f"bad blob length {str(n)[:20]} (message of {view.nbytes} bytes)")
        blobs.append(view[offset:offset + n])
        offset += align8(n)
    if offset != view.nbytes:
        raise ProtocolError(f"message is {view.nbytes} bytes; its header implies {offset}")
    header["blobs"] = lengths
    return Message(header, blobs)


def field(header: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``header[key]``, checked to be of ``kind`` (``bool`` never passes for ``int``).

    Raises:
        ProtocolError: the key is missing or of another type.
    """
    value = header.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ProtocolError(f"{header.get('type')!r} message: {key!r} must be {names}, got {type(value).__name__}")
    return value


def integer(header: dict[str, Any], key: str, low: int, high: int) -> int:
    """``header[key]`` checked to be an int in ``[low, high]`` (ProtocolError otherwise)."""
    value = field(header, key, int)
    if not low <= value <= high:
        raise ProtocolError(f"{header.get('type')!r} message: {key!r} = {value} is outside [{low}, {high}]")
    return value


def name(value: Any, what: str) -> str:
    """Check ``value`` is a non-empty string of at most :data:`MAX_NAME_CHARS` characters (ProtocolError)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise ProtocolError(f"{what} must be a string of 1 to {MAX_NAME_CHARS} characters")
    return value


def tensor_specs(header: dict[str, Any], key: str, blobs: Sequence[memoryview]) -> list[dict[str, Any]]:
    """Check ``header[key]``, a list of ``{name, dtype, shape}`` describing the message's blobs in order.

    Returns:
        The list, each entry with exactly ``name`` (str), ``dtype`` (a key of :data:`DTYPES`) and
        ``shape`` (list of ints >= 0, at most :data:`MAX_DIMS`).

    Raises:
        ProtocolError: a malformed entry, a repeated name, a count differing from the blobs', or a
            blob whose byte length is not ``prod(shape) * itemsize``.
    """
    specs = field(header, key, list)
    if len(specs) != len(blobs):
        raise ProtocolError(f"{header['type']!r} message: {len(specs)} tensors but {len(blobs)} blobs")
    out, seen = [], set()
    for spec, blob in zip(specs, blobs, strict=True):
        if not isinstance(spec, dict):
            raise ProtocolError(f"{header['type']!r} message: a tensor description is not an object")
        tensor = name(spec.get("name"), "a tensor name")
        if tensor in seen:
            raise ProtocolError(f"{header['type']!r} message: tensor {tensor!r} appears twice")
        seen.add(tensor)
        dtype = spec.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:  # (a list or object is unhashable)
            raise ProtocolError(f"tensor {tensor!r}: dtype {str(dtype)[:20]!r} is not one of {', '.join(DTYPES)}")
        shape = spec.get("shape")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(type(d) is int and 0 <= d < 2**31 for d in shape)):
            raise ProtocolError(f"tensor {tensor!r}: shape must be a list of at most {MAX_DIMS} ints in [0, 2^31)")
        expected = math.prod(shape) * DTYPES[dtype].itemsize
        if blob.nbytes != expected:
            raise ProtocolError(f"tensor {tensor!r}: {dtype}{shape} is {expected} bytes, its blob {blob.nbytes}")
        out.append({"name": tensor, "dtype": dtype, "shape": shape})
    return out


def arrays_to_blobs(arrays: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """Describe and serialise named arrays as tensors.

    Args:
        arrays: name -> array of a dtype in :data:`DTYPES` (any byte order or layout; converted to
            little-endian row-major).

    Returns:
        ``(specs, blobs)``: the ``{name, dtype, shape}`` list and one blob per array.

    Raises:
        ProtocolError: an array of another dtype, or of more than :data:`MAX_DIMS` dimensions.
    """
    specs, blobs = [], []
    for key, value in arrays.items():
        a = np.asarray(value)
        little = a.dtype.newbyteorder("<")
        dtype = next((k for k, d in DTYPES.items() if little == d), None)
        if dtype is None:
            raise ProtocolError(f"tensor {key!r}: dtype {a.dtype} cannot be sent (supported: {', '.join(DTYPES)})")
        if a.ndim > MAX_DIMS:
            raise ProtocolError(f"tensor {key!r}: {a.ndim} dimensions; the limit is {MAX_DIMS}")
        data = np.ascontiguousarray(a, dtype=DTYPES[dtype])
        specs.append({"name": key, "dtype": dtype, "shape": list(a.shape)})
        blobs.append(memoryview(data).cast("B"))
    return specs, blobs


def blobs_to_arrays(specs: list[dict[str, Any]], blobs: Sequence[memoryview]) -> dict[str, np.ndarray]:
    """Turn checked tensor descriptions (:func:`tensor_specs`) and their blobs into new writable arrays."""
    return {s["name"]: np.frombuffer(b, dtype=DTYPES[s["dtype"]]).reshape(s["shape"]).copy()
            for s, b in zip(specs, blobs, strict=True)}


def file_specs(header: dict[str, Any], blobs: Sequence[memoryview]) -> list[dict[str, str]]:
    """Check ``header["files"]``: one ``{path, sha256}`` per blob, paths relative and unique.

    Returns:
        The list, each entry with ``path`` (relative, ``/``-separated, no ``.`` or ``..`` parts) and
        ``sha256`` (64 lowercase hex digits; the SHA-256 the sender claims for the blob).

    Raises:
        ProtocolError: a malformed entry, an unsafe or repeated path, or a count differing from the blobs'.
    """
    files = field(header, "files", list)
    if len(files) != len(blobs):
        raise ProtocolError(f"{header['type']!r} message: {len(files)} files but {len(blobs)} blobs")
    out, seen = [], set()
    for entry in files:
        if not isinstance(entry, dict):
            raise ProtocolError("a file description is not an object")
        path = name(entry.get("path"), "a file path")
        parts = path.split("/")
        if "\\" in path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ProtocolError(f"unsafe file path {path!r} (must be relative, '/'-separated, without '.' or '..')")
        if path in seen:
            raise ProtocolError(f"file {path!r} appears twice")
        seen.add(path)
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ProtocolError(f"file {path!r}: sha256 must be 64 lowercase hex digits")
        out.append({"path": path, "sha256": digest})
    return out


def error_info(header: dict[str, Any]) -> tuple[str, str]:
    """Check an ``error`` message's ``error`` object; returns ``(kind, message)``, the message cut to a limit.

    Raises:
        ProtocolError: ``error`` is not ``{"name": str, "message": str}``.
    """
    error = field(header, "error", dict)
    kind = name(error.get("name"), "an error name")
    message = error.get("message")
    if not isinstance(message, str):
        raise ProtocolError("an error message must be a string")
    return kind, message[:MAX_MESSAGE_CHARS]


def timing(header: dict[str, Any], repeat: int) -> tuple[str, list[float], list[float]]:
    """Check a ``timing`` reply to a request of ``repeat`` runs.

    Returns:
        ``(clock, times_ms, wall_ms)``: ``clock`` one of :data:`CLOCKS`, each list ``repeat``
        finite non-negative milliseconds.

    Raises:
        ProtocolError: an unknown clock, lists of another length, or non-finite or negative times.
    """
    clock = field(header, "clock", str)
    if clock not in CLOCKS:
        raise ProtocolError(f"'timing' message: unknown clock {clock[:40]!r} (expected one of {', '.join(CLOCKS)})")
    lists = []
    for key in ("times_ms", "wall_ms"):
        values = field(header, key, list)
        if len(values) != repeat or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in values):
            raise ProtocolError(f"'timing' message: {key!r} must be {repeat} finite times >= 0")
        lists.append([float(v) for v in values])
    return clock, lists[0], lists[1]


#: most kernel candidates in one ``measure`` request
MAX_CANDIDATES = 256
#: most bytes of one candidate's WGSL source
MAX_SOURCE_BYTES = 1 << 20
#: most output elements a ``measured`` reply samples per candidate
MAX_SAMPLE = 1 << 16
#: most dispatches in one timed pass, timed passes, and untimed passes of a ``measure`` request
MAX_BATCH = 1024
MAX_MEASURE_REPEAT = 100
MAX_MEASURE_WARMUP = 10


def measure_request(header: dict[str, Any], blobs: Sequence[memoryview]) -> tuple[list[dict[str, Any]], int]:
    """Check a ``measure`` request: float32 ``inputs`` (the first blobs), then one WGSL source blob
    per entry of ``candidates`` (``{"dispatch": [x, y, z]}``), ``output`` (``{"dtype": "float32",
    "elements": n}``), ``batch``, ``repeat``, ``warmup`` and ``sample``.

    Returns:
        ``(input specs, number of output elements sampled per candidate)``.

    Raises:
        ProtocolError: a field missing, of the wrong type or out of range, a source that is not
            UTF-8 or too long, or blob counts that do not add up.
    """
    candidates = field(header, "candidates", list)
    if not 1 <= len(candidates) <= MAX_CANDIDATES:
        raise ProtocolError(f"'measure' message: 1 to {MAX_CANDIDATES} candidates, got {len(candidates)}")
    n_inputs = len(blobs) - len(candidates)
    if n_inputs < 0:
        raise ProtocolError("'measure' message: fewer blobs than candidates")
    specs = tensor_specs(header, "inputs", blobs[:n_inputs])
    if any(s["dtype"] != "float32" for s in specs):
        raise ProtocolError("'measure' message: kernel inputs must be float32")
    for c in candidates:
        dispatch = c.get("dispatch") if isinstance(c, dict) else None
        if (not isinstance(dispatch, list) or len(dispatch) != 3
                or not all(type(d) is int and 1 <= d <= 65535 for d in dispatch)):
            raise ProtocolError("'measure' message: a candidate's dispatch must be 3 ints in [1, 65535]")
    for blob in blobs[n_inputs:]:
        if blob.nbytes > MAX_SOURCE_BYTES:
            raise ProtocolError(f"'measure' message: a source of {blob.nbytes} bytes; the limit is {MAX_SOURCE_BYTES}")
        try:
            bytes(blob).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("'measure' message: a source is not UTF-8") from None
    output = field(header, "output", dict)
    if output.get("dtype") != "float32":
        raise ProtocolError("'measure' message: the output must be float32")
    elements = integer(output, "elements", 1, 2**31 // 4)
    integer(header, "batch", 1, MAX_BATCH)
    integer(header, "repeat", 1, MAX_MEASURE_REPEAT)
    integer(header, "warmup", 0, MAX_MEASURE_WARMUP)
    sample = integer(header, "sample", 1, MAX_SAMPLE)
    return specs, min(sample, elements)


def _number_or_null(value: Any, low: float = -math.inf) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and value >= low)


def measured(header: dict[str, Any], blobs: Sequence[memoryview], candidates: int, sample: int) -> tuple[str, list]:
    """Check a ``measured`` reply to a ``measure`` request of ``candidates`` candidates.

    Returns:
        ``(clock, results)``: each result ``{"ms", "error", "total", "abs_total"}``, ``ms`` a finite
        number >= 0 or ``None`` (failed, with ``error`` a string), the sums finite or ``None`` (NaN).
        Blob ``i`` holds candidate ``i``'s ``sample`` float32 output elements, or nothing if it failed.

    Raises:
        ProtocolError: an unknown clock, a wrong number of results or blobs, or a malformed result.
    """
    clock = field(header, "clock", str)
    if clock not in CLOCKS:
        raise ProtocolError(f"'measured' message: unknown clock {clock[:40]!r}")
    results = field(header, "results", list)
    if len(results) != candidates or len(blobs) != candidates:
        raise ProtocolError(f"'measured' message: {len(results)} results and {len(blobs)} blobs for "
                            f"{candidates} candidates")
    for r, blob in zip(results, blobs, strict=True):
        if not isinstance(r, dict) or not _number_or_null(r.get("ms"), 0.0):
            raise ProtocolError("'measured' message: a result needs 'ms', a number >= 0 or null")
        error = r.get("error")
        if error is not None and not isinstance(error, str):
            raise ProtocolError("'measured' message: 'error' must be a string or null")
        if not all(_number_or_null(r.get(k)) for k in ("total", "abs_total")):
            raise ProtocolError("'measured' message: 'total' and 'abs_total' must be numbers or null")
        if r.get("ms") is None and error is None:
            raise ProtocolError("'measured' message: a failed candidate needs an 'error'")
        want = 0 if r.get("ms") is None else sample * 4
        if blob.nbytes != want:
            raise ProtocolError(f"'measured' message: a sample of {blob.nbytes} bytes; expected {want}")
    return clock, results
