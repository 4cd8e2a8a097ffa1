"""Read a GGUF file (llama.cpp's model format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) through
the ``gguf`` library, llama.cpp's own reader: its hyper-parameters, its tensors in Kiln's packed layout
(:mod:`kiln.ir.ops_quant`), its tokenizer and chat template.

Block formats (ggml-common.h), each a row of ``K`` weights cut into blocks of 32:

- ``Q4_0``: ``d`` (f16), 16 bytes of nibbles; weight ``j`` is the low nibble of byte ``j``, weight ``j + 16``
  its high nibble; value ``d * (q - 8)``.
- ``Q4_1``: ``d``, ``m`` (f16), 16 bytes of nibbles as Q4_0; value ``d * q + m``.
- ``Q8_0``: ``d`` (f16), 32 int8; value ``d * q``.

Each becomes packed words in element order plus one word a block with the block's scale and offset as
two halves (``f16x2``), so the package holds 5 bits a weight for Q4_0/Q4_1 and 9 for Q8_0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModelFormatError

#: architectures of the Llama family this frontend builds (general.architecture)
ARCHITECTURES = ("llama", "qwen2")
#: block formats kept packed; F32 and F16 tensors are read as float32
PACKED_TYPES = ("Q4_0", "Q4_1", "Q8_0")


@dataclass
class Config:
    """A Llama-family decoder's hyper-parameters, from the GGUF metadata (``<arch>.*`` keys)."""

    architecture: str
    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    eps: float
    rope_base: float
    name: str = ""


@dataclass
class PackedTensor:
    """A block-quantized ``[N, K]`` weight in Kiln's packed layout (:mod:`kiln.ir.ops_quant`, ``f16x2`` scales)."""

    packed: np.ndarray  # int32 [N, K * bits / 32]
    scales: np.ndarray  # int32 [N, K / 32]: scale (low half) and offset (high half) as f16
    bits: int
    n: int
    k: int
    source_type: str

    @property
    def attrs(self) -> dict[str, Any]:
        """The attributes of ``MatMulNBits`` / ``GatherBlockQuantized`` over this weight."""
        return {"K": self.k, "N": self.n, "bits": self.bits, "block_size": 32, "scale_format": "f16x2"}


@dataclass
class GGUFModel:
    """What Kiln takes from a GGUF file."""

    config: Config
    tensors: dict[str, np.ndarray | PackedTensor]
    metadata: dict[str, Any] = field(default_factory=dict)


def _halves(scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """int32 words holding f16 ``scale`` (low half) and f16 ``offset`` (high half)."""
    lo = np.ascontiguousarray(scale, np.float16).view(np.uint16).astype(np.uint32)
    hi = np.ascontiguousarray(offset, np.float16).view(np.uint16).astype(np.uint32)
    return (lo | (hi << 16)).view(np.int32)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-wide values ``q [N, K]`` packed into int32 words, element ``k`` at bit ``(k * bits) % 32``."""
    n, k = q.shape
    per = 32 // bits
    q = q.astype(np.uint32).reshape(n, k // per, per)
    words = np.zeros((n, k // per), np.uint32)
    for i in range(per):
        words |= q[:, :, i] << np.uint32(i * bits)
    return words.view(np.int32)


def pack_blocks(raw: np.ndarray, type_name: str, n: int, k: int) -> PackedTensor:
    """A GGUF tensor's raw block bytes (``[N, K / 32 * block_bytes]`` uint8) in Kiln's packed layout.

    Raises:
        ModelFormatError: a block type other than :data:`PACKED_TYPES`.
    """
    nb = k // 32
    if type_name in ("Q4_0", "Q4_1"):
        head = 2 if type_name == "Q4_0" else 4
        blocks = raw.reshape(n, nb, head + 16)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0]
        qs = blocks[:, :, head:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(n, k)  # weight j: low nibble j, j + 16: high nibble
        if type_name == "Q4_0":
            offset = (d.astype(np.float32) * -8).astype(np.float16)  # exact: a power of two times an f16
        else:
            offset = blocks[:, :, 2:4].copy().view(np.float16)[..., 0]
        return PackedTensor(_pack(q, 4), _halves(d, offset), 4, n, k, type_name)
    if type_name == "Q8_0":
        blocks = raw.reshape(n, nb, 34)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0]
        q = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).reshape(n, k)
        offset = d.astype(np.float32) * -128
        if np.abs(offset).max(initial=0) > 65504:
            raise ModelFormatError(f"Q8_0 tensor has a scale too large for an f16 offset ({np.abs(d).max()})")
        return PackedTensor(_pack(q, 8), _halves(d, offset.astype(np.float16)), 8, n, k, type_name)
    raise ModelFormatError(f"GGUF quantization type {type_name} is not supported (Kiln reads "
                           f"{', '.join(PACKED_TYPES)}, F32 and F16)")


def _field(fields: dict, key: str, default: Any = None, required: bool = True) -> Any:
    if key not in fields:
        if required and default is None:
            raise ModelFormatError(f"GGUF metadata has no {key}")
        return default
    return fields[key].contents()


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Read a Llama-family GGUF file.

    Returns:
        Its :class:`Config`, its tensors by GGUF name (float32 arrays in GGUF's ``[rows, cols]`` order, or
        :class:`PackedTensor`) and its metadata fields (tokenizer, chat template).

    Raises:
        ModelFormatError: not a GGUF file, a truncated one, an architecture outside :data:`ARCHITECTURES`,
            a tensor type Kiln does not read, or missing hyper-parameters.
    """
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise KilnError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelFormatError(f"{path}: not a GGUF file (no GGUF magic)")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001  (the reader raises ValueError, IndexError, struct errors on damage)
        raise ModelFormatError(f"{path}: unreadable GGUF file (truncated or damaged: {type(e).__name__}: {e})") \
            from None
    size = os.path.getsize(path)
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ModelFormatError(f"{path}: truncated GGUF file ({size} bytes, its tensors need {end})")
    fields = reader.fields
    arch = _field(fields, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFormatError(f"{path}: GGUF architecture {arch!r} is not supported (Kiln builds "
                               f"{', '.join(ARCHITECTURES)})")
    width = int(_field(fields, f"{arch}.embedding_length"))
    heads = int(_field(fields, f"{arch}.attention.head_count"))
    tensors: dict[str, np.ndarray | PackedTensor] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind in ("F32", "F16"):
            tensors[t.name] = np.array(t.data, np.float32).reshape([int(d) for d in reversed(t.shape)])
        elif kind in PACKED_TYPES:
            k, n = (int(d) for d in t.shape)
            tensors[t.name] = pack_blocks(np.asarray(t.data), kind, n, k)
        else:
            raise ModelFormatError(f"{path}: tensor {t.name} has quantization type {kind}, which Kiln does not "
                                   f"read ({', '.join(PACKED_TYPES)}, F32 and F16)")
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFormatError(f"{path}: no token_embd.weight tensor")
    vocab = embd.n if isinstance(embd, PackedTensor) else embd.shape[0]
    config = Config(
        architecture=arch, layers=int(_field(fields, f"{arch}.block_count")), width=width,
        ffn=int(_field(fields, f"{arch}.feed_forward_length")), heads=heads,
        kv_heads=int(_field(fields, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(fields, f"{arch}.rope.dimension_count", width // heads)), vocab=int(vocab),
        context=int(_field(fields, f"{arch}.context_length")),
        eps=float(_field(fields, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_base=float(_field(fields, f"{arch}.rope.freq_base", 10000.0)),
        name=str(_field(fields, "general.name", "", required=False)))
    metadata = {k: fields[k].contents() for k in fields if k.startswith(("tokenizer.", "general."))}
    return GGUFModel(config, tensors, metadata)
