"""`elr-rl eval --loop-probe`: per-loop teacher-forced readout accuracy, answer and dense steps."""

from __future__ import annotations

import json

import pytest
import torch

from elr_rl.eval.cli import main as eval_main
from elr_rl.eval.loop_probe import ProbeRow, _Doc, _encode, format_probe, score_readouts


def _logits(T: int, V: int, argmax: dict[int, int]) -> torch.Tensor:
    z = torch.zeros(1, T, V)
    for t, v in argmax.items():
        z[0, t, v] = 1.0
    return z


def test_scoring_follows_the_dense_rule_a_loop_is_scored_on_the_deepest_target_it_can_know():
    # ids 0..5; the response is tokens 4-5; token 2 holds two dense targets: value 7 at depth 1, 9 at depth 2
    doc = _Doc(ids=[1, 2, 3, 4, 5, 6], answer_at=[4, 5], dense={2: [(1, 7), (2, 9)]})
    V = 10
    readouts = [
        _logits(6, V, {2: 7, 3: 5, 4: 6}),  # loop 1: step 1 right, answer right
        _logits(6, V, {2: 7, 3: 5, 4: 0}),  # loop 2: still 7 (depth 2 wants 9), answer's second token wrong
        _logits(6, V, {2: 9, 3: 5, 4: 6}),  # loop 3: 9, answer right
    ]
    rows: dict = {}
    score_readouts([doc], readouts, rows, "k")
    assert rows[("k", "answer")] == [[1, 0, 1], [1, 1, 1]]
    assert rows[("k", "step 1")] == [[1, 0, 0], [1, 0, 0]]  # loops 2-3 know depth 2 and are scored on it
    assert rows[("k", "step 2")] == [[0, 0, 1], [0, 1, 1]]


@pytest.mark.parametrize("env_name", ["ladder_automaton", "ladder_nested", "ladder_binding", "ladder_tail"])
def test_probe_scores_the_tokens_and_values_the_dense_loss_trains(env_name):
    """The probe's dense positions and values are the ones `loop_aux.targets=dense` puts in the last loop's row."""
    from elr_rl.text import TextCodec
    from elr_rl.train.corpus import task_document
    from elr_rl.train.loopwise import DENSE_MARK, dense_target_rows
    from environments.registry import get_env

    codec, env, K = TextCodec.byte_level(), get_env(env_name), 4
    for seed in range(6):
        doc = task_document(env, env.generate(seed=seed, difficulty=3))
        enc = _encode(doc, codec)
        rows = dense_target_rows(doc, enc.ids, codec, K)
        marked = {t: DENSE_MARK - rows[K - 1][t + 1] for t in range(len(enc.ids) - 1) if rows[K - 1][t + 1] <= DENSE_MARK}
        assert marked and marked == {t: targets[-1][1] for t, targets in enc.dense.items()}
        assert {d for targets in enc.dense.values() for d, _ in targets} == {1, 2, 3}
        assert codec.decode([enc.ids[t] for t in enc.answer_at]).startswith(f"<answer>{doc.response[8]}")


def test_loop_probe_cli_prints_and_writes_rows_per_env_difficulty_and_loop(toy_checkpoint, tmp_path, capsys):
    out = tmp_path / "probe.json"
    rc = eval_main([str(toy_checkpoint), "--loop-probe", "--envs", "ladder_automaton,even_odd", "--k", "1,3",
                    "--difficulty", "1,2", "-n", "6", "--json", str(out)])
    assert rc == 0
    assert "loop probe of" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    keys = [(r["env"], r["difficulty"], r["target"]) for r in rows]
    assert keys == [("ladder_automaton", 1, "answer"), ("ladder_automaton", 1, "step 1"),
                    ("ladder_automaton", 2, "answer"), ("ladder_automaton", 2, "step 1"), ("ladder_automaton", 2, "step 2"),
                    ("ladder_automaton", 2, "partial"), ("even_odd", 1, "answer"), ("even_odd", 2, "answer")]
    for r in rows:
        assert len(r["accuracy"]) == 3 and r["count"] == 6  # one 3-loop pass, six tasks (one target each)
        acc = r["accuracy"]
        if r["target"] == "step 2":
            assert acc[0] is None and all(a is not None for a in acc[1:])  # loop 1 is not asked a depth-2 value
        elif r["target"] == "partial":
            assert acc[0] is not None and acc[1:] == [None, None]  # D = 2: the second move's map, after loop 1 only
        else:
            assert all(0.0 <= a <= 1.0 for a in acc)


def test_loop_probe_refuses_a_difficulty_the_environment_does_not_have(toy_checkpoint, capsys):
    assert eval_main([str(toy_checkpoint), "--loop-probe", "--envs", "ladder_automaton", "--difficulty", "99"]) == 2
    assert "outside" in capsys.readouterr().out


def test_a_dense_target_on_no_single_token_is_counted_and_shown_not_dropped():
    from elr_rl.text import TextCodec
    from elr_rl.train.corpus import Document

    doc = Document("a=1 b=a b?", "<answer>1</answer>", dense_targets=((3, 1, "1"), (7, 2, "12")))  # "12": two bytes
    enc = _encode(doc, TextCodec.byte_level())
    assert enc.unplaced == 1 and [v for targets in enc.dense.values() for _, v in targets] == [ord("1")]
    rows = [ProbeRow("ladder_x", 2, "answer", [1, 1], [2, 2], unplaced=1), ProbeRow("ladder_x", 2, "step 10", [0, 1], [0, 2])]
    text = format_probe(rows, "t")
    assert "ladder_x D=2: 1 dense or partial targets sit on no single token" in text and "step 10" in text
    assert rows[0].as_dict()["unplaced_dense_targets"] == 1


def test_partial_targets_are_scored_at_their_own_loop_only():
    from elr_rl.text import TextCodec
    from elr_rl.train.corpus import Document

    codec = TextCodec.byte_level()
    doc = Document("at 2 do RL?", "<answer>2</answer>", steps=2, dense_targets=((9, 1, "3"), (10, 2, "2")),
                   partial_targets=((10, 1, "a"),))
    enc = _encode(doc, codec)
    (t, loop, value), = enc.partial
    assert loop == 1 and value == ord("a") and t in enc.dense  # on the token of the second move
    V, T = codec.vocab_size, len(enc.ids)
    readouts = [torch.zeros(1, T, V) for _ in range(3)]
    readouts[0][0, t, ord("a")] = 1.0  # loop 1 holds the composed map: right
    readouts[1][0, t, ord("a")] = 1.0  # loop 2 still holds it: the partial is not asked of loop 2 (step 2 is)
    rows: dict = {}
    score_readouts([enc], readouts, rows, "k")
    assert rows[("k", "partial")] == [[1, 0, 0], [1, 0, 0]]
    assert rows[("k", "step 2")] == [[0, 0, 0], [0, 1, 1]]


def test_each_loops_readout_in_a_padded_batch_is_the_model_at_that_k_on_the_task_alone(toy_checkpoint, monkeypatch):
    """The probe scores, for loop i, exactly the logits of the model run with k = i on the unpadded task."""
    import elr_rl.eval.loop_probe as lp
    from elr_rl.model import LoopedForCausalLM

    seen = []
    real = lp.score_readouts
    monkeypatch.setattr(lp, "score_readouts", lambda docs, readouts, rows, key: (seen.append((docs, readouts)),
                                                                                 real(docs, readouts, rows, key)))
    rows = lp.probe(str(toy_checkpoint), ["even_odd", "ladder_automaton"], [1, 2], 6, seed_offset=700, loops=3,
                    batch_size=4, progress=False)
    model = LoopedForCausalLM.from_pretrained(toy_checkpoint).eval()
    assert not model.config.loop_conditioning  # else loop i of a 3-loop pass is not the model at k = i
    lengths = set()
    for docs, readouts in seen:
        assert len(readouts) == 3
        for b, doc in enumerate(docs):
            lengths.add(len(doc.ids))
            with torch.no_grad():
                for k in (1, 2, 3):
                    alone = model(torch.tensor([doc.ids]), k=k)[0]
                    assert torch.allclose(readouts[k - 1][b, :len(doc.ids)], alone, atol=1e-4), (k, b)
    assert len(seen) == 8 and len(lengths) > 1  # 4 (env, D) jobs of 6 tasks in batches of 4; padding was used
    assert sum(r.counts[0] for r in rows if r.target == "answer") == 24
