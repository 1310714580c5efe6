"""A state dict as the bytes of a safetensors file, packed into a buffer that can be reused.

`safetensors.torch.save` took about 95 ms for a 47M-parameter (94 MB) bf16 state dict on one thread, and over
200 ms inside a busy learner rank: most of it is the kernel handing out and zeroing the fresh pages of a new
94 MB result each call. Packing into the same buffer every step takes one copy per tensor (about 8 ms there),
and writes the same bytes. The RL learner publishes its weights this way after every step.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
import warnings
from collections.abc import Mapping

import numpy as np
import torch

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
# safetensors orders tensors by this dtype order (its enum), widest first, then by name
_ORDER = {code: i for i, code in enumerate(
    ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "F16", "BF16", "I32", "F32", "F64", "I64"))}


def pack_safetensors(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None,
                     out: np.ndarray | None = None) -> np.ndarray:
    """The bytes of a safetensors file holding `tensors` (any device, any strides) and string `metadata`, as a
    uint8 array: the front of `out` when it is a uint8 array large enough (reused, so valid until the next
    call), else a new one. Byte for byte what `safetensors.torch.save` writes for contiguous tensors (with two or
    more metadata keys, up to their order: these are in the given order, safetensors' in its hash map's).

    Tensors are laid out as safetensors lays them out (widest dtype first, then by name), so every tensor
    starts aligned to its element size and is copied straight into place.
    """
    if sys.byteorder != "little":
        raise RuntimeError("safetensors stores little-endian data; this packer copies native bytes")
    entries = []
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor name {name!r}: names must be strings other than '__metadata__'")
        if t.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors code; cast it to one of "
                             f"{sorted(str(d) for d in _DTYPES)}")
        entries.append((name, t.detach()))
    entries.sort(key=lambda e: (-_ORDER[_DTYPES[e[1].dtype]], e[0]))
    header: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("safetensors metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, t in entries:
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    start = 8 + len(head)
    total = start + offset
    if out is not None and out.dtype == np.uint8 and out.ndim == 1 and out.flags.writeable and out.size >= total:
        buf = out[:total]
    else:
        buf = np.empty(total, dtype=np.uint8)
    buf[:8] = np.frombuffer(struct.pack("<Q", len(head)), dtype=np.uint8)
    buf[8:start] = np.frombuffer(head, dtype=np.uint8)
    flat = torch.from_numpy(buf)
    for name, t in entries:
        begin, end = header[name]["data_offsets"]
        if end > begin:
            flat[start + begin:start + end].view(t.dtype).view(t.shape).copy_(t)
    return buf


class BytesOutOfBand:
    """A uint8 buffer that unpickles as `bytes`, handed over out of band: `ray.put` copies it once into the
    object store (no in-band bytes object is built in the sender, whose fresh pages cost most of a copy),
    and whoever gets it receives plain `bytes` (for instance the safetensors file `pack_safetensors` built)."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer

    def __reduce_ex__(self, protocol: int):
        if protocol >= 5:
            return bytes, (pickle.PickleBuffer(self.buffer),)
        return bytes, (self.buffer.tobytes(),)


_CODES = {code: dtype for dtype, code in _DTYPES.items()}


def safetensors_views(data: bytes | bytearray | memoryview | np.ndarray) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes as views into them (no copy; the caller keeps `data` alive
    and does not write through the views). ValueError, naming what is wrong, for a truncated or malformed
    file."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise ValueError(f"not a safetensors file: {len(view)} bytes, no header length")
    n = struct.unpack("<Q", view[:8])[0]
    if n < 2 or 8 + n > len(view):
        raise ValueError(f"not a whole safetensors file: a {n}-byte header in {len(view)} bytes")
    try:
        header = json.loads(bytes(view[8:8 + n]))
    except ValueError:
        raise ValueError("unreadable safetensors header (not JSON)") from None
    start, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = _CODES[info["dtype"]], [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"safetensors header entry {name!r} is malformed or has an unknown dtype: {info!r}") from None
        size = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        if begin < 0 or end - begin != size or start + end > len(view):
            raise ValueError(f"tensor {name!r}: bytes [{begin}, {end}) do not hold shape {shape} of {info['dtype']} "
                             f"within the {len(view) - start} data bytes (truncated?)")
        with warnings.catch_warnings():  # read-only buffers: torch warns that writes would be undefined
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(view, dtype=torch.uint8, count=size, offset=start + begin) if size else \
                torch.empty(0, dtype=torch.uint8)
        out[name] = flat.view(dtype).view(shape)
    return out
