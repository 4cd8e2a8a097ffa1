"""A reader of CTranslate2 model files (``model.bin``): the variables of a converted model, as numpy arrays.

The layout is CTranslate2's own serializer (``ctranslate2/specs/model_spec.py``, ``ModelSpec._serialize``,
binary version 6; versions 3 to 6 read the same way here), all little-endian:

- ``uint32`` binary version; a string: the spec's name (``WhisperSpec``, ``TransformerSpec``, ...); ``uint32`` its
  revision; ``uint32`` the number of variables, then per variable: its name (a string), ``uint8`` rank, ``uint32``
  per dim, ``uint8`` dtype id (the ``DataType`` enum of ``include/ctranslate2/types.h``: float32, int8, int16,
  int32, float16, bfloat16), ``uint32`` byte count, the bytes (row-major);
- ``uint32`` the number of aliases, then per alias two strings: the alias and the variable it names (tied weights:
  Whisper's ``decoder/projection/weight`` is ``decoder/embeddings/weight``).

A string is a ``uint16`` length (the NUL included), the UTF-8 bytes and a NUL. Scalars (``num_heads``,
``activation``, ``pre_norm``) are rank-0 variables. A model quantized to int8 (``ct2-transformers-converter
--quantization int8``) stores each such weight with a ``weight_scale`` (per output row): the reader gives the
dequantized float32 weight ``W_q / scale`` (CTranslate2's own dequantization); int8 with float16 (``int8_float16``)
reads the same way.

No well-kept library reads the format outside CTranslate2 itself, whose Python API exposes no variables; this
reader is checked against CTranslate2 running the same file (tests/test_whisper.py).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kiln.errors import ModelFormatError

#: the DataType enum of include/ctranslate2/types.h, in order
_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")


@dataclass
class CT2Model:
    """A CTranslate2 model file's contents.

    Attributes:
        spec: the model spec's name (``WhisperSpec``).
        revision: the spec's revision (Whisper: 3).
        version: the binary format version (3 to 6).
        variables: name -> array (float16 weights stay float16; quantized weights come dequantized, float32;
            aliases resolve to their variable's array).
    """

    spec: str
    revision: int
    version: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)

    def scalar(self, name: str, default: int | None = None) -> int:
        """A one-element integer variable (``encoder/num_heads``), or ``default`` when absent.

        Raises:
            ModelFormatError: absent with no default, or not one integer.
        """
        if name not in self.variables:
            if default is None:
                raise ModelFormatError(f"the CTranslate2 {self.spec} file has no {name}")
            return default
        value = np.asarray(self.variables[name])
        if value.size != 1 or value.dtype.kind not in "iu":
            raise ModelFormatError(f"the CTranslate2 {self.spec} file's {name} is not one integer "
                                   f"({value.dtype}, {list(value.shape)})")
        return int(value.reshape(-1)[0])


def read_ctranslate2(path: str | os.PathLike) -> CT2Model:
    """Read a CTranslate2 ``model.bin`` (or the model folder holding it).

    Args:
        path: the file, or its folder (``config.json`` beside it is read by the model's frontend, not here).

    Returns:
        The variables by name, :class:`CT2Model`.

    Raises:
        ModelFormatError: not a CTranslate2 model file (an unknown binary version, a truncated file, an unknown
            dtype id, a byte count that does not match the shape).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "model.bin"
    try:
        data = memoryview(p.read_bytes())
    except OSError as e:
        raise ModelFormatError(f"cannot read {p}: {e.strerror or e}") from None
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ModelFormatError(f"{p} is truncated (at byte {pos}): not a whole CTranslate2 model file")
        value = struct.unpack_from(fmt, data, pos)
        pos += size
        return value[0]

    def text() -> str:
        nonlocal pos
        n = take("<H")
        if n < 1 or pos + n > len(data):
            raise ModelFormatError(f"{p}: a bad string at byte {pos}: not a CTranslate2 model file")
        raw = bytes(data[pos:pos + n - 1])
        pos += n
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"{p}: a string at byte {pos - n} is not UTF-8: not a CTranslate2 model "
                                   "file") from None
        if any(c < " " for c in value):  # (names and the spec: never control characters, which messages would carry)
            raise ModelFormatError(f"{p}: a string at byte {pos - n} holds control characters: not a CTranslate2 "
                                   "model file")
        return value

    if len(data) < 4:
        raise ModelFormatError(f"{p} is {len(data)} bytes: not a CTranslate2 model file")
    version = take("<I")
    if not 3 <= version <= 6:
        raise ModelFormatError(f"{p}: binary version {version} is not a CTranslate2 model file Kiln reads "
                               "(versions 3 to 6)")
    spec = text()
    revision = take("<I")
    count = take("<I")
    raw: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = text()
        rank = take("<B")
        shape = tuple(take("<I") for _ in range(rank))
        type_id = take("<B")
        nbytes = take("<I")
        if type_id >= len(_DTYPES):
            raise ModelFormatError(f"{p}: variable {name} has an unknown dtype id {type_id}")
        dtype = _DTYPES[type_id]
        item = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        if nbytes != item * math.prod(shape) or pos + nbytes > len(data):  # (Python ints: no overflow)
            raise ModelFormatError(f"{p}: variable {name} {list(shape)} {dtype} has {nbytes} bytes "
                                   f"(or the file ends first)")
        buf = data[pos:pos + nbytes]
        pos += nbytes
        if dtype == "bfloat16":
            arr = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, np.dtype(dtype).newbyteorder("<"))
        raw[name] = arr.reshape(shape)
    aliases = take("<I") if pos < len(data) else 0
    for _ in range(aliases):
        alias, target = text(), text()
        if target not in raw:
            raise ModelFormatError(f"{p}: alias {alias} names no variable ({target})")
        raw[alias] = raw[target]
    return CT2Model(spec, revision, version, _dequantize(raw))


def _dequantize(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """int8 (or int16) weights with a ``weight_scale`` -> float32 ``W_q / scale`` (per output row, or one scale)."""
    out = dict(raw)
    for name, scale in raw.items():
        if not name.endswith("/weight_scale"):
            continue
        wname = name[: -len("_scale")]
        w = raw.get(wname)
        if w is None or w.dtype.kind != "i":
            continue
        s = np.asarray(scale, np.float32)
        if s.size not in (1, w.shape[0] if w.ndim else 1):
            raise ModelFormatError(f"{name}: {s.size} scales for a weight of {list(w.shape)} (one per row, or one)")
        s = s.reshape((-1,) + (1,) * (w.ndim - 1)) if s.size > 1 else s.reshape(())
        with np.errstate(divide="ignore", invalid="ignore"):
            out[wname] = (w.astype(np.float32) / s).astype(np.float32)
        del out[name]
    return out
