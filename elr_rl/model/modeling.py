"""The looped language model in PyTorch (single device; parallelism is applied from outside).

    h_in = InputBlock(embed(x))                      L_in sublayers, once
    s_k  = loop k times over RecurrentBlock          loop.run_loops (update rule, conditioning)
    y    = lm_head(OutputBlock(s_k))                 L_out sublayers, once

Both checkpoint formats (ELR, Dory1.0-4B) build this one module tree; with a
`DoryConfig` its parameter names are exactly the released checkpoint's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.checkpoint
from torch import nn

from elr_rl.model.cache import CachedCore, DenseCore, KVCache, SegmentCore
from elr_rl.model.config import DoryConfig, ElrConfig, LoopSpec, config_from_dict
from elr_rl.model.backbones import make_backbone_variant
from elr_rl.model.layers import AttentionCore
from elr_rl.model.loop import LoopConditioning, make_update_rule, run_loops

Mods = list  # per-sublayer loop.Modulation (ELR eq. 4) or None


class Backbone(nn.Module):
    checkpoint_sublayers: bool = False
    """Activation checkpointing (a training setting, not saved with the model): while gradients are
    recorded, each sublayer keeps only its input for the backward pass, which runs the sublayer again.
    Memory then grows by one [T, d] state per sublayer executed (k x the recurrent ones) instead of
    every intermediate of each; the price is a second forward of each sublayer. Set by the training
    engine (engine.activation_checkpointing)."""

    def __init__(self, spec: LoopSpec) -> None:
        super().__init__()
        self.spec = spec
        self.variant = make_backbone_variant(spec.backbone)  # prenorm or nGPT: sublayers, final norm, head
        self.embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(self.variant.sublayer(spec, i) for i in range(spec.num_sublayers))
        self.update = make_update_rule(spec.update_rule, spec.hidden_size)
        # Conditioning heads: recurrent sublayers first, then output sublayers.
        self.loop_cond = (
            LoopConditioning(spec.hidden_size, spec.n_rec + spec.n_out, spec.max_loops)
            if spec.loop_conditioning
            else None
        )
        self.final_norm = self.variant.final_norm(spec)

    def _sublayer(self, layer: nn.Module, *args) -> torch.Tensor:
        if self.checkpoint_sublayers and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _mods(self, i: int, k: int, heads: range) -> Mods:
        if self.loop_cond is None:
            return [None] * len(heads)
        return self.loop_cond(i, k, heads)

    def forward(
        self,
        h: torch.Tensor,  # [..., T, d] embeddings
        positions: torch.Tensor,  # [..., T]
        core: AttentionCore,
        k: int,
        readouts: bool = False,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Hidden states after the output block [..., T, d]; with `readouts`, one per loop 1..k; with
        `rows` ([N] indices into the flattened positions), only those positions' [1, N, d]."""
        s = self.spec
        n_in, n_rec = s.n_in, s.n_rec
        for layer in self.layers[:n_in]:
            h = self._sublayer(layer, h, positions, core, 0)
        h_in = h

        def recurrent_block(x: torch.Tensor, i: int) -> torch.Tensor:
            mods = self._mods(i, k, range(0, n_rec))  # c_i = MLP([phi(i/k); phi(k/K)])
            for j, layer in enumerate(self.layers[n_in : n_in + n_rec]):
                x = self._sublayer(layer, x, positions, core, i - 1, mods[j])
            return x

        states: list[torch.Tensor] = []
        on_state = (lambda i, st: states.append(st)) if readouts else None
        h = run_loops(h_in, k, recurrent_block, self.update, s.initial_state, s.truncated_backprop, on_state)
        if readouts:  # the output block on every loop's state, as a model stopping at loop i would run it
            return [self.output_block(st, positions, core, i, rows) for i, st in enumerate(states, start=1)]
        return self.output_block(h, positions, core, k, rows)

    def output_block(self, h: torch.Tensor, positions: torch.Tensor, core: AttentionCore, k: int,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
        """The output sublayers (conditioned as at loop k of k) and the final norm.

        `rows`: only these positions (indices into the flattened [..., T]) leave the block. Every
        sublayer after the block's last attention works on each position alone, so from there on
        only those rows are computed: a GRPO row's shared prompt, whose logits train nothing but
        its last token, skips the output block's last MLP, the final norm and the head."""
        s = self.spec
        first = s.n_in + s.n_rec
        out_mods = self._mods(k, k, range(s.n_rec, s.n_rec + s.n_out))
        attention = [j for j in range(s.n_out) if s.is_attention(first + j)]
        cut = attention[-1] + 1 if attention else 0  # sublayers from `cut` on are position-wise
        for j, layer in enumerate(self.layers[first:]):
            if j == cut and rows is not None:
                h, positions = _select_rows(h, rows), _select_rows(positions, rows)
            h = self._sublayer(layer, h, positions, core, 0, out_mods[j])
        if cut == s.n_out and rows is not None:
            h = _select_rows(h, rows)
        return self.final_norm(h) if self.final_norm is not None else h


def _select_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[..., T, (d)] -> [1, N, (d)]: the positions `rows` of the flattened leading dims."""
    lead = x.dim() if x.dtype in (torch.long, torch.int) else x.dim() - 1
    flat = x.reshape(-1, *x.shape[lead:])
    return flat.index_select(0, rows.reshape(-1)).unsqueeze(0)


@dataclass
class Generation:
    """What `LoopedForCausalLM.generate` returns, whatever was asked for."""

    tokens: torch.Tensor
    """[B, T + n]: the prompts, then the n sampled tokens (a finished row repeats its first stop id)."""
    logprobs: torch.Tensor
    """[B, n] float32: each sampled token's raw logprob (before temperature, like vLLM's raw_logprobs)."""
    finished: torch.Tensor
    """[B] bool: the row sampled a stop id (False: it ran to max_new_tokens, or no stop ids were given)."""
    cache: KVCache
    """The KV cache after the last step (its length counts every token fed to the model)."""
    prompt_len: int
    """T, the prompts' length."""

    @property
    def new_tokens(self) -> torch.Tensor:
        """[B, n]: the sampled tokens only."""
        return self.tokens[:, self.prompt_len :]


def _left_pad(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor | None:
    """[B] left-pad counts of a 0...01...1 attention mask (ValueError for any other shape of mask)."""
    if attention_mask is None:
        return None
    mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}: "
                         "give one 0/1 entry per token")
    pad = (mask == 0).sum(-1)
    left = torch.arange(mask.shape[1], device=mask.device)[None] >= pad[:, None]
    if not torch.equal(mask.bool(), left) or bool((pad == mask.shape[1]).any()):
        raise ValueError("attention_mask must be left padding (0s, then 1s) with at least one prompt token per "
                         "row: pad prompts on the left")
    return pad


class LoopedForCausalLM(nn.Module):
    """A looped causal LM; one checkpoint serves any loop count k in 1..K."""

    def __init__(self, config: ElrConfig | DoryConfig) -> None:
        super().__init__()
        self.config = config
        self.spec = config.loop_spec()
        self.backbone = Backbone(self.spec)
        self.lm_head = self.backbone.variant.lm_head(self.spec)
        self.reset_parameters()

    # ---------------------------------------------------------------- parameters
    def reset_parameters(self) -> None:
        std = self.spec.init_std
        for name, p in self.named_parameters():
            if name.endswith(".weight") and p.dim() == 2 and ".loop_cond." not in name and ".update." not in name:
                nn.init.normal_(p, 0.0, std)
        if self.backbone.loop_cond is not None:
            self.backbone.loop_cond.reset_heads()
        self.normalize_weights_()

    @torch.no_grad()
    def normalize_weights_(self) -> None:
        """Put the weights back where the backbone keeps them (nGPT: on the unit sphere; prenorm: nothing).
        Call after every optimizer step."""
        self.backbone.variant.normalize_weights_(self)

    def reset_loop_conditioning_(self) -> None:
        """Zero-init the conditioning heads (delayed mixed depth's switch): the function is unchanged."""
        if self.backbone.loop_cond is not None:
            self.backbone.loop_cond.reset_heads()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------- forward
    def _check_k(self, k: int | None) -> int:
        k = self.spec.num_loops if k is None else int(k)
        if not 1 <= k <= self.spec.max_loops:
            raise ValueError(f"loop count k={k} is outside 1..{self.spec.max_loops} (max_loops): pick k in that range")
        return k

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        k: int | None = None,
        positions: torch.Tensor | None = None,  # [B, T]; reset per packed document
        segment_ids: torch.Tensor | None = None,  # [B, T]; attention never crosses documents
        loop_readouts: bool = False,
        parent_ids: torch.Tensor | None = None,  # [B, T]; a segment also sees its parent segment (shared prompts)
        logit_rows: torch.Tensor | None = None,  # [N] (or [1, N]) indices into the flattened [B * T] positions
    ) -> torch.Tensor | list[torch.Tensor]:
        """Teacher-forced logits [B, T, V] (float32) at loop count k.

        With `parent_ids` (and `segment_ids`), attention runs per segment (`SegmentCore`): a
        completion packed after its group's one copy of the prompt sees it as if it were its own.

        With `loop_readouts`, one pass of k loops returns k logits tensors: the output block and
        head applied to the state after each loop (the last one is the plain forward's logits).
        Without loop conditioning, readout i equals the model run at k = i.

        With `logit_rows`, the logits are [1, N, V]: those positions' only, in that order (the same
        values as the full logits' rows), and the work after the output block's last attention is
        done for them alone (`Backbone.output_block`).
        """
        k = self._check_k(k)
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
        if parent_ids is not None:
            if segment_ids is None:
                raise ValueError("parent_ids needs segment_ids: which segment each token belongs to")
            core = SegmentCore(positions, segment_ids, parent_ids)
        else:
            core = DenseCore(positions, segment_ids)
        if logit_rows is not None:
            logit_rows = logit_rows.reshape(-1)
            n = input_ids.numel()
            if logit_rows.numel() == 0 or int(logit_rows.min()) < 0 or int(logit_rows.max()) >= n:
                raise ValueError(f"logit_rows must be one or more indices into the {n} positions of input_ids, "
                                 f"got {logit_rows.numel()} in [{int(logit_rows.min()) if logit_rows.numel() else '-'}, "
                                 f"{int(logit_rows.max()) if logit_rows.numel() else '-'}]")
        h = self.backbone(self.backbone.embeddings(input_ids), positions, core, k, readouts=loop_readouts,
                          rows=logit_rows)
        return [self.lm_head(x) for x in h] if loop_readouts else self.lm_head(h)

    def token_logprobs(self, input_ids: torch.Tensor, k: int | None = None, **kw) -> torch.Tensor:
        """log p(x_{t+1} | x_<=t) for every position: [B, T-1]."""
        logits = self(input_ids, k=k, **kw)[:, :-1]
        return logits.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    @torch.no_grad()
    def decode_logprobs(self, prompt: list[int], completion: list[int], k: int | None = None,
                        cache_mode: str | None = None) -> torch.Tensor:
        """log p(completion[j] | ...) as the KV-cached decoder computes it: the prompt prefilled in one
        step, then each completion token fed back, as `generate` does in `cache_mode`.

        In per_loop mode this equals teacher forcing; in last_loop mode it is the sampler's own
        distribution (what vLLM's last_loop rollouts report), which teacher forcing does not give.
        Returns [len(completion)].
        """
        k = self._check_k(k)
        device = self.lm_head.weight.device
        cache = KVCache(cache_mode or self.spec.kv_cache_mode)
        ids = torch.tensor([list(prompt) + list(completion)], device=device)
        logits = [self._cached_step(ids[:, : len(prompt)], cache, k)[0, -1:]]
        for t in range(len(prompt), ids.shape[1] - 1):
            logits.append(self._cached_step(ids[:, t : t + 1], cache, k)[0])
        logp = torch.cat(logits).float().log_softmax(-1)  # row j predicts completion[j]
        return logp.gather(-1, torch.tensor(list(completion), device=device)[:, None])[:, 0]

    # ---------------------------------------------------------------- generation
    def _cached_step(self, chunk: torch.Tensor, cache: KVCache, k: int) -> torch.Tensor:
        positions = cache.positions(chunk.shape[1], chunk.device).expand_as(chunk)
        h = self.backbone(self.backbone.embeddings(chunk), positions, CachedCore(cache), k)
        cache.advance(chunk.shape[1])
        return self.lm_head(h)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,  # [B, T]: prompts, left-padded to one length when attention_mask is given
        max_new_tokens: int,
        k: int | None = None,
        cache_mode: str | None = None,
        temperature: float = 0.0,
        eos_token_id: int | list[int] | tuple[int, ...] | None = None,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, T]: 0 on the left pads, 1 on the prompt
    ) -> Generation:
        """KV-cached sampling (greedy at temperature 0): tokens, their raw logprobs, which rows
        stopped, and the cache (see `Generation`). Prompts of different lengths go in left-padded
        with `attention_mask`: each row then samples as it would alone (pads unseen, positions
        counted from its first prompt token)."""
        k = self._check_k(k)
        cache = KVCache(cache_mode or self.spec.kv_cache_mode, left_pad=_left_pad(attention_mask, input_ids))
        stops = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
        stop_t = torch.tensor(stops, dtype=torch.long, device=input_ids.device)
        tokens, logprobs = input_ids, []
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        logits = self._cached_step(input_ids, cache, k)
        for step in range(max_new_tokens):
            last = logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(last / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                nxt = last.argmax(-1)
            if eos_token_id is not None:  # finished rows repeat their first stop id
                nxt = torch.where(done, torch.full_like(nxt, stops[0]), nxt)
            logprobs.append(last.log_softmax(-1).gather(-1, nxt[:, None]).squeeze(-1))
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if eos_token_id is not None:
                done |= torch.isin(nxt, stop_t)
                if bool(done.all()):
                    break
            if step + 1 < max_new_tokens:
                logits = self._cached_step(nxt[:, None], cache, k)
        lps = torch.stack(logprobs, dim=1) if logprobs else tokens.new_zeros(tokens.shape[0], 0).float()
        return Generation(tokens, lps, done, cache, input_ids.shape[1])

    # ------------------------------------------------------------------ save/load
    def save_pretrained(self, path: str | Path) -> None:
        """config.json + model.safetensors (Hugging Face layout)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(path)
        state = {n: t.detach().contiguous().cpu() for n, t in self.state_dict().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None) -> "LoopedForCausalLM":
        from elr_rl.model.safetensors_check import load_checkpoint_weights

        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ValueError(f"{str(path)!r} is not a checkpoint folder: it has no config.json")
        config = config_from_dict(json.loads(cfg_file.read_text()))
        with torch.device("meta"):
            model = cls(config)
        state = load_checkpoint_weights(path)  # model.safetensors or its shards; a truncated copy: one clear line
        expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        wrong = sorted(n for n in expected.keys() & state.keys() if tuple(state[n].shape) != expected[n])
        if missing or unexpected or wrong:
            raise ValueError(
                f"checkpoint {str(path)!r} does not match its config: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}, wrong shapes {wrong[:5]}"
            )
        model.load_state_dict(state, assign=True)
        # Non-persistent buffers (RoPE frequencies) were created on meta: rebuild them.
        model._rebuild_buffers()
        return model.to(dtype) if dtype is not None else model

    def _rebuild_buffers(self) -> None:
        from elr_rl.model.layers import Rotary

        for mod in self.modules():
            if isinstance(mod, Rotary):
                mod.reset_buffers()
