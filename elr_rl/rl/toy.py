"""A tiny checkpoint that has learned an environment's answer format but not its answers.

Used by the RL tests, the RL benchmark and the quickstart's smoke checks: a
few hundred SFT steps on reference answers whose *content is randomised*
(each prompt is shown with its right and a wrong answer) teach the format and
leave every prompt at a coin flip, so every GRPO group carries signal.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch


def format_sft_checkpoint(out_dir: str | Path, env_name: str = "even_odd", difficulty: int = 1, steps: int = 150,
                          seed: int = 0, random_answers: bool = True, warm_steps: int = 0,
                          **model_overrides) -> Path:
    """Train a tiny ElrConfig model on `<prompt> -> reference answer` records and save it (HF layout).

    `steps` of format training (right and wrong answers side by side when random_answers),
    then `warm_steps` on right answers only: a policy a little better than chance, which
    RL then has to sharpen.
    """
    from elr_rl.model import ElrConfig, LoopedForCausalLM, save_tokenizer
    from elr_rl.text import TextCodec
    from environments.registry import get_env

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(out)
    codec = TextCodec.load(out)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    env = get_env(env_name)
    model = LoopedForCausalLM(ElrConfig.tiny(**model_overrides))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps + warm_steps):
        rows = []
        for _ in range(8):
            task = env.generate(rng.randrange(10**6), difficulty)
            answers = [env.reference_solution(task)]
            if random_answers and step < steps:  # right and wrong side by side: the best fit is a coin flip per prompt
                answers.append(env.bad_answers(task)[0])
            for answer in answers:
                x, m = codec.sft_ids(task.prompt, answer)
                rows.append((x, [int(b) for b in m]))
        T = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), T), codec.pad_token_id)
        mask = torch.zeros(len(rows), T)
        for i, (x, m) in enumerate(rows):
            ids[i, : len(x)], mask[i, : len(m)] = torch.tensor(x), torch.tensor(m, dtype=torch.float32)
        k = rng.randint(1, model.spec.max_loops)  # mixed depth: any k serves the format
        logp = model.token_logprobs(ids, k=k)
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    return out
