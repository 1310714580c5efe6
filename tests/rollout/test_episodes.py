"""Multi-turn episodes are token in / token out, with environment text masked out of the loss."""

from __future__ import annotations

from dataclasses import dataclass

from elr_rl.rollout.episodes import play_episodes
from environments.pool import LocalEpisode
from elr_rl.text import TextCodec
from environments.registry import get_env

CODEC = TextCodec.byte_level()


@dataclass
class Turn:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


def test_episode_transcript_is_exact_and_env_tokens_are_masked():
    env = get_env("interactive_deduction")
    task = env.generate(0, 1)
    turns = env.reference_turns(task)  # a scripted policy that solves the task
    prompt = CODEC.prompt_ids(task.prompt)
    stop = CODEC.stop_token_ids[0]
    seen_contexts = []

    def turn_ids(text: str) -> list[int]:  # a model turn as sampled: its tokens, then the end of the turn
        return CODEC.encode_text(text) + [stop]

    def generate(contexts):
        out = []
        for ctx in contexts:
            seen_contexts.append(list(ctx))
            n_model_turns = ctx.count(stop)  # each model turn so far ended in the stop id
            ids = turn_ids(turns[n_model_turns])
            out.append(Turn(ids, [-0.5] * len(ids)))
        return out

    first = Turn(turn_ids(turns[0]), [-0.25] * len(turn_ids(turns[0])))
    (ep,) = play_episodes(generate, CODEC, [LocalEpisode(env, task)], env.max_turns, prompt, [first])
    assert ep.score.reward == 1.0 and len(ep.turns) == len(turns)
    # every model turn was generated from the exact token transcript so far (no re-tokenisation)
    for ctx in seen_contexts:
        assert ctx[: len(prompt)] == prompt and ctx[len(prompt):] == ep.response_ids[: len(ctx) - len(prompt)]
    model = [t for t, m in zip(ep.response_ids, ep.response_mask) if m]
    assert model == [i for t in turns for i in turn_ids(t)]  # the mask keeps exactly the model's ids
    assert ep.turns == turns  # what the environment saw: each turn's text without its stop id
    env_tokens = [lp for lp, m in zip(ep.logprobs, ep.response_mask) if not m]
    assert env_tokens and all(lp == 0.0 for lp in env_tokens)
    env_text = CODEC.tokenizer.decode([t for t, m in zip(ep.response_ids, ep.response_mask) if not m])
    assert env_text.startswith("tool: ") and env_text.endswith("<|sep|>")  # rendered by the chat template
    assert ep.model_tokens == sum(len(turn_ids(t)) for t in turns)


def test_episode_stops_when_the_context_is_full():
    env = get_env("interactive_deduction")
    task = env.generate(1, 2)
    prompt = CODEC.prompt_ids(task.prompt)
    guess = CODEC.encode_text("<guess>1</guess>") + [CODEC.stop_token_ids[0]]

    def run(max_context):
        calls = []

        def generate(contexts):
            calls.append(max(len(c) for c in contexts))
            return [Turn(guess, [0.0] * len(guess)) for _ in contexts]

        (ep,) = play_episodes(generate, CODEC, [LocalEpisode(env, task)], env.max_turns, prompt,
                              [Turn(guess, [0.0] * len(guess))], max_context)

        return ep, calls

    free, free_calls = run(None)
    limit = len(prompt) + 2 * len(guess) + 120
    capped, capped_calls = run(limit)
    assert len(capped_calls) < len(free_calls)
    assert all(n < limit for n in capped_calls)  # the engine is never asked to extend a full transcript
    assert capped.score is not None and capped.score.reward == 0.0
