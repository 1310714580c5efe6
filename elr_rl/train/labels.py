"""Next-token labels of packed sequences, shared by the packer (`train.data`) and the loop-wise
targets (`train.loopwise`): both import this module, it imports neither."""

from __future__ import annotations

IGNORE_INDEX = -100
"""A label the loss skips (PyTorch cross entropy's default ignore_index)."""


def labels_from_packed(ids: list[int], segs: list[int], mask: list[bool]) -> list[int]:
    """labels[t] = ids[t+1] when t+1 is in t's segment and is a target, else IGNORE_INDEX."""
    T = len(ids)
    return [
        ids[t + 1] if t + 1 < T and segs[t + 1] == segs[t] and mask[t + 1] else IGNORE_INDEX
        for t in range(T)
    ]
