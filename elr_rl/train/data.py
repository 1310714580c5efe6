"""Tokenising, sequence packing and batching.

Packed sequences carry `segment_ids` (attention never crosses documents) and
`positions` that restart at 0 in every document; the model takes both. Labels
are the next token inside the same segment, or -100 (no loss) at document ends,
padding, and (SFT) prompt tokens.

Each rank packs its own shard of the document stream (documents j = rank,
rank + W, ...), so ranks never exchange data; a packer's state is the next
document index plus the unfinished remainder, which makes resume exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from elr_rl.train.corpus import Document, MixedSource

IGNORE_INDEX = -100


def tokenize_document(doc: Document, tokenizer: Any, stage: str) -> tuple[list[int], list[bool]]:
    """ids = [bos] + prompt + [sep] + response + [eos]; mask[t] says token t is a training target.

    The rollout format (elr_rl.model.tokenizer.encode_prompt / encode_response): the model's
    turn starts after <|sep|>. Pretraining: every token after bos is a target. SFT: only
    response tokens and eos.
    """
    p = tokenizer.encode(doc.prompt, add_special_tokens=False) if doc.prompt else []
    if p and tokenizer.sep_token_id is not None:
        p = [*p, tokenizer.sep_token_id]
    r = tokenizer.encode(doc.response, add_special_tokens=False)
    ids = [tokenizer.bos_token_id, *p, *r, tokenizer.eos_token_id]
    if stage == "pretrain":
        mask = [False] + [True] * (len(ids) - 1)
    else:
        mask = [False] * (1 + len(p)) + [True] * (len(r) + 1)
    return ids, mask


def labels_from_packed(ids: list[int], segs: list[int], mask: list[bool]) -> list[int]:
    """labels[t] = ids[t+1] when t+1 is in t's segment and is a target, else IGNORE_INDEX."""
    T = len(ids)
    return [
        ids[t + 1] if t + 1 < T and segs[t + 1] == segs[t] and mask[t + 1] else IGNORE_INDEX
        for t in range(T)
    ]


@dataclass
class Packer:
    """Greedy packer over one rank's shard of a document stream.

    split_documents=True (pretraining): a document that does not fit is cut and its remainder
    starts the next sequence as a new segment. False (SFT): a document that does not fit starts
    the next sequence (the current one is padded), and one longer than seq_len is truncated, so a
    response is never separated from its prompt.
    """

    source: MixedSource
    tokenizer: Any
    seq_len: int
    stage: str
    rank: int = 0
    world_size: int = 1
    next_doc: int = -1
    pending: list = field(default_factory=list)  # [ids, mask] of an unfinished document, or []

    def __post_init__(self) -> None:
        if self.next_doc < 0:
            self.next_doc = self.rank

    @property
    def split_documents(self) -> bool:
        return self.stage == "pretrain"

    def _take_document(self) -> tuple[list[int], list[bool]]:
        if self.pending:
            ids, mask = self.pending
            self.pending = []
            return ids, mask
        doc = self.source.document(self.next_doc)
        self.next_doc += self.world_size
        return tokenize_document(doc, self.tokenizer, self.stage)

    def next_sequence(self) -> dict[str, list[int]]:
        """One packed sequence: input_ids, positions, segment_ids, labels (each seq_len long)."""
        T = self.seq_len
        ids: list[int] = []
        mask: list[bool] = []
        segs: list[int] = []
        pos: list[int] = []
        seg = 0
        while len(ids) < T:
            d_ids, d_mask = self._take_document()
            room = T - len(ids)
            if len(d_ids) > room:
                if self.split_documents:
                    self.pending = [d_ids[room:], d_mask[room:]]
                    d_ids, d_mask = d_ids[:room], d_mask[:room]
                elif ids:  # SFT: keep the document whole for the next sequence
                    self.pending = [d_ids, d_mask]
                    break
                else:  # SFT document longer than a sequence: truncate
                    d_ids, d_mask = d_ids[:room], d_mask[:room]
            ids += d_ids
            mask += d_mask
            segs += [seg] * len(d_ids)
            pos += list(range(len(d_ids)))
            seg += 1
        pad = T - len(ids)
        if pad:  # padding is its own segment: no document attends to it, it has no loss
            ids += [self.tokenizer.pad_token_id] * pad
            mask += [False] * pad
            segs += [seg] * pad
            pos += list(range(pad))
        return {"input_ids": ids, "positions": pos, "segment_ids": segs, "labels": labels_from_packed(ids, segs, mask)}

    def next_batch(self, batch_size: int) -> dict[str, torch.Tensor]:
        """`batch_size` packed sequences stacked into LongTensors [B, T]."""
        rows = [self.next_sequence() for _ in range(batch_size)]
        return {key: torch.tensor([r[key] for r in rows], dtype=torch.long) for key in rows[0]}

    def state_dict(self) -> dict:
        return {"next_doc": self.next_doc, "pending": [list(x) for x in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        self.next_doc = int(state["next_doc"])
        self.pending = [list(x) for x in state["pending"]]


def fixed_batches(source: MixedSource, tokenizer: Any, seq_len: int, stage: str, batch_size: int,
                  n_batches: int) -> list[dict[str, torch.Tensor]]:
    """A fixed list of batches (held-out evaluation): the same on every rank and every call."""
    packer = Packer(source, tokenizer, seq_len, stage)
    return [packer.next_batch(batch_size) for _ in range(n_batches)]
