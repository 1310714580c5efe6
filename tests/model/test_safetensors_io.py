"""`pack_safetensors` writes what `safetensors.torch.save` writes, into a reusable buffer, and
`BytesOutOfBand` arrives as plain bytes on the other side of a pickle."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from elr_rl.model.safetensors_io import BytesOutOfBand, pack_safetensors


def _every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "z.bool": torch.rand(3, generator=g) > 0.5, "y.scalar": torch.tensor(2.5),
        "x.u8": torch.randint(0, 255, (7,), dtype=torch.uint8, generator=g),
        "w.i8": torch.randint(-100, 100, (3,), dtype=torch.int8, generator=g),
        "v.i16": torch.randint(-1000, 1000, (5,), dtype=torch.int16, generator=g),
        "u.f16": torch.randn(2, 3, generator=g).half(), "t.bf16": torch.randn(3, 1, 2, generator=g).bfloat16(),
        "s.i32": torch.randint(-10**6, 10**6, (4,), dtype=torch.int32, generator=g),
        "r.f32": torch.randn(5, 3, generator=g), "q.empty": torch.zeros(0, 3),
        "p.f64": torch.randn(3, generator=g).double(), "o.i64": torch.arange(5, dtype=torch.int64) - 2,
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            tensors[f"n.{name}"] = torch.randn(6, generator=g).to(getattr(torch, name))
    return tensors


def _header_and_data(blob: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"format": "pt", "step": "3", "run": "a"}])
def test_packed_bytes_are_what_safetensors_saves(metadata):
    tensors = _every_dtype()
    packed = pack_safetensors(tensors, metadata).tobytes()
    saved = save(tensors, metadata)
    if metadata is None or len(metadata) == 1:
        assert packed == saved
    else:  # safetensors writes metadata keys in its hash map's order, which changes from process to process
        assert _header_and_data(packed) == _header_and_data(saved)
        assert len(packed) == len(saved)


def test_strided_tensors_pack_as_their_values():
    base = torch.randn(6, 8)
    tensors = {"t": base.t(), "every_other": base[:, ::2], "bf": base.bfloat16()[1:4, 2:]}
    got = load(pack_safetensors(tensors).tobytes())
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)


def test_the_buffer_is_reused_and_never_overrun():
    a = {"w": torch.randn(64, 32).bfloat16(), "b": torch.randn(32).bfloat16()}
    first = pack_safetensors(a)
    again = pack_safetensors({n: t + 1 for n, t in a.items()}, out=first)
    assert again.ctypes.data == first.ctypes.data  # packed in place
    assert all(torch.equal(load(again.tobytes())[n], t + 1) for n, t in a.items())
    bigger = {"w": torch.randn(128, 32).bfloat16()}
    grown = pack_safetensors(bigger, out=again)  # too small: a new buffer, the old one untouched
    assert grown.ctypes.data != again.ctypes.data
    assert torch.equal(load(grown.tobytes())["w"], bigger["w"])
    assert all(torch.equal(load(again.tobytes())[n], t + 1) for n, t in a.items())
    read_only = np.zeros(first.size + 64, dtype=np.uint8)
    read_only.flags.writeable = False
    assert pack_safetensors(a, out=read_only).ctypes.data != read_only.ctypes.data


@pytest.mark.parametrize("bad, match", [
    ({"c": torch.zeros(2, dtype=torch.complex64)}, "no safetensors code"),
    ({"__metadata__": torch.zeros(2)}, "names must be strings"),
])
def test_what_safetensors_cannot_hold_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        pack_safetensors(bad)
    with pytest.raises(ValueError, match="strings"):
        pack_safetensors({"a": torch.zeros(1)}, {"step": 3})


@pytest.mark.parametrize("protocol", [4, 5])
def test_bytes_out_of_band_unpickle_as_bytes(protocol):
    buffer = pack_safetensors({"w": torch.randn(4, 4)})
    buffers: list[pickle.PickleBuffer] = []
    callback = buffers.append if protocol >= 5 else None
    blob = pickle.dumps(BytesOutOfBand(buffer), protocol=protocol, buffer_callback=callback)
    if protocol >= 5:
        assert len(buffers) == 1 and len(blob) < 200  # the data went out of band, not into the pickle
    got = pickle.loads(blob, buffers=buffers)
    assert type(got) is bytes and got == buffer.tobytes()
