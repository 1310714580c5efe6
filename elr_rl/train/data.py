"""Tokenising, sequence packing and batching.

Packed sequences carry `segment_ids` (attention never crosses documents) and
`positions` that restart at 0 in every document; the model takes both. Labels
are the next token inside the same segment, or -100 (no loss) at document ends,
padding, and (SFT) prompt tokens.

Text becomes tokens only through the checkpoint's `TextCodec` (elr_rl.text): SFT
documents are rendered with the chat template and trained on the assistant's
tokens. An SFT document longer than a sequence is never truncated (that would
train a response without its end): it is skipped and counted per source
(`Packer.dropped`), and `preflight` measures before training, per source, how many
responses fit whole and how many supervised tokens a sequence carries.

Each rank packs its own shard of the document stream (documents j = rank,
rank + W, ...), so ranks never exchange data; a packer's state is the next
document index plus the unfinished remainder, which makes resume exact.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from elr_rl.text import TextCodec
from elr_rl.train.corpus import Document, MixedSource
from elr_rl.train.labels import IGNORE_INDEX, labels_from_packed

# An SFT stream that skips this many documents in a row has nothing that fits a sequence.
MAX_SKIPS_IN_A_ROW = 1000


def tokenize_document(doc: Document, codec: TextCodec, stage: str) -> tuple[list[int], list[bool]]:
    """(ids, mask): mask[t] says token t is a training target.

    A document with a prompt is a conversation rendered with the chat template, exactly as
    rollouts render prompts. SFT trains on the assistant's tokens (through its end-of-turn
    token); pretraining on every token after the first. Plain text (no prompt): [bos] text [eos].
    """
    if doc.prompt:
        ids, mask = codec.sft_ids(doc.prompt, doc.response, system=doc.system)
    else:
        ids = codec.pretrain_ids(doc.response)
        mask = [True] * len(ids)
    if stage == "pretrain":
        mask = [False] + [True] * (len(ids) - 1)
    return ids, mask


@dataclass
class Packer:
    """Greedy packer over one rank's shard of a document stream.

    split_documents=True (pretraining): a document that does not fit is cut and its remainder
    starts the next sequence as a new segment. False (SFT): a document that does not fit starts
    the next sequence (the current one is padded), and one longer than seq_len is skipped and
    counted in `dropped` (per source), so a response is never cut or separated from its prompt.
    """

    source: MixedSource
    codec: TextCodec
    seq_len: int
    stage: str
    rank: int = 0
    world_size: int = 1
    next_doc: int = -1
    pending: list = field(default_factory=list)  # [ids, mask] of an unfinished document, or []
    dropped: Counter = field(default_factory=Counter)  # source -> SFT documents skipped as too long
    kept: Counter = field(default_factory=Counter)  # source -> documents packed
    own_targets: Counter = field(default_factory=Counter)  # source -> documents packed without per-loop targets
    loop_targets: int = 0  # K > 0: also pack per-loop targets `loop_labels` [B, K, T] (elr_rl.train.loopwise)
    dense_targets: bool = False  # the loop targets are dense ones (loop_aux.targets=dense; loopwise)
    partial_targets: bool = False  # dense ones with partial targets below their depth (loop_aux.targets=chain)
    with_steps: bool = False  # also pack `steps` [B]: the most serial steps a sequence's documents need

    def __post_init__(self) -> None:
        if self.next_doc < 0:
            self.next_doc = self.rank

    @property
    def split_documents(self) -> bool:
        return self.stage == "pretrain"

    def _take_document(self) -> list[list]:
        """[ids, mask, *extras]: parallel per-token lists (extras: loop target rows, steps; see loopwise)."""
        if self.pending:
            parts = self.pending
            self.pending = []
            return parts
        for _ in range(MAX_SKIPS_IN_A_ROW):
            doc = self.source.document(self.next_doc)
            self.next_doc += self.world_size
            ids, mask = tokenize_document(doc, self.codec, self.stage)
            if self.split_documents or len(ids) <= self.seq_len:
                self.kept[doc.source] += 1
                if not (self.loop_targets or self.with_steps):
                    return [ids, mask]
                from elr_rl.train.loopwise import document_extras

                tokenize = lambda d: tokenize_document(d, self.codec, self.stage)  # noqa: E731
                extras, has_targets = document_extras(doc, ids, tokenize, self.loop_targets, self.with_steps,
                                                      codec=self.codec if self.dense_targets else None,
                                                      partial=self.partial_targets)
                if self.loop_targets and not has_targets:
                    self.own_targets[doc.source] += 1  # every loop keeps the document's own targets
                return [ids, mask, *extras]
            self.dropped[doc.source] += 1  # SFT: never truncate a response
        raise ValueError(
            f"config field `data.seq_len`: {MAX_SKIPS_IN_A_ROW} documents in a row are longer than "
            f"seq_len={self.seq_len} tokens (last: {doc.source}, {len(ids)} tokens); raise data.seq_len"
        )

    def next_sequence(self) -> dict[str, list[int]]:
        """One packed sequence: input_ids, positions, segment_ids, labels (each seq_len long)."""
        T = self.seq_len
        ids: list[int] = []
        mask: list[bool] = []
        segs: list[int] = []
        pos: list[int] = []
        seg = 0
        extras: list[list[int]] = []
        while len(ids) < T:
            parts = self._take_document()
            d_ids, d_mask = parts[0], parts[1]
            room = T - len(ids)
            if len(d_ids) > room:
                if self.split_documents:
                    self.pending = [x[room:] for x in parts]
                    parts = [x[:room] for x in parts]
                    d_ids, d_mask = parts[0], parts[1]
                else:  # SFT: keep the document whole for the next sequence
                    self.pending = parts
                    break
            ids += d_ids
            mask += d_mask
            extras = [acc + x for acc, x in zip(extras, parts[2:])] if extras else [list(x) for x in parts[2:]]
            segs += [seg] * len(d_ids)
            pos += list(range(len(d_ids)))
            seg += 1
        pad = T - len(ids)
        if pad:  # padding is its own segment: no document attends to it, it has no loss
            ids += [self.codec.pad_token_id] * pad
            mask += [False] * pad
            segs += [seg] * pad
            pos += list(range(pad))
        out = {"input_ids": ids, "positions": pos, "segment_ids": segs, "labels": labels_from_packed(ids, segs, mask)}
        if self.loop_targets or self.with_steps:
            from elr_rl.train.loopwise import packed_extras

            out.update(packed_extras(extras, segs, mask, self.loop_targets, self.with_steps, self.codec.pad_token_id))
        return out

    def next_batch(self, batch_size: int) -> dict[str, torch.Tensor]:
        """`batch_size` packed sequences stacked into LongTensors [B, T]."""
        rows = [self.next_sequence() for _ in range(batch_size)]
        return {key: torch.tensor([r[key] for r in rows], dtype=torch.long) for key in rows[0]}

    def state_dict(self) -> dict:
        return {"next_doc": self.next_doc, "pending": [list(x) for x in self.pending],
                "dropped": dict(self.dropped), "kept": dict(self.kept), "own_targets": dict(self.own_targets)}

    def load_state_dict(self, state: dict) -> None:
        self.next_doc = int(state["next_doc"])
        self.pending = [list(x) for x in state["pending"]]
        self.dropped = Counter(state.get("dropped", {}))
        self.kept = Counter(state.get("kept", {}))
        self.own_targets = Counter(state.get("own_targets", {}))


def fixed_batches(source: MixedSource, codec: TextCodec, seq_len: int, stage: str, batch_size: int,
                  n_batches: int) -> list[dict[str, torch.Tensor]]:
    """A fixed list of batches (held-out evaluation): the same on every rank and every call."""
    packer = Packer(source, codec, seq_len, stage)
    return [packer.next_batch(batch_size) for _ in range(n_batches)]


@dataclass
class SourceReport:
    """What one document source gives the packer, measured on a sample of its documents."""

    source: str
    documents: int
    mean_tokens: float  # whole document
    max_tokens: int
    kept_whole: float  # share of documents that fit a sequence whole (SFT: the rest are skipped)
    supervised_per_sequence: float  # loss-carrying tokens per packed sequence, from what fits
    loop_targets: float | None = None  # loop_aux per-step/dense targets asked for: share of documents that have them
    dense_per_sequence: float | None = None  # loop_aux dense: prompt-position targets of the last loop per sequence
    partial_per_sequence: float | None = None  # loop_aux chain: partial targets (of shallower loops) per sequence

    def line(self) -> str:
        out = (f"{self.source}: {self.documents} documents sampled, {self.mean_tokens:.0f} tokens on average "
               f"(max {self.max_tokens}), {self.kept_whole:.0%} fit a sequence whole, "
               f"~{self.supervised_per_sequence:.0f} supervised tokens per sequence")
        if self.loop_targets is not None:
            out += f", {self.loop_targets:.0%} with per-loop targets"
        if self.dense_per_sequence is not None:
            out += f" (~{self.dense_per_sequence:.0f} dense targets per sequence"
            if self.partial_per_sequence is not None:
                out += f", ~{self.partial_per_sequence:.0f} partial ones over the shallower loops"
            out += ")"
        return out


def preflight(source: MixedSource, codec: TextCodec, seq_len: int, stage: str, n: int = 64,
              loop_targets: int = 0, dense_targets: bool = False, partial_targets: bool = False) -> list[SourceReport]:
    """Per source: token lengths, the share of documents kept whole, supervised tokens per sequence, and
    with `loop_targets` (K) the share of documents that carry per-loop targets (dense ones per sequence).

    SFT: a source none of whose sampled documents fits a sequence is an error (its responses
    would all be skipped), naming the length that would fit.
    """
    reports = []
    for name, docs in source.sample_by_source(n).items():
        enc = [tokenize_document(d, codec, stage) for d in docs]
        lengths = [len(ids) for ids, _ in enc]
        fit = [(ids, mask) for ids, mask in enc if len(ids) <= seq_len] if stage != "pretrain" else enc
        tokens = sum(len(ids) for ids, _ in fit)
        supervised = sum(sum(mask) for _, mask in fit)
        sequences = max(1.0, tokens / seq_len) if fit else 1.0
        whole = sum(length <= seq_len for length in lengths) / len(lengths)  # pretraining splits the rest
        rep = SourceReport(name, len(docs), sum(lengths) / len(lengths), max(lengths), whole,
                           supervised / sequences if fit else 0.0)
        if loop_targets:
            from elr_rl.train.loopwise import DENSE_MARK, document_extras

            tokenize = lambda d: tokenize_document(d, codec, stage)  # noqa: E731
            extras = [document_extras(d, ids, tokenize, loop_targets, False, codec if dense_targets else None,
                                      partial_targets)
                      for d, (ids, _) in zip(docs, enc)]
            rep.loop_targets = sum(has for _, has in extras) / len(extras)
            dense_only = ([document_extras(d, ids, tokenize, loop_targets, False, codec) for d, (ids, _) in zip(docs, enc)]
                          if partial_targets else extras)
            if dense_targets:  # the documents that fit, as supervised tokens are counted
                marks = sum(sum(x <= DENSE_MARK for x in rows[-1]) for (rows, has), (ids, _) in zip(extras, enc)
                            if has and (stage == "pretrain" or len(ids) <= seq_len))
                rep.dense_per_sequence = marks / sequences if fit else 0.0
                if partial_targets:
                    extra = sum(sum(x <= DENSE_MARK for row in rows for x in row) for (rows, has), (ids, _)
                                in zip(extras, enc) if has and (stage == "pretrain" or len(ids) <= seq_len))
                    dense_all = sum(sum(x <= DENSE_MARK for row in rows for x in row) for (rows, has), (ids, _)
                                    in zip(dense_only, enc) if has and (stage == "pretrain" or len(ids) <= seq_len))
                    rep.partial_per_sequence = (extra - dense_all) / sequences if fit else 0.0
        if stage != "pretrain" and not fit:
            raise ValueError(
                f"config field `data.seq_len`: no sampled document of {name} fits seq_len={seq_len} tokens "
                f"(shortest {min(lengths)}, longest {max(lengths)}); raise data.seq_len to at least {max(lengths)}"
            )
        reports.append(rep)
    return reports
