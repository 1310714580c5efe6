"""Corpus, packing and SFT masks: documents never see each other, SFT trains on responses only."""

from __future__ import annotations

import json

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.text import TextCodec
from elr_rl.train.config import DataConfig
from elr_rl.train.corpus import GENERATORS, Document, MixedSource, build_source
from elr_rl.train.data import IGNORE_INDEX, Packer, preflight, tokenize_document
from elr_rl.train.engine import cross_entropy_loss


class ListSource(MixedSource):
    """A fixed list of documents, cycled (for exact packing tests)."""

    def __init__(self, docs: list[Document]) -> None:
        self.docs = docs

    def document(self, index: int) -> Document:
        return self.docs[index % len(self.docs)]


@pytest.fixture(scope="module")
def tok():
    return TextCodec.byte_level()


def test_generators_are_deterministic_and_worked():
    src = build_source(DataConfig(), "pretrain")
    assert src.document(5) == build_source(DataConfig(), "pretrain").document(5)
    assert src.document(5) != build_source(DataConfig(), "pretrain", heldout=True).document(5)
    for name in GENERATORS:
        doc = build_source(DataConfig(generators=[name], max_difficulty=1), "pretrain").document(0)
        assert doc.prompt.startswith("Q:") and doc.response.startswith("A:") and " so " in doc.response


def test_packing_resets_positions_and_never_crosses_documents(tok):
    docs = [Document("Q: 12+34=?\n", "A: 46\n"), Document("Q: sort 3 1 2\n", "A: 1 2 3\n")]
    seq = Packer(ListSource(docs), tok, seq_len=64, stage="pretrain").next_sequence()
    ids, pos, seg, labels = (seq[k] for k in ("input_ids", "positions", "segment_ids", "labels"))
    first_len = len(tokenize_document(docs[0], tok, "pretrain")[0])
    assert pos[:first_len] == list(range(first_len)) and pos[first_len] == 0
    assert seg[first_len - 1] != seg[first_len]
    for t in range(63):
        if labels[t] != IGNORE_INDEX:
            assert seg[t] == seg[t + 1] and labels[t] == ids[t + 1]
    assert labels[first_len - 1] == IGNORE_INDEX  # eos of doc 0 does not predict bos of doc 1


def test_model_sees_packed_documents_as_if_alone(tok):
    """Correct attention boundaries: a document's logits do not depend on its neighbours."""
    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny()).eval()
    docs = [Document("Q: 12+34=?\n", "A: 46\n"), Document("Q: sort 3 1 2\n", "A: 1 2 3\n")]
    batch = Packer(ListSource(docs), tok, seq_len=64, stage="pretrain").next_batch(1)
    n0 = len(tokenize_document(docs[0], tok, "pretrain")[0])
    n1 = len(tokenize_document(docs[1], tok, "pretrain")[0])
    with torch.no_grad():
        packed = model(batch["input_ids"], k=3, positions=batch["positions"], segment_ids=batch["segment_ids"])
        alone = model(batch["input_ids"][:, n0:n0 + n1], k=3)
    torch.testing.assert_close(packed[:, n0:n0 + n1], alone, atol=1e-5, rtol=1e-5)


def test_pretraining_splits_long_documents_and_sft_skips_and_counts_them(tok):
    long = Document("Q: " + "x" * 30 + "\n", "A: " + "y" * 30 + "\n", source="long")
    short = Document("Q: 1+1\n", "A: 2\n", source="short")
    pre = Packer(ListSource([long]), tok, seq_len=48, stage="pretrain")
    a, b = pre.next_sequence(), pre.next_sequence()
    assert tok.pad_token_id not in a["input_ids"] and b["positions"][0] == 0
    sft = Packer(ListSource([long, short]), tok, seq_len=48, stage="sft")
    short_ids = tokenize_document(short, tok, "sft")[0]
    for _ in range(3):  # the 71-token document is never cut: skipped and counted, the short one packed whole
        s = sft.next_sequence()
        assert s["input_ids"][: len(short_ids)] == short_ids
    assert sft.dropped["long"] >= 3 and sft.kept["short"] >= 3 and "long" not in sft.kept
    assert Packer(ListSource([long]), tok, seq_len=48, stage="sft").state_dict()["dropped"] == {}
    with pytest.raises(ValueError, match="data.seq_len"):  # nothing fits: an error, not an endless skip
        Packer(ListSource([long]), tok, seq_len=48, stage="sft").next_sequence()


def test_preflight_reports_what_fits_per_source(tok):
    cfg = DataConfig(generators=["env:even_odd", "addition"], seq_len=160)
    src = build_source(cfg, "sft")
    reports = {r.source: r for r in preflight(src, tok, 160, "sft", n=16)}
    assert set(reports) == {"env:even_odd", "addition"}
    for r in reports.values():
        assert 0 < r.kept_whole <= 1 and r.supervised_per_sequence > 0 and r.max_tokens >= r.mean_tokens
    with pytest.raises(ValueError, match="raise data.seq_len to at least"):
        preflight(src, tok, 8, "sft", n=4)


def test_packer_state_dict_resumes_exactly(tok):
    src = build_source(DataConfig(), "pretrain")
    a = Packer(src, tok, 64, "pretrain", rank=1, world_size=2)
    for _ in range(3):
        a.next_sequence()
    b = Packer(src, tok, 64, "pretrain", rank=1, world_size=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [a.next_sequence() for _ in range(3)] == [b.next_sequence() for _ in range(3)]


def _sft_records(path, prompts, responses):
    with open(path, "w") as fh:
        for p, r in zip(prompts, responses):
            fh.write(json.dumps({"prompt": p, "response": r}) + "\n")


def test_sft_loss_ignores_prompt_targets(tok, tmp_path):
    """Changing the prompt tokens (the targets at prompt positions) leaves the SFT loss unchanged;
    changing a response token does not."""
    resp = ["A: 46\n", "A: 1 2 3\n"]
    base, other, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    _sft_records(base, ["Q: 12+34=?\n", "Q: sort 3 1 2\n"], resp)
    _sft_records(other, ["Z: 98*76=!\n", "Z: tros 9 8 7\n"], resp)  # same lengths, other prompt tokens
    _sft_records(bad, ["Q: 12+34=?\n", "Q: sort 3 1 2\n"], ["A: 47\n", "A: 1 2 3\n"])

    def batch(path):
        src = build_source(DataConfig(files=[str(path)], generators=[], seq_len=32), "sft")
        return Packer(src, tok, 32, "sft").next_batch(2)

    b0, b1, b2 = batch(base), batch(other), batch(bad)
    assert not torch.equal(b0["input_ids"], b1["input_ids"])
    n_targets = int((b0["labels"] != IGNORE_INDEX).sum())
    assert n_targets == sum(len(tok.encode_text(r)) + 1 for r in resp)  # response tokens and end of turn
    torch.manual_seed(0)
    logits = torch.randn(2, 32, 260)
    l0, l1, l2 = (cross_entropy_loss(logits, b) for b in (b0, b1, b2))
    assert float(l0) == float(l1)
    assert float(l0) != float(l2)


def test_local_text_and_parquet_files_through_datasets(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    txt = tmp_path / "corpus.txt"
    txt.write_text("first line of text\nsecond line\n")
    src = build_source(DataConfig(files=[str(txt)], generators=[]), "pretrain")
    assert {src.document(i).response for i in range(2)} == {"first line of text", "second line"}
    pq.write_table(pa.table({"prompt": ["Q: 1+1=?\n"], "response": ["A: 2\n"]}), tmp_path / "sft.parquet")
    src = build_source(DataConfig(files=[str(tmp_path / "sft.parquet")], generators=[]), "sft")
    assert src.document(3) == Document("Q: 1+1=?\n", "A: 2\n", source="files")
    with pytest.raises(ValueError, match="data.text_field"):
        build_source(DataConfig(files=[str(tmp_path / "sft.parquet")], generators=[]), "pretrain")


def test_truncated_backprop_and_K_come_from_the_loop_config():
    from elr_rl.train.build import build_model, build_model_config
    from elr_rl.train.config import LoopConfig, ModelSpec

    for family in ("elr", "dory"):
        spec = ModelSpec(family=family)
        mc = build_model_config(spec, LoopConfig(max_loops=6, truncated_backprop=2))
        model = build_model(spec, mc, seed=0)
        assert model.spec.truncated_backprop == 2 and model.spec.max_loops == 6


def test_registered_environment_worked_solutions_feed_the_corpus():
    src = build_source(DataConfig(generators=["env:arith_multidigit", "addition"], min_difficulty=2,
                                  max_difficulty=2), "pretrain")
    docs = [src.document(i) for i in range(12)]
    env_docs = [d for d in docs if not d.prompt.startswith("Q:")]
    assert env_docs and all("<answer>" in d.response for d in env_docs)
    with pytest.raises(ValueError, match="data.generators"):
        build_source(DataConfig(generators=["env:no_such_env"]), "pretrain")



def test_env_wrong_answer_fraction_mixes_in_well_formed_wrong_answers():
    """SFT for format only: a share of the answers are the environment's wrong ones."""

    def right_share(fraction: float) -> float:
        cfg = DataConfig(generators=["env:even_odd"], min_difficulty=1, max_difficulty=1,
                         env_wrong_answer_fraction=fraction)
        src = build_source(cfg, "sft")
        right = 0
        for i in range(200):
            doc = src.document(i)
            n = int(doc.prompt.split()[1])  # "Is {n} even or odd? ..."
            assert doc.response in ("<answer>even</answer>", "<answer>odd</answer>")  # the format is kept
            right += doc.response == f"<answer>{'even' if n % 2 == 0 else 'odd'}</answer>"
        return right / 200

    assert right_share(0.0) == 1.0
    assert right_share(0.5) == 0.5
    assert 0.7 < right_share(0.2) < 0.9  # a fifth of all answers wrong
    # side by side: documents 2i and 2i + 1 are the same task, right then wrong (with other generators mixed in)
    src = build_source(DataConfig(generators=["env:even_odd", "addition"], min_difficulty=1, max_difficulty=1,
                                  env_wrong_answer_fraction=0.5), "sft")
    pairs = [(src.document(2 * i), src.document(2 * i + 1)) for i in range(20)]
    env_pairs = [(a, b) for a, b in pairs if a.prompt.startswith("Is ")]
    assert env_pairs and all(a.prompt == b.prompt and a.response != b.response for a, b in env_pairs)
    with pytest.raises(ValueError, match="env_wrong_answer_fraction"):
        DataConfig(generators=["env:even_odd"], env_wrong_answer_fraction=0.7).validate()
