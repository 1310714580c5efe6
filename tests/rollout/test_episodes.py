"""Multi-turn episodes are token in / token out, with environment text masked out of the loss."""

from __future__ import annotations

from dataclasses import dataclass

from elr_rl.model.tokenizer import SEP_ID, encode_prompt
from elr_rl.rollout.episodes import play_episodes
from environments.registry import get_env


@dataclass
class Turn:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


def test_episode_transcript_is_exact_and_env_tokens_are_masked():
    env = get_env("interactive_deduction")
    task = env.generate(0, 1)
    turns = env.reference_turns(task)  # a scripted policy that solves the task
    prompt = encode_prompt(task.prompt)
    seen_contexts = []

    def generate(contexts):
        out = []
        for ctx in contexts:
            seen_contexts.append(list(ctx))
            n_model_turns = ctx.count(SEP_ID) - 1  # the prompt ends in one <|sep|>, each observation in one
            text = turns[n_model_turns]
            out.append(Turn(list(text.encode()), [-0.5] * len(text.encode())))
        return out

    first = Turn(list(turns[0].encode()), [-0.25] * len(turns[0].encode()))
    (ep,) = play_episodes(generate, env, task, prompt, [first])
    assert ep.score.reward == 1.0 and len(ep.turns) == len(turns)
    # every model turn was generated from the exact token transcript so far (no re-tokenisation)
    for ctx in seen_contexts:
        assert ctx[: len(prompt)] == prompt and ctx[len(prompt):] == ep.response_ids[: len(ctx) - len(prompt)]
    model = [t for t, m in zip(ep.response_ids, ep.response_mask) if m]
    assert bytes(model).decode() == "".join(turns)  # the mask keeps exactly the model's bytes
    env_tokens = [lp for lp, m in zip(ep.logprobs, ep.response_mask) if not m]
    assert env_tokens and all(lp == 0.0 for lp in env_tokens)
    assert ep.model_tokens == sum(len(t.encode()) for t in turns)


def test_episode_stops_when_the_context_is_full():
    env = get_env("interactive_deduction")
    task = env.generate(1, 2)
    prompt = encode_prompt(task.prompt)
    guess = list(b"<guess>1</guess>")

    def run(max_context):
        calls = []

        def generate(contexts):
            calls.append(max(len(c) for c in contexts))
            return [Turn(guess, [0.0] * len(guess)) for _ in contexts]

        (ep,) = play_episodes(generate, env, task, prompt, [Turn(guess, [0.0] * len(guess))], max_context)

        return ep, calls

    free, free_calls = run(None)
    limit = len(prompt) + 2 * len(guess) + 120
    capped, capped_calls = run(limit)
    assert len(capped_calls) < len(free_calls)
    assert all(n < limit for n in capped_calls)  # the engine is never asked to extend a full transcript
    assert capped.score is not None and capped.score.reward == 0.0
