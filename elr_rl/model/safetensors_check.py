"""Check a safetensors file before anything loads it: a truncated copy fails here with one clear line,
not deep inside a loader (or after Ray and the engines have started)."""

from __future__ import annotations

import json
from pathlib import Path

_MAX_HEADER = 100 << 20  # the format caps its JSON header at 100 MB


def check_safetensors(path: str | Path) -> None:
    """Raise ValueError unless `path` is a whole safetensors file: a readable header and every tensor's bytes."""
    p = Path(path)
    fix = "copy or save the checkpoint again"
    if not p.is_file():
        raise ValueError(f"{str(p)!r} does not exist; {fix}")
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{str(p)!r} is truncated or not a safetensors file ({size} bytes, no whole header); {fix}")
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ValueError(f"{str(p)!r} has an unreadable safetensors header; {fix}") from None
    if 8 + n + end != size:
        raise ValueError(f"{str(p)!r} is truncated: its header describes {8 + n + end} bytes, the file has {size}; {fix}")


def check_checkpoint_files(folder: str | Path) -> None:
    """Every *.safetensors file of a checkpoint folder is whole."""
    for p in sorted(Path(folder).glob("*.safetensors")):
        check_safetensors(p)


INDEX_FILE = "model.safetensors.index.json"


def checkpoint_weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files holding a checkpoint's weights: `model.safetensors`, or the shards a Hugging
    Face index names (`model.safetensors.index.json`, written by save_pretrained above its shard size:
    5 GB by default, so an 8 GB bf16 4B model comes in two). ValueError if neither is there."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{str(index)!r} is not a safetensors index (no weight_map)") from None
        if not names:
            raise ValueError(f"{str(index)!r} names no weight files")
        return [folder / n for n in names]
    raise ValueError(f"checkpoint {str(folder)!r} has no model.safetensors and no {INDEX_FILE}")


def load_checkpoint_weights(folder: str | Path) -> dict:
    """Every tensor of a checkpoint (single file or shards), each file checked whole first."""
    from safetensors.torch import load_file

    state: dict = {}
    for path in checkpoint_weight_files(folder):
        check_safetensors(path)
        part = load_file(str(path))
        twice = state.keys() & part.keys()
        if twice:
            raise ValueError(f"tensor {sorted(twice)[0]!r} is in more than one weight file of {str(folder)!r}")
        state.update(part)
    return state
