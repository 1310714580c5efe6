"""Loop-wise auxiliary loss and difficulty-aware loop sampling: the pure functions and the model's readouts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.train.config import LoopAuxConfig
from elr_rl.train.loopwise import difficulty_aware_k, loop_aux_loss, loop_target_rows, step_of_loop

torch.set_num_threads(1)


@pytest.mark.parametrize("cond", [False, True])
def test_readouts_are_one_pass_and_the_last_is_the_plain_forward(cond):
    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny(loop_conditioning=cond, n_recurrent_layers=2)).eval()
    ids = torch.randint(0, 256, (2, 7))
    readouts = model(ids, k=4, loop_readouts=True)
    assert len(readouts) == 4
    assert torch.allclose(readouts[-1], model(ids, k=4), atol=1e-5)
    if not cond:  # without loop conditioning, readout i is exactly the model run at k = i
        for i, z in enumerate(readouts, start=1):
            assert torch.allclose(z, model(ids, k=i), atol=1e-5)
    assert not torch.allclose(readouts[0], readouts[-1], atol=1e-3)


def test_aux_loss_adds_weighted_mean_of_earlier_readouts_on_their_own_targets():
    torch.manual_seed(1)
    z = [torch.randn(1, 3, 11, requires_grad=True) for _ in range(3)]
    labels = torch.tensor([[-100, 4, 5]])
    rows = torch.tensor([[[-100, 4, 1], [-100, 4, 2], [-100, 4, 5]]])  # loop i's targets
    ce = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)  # noqa: E731
    total, main = loop_aux_loss(z, {"labels": labels, "loop_labels": rows}, 0.5)
    assert torch.allclose(main, ce(z[2], labels))
    assert torch.allclose(total, main + 0.5 * (ce(z[0], rows[:, 0]) + ce(z[1], rows[:, 1])) / 2)
    total_final, _ = loop_aux_loss(z, {"labels": labels}, 0.5)  # targets=final: every readout on the labels
    assert torch.allclose(total_final, main + 0.5 * (ce(z[0], labels) + ce(z[1], labels)) / 2)
    off, _ = loop_aux_loss(z, {"labels": labels, "loop_labels": rows}, 0.0)
    assert torch.equal(off, main)
    total.backward()
    assert z[0].grad.abs().sum() > 0  # the early readouts are trained


def test_difficulty_aware_k_is_at_least_the_steps_capped_at_K():
    assert difficulty_aware_k(1, 3, 4) == 3
    assert difficulty_aware_k(4, 2, 4) == 4
    assert difficulty_aware_k(2, 9, 4) == 4
    assert difficulty_aware_k(3, 0, 4) == 3  # documents without steps keep the draw
    assert [step_of_loop(i, 2) for i in (1, 2, 3, 4)] == [1, 2, 2, 2]


@dataclass(frozen=True)
class _Doc:
    prompt: str
    response: str
    step_responses: tuple[str, ...] = ()


def _tokenize(doc):
    ids = [1, *doc.prompt.encode(), 2, *doc.response.encode(), 3]
    return ids, [False] * (len(doc.prompt) + 2) + [True] * (len(doc.response) + 1)


def test_loop_target_rows_follow_one_step_per_loop():
    doc = _Doc("q", "<a>z</a>", ("<a>x</a>", "<a>y</a>", "<a>z</a>"))
    ids, _ = _tokenize(doc)
    rows = loop_target_rows(doc, ids, _tokenize, K=4)
    answers = [chr(r[ids.index(ord("z"))]) for r in rows]
    assert answers == ["x", "y", "z", "z"]
    assert rows[2] == rows[3] == ids
    assert loop_target_rows(_Doc("q", "a"), [1], _tokenize, K=4) is None  # no per-step targets
    uneven = _Doc("q", "<a>z</a>", ("<a>xx</a>", "<a>z</a>"))
    assert loop_target_rows(uneven, ids, _tokenize, K=4) is None  # variants of another length: final targets


def test_config_refuses_bad_values_and_is_off_by_default():
    assert not LoopAuxConfig().enabled
    with pytest.raises(ValueError, match="loop_aux.targets"):
        LoopAuxConfig(weight=1.0, targets="every").validate()
    with pytest.raises(ValueError, match="loop_aux.weight"):
        LoopAuxConfig(weight=-1.0).validate()


@pytest.mark.parametrize("stage", ["sft", "pretrain"])
def test_packer_carries_per_loop_targets_and_steps_of_ladder_documents(stage):
    from elr_rl.text import TextCodec
    from elr_rl.train.config import DataConfig
    from elr_rl.train.corpus import build_source
    from elr_rl.train.data import IGNORE_INDEX, Packer

    codec = TextCodec.byte_level()
    cfg = DataConfig(generators=["env:ladder_automaton"], min_difficulty=1, max_difficulty=4, seq_len=128)
    source = build_source(cfg, stage)
    plain = Packer(source, codec, 128, stage).next_batch(3)
    batch = Packer(source, codec, 128, stage, loop_targets=4, with_steps=True).next_batch(3)
    assert torch.equal(batch["labels"], plain["labels"]) and torch.equal(batch["input_ids"], plain["input_ids"])
    assert batch["loop_labels"].shape == (3, 4, 128) and batch["steps"].shape == (3,)
    assert torch.equal(batch["loop_labels"][:, 3], batch["labels"])  # loop K answers after min(K, D) = D steps
    # loops before a document's last step target an intermediate state: only the answer symbol differs
    differs = batch["loop_labels"][:, 0] != batch["labels"]
    assert 0 < int(differs.sum()) <= int((batch["labels"] != IGNORE_INDEX).sum())
    assert bool((batch["steps"] >= 1).all()) and bool((batch["steps"] <= 4).all())
    docs = [source.document(i) for i in range(6)]
    assert all(d.steps == len(d.step_responses) >= 1 and d.step_responses[-1] == d.response for d in docs)


@pytest.mark.slow
def test_sft_run_with_both_options_trains_deep_enough(tmp_path):
    """A real (DeepSpeed, one rank) SFT run with loop_aux on per-step targets and difficulty-aware k."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "elr_rl.cli", "sft", "configs/sft_ladder.yaml", f"run.output_dir={out}",
           "run.total_steps=3", "run.progress=false", "loops.mode=independent", "loops.force_one_fraction=0",
           "loops.difficulty_aware=true", "data.min_difficulty=3", "data.max_difficulty=3",
           "engine.micro_batch_size=2", "engine.grad_accum_steps=2"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=str(Path(__file__).parents[2]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ks = [k for r in rows if "loops/ks" in r for k in r["loops/ks"]]
    assert len(ks) == 6 and all(k >= 3 for k in ks), ks  # independent draws alone: all >= 3 in 1 of 64 runs
    losses = [r["loss/mean"] for r in rows if "loss/mean" in r]
    assert all(0 < x < 10 for x in losses)
    assert (out / "final" / "model.safetensors").is_file()


# --- dense targets (loop_aux.targets=dense) ---

def _automaton_value(prefix: str) -> tuple[int, str]:
    from environments.ladder.automaton import MOVES

    _, start, _, moves = prefix.split(" ")
    p = int(start)
    for m in moves:
        p = MOVES[m](p)
    return len(moves), str(p)


def _nested_value(prefix: str) -> tuple[int, str]:
    """(operations applied, value mod 3) of a postfix prefix that ends at an operator."""
    stack = []
    for ch in prefix:
        stack.append(ch if ch.isdigit() else str(eval(f"({stack.pop(-2)}){ch}({stack.pop()})") % 3))  # noqa: S307
    assert len(stack) == 1, prefix
    return sum(not ch.isdigit() for ch in prefix), stack[0]


def _binding_value(prefix: str) -> tuple[int, str]:
    env: dict[str, str] = {}
    for line in prefix.split(" "):
        var, rhs = line.split("=")
        env[var] = rhs
    var, depth = prefix.split(" ")[-1].split("=")[0], 0
    while not var.isdigit():
        var, depth = env[var], depth + 1
    return depth, var


def _tail_path(prefix: str) -> list[str]:
    """The letters visited from the last cell of a ladder_tail prefix to its tail, links followed one by one."""
    cells = prefix.removeprefix("tail ").split(" ")
    i, path = len(cells) - 1, []
    while int(cells[i][1]):
        i -= int(cells[i][1])
        assert i >= 0, prefix
        path.append(cells[i][0])
    return path


def _tail_value(prefix: str) -> tuple[int, str]:
    path = _tail_path(prefix)
    return len(path), path[-1]


def _ladder_tasks(name: str):
    """The environment and its tasks at D = 1..5, 20 seeds each."""
    from environments.registry import get_env

    env = get_env(name)
    return env, [env.generate(seed, D) for D in range(1, 6) for seed in range(20)]


@pytest.mark.parametrize("name,solve", [("ladder_automaton", _automaton_value), ("ladder_nested", _nested_value),
                                        ("ladder_binding", _binding_value), ("ladder_tail", _tail_value)])
def test_dense_targets_are_what_the_prompt_prefix_determines(name, solve):
    """Each (end, depth, value) is recomputed from prompt[:end] alone: a causal model can hold it there."""
    env, tasks = _ladder_tasks(name)
    for task in tasks:
        D, dense = task.difficulty, env.dense_targets(task)
        assert len(dense) >= D and max(d for _, d, _ in dense) == D
        for end, depth, value in dense:
            assert solve(task.prompt[:end]) == (depth, value), (task.prompt, end)
        chain_end = max(e for e, d, v in dense if d == D and v == task.answer)
        assert chain_end < len(task.prompt)  # the answer's last step is laid out before the query


def _automaton_partial(prefix: str, loop: int) -> str:
    """Name of the map that the last loop + 1 moves of `prefix` make (p -> p + b: "abcde"[b]; p -> b - p: "fghij"[b])."""
    from environments.ladder.automaton import MOVES

    moves = prefix.split(" ")[-1][-(loop + 1):]
    table = []
    for p in range(5):
        for m in moves:
            p = MOVES[m](p)
        table.append(p)
    names = [n for b in range(5) for n, f in (("abcde"[b], lambda p, b=b: (p + b) % 5),
                                               ("fghij"[b], lambda p, b=b: (b - p) % 5)) if [f(p) for p in range(5)] == table]
    assert len(names) == 1, (prefix, table)
    return names[0]


def _binding_partial(prefix: str, loop: int) -> str:
    """The variable the last line of `prefix` reaches after `loop` look-ups."""
    env = dict(line.split("=") for line in prefix.split(" "))
    var = prefix.split(" ")[-1].split("=")[0]
    for _ in range(loop):
        var = env[var]
    return var


def _nested_partial(prefix: str, loop: int) -> str:
    """Name of the map x -> a*x + c mod 3 that the last `loop` operations of `prefix` make ("a".."f": 3*(a-1) + c)."""
    import re

    ops = re.findall(r"(\d)([-+*])", prefix[1:])[-loop:]
    table = []
    for x in range(3):
        for b, op in ops:
            x = eval(f"{x}{op}{b}") % 3  # noqa: S307 (our own generator's text)
        table.append(x)
    names = ["abcdef"[3 * (a - 1) + c] for a in range(1, 3) for c in range(3) if [(a * x + c) % 3 for x in range(3)] == table]
    assert len(names) == 1, (prefix, table)
    return names[0]


def _tail_partial(prefix: str, loop: int) -> str:
    """The letter `loop` links back from the last cell of `prefix`."""
    return _tail_path(prefix)[loop - 1]


@pytest.mark.parametrize("name,solve", [("ladder_automaton", _automaton_partial), ("ladder_binding", _binding_partial),
                                        ("ladder_nested", _nested_partial), ("ladder_tail", _tail_partial)])
def test_partial_targets_are_the_chain_rule_applied_loop_times(name, solve):
    """Below each dense target's depth, every loop gets one partial target there, recomputed from prompt[:end]."""
    env, tasks = _ladder_tasks(name)
    for task in tasks:
        dense, partial = env.dense_targets(task), env.partial_targets(task)
        assert sorted((e, i) for e, i, _ in partial) == sorted((e, i) for e, d, _ in dense for i in range(1, d))
        for end, loop, value in partial:
            assert solve(task.prompt[:end], loop) == value, (task.prompt, end, loop)
            if env.partial_alphabet:  # a map or a variable of its own alphabet, never a value the answer could be
                assert value not in env.alphabet and value in env.partial_alphabet  # (a tail's are cells, like its answer)


def _check_dense_rows(codec, doc, K=4, partial=False):
    from elr_rl.train.data import tokenize_document
    from elr_rl.train.labels import IGNORE_INDEX
    from elr_rl.train.loopwise import DENSE_MARK, dense_target_rows

    ids, mask = tokenize_document(doc, codec, "sft")
    rows = dense_target_rows(doc, ids, codec, K, partial)
    assert rows is not None and len(rows) == K
    head = codec.render_prompt(doc.prompt, doc.system)
    at = head.rfind(doc.prompt)
    tok = codec.tokenizer
    # token t has read prompt[:e] when the text of ids[:t+1] reaches it (and ids[:t] does not)
    first = {e: next(t for t in range(len(ids)) if len(tok.decode(ids[: t + 1])) >= at + e)
             for e, _, _ in doc.dense_targets + doc.partial_targets}
    for i, row in enumerate(rows, start=1):
        resp = [r for r, m in zip(row, mask) if m]
        assert resp == ([x for x, m in zip(ids, mask) if m] if i >= doc.steps else [IGNORE_INDEX] * len(resp))
        marks = {t - 1: tok.decode([DENSE_MARK - r]) for t, r in enumerate(row) if r <= DENSE_MARK}
        want = {}
        applies = [(e, v) for e, d, v in doc.dense_targets if d <= i]
        applies += [(e, v) for e, j, v in doc.partial_targets if partial and j == i]
        for e, v in sorted(applies):  # a token holding several steps targets the last one this loop can know
            want[first[e]] = v
        assert marks == want, (doc.prompt, i)
        assert not any(mask[t + 1] for t in marks)  # prompt positions only


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
@pytest.mark.parametrize("partial", [False, True])
def test_dense_rows_put_each_target_on_the_first_token_that_has_read_it(tokenizer, partial, tmp_path):
    from elr_rl.model.bpe import train_bpe
    from elr_rl.text import TextCodec
    from elr_rl.train.config import DataConfig
    from elr_rl.train.corpus import build_source

    cfg = DataConfig(generators=["env:ladder_automaton", "env:ladder_binding", "env:ladder_nested"],
                     min_difficulty=1, max_difficulty=4, seq_len=128)
    source = build_source(cfg, "sft")
    docs = [source.document(i) for i in range(24)]
    if tokenizer == "byte":
        codec = TextCodec.byte_level()
    else:  # merges across the prompt's characters: positions come from the tokenizer, not from bytes
        train_bpe([d.prompt + " " + d.response for d in (source.document(i) for i in range(600))], tmp_path, 400)
        codec = TextCodec.load(tmp_path)
        assert sum(len(codec.encode_text(d.prompt)) for d in docs) < 0.8 * sum(len(d.prompt) for d in docs)
    for doc in docs:
        assert doc.dense_targets and doc.steps >= 1
        _check_dense_rows(codec, doc, partial=partial)


@pytest.mark.parametrize("partial", [False, True])
def test_packer_places_dense_targets_and_the_loss_covers_every_loop(partial):
    from elr_rl.text import TextCodec
    from elr_rl.train.config import DataConfig
    from elr_rl.train.corpus import build_source
    from elr_rl.train.data import IGNORE_INDEX, Packer

    codec = TextCodec.byte_level()
    cfg = DataConfig(generators=["env:ladder_nested"], min_difficulty=3, max_difficulty=3, seq_len=128)
    source = build_source(cfg, "sft")
    packer = Packer(source, codec, 128, "sft", loop_targets=4, dense_targets=True, partial_targets=partial)
    batch = packer.next_batch(2)
    rows, labels = batch["loop_labels"], batch["labels"]
    answer = labels != IGNORE_INDEX
    assert bool((rows[:, 0][answer] == IGNORE_INDEX).all()) and bool((rows[:, 1][answer] == IGNORE_INDEX).all())
    assert torch.equal(rows[:, 2][answer], labels[answer]) and torch.equal(rows[:, 3][answer], labels[answer])
    prompt_targets = [int(((rows[:, i] != IGNORE_INDEX) & ~answer).sum()) for i in range(4)]
    docs = sum(len(set(batch["segment_ids"][b][answer[b]].tolist())) for b in range(2))  # documents packed
    if partial:  # every level's operator has a target at every loop: its map below its depth, its value from there
        assert prompt_targets == [3 * docs] * 4
    else:
        assert prompt_targets == [docs, 2 * docs, 3 * docs, 3 * docs]  # one more level's value per loop, then all
    z = [torch.randn(2, 128, codec.vocab_size, requires_grad=True) for _ in range(4)]
    total, main = loop_aux_loss(z, batch, 0.5, dense=True)
    ce = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)  # noqa: E731
    assert torch.allclose(total, main + 0.5 * sum(ce(z[i], rows[:, i]) for i in range(4)) / 4)


@pytest.mark.parametrize("targets", ["dense", "chain"])
def test_dense_targets_are_refused_outside_sft(targets):
    from elr_rl.train.config import TrainConfig

    cfg = TrainConfig(stage="pretrain")
    cfg.loop_aux = LoopAuxConfig(weight=1.0, targets=targets)
    with pytest.raises(ValueError, match="loop_aux.targets"):
        cfg.validate()
    cfg.stage = "sft"
    cfg.validate()


@pytest.mark.parametrize("dense", [False, True])
def test_packer_counts_documents_that_have_no_loop_targets(dense):
    """Per-loop targets asked for, a document without them keeps its own on every loop, and is counted."""
    from elr_rl.text import TextCodec
    from elr_rl.train.config import DataConfig
    from elr_rl.train.corpus import build_source
    from elr_rl.train.data import Packer

    codec = TextCodec.byte_level()
    gens = ["env:ladder_automaton", "env:ladder_pointer", "env:even_odd"]
    source = build_source(DataConfig(generators=gens, min_difficulty=1, max_difficulty=2, seq_len=256), "sft")
    packer = Packer(source, codec, 256, "sft", loop_targets=4, dense_targets=dense)
    packer.next_batch(4)
    kept = packer.kept
    assert kept["env:ladder_automaton"] and kept["env:even_odd"] and kept["env:ladder_pointer"]
    no_targets = {"env:even_odd": kept["env:even_odd"]}
    if dense:  # the pointer task lays no chain out in its prompt
        no_targets["env:ladder_pointer"] = kept["env:ladder_pointer"]
    assert dict(packer.own_targets) == no_targets
    assert packer.state_dict()["own_targets"] == no_targets


def test_preflight_shows_which_documents_carry_loop_targets_and_how_many_dense_ones():
    from elr_rl.text import TextCodec
    from elr_rl.train.config import DataConfig
    from elr_rl.train.corpus import build_source
    from elr_rl.train.data import IGNORE_INDEX, Packer, preflight

    codec = TextCodec.byte_level()
    gens = ["env:ladder_automaton", "env:ladder_pointer", "env:even_odd"]
    source = build_source(DataConfig(generators=gens, min_difficulty=1, max_difficulty=3, seq_len=128), "sft")
    reports = {r.source: r for r in preflight(source, codec, 128, "sft", n=32, loop_targets=4, dense_targets=True)}
    assert reports["env:ladder_automaton"].loop_targets == 1.0
    assert reports["env:ladder_pointer"].loop_targets == 0.0 and reports["env:even_odd"].loop_targets == 0.0
    assert reports["env:ladder_pointer"].dense_per_sequence == 0.0
    assert "100% with per-loop targets" in reports["env:ladder_automaton"].line()
    plain = {r.source: r for r in preflight(source, codec, 128, "sft", n=32)}
    assert plain["env:even_odd"].loop_targets is None and "per-loop" not in plain["env:even_odd"].line()
    # the estimate matches what the packer places (one source: every sequence is automaton documents)
    alone = build_source(DataConfig(generators=["env:ladder_automaton"], min_difficulty=1, max_difficulty=3), "sft")
    est = preflight(alone, codec, 128, "sft", n=64, loop_targets=4, dense_targets=True)[0].dense_per_sequence
    batch = Packer(alone, codec, 128, "sft", loop_targets=4, dense_targets=True).next_batch(16)
    placed = ((batch["loop_labels"][:, 3] != IGNORE_INDEX) & (batch["labels"] == IGNORE_INDEX)).sum().item() / 16
    assert est > 3 and abs(est - placed) / placed < 0.25, (est, placed)
    # chain targets: the partial ones are counted apart, as the packer places them over loops 1..K-1
    rep = preflight(alone, codec, 128, "sft", n=64, loop_targets=4, dense_targets=True, partial_targets=True)[0]
    batch = Packer(alone, codec, 128, "sft", loop_targets=4, dense_targets=True, partial_targets=True).next_batch(16)
    prompt = batch["labels"] == IGNORE_INDEX
    marks = sum(((batch["loop_labels"][:, i] != IGNORE_INDEX) & prompt).sum().item() for i in range(4)) / 16
    dense_marks = sum(((Packer(alone, codec, 128, "sft", loop_targets=4, dense_targets=True).next_batch(16)
                        ["loop_labels"][:, i] != IGNORE_INDEX) & prompt).sum().item() for i in range(4)) / 16
    assert rep.partial_per_sequence > 1 and "partial ones over the shallower loops" in rep.line()
    assert abs(rep.partial_per_sequence - (marks - dense_marks)) / (marks - dense_marks) < 0.25


def test_a_prompt_holding_control_token_text_places_no_dense_targets():
    from types import SimpleNamespace

    from elr_rl.text import TextCodec
    from elr_rl.train.loopwise import prompt_positions

    codec = TextCodec.byte_level()
    plain = SimpleNamespace(prompt="a=1; b=a", system=None)
    assert prompt_positions(codec, plain, [3, 8]) is not None
    # the codec keeps `<|eos|>` as bytes, so prefixes of the rendering (which parse it) would misplace targets
    assert prompt_positions(codec, SimpleNamespace(prompt="a=1<|eos|>; b=a", system=None), [3, 15]) is None
