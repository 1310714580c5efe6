"""Options that teach depth to small models (off by default; `TrainConfig.loop_aux`, `loops.difficulty_aware`).

Loop-wise auxiliary loss. One forward at the microbatch's k reads out logits after
every loop (`LoopedForCausalLM(..., loop_readouts=True)`); with readouts z_1..z_k,

    loss = CE(z_k, y) + w * mean_{i<k} CE(z_i, y_i)

where y are the microbatch's labels and y_i loop i's targets: y itself
(`targets=final`) or, for documents with per-step targets, the answer after
min(i, D) of their D serial steps (`targets=steps`, the rows `loop_labels[:, i-1]`).

Dense targets (`targets=dense`, SFT): every loop is asked only what it can know. A ladder
document records (end, depth, value) for the places where its prompt lays out the chain
(the s-th move, the s-th operator, a binding line); loop i's readout at the token
holding the first `end` prompt characters targets `value` once i >= depth, and the
response (the answer, D steps) once i >= D; nothing is asked of shallower loops. The term
then covers every loop, the last included (its prompt positions are not in y):

    loss = CE(z_k, y) + w * mean_{i<=k} CE(z_i, y_i)

Chain targets (`targets=chain`, SFT): dense targets plus, where a ladder task records them,
partial ones (end, loop, value): below a dense target's depth, loop i at that token targets
what applying the chain's rule i times gives there (the automaton's last i + 1 moves composed
into one map, the variable a binding line reaches after i look-ups). Every link of the chain
then has a target at every loop, so the state one loop hands to the next has one meaning at
every depth (as in the pointer-doubling pilot, where per-loop targets at every node made
depth pay).

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


DENSE_MARK = -1000
"""Dense rows carry a prompt-position target v as DENSE_MARK - v (ids are >= 0, IGNORE_INDEX is -100)."""


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # no target: zero loss, graph kept for DeepSpeed
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def loop_aux_loss(readouts: list[torch.Tensor], batch: dict, weight: float,
                  dense: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, main): main = CE(z_k, labels); total = main + weight * mean_{i<k} CE(z_i, loop i's labels)
    (mean over i <= k when `dense`: the last loop's dense targets are not in `labels`).

    `readouts[i-1]` are loop i's logits [B, T, V]; loop i's labels are `batch["loop_labels"][:, i-1]`
    ([B, K, T], per-step or dense targets) when present, else `batch["labels"]`.
    """
    labels = batch["labels"]
    main = _ce(readouts[-1], labels)
    rows = batch.get("loop_labels")
    dense = dense and rows is not None
    if (len(readouts) == 1 and not dense) or weight == 0:
        return main, main
    looped = readouts if dense else readouts[:-1]
    aux = [_ce(z, rows[:, i] if rows is not None else labels) for i, z in enumerate(looped)]
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


def prompt_positions(codec, doc, ends: list[int]) -> list[int] | None:
    """The token of the rendered prompt holding the first `end` characters of `doc.prompt`, for each end
    (the first token that has seen them all: the one ending there, or the one merged across the boundary).
    None when the chat template does not render the prompt verbatim, or when the prompt holds control-token
    text (the codec keeps it as text, so prefixes of the rendering do not tokenise as the prompt does)."""
    head = codec.render_prompt(doc.prompt, doc.system)
    at = head.rfind(doc.prompt)
    if at < 0:
        return None
    full = codec.encode_text(head)
    if full != codec.prompt_ids(doc.prompt, doc.system):
        return None
    out = []
    for end in ends:
        pre = codec.encode_text(head[:at + end])
        c = next((i for i, (a, b) in enumerate(zip(pre, full)) if a != b), min(len(pre), len(full)))
        out.append(c - 1 if c == len(pre) else c)
    return out


def dense_target_rows(doc, ids: list[int], codec, K: int, partial: bool = False) -> list[list[int]] | None:
    """K rows aligned with `ids`, in the packer's id-row form (a row's entry t+1 is position t's target).

    Loop i keeps the response only once i >= D (else IGNORE_INDEX) and gets each dense target (end, depth,
    value) with depth <= i at the prompt token holding the first `end` characters; a token holding several
    targets the last of them that loop i can know. None when the document has no dense targets, a value is
    not one token, or a position cannot be located (then every loop keeps the document's own targets).
    With `partial`, each partial target (end, loop, value) is loop `loop`'s target there (chain targets).
    """
    dense = list(getattr(doc, "dense_targets", ()) or ())
    if not dense:
        return None
    D = int(getattr(doc, "steps", 0)) or max(d for _, d, _ in dense)
    # (end, first loop, last loop, value), by end: a token holding several keeps the last that applies
    targets = sorted([(e, d, K, v) for e, d, v in dense]
                     + ([(e, i, i, v) for e, i, v in getattr(doc, "partial_targets", ())] if partial else []))
    values = [codec.encode_text(v) for *_, v in targets]
    where = prompt_positions(codec, doc, [e for e, *_ in targets])
    if where is None or any(len(v) != 1 for v in values) or any(not 0 <= t < len(ids) - 1 for t in where):
        return None
    rows = []
    for i in range(1, K + 1):
        row = list(ids) if i >= D else [IGNORE_INDEX] * len(ids)
        for (_, first, last, _), (value,), t in zip(targets, values, where):
            if first <= i <= last:
                row[t + 1] = DENSE_MARK - value  # a prompt-position target (packed_extras places it)
        rows.append(row)
    return rows


def document_extras(doc, ids: list[int], tokenize: Callable[[object], tuple[list[int], list[bool]]],
                    loop_targets: int, with_steps: bool, codec=None,
                    partial: bool = False) -> tuple[list[list[int]], bool]:
    """(lists, has_loop_targets): per-token lists packed alongside a document's ids: K loop target rows (its
    own ids when it has no per-step targets; dense rows when a codec is given, with partial targets when
    `partial`), then its serial steps
    repeated on every token; and whether its loop rows are per-step/dense ones (the packer counts the rest)."""
    out: list[list[int]] = []
    rows = None
    if loop_targets:
        rows = (dense_target_rows(doc, ids, codec, loop_targets, partial) if codec is not None
                else loop_target_rows(doc, ids, tokenize, loop_targets))
        out += rows or [list(ids)] * loop_targets
    if with_steps:
        out.append([int(getattr(doc, "steps", 0))] * len(ids))
    return out, rows is not None


def packed_extras(extras: list[list[int]], segs: list[int], mask: list[bool], loop_targets: int, with_steps: bool,
                  pad_id: int) -> dict[str, list]:
    """A packed sequence's `loop_labels` [K, T] (next-token targets of each row, as labels are built, plus
    the dense rows' prompt-position targets) and `steps` (the most serial steps any of its documents needs)."""
    T = len(segs)
    out: dict[str, list] = {}
    if loop_targets:
        rows = [x + [pad_id] * (T - len(x)) for x in extras[:loop_targets]]
        labels = []
        for r in rows:
            lab = labels_from_packed(r, segs, mask)
            for t in range(T - 1):
                if r[t + 1] <= DENSE_MARK and segs[t + 1] == segs[t]:
                    lab[t] = DENSE_MARK - r[t + 1]  # a dense target at a prompt position
            labels.append(lab)
        out["loop_labels"] = labels
    if with_steps:
        out["steps"] = max(extras[-1], default=0)
    return out
