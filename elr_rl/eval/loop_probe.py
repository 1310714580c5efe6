"""Where depth stops: teacher-forced readout accuracy after every loop of one K-loop pass.

`elr-rl eval CHECKPOINT --loop-probe` renders held-out tasks as SFT documents (prompt plus
the reference response), runs the model once with K loops and reads out after each loop
(the output block and head on loop i's state; with `loop_conditioning` off this is exactly
the model at k = i). Per environment and difficulty it reports, for every loop i:

* `answer`: the share of tasks whose whole reference response is the argmax at every
  response token given the tokens before it (teacher forcing);
* `step s` (ladder environments): the share of dense targets of depth s (the value the
  prompt up to that token gives after s serial steps, `Task.hidden["dense"]`) that loop i
  reads out at their prompt token, for i >= s (the loss of `loop_aux.targets=dense` asks
  nothing of shallower loops, so they are not scored);
* `partial` (ladder environments that record them): the share of partial targets of loop i
  (below a dense target's depth, what applying the chain's rule i times gives at that
  token, `Task.hidden["partial"]`; trained by `loop_aux.targets=chain`) that loop i reads out.

A row such as `step 3: -, -, 0.45, 0.47` says the loops carry out two steps and not a
third: the accuracy of deeper loops on the answer cannot rise above what the steps give.
This runs the PyTorch model on the CPU (or `device`), not vLLM: it needs the per-loop states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ProbeRow:
    env: str
    difficulty: int
    target: str  # "answer" or "step s"
    hits: list[int]  # per loop 1..K
    counts: list[int]  # per loop (0: not scored at that loop)
    unplaced: int = 0  # (answer rows) dense targets that sit on no single token of this tokenizer: not scored

    def accuracy(self) -> list[float | None]:
        return [h / c if c else None for h, c in zip(self.hits, self.counts)]

    def as_dict(self) -> dict:
        return {"env": self.env, "difficulty": self.difficulty, "target": self.target,
                "accuracy": self.accuracy(), "count": max(self.counts), "unplaced_dense_targets": self.unplaced}


@dataclass
class _Doc:
    ids: list[int]
    answer_at: list[int]  # response token positions t (predicted at t - 1)
    dense: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # token -> [(depth, value id)] by end
    partial: list[tuple[int, int, int]] = field(default_factory=list)  # (token, loop, value id)
    unplaced: int = 0  # dense targets whose value is not one token or whose prompt position was not found


def _encode(doc, codec) -> _Doc:
    from elr_rl.train.data import tokenize_document
    from elr_rl.train.loopwise import prompt_positions

    ids, mask = tokenize_document(doc, codec, "sft")
    out = _Doc(ids, [t for t in range(1, len(ids)) if mask[t]])
    targets = sorted(doc.dense_targets)
    where = prompt_positions(codec, doc, [e for e, _, _ in targets]) if targets else None
    out.unplaced = len(targets) if where is None else 0
    for (_, depth, value), t in zip(targets, where or ()):
        vid = codec.encode_text(value)
        if len(vid) == 1 and 0 <= t < len(ids) - 1:
            out.dense.setdefault(t, []).append((depth, vid[0]))
        else:
            out.unplaced += 1
    partial = sorted(getattr(doc, "partial_targets", ()) or ())
    where = prompt_positions(codec, doc, [e for e, _, _ in partial]) if partial else None
    out.unplaced += len(partial) if where is None else 0
    for (_, loop, value), t in zip(partial, where or ()):
        vid = codec.encode_text(value)
        if len(vid) == 1 and 0 <= t < len(ids) - 1:
            out.partial.append((t, loop, vid[0]))
        else:
            out.unplaced += 1
    return out


def score_readouts(docs: list[_Doc], readouts: list[torch.Tensor], rows: dict, key) -> None:
    """Add one padded batch's per-loop argmax hits to `rows[(key, target)] = [hits, counts]` (K each).

    `readouts[i]` holds loop i+1's logits [B, T, V] for `docs` (right-padded). A token holding several
    dense targets is scored on the last one loop i can know (the `loop_aux` dense rule).
    """
    K = len(readouts)
    preds = [r.argmax(-1) for r in readouts]
    for b, doc in enumerate(docs):
        for i in range(K):
            p = preds[i][b]
            hit = all(int(p[t - 1]) == doc.ids[t] for t in doc.answer_at)
            cell = rows.setdefault((key, "answer"), [[0] * K, [0] * K])
            cell[0][i] += int(hit)
            cell[1][i] += 1
            for t, targets in doc.dense.items():
                known = [(d, v) for d, v in targets if d <= i + 1]
                if not known:
                    continue
                depth, value = known[-1]
                cell = rows.setdefault((key, f"step {depth}"), [[0] * K, [0] * K])
                cell[0][i] += int(int(p[t]) == value)
                cell[1][i] += 1
            for t, loop, value in doc.partial:
                if loop == i + 1:
                    cell = rows.setdefault((key, "partial"), [[0] * K, [0] * K])
                    cell[0][i] += int(int(p[t]) == value)
                    cell[1][i] += 1


def probe(checkpoint: str, envs: list[str], difficulties: list[int], num_tasks: int, seed_offset: int = 100_000,
          loops: int | None = None, batch_size: int = 32, device: str = "cpu", progress: bool = True) -> list[ProbeRow]:
    """Per-loop teacher-forced accuracy (module docstring) for each environment and difficulty."""
    from tqdm import tqdm

    from elr_rl.model.modeling import LoopedForCausalLM
    from elr_rl.text import TextCodec
    from elr_rl.train.corpus import task_document
    from environments.registry import get_env, resolve_envs

    model = LoopedForCausalLM.from_pretrained(checkpoint).to(device).eval()
    K = int(loops or model.config.num_loops)
    if not 1 <= K <= model.config.max_loops:
        raise ValueError(f"--k asks for {K} loops; this checkpoint runs 1..{model.config.max_loops}")
    codec = TextCodec.load(checkpoint)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    rows: dict = {}
    order: list = []
    unplaced: dict = {}
    jobs = [(name, d) for name in resolve_envs(envs) for d in difficulties]
    for name, d in tqdm(jobs, desc="loop probe", disable=not progress):
        env = get_env(name)
        if hasattr(env, "sft_pair"):
            raise ValueError(f"the loop probe generates tasks; {name} is a dataset environment and generates none")
        if not env.min_difficulty <= d <= env.max_difficulty:
            raise ValueError(f"{name} has difficulties {env.min_difficulty}..{env.max_difficulty}; --difficulty {d} is outside")
        docs = [_encode(task_document(env, env.generate(seed=seed_offset + j, difficulty=d)), codec)
                for j in range(num_tasks)]
        for lo in range(0, len(docs), batch_size):
            chunk = docs[lo:lo + batch_size]
            T = max(len(x.ids) for x in chunk)
            ids = torch.full((len(chunk), T), pad, dtype=torch.long)
            for b, x in enumerate(chunk):  # right padding: a causal model's earlier positions never see it
                ids[b, :len(x.ids)] = torch.tensor(x.ids)
            with torch.no_grad():
                readouts = model(ids.to(device), k=K, loop_readouts=True)
            score_readouts(chunk, [r.float().cpu() for r in readouts], rows, (name, d))
        order.append((name, d))
        unplaced[(name, d)] = sum(x.unplaced for x in docs)
    out = []
    for key in order:
        targets = sorted((t for (k, t) in rows if k == key),
                         key=lambda t: (t == "partial", t != "answer", int(t.split()[-1]) if t.startswith("step") else 0))
        out.extend(ProbeRow(key[0], key[1], t, *rows[(key, t)], unplaced=unplaced[key] if t == "answer" else 0)
                   for t in targets)
    return out


def format_probe(rows: list[ProbeRow], title: str) -> str:
    K = len(rows[0].hits) if rows else 0
    head = ["env", "D", "target", *[f"loop {i}" for i in range(1, K + 1)], "n"]
    body = [[r.env, str(r.difficulty), r.target, *["-" if a is None else f"{a:.2f}" for a in r.accuracy()],
             str(max(r.counts))] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    lines += [f"{r.env} D={r.difficulty}: {r.unplaced} dense or partial targets sit on no single token of this tokenizer "
              "(not scored)" for r in rows if r.unplaced]
    return "\n".join(lines)

