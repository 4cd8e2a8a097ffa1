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


def _f16_offset(d: np.ndarray, times: int, type_name: str) -> np.ndarray:
    """The f16 block offsets ``d * times`` of a block type without its own offset (Q4_0: -8, Q8_0: -128).

    Raises:
        ModelFormatError: a finite scale whose offset overflows f16 (the packed layout holds f16 offsets).
    """
    offset = d.astype(np.float32) * times
    if not np.all(np.abs(offset) <= 65504, where=np.isfinite(d)):
        raise ModelFormatError(f"{type_name} tensor has a scale too large for an f16 offset ({np.nanmax(np.abs(d))})")
    return offset.astype(np.float16)


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
            offset = _f16_offset(d, -8, type_name)  # (exact: a power of two times an f16, unless it overflows)
        else:
            offset = blocks[:, :, 2:4].copy().view(np.float16)[..., 0]
        return PackedTensor(_pack(q, 4), _halves(d, offset), 4, n, k, type_name)
    if type_name == "Q8_0":
        blocks = raw.reshape(n, nb, 34)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0]
        q = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).reshape(n, k)
        return PackedTensor(_pack(q, 8), _halves(d, _f16_offset(d, -128, type_name)), 8, n, k, type_name)
    raise ModelFormatError(f"GGUF quantization type {type_name} is not supported (Kiln reads "
                           f"{', '.join(PACKED_TYPES)}, F32 and F16)")


def _field(fields: dict, key: str, default: Any = None, required: bool = True) -> Any:
    if key not in fields:
        if required and default is None:
            raise ModelFormatError(f"GGUF metadata has no {key}")
        return default
    return _contents(fields[key], key)


def _contents(field: Any, key: str) -> Any:
    """A metadata field's value (ModelFormatError where gguf cannot decode it: strings that are not UTF-8)."""
    try:
        return field.contents()
    except (UnicodeDecodeError, ValueError, IndexError, TypeError) as e:
        raise ModelFormatError(f"GGUF metadata {key} is unreadable ({type(e).__name__}: {e})") from None


#: bytes of GGUF's scalar value types (GGUFValueType: UINT8 .. FLOAT64)
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def check_layout(path: str) -> None:
    """Walk the GGUF header (the metadata and tensor-info sections, GGUF spec v2/v3) checking every count and length
    against the bytes left in the file, before gguf's reader parses it: the reader reads past the end as empty
    arrays, so a damaged array count of 2^63 would have it loop and allocate without bound. Costs one pass over the
    header (a 49,152-token vocabulary: tens of milliseconds).

    Raises:
        ModelFormatError: a count, length or value type the file cannot hold, naming the byte offset.
    """
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        end, at = len(m), 4

        def fail(what: str) -> None:
            raise ModelFormatError(f"{path}: damaged GGUF header at byte {at}: {what}")

        def u(n: int) -> int:
            nonlocal at
            if at + n > end:
                fail("the file ends inside it")
            v = int.from_bytes(m[at:at + n], "little")
            at += n
            return v

        def skip(n: int) -> None:
            nonlocal at
            if n > end - at:
                fail(f"{n} bytes announced, {end - at} left")
            at += n

        def value(kind: int, depth: int = 0) -> None:
            if kind in _SCALAR_BYTES:
                skip(_SCALAR_BYTES[kind])
            elif kind == _STRING:
                skip(u(8))
            elif kind == _ARRAY and depth < 4:
                item, count = u(4), u(8)
                if item in _SCALAR_BYTES:
                    skip(count * _SCALAR_BYTES[item])
                    return
                if count * (8 if item == _STRING else 12) > end - at:  # (each at least a length or a header)
                    fail(f"an array of {count} values in {end - at} bytes")
                for _ in range(count):
                    value(item, depth + 1)
            else:
                fail(f"unknown value type {kind}")

        version = u(4)
        if version not in (2, 3):
            fail(f"GGUF version {version} (Kiln reads 2 and 3)")
        tensors, kvs = u(8), u(8)
        if kvs * 13 > end - at or tensors * 28 > end - at:
            fail(f"{kvs} metadata entries and {tensors} tensors in {end - at} bytes")
        for _ in range(kvs):
            skip(u(8))  # the key
            value(u(4))
        for _ in range(tensors):
            skip(u(8))  # the name
            dims = u(4)
            if dims > 8:
                fail(f"a tensor of {dims} dims")
            skip(8 * dims + 4 + 8)  # dims, type, offset


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
    check_layout(path)
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
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ModelFormatError(f"{path}: GGUF architecture {arch!r} is not supported (Kiln builds "
                               f"{', '.join(ARCHITECTURES)})")
    def count(key: str, default: int | None = None) -> int:
        v = _field(fields, key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_DIM:
            raise ModelFormatError(f"{path}: GGUF metadata {key} is {v!r}, not an integer in 1..{MAX_DIM}")
        return int(v)

    def number(key: str, default: float | None = None) -> float:
        v = _field(fields, key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not np.isfinite(v):
            raise ModelFormatError(f"{path}: GGUF metadata {key} is {v!r}, not a finite number")
        return float(v)

    width = count(f"{arch}.embedding_length")
    heads = count(f"{arch}.attention.head_count")
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
        architecture=arch, layers=count(f"{arch}.block_count"), width=width,
        ffn=count(f"{arch}.feed_forward_length"), heads=heads,
        kv_heads=count(f"{arch}.attention.head_count_kv", heads),
        head_dim=count(f"{arch}.rope.dimension_count", max(width // heads, 1)), vocab=int(vocab),
        context=count(f"{arch}.context_length"), eps=number(f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_base=number(f"{arch}.rope.freq_base", 10000.0),
        name=str(_field(fields, "general.name", "", required=False)))
    _check_config(path, config, tensors)
    metadata = {k: _contents(fields[k], k) for k in fields if k.startswith(("tokenizer.", "general."))}
    return GGUFModel(config, tensors, metadata)


#: the largest hyper-parameter Kiln accepts for a count or a size (layers, width, heads, context): int32's range
MAX_DIM = 2**31 - 1


def _shape_of(t: np.ndarray | PackedTensor) -> tuple[int, ...]:
    return (t.n, t.k) if isinstance(t, PackedTensor) else tuple(t.shape)


def _check_config(path: str, c: Config, tensors: dict) -> None:
    """The hyper-parameters must be consistent with each other and with the tensors the decoder reads (every
    layer's, of the shapes they imply): what the file says is checked before anything is sized by it.

    Raises:
        ModelFormatError: naming the first field or tensor that does not fit.
    """
    def fail(what: str) -> None:
        raise ModelFormatError(f"{path}: {what} (a damaged or unsupported GGUF file)")

    # (counts were read in 1..MAX_DIM and numbers finite, by read_gguf)
    if c.eps < 0 or c.rope_base <= 0:
        fail(f"RMSNorm epsilon {c.eps} is negative or rope base {c.rope_base} is not positive")
    if c.heads % c.kv_heads or c.head_dim % 2:
        fail(f"{c.heads} query heads do not share {c.kv_heads} KV heads evenly, or head size {c.head_dim} is odd")
    d, q, kv, f = c.width, c.heads * c.head_dim, c.kv_heads * c.head_dim, c.ffn
    want = {"token_embd.weight": (c.vocab, d), "output_norm.weight": (d,)}
    if "output.weight" in tensors:
        want["output.weight"] = (c.vocab, d)
    for layer in range(c.layers):
        p = f"blk.{layer}."
        want |= {p + "attn_norm.weight": (d,), p + "attn_q.weight": (q, d), p + "attn_k.weight": (kv, d),
                 p + "attn_v.weight": (kv, d), p + "attn_output.weight": (d, q), p + "ffn_norm.weight": (d,),
                 p + "ffn_gate.weight": (f, d), p + "ffn_up.weight": (f, d), p + "ffn_down.weight": (d, f)}
        want |= {p + f"attn_{x}.bias": (n,) for x, n in (("q", q), ("k", kv), ("v", kv)) if p + f"attn_{x}.bias" in tensors}
        if len(want) > len(tensors) + 2:  # (a block count beyond the tensors fails at its first layer)
            break
    for name, shape in want.items():
        if name not in tensors:
            fail(f"no tensor {name}")
        if _shape_of(tensors[name]) != shape:
            fail(f"tensor {name} has shape {list(_shape_of(tensors[name]))}, the hyper-parameters need {list(shape)}")
