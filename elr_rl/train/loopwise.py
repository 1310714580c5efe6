"""Options that teach depth to small models (off by default; `TrainConfig.loop_aux`, `loops.difficulty_aware`).

Loop-wise auxiliary loss. One forward at the microbatch's k reads out logits after
every loop (`LoopedForCausalLM(..., loop_readouts=True)`); with readouts z_1..z_k,

    loss = CE(z_k, y) + w * mean_{i<k} CE(z_i, y_i)

where y are the microbatch's labels and y_i loop i's targets: y itself
(`targets=final`) or, for documents with per-step targets, the answer after
min(i, D) of their D serial steps (`targets=steps`, the rows `loop_labels[:, i-1]`).

Difficulty-aware loop sampling. A microbatch runs at k = max(k_drawn, min(K, D_max)),
D_max the most serial steps any of its documents needs: no instance is trained at a
depth too shallow to solve it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from elr_rl.train.labels import IGNORE_INDEX, labels_from_packed


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # no target: zero loss, graph kept for DeepSpeed
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def loop_aux_loss(readouts: list[torch.Tensor], batch: dict, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, main): main = CE(z_k, labels); total = main + weight * mean_{i<k} CE(z_i, loop i's labels).

    `readouts[i-1]` are loop i's logits [B, T, V]; loop i's labels are `batch["loop_labels"][:, i-1]`
    ([B, K, T], per-step targets) when present, else `batch["labels"]`.
    """
    labels = batch["labels"]
    main = _ce(readouts[-1], labels)
    if len(readouts) == 1 or weight == 0:
        return main, main
    rows = batch.get("loop_labels")
    aux = [_ce(z, rows[:, i] if rows is not None else labels) for i, z in enumerate(readouts[:-1])]
    return main + weight * torch.stack(aux).mean(), main


def difficulty_aware_k(k_drawn: int, steps_needed: int, K: int) -> int:
    """k = max(k_drawn, min(K, steps_needed)): at least the serial steps the hardest document needs."""
    return max(int(k_drawn), min(int(K), int(steps_needed)))


def step_of_loop(i: int, n_steps: int) -> int:
    """Loop i (1-based) targets the answer after min(i, D) steps: one step per loop, then the answer."""
    return min(i, n_steps)


def loop_target_rows(doc, ids: list[int], tokenize: Callable[[object], tuple[list[int], list[bool]]],
                     K: int) -> list[list[int]] | None:
    """Per-loop target ids aligned with `ids` (row i-1: the document answered after min(i, D) steps).

    `doc.step_responses` holds the response after each of the D steps (the last is the response itself);
    each variant is tokenised like the document. None when the document has no per-step targets or a
    variant does not tokenise to the same length (then every loop keeps the document's own targets).
    """
    steps = tuple(getattr(doc, "step_responses", ()) or ())
    if not steps:
        return None
    variants = [tokenize(replace(doc, response=r))[0] for r in steps]
    if any(len(v) != len(ids) for v in variants):
        return None
    return [variants[step_of_loop(i, len(steps)) - 1] for i in range(1, K + 1)]


def document_extras(doc, ids: list[int], tokenize: Callable[[object], tuple[list[int], list[bool]]],
                    loop_targets: int, with_steps: bool) -> list[list[int]]:
    """Per-token lists packed alongside a document's ids: K loop target rows (its own ids when it has no
    per-step targets), then its serial steps repeated on every token."""
    out: list[list[int]] = []
    if loop_targets:
        out += loop_target_rows(doc, ids, tokenize, loop_targets) or [list(ids)] * loop_targets
    if with_steps:
        out.append([int(getattr(doc, "steps", 0))] * len(ids))
    return out


def packed_extras(extras: list[list[int]], segs: list[int], mask: list[bool], loop_targets: int, with_steps: bool,
                  pad_id: int) -> dict[str, list]:
    """A packed sequence's `loop_labels` [K, T] (next-token targets of each row, as labels are built)
    and `steps` (the most serial steps any of its documents needs)."""
    T = len(segs)
    out: dict[str, list] = {}
    if loop_targets:
        rows = [x + [pad_id] * (T - len(x)) for x in extras[:loop_targets]]
        out["loop_labels"] = [labels_from_packed(r, segs, mask) for r in rows]
    if with_steps:
        out["steps"] = max(extras[-1], default=0)
    return out
