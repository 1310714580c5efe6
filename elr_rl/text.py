"""The one text <-> token layer: every stage turns text into token ids (and back) here.

A `TextCodec` is loaded from a checkpoint folder: its tokenizer (`tokenizer.json`,
`tokenizer_config.json`, through `transformers.AutoTokenizer`), its chat template
and the stop ids of `generation_config.json`. Pretraining, SFT, profiling, rollouts,
multi-turn episodes, evaluation and the benchmarks all go through it, so nothing
else in the project knows a token id.

    prompt_ids(p)        chat template over [system?, user p], add_generation_prompt=True
    sft_ids(p, r)        prompt_ids(p) + the assistant turn r; loss mask on the assistant's tokens
                         (through its end-of-turn token), located from the template, not by offsets
    observation_ids(t)   an environment turn t (tool or user message) + the next generation prompt,
                         appended after a model turn's own sampled ids (never re-tokenised)
    decode(ids)          the response text the reward sees: cut at the first stop id, without it

Text inside a message is text: a prompt, a response or a tool's output that contains the
text of a control token (`<|im_end|>`, `<|im_start|>`, the eos...) is encoded as ordinary
characters, so it cannot forge a turn boundary or cut an SFT response at a fake stop id.
Messages without such text encode exactly as `apply_chat_template(..., tokenize=True)` does.

The byte-level tokenizer (`elr_rl.model.tokenizer`) is one tokenizer among others
with a chat template of its own.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_PROBE = "Probe question?"
_PROBE_REPLY = "Probe answer."
_PROBE_TOOL = "Probe observation."
_PROBE_SYSTEM = "Probe system."
_MARKER_BASE = 0x100000  # private-use characters that stand in for control text inside messages (plane 16)
log = logging.getLogger(__name__)


@dataclass
class ChatOptions:
    """How prompts are rendered with the chat template (shared by every stage of a run)."""

    system_prompt: Optional[str] = None
    """A system message put before every prompt (None: none)."""
    thinking: Optional[bool] = None
    """Thinking on/off for templates that have the switch (`enable_thinking`; refused on a template without
    it); None: the template's default."""


class TextCodec:
    """Text <-> token ids for one checkpoint (tokenizer, chat template, stop ids)."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int], options: ChatOptions | None = None,
                 source: str = "<tokenizer>") -> None:
        if not stop_token_ids:
            raise ValueError(f"{source}: no stop token: set `eos_token_id` in generation_config.json "
                             "(or the tokenizer's eos_token)")
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(int(i) for i in dict.fromkeys(stop_token_ids))
        self.options = options = options or ChatOptions()
        self.source = source
        self._template_kwargs: dict[str, Any] = {}
        if options.thinking is not None:
            self._template_kwargs["enable_thinking"] = bool(options.thinking)
        self._system_role = True
        self._check_template()

    # ------------------------------------------------------------------ loading
    @classmethod
    def byte_level(cls, options: ChatOptions | None = None) -> "TextCodec":
        """The project's byte-level tokenizer with its own chat template (tiny local models)."""
        from elr_rl.model.tokenizer import build_tokenizer

        tok = build_tokenizer()
        return cls(tok, [tok.eos_token_id], options, source="byte-level tokenizer")

    @classmethod
    def load(cls, path: str | Path, options: ChatOptions | None = None) -> "TextCodec":
        """The codec of a checkpoint folder; one clear error naming what is missing."""
        from transformers import AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"{str(path)!r} is not a checkpoint folder")
        missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
        if missing:
            raise ValueError(
                f"checkpoint {str(path)!r} has no {' or '.join(missing)}: save the tokenizer into the folder "
                "(tokenizer.save_pretrained(path)), or create the checkpoint with `elr-rl model init` "
                "(byte-level tokenizer) or `elr-rl model init --tokenizer DIR`"
            )
        try:
            tok = AutoTokenizer.from_pretrained(str(path))
        except Exception as exc:  # a corrupt file: say which folder
            raise ValueError(f"{path / 'tokenizer.json'}: the tokenizer does not load ({exc})") from None
        return cls(tok, stop_ids_of(path, tok), options or ChatOptions(), source=str(path))

    def _check_template(self) -> None:
        tpl = getattr(self.tokenizer, "chat_template", None)
        if not tpl:
            raise ValueError(
                f"{self.source}: the tokenizer has no chat template: add `chat_template` to tokenizer_config.json "
                "(or a chat_template.jinja file)"
            )
        try:
            ids = self._render_ids_checked()
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"{self.source}: the chat template cannot render a conversation ({exc}); "
                             "fix `chat_template` in tokenizer_config.json") from None
        if not ids:
            raise ValueError(f"{self.source}: the chat template renders an empty prompt")
        if self.options.thinking is not None and self._thinking_suffix is None:
            raise ValueError(
                f"{self.source}: `chat.thinking: {str(self.options.thinking).lower()}` is set, but the chat template has "
                "no thinking switch (enable_thinking changes nothing it renders); set `chat.thinking: null` "
                "(`rollout.chat.thinking`, `data.chat.thinking`; eval: leave out --thinking)")

    @functools.cached_property
    def _thinking_suffix(self) -> str | None:
        """What thinking off adds to the generation prompt (an empty think block); '' if it removes something
        instead, None where the template ignores `enable_thinking`."""
        msgs = self._messages(_PROBE)
        on, off = (self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                      enable_thinking=v) for v in (True, False))
        if on == off:
            return None
        return off[len(on):] if off.startswith(on) else ""

    @functools.cached_property
    def _think_open(self) -> str | None:
        """The token that opens the empty think block thinking off writes (`<think>`), if it is one token."""
        ids = self.encode_text((self._thinking_suffix or "").lstrip())
        added = {getattr(t, "content", str(t)) for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values()}
        first = self.tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
        return first if first in added else None

    def _render_ids_checked(self) -> list[int]:
        """Probe the template: a plain conversation renders; whether it takes a system message (Gemma's and
        Mistral's raise: the system text then leads the user's message); the token that closes an
        assistant turn is a stop id (a chat template may close turns with a token the generation
        config does not list, e.g. <end_of_turn>)."""
        try:
            self._system_role = _PROBE_SYSTEM in self._render(
                [{"role": "system", "content": _PROBE_SYSTEM}, {"role": "user", "content": _PROBE}], True)
        except Exception:  # noqa: BLE001 - a template that refuses the role
            self._system_role = False
        if not self._system_role:
            log.warning("%s: the chat template has no system role: system prompts lead the user's message",
                        self.source)
        # the stop ids are settled before anything encodes a message: they are control tokens too
        end = self._turn_end_id()
        if end is not None and end not in self.stop_token_ids:
            log.warning("%s: the chat template ends an assistant turn with %r, not a stop id of the generation "
                        "config: added to the stop ids", self.source, self.tokenizer.convert_ids_to_tokens(end))
            self.stop_token_ids = (*self.stop_token_ids, end)
        ids = self.prompt_ids(_PROBE)
        self.sft_ids(_PROBE, _PROBE_REPLY)
        return ids

    def _turn_end_id(self) -> int | None:
        """The first special token the template writes after an assistant message's content, if any."""
        full = self._render([*self._messages(_PROBE), {"role": "assistant", "content": _PROBE_REPLY}], False)
        at = full.rfind(_PROBE_REPLY)
        if at < 0:
            return None
        bos = self.tokenizer.bos_token_id
        return next((t for t in self.encode_text(full[at + len(_PROBE_REPLY):])
                     if t in self._special_ids and t != bos), None)

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        special = {int(i) for i, tok in getattr(self.tokenizer, "added_tokens_decoder", {}).items()
                   if getattr(tok, "special", False)}
        return frozenset(special | {int(i) for i in getattr(self.tokenizer, "all_special_ids", [])})

    def save_pretrained(self, path: str | Path) -> None:
        """Write the tokenizer files and generation_config.json (stop ids) into a checkpoint folder."""
        self.tokenizer.save_pretrained(str(path))
        gen = Path(path) / "generation_config.json"
        cfg = json.loads(gen.read_text()) if gen.is_file() else {}
        ids = list(self.stop_token_ids)
        cfg["eos_token_id"] = ids if len(ids) > 1 else ids[0]
        gen.write_text(json.dumps(cfg, indent=2) + "\n")

    # ------------------------------------------------------------------ control tokens inside messages
    @functools.cached_property
    def _controls(self) -> tuple[str, ...]:
        """The texts of the tokens that structure a conversation: the stop ids, bos/eos/pad/unk and the special
        tokens the template writes around messages (`<|im_start|>`, `<start_of_turn>`...), longest first.
        Special tokens a message may rightly hold as tokens (a response's `<think>` block) are not among them."""
        tok = self.tokenizer
        ids = set(self.stop_token_ids)
        ids |= {int(i) for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                                 getattr(tok, "unk_token_id", None)) if i is not None}
        rendered = self._render(self._messages(_PROBE, _PROBE_SYSTEM), False)
        ids |= {t for t in self.encode_text(rendered) if t in self._special_ids}
        # added tokens only: a pad (or stop) id set to an ordinary token is text the tokenizer splits anyway
        added = self._special_ids | {int(i) for i in getattr(tok, "added_tokens_decoder", {})}
        texts = {s for s in tok.convert_ids_to_tokens(sorted(ids & added)) if isinstance(s, str) and s}
        return tuple(sorted(texts, key=lambda s: (-len(s), s)))

    @functools.cached_property
    def _control_re(self) -> re.Pattern | None:
        return re.compile("|".join(map(re.escape, self._controls))) if self._controls else None

    def _guard(self, contents: Sequence[str]) -> dict[str, str]:
        """{marker: control text} for the control texts written in `contents` (empty in the usual case).

        A marker is a private-use character none of the contents holds: it stands in for the control text
        while the template renders (so a template that edits contents edits them as it would the text), and is
        encoded as that text's ordinary characters. The fixed markers (one per control, from U+100000) are
        the ones `_marker_backend` turns back into text; contents holding one of them get others."""
        found = sorted({m for c in contents if c for m in self._control_re.findall(c)}) if self._control_re else []
        if not found:
            return {}
        used = set("".join(contents))
        if not any(chr(_MARKER_BASE + i) in used for i in range(len(self._controls))):
            return {chr(_MARKER_BASE + self._controls.index(text)): text for text in found}
        base = next(b for b in range(0xF0000, 0xFFFFD - len(found), len(found))
                    if not any(chr(b + i) in used for i in range(len(found))))
        return {chr(base + i): text for i, text in enumerate(found)}

    def _mark(self, text: str, guard: dict[str, str]) -> str:
        if not guard:
            return text
        marker = {t: m for m, t in guard.items()}
        return self._control_re.sub(lambda m: marker[m.group(0)], text)

    @functools.cached_property
    def _marker_backend(self) -> Any:
        """A copy of the fast tokenizer's backend whose normalizer puts each fixed marker's control text back.

        Added tokens are cut out of the raw input before normalisation, so a marker becomes ordinary text
        inside its stretch of the input, tokenised with its neighbours exactly as `split_special_tokens`
        would tokenise it, with the stretch's place in the input (a SentencePiece word prefix only at the
        start) kept. None for slow tokenizers, or where the copy does not encode plain text as the tokenizer
        does."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not self._controls:
            return None
        try:
            from tokenizers import Tokenizer, normalizers

            clone = Tokenizer.from_str(backend.to_str())
            back = [normalizers.Replace(chr(_MARKER_BASE + i), t) for i, t in enumerate(self._controls)]
            clone.normalizer = normalizers.Sequence(back + ([clone.normalizer] if clone.normalizer else []))
            clone.no_truncation()
            clone.no_padding()
            probe = self._render([*self._messages(_PROBE, _PROBE_SYSTEM),
                                  {"role": "assistant", "content": _PROBE_REPLY}], False)
            if clone.encode(probe, add_special_tokens=False).ids != self.encode_text(probe):
                return None
        except Exception:  # noqa: BLE001 - a backend this cannot copy: the piecewise encoding serves
            return None
        return clone

    def _encode_guarded(self, text: str, guard: dict[str, str]) -> list[int]:
        """Ids of rendered text whose markers stand for control text written in a message's content."""
        if not guard:
            return self.encode_text(text)
        backend = self._marker_backend
        if backend is not None and all(ord(m) - _MARKER_BASE < len(self._controls) for m in guard):
            ids = [int(i) for i in backend.encode(text, add_special_tokens=False).ids]
            control_ids = {t for t in self.tokenizer.convert_tokens_to_ids(list(guard.values())) if t is not None}
            template = self.encode_text(re.sub("[" + "".join(guard) + "]", "", text))
            if sum(i in control_ids for i in ids) == sum(i in control_ids for i in template):
                return ids
        # piecewise: each control text alone, as ordinary characters (a slow tokenizer; a SentencePiece word
        # prefix may then come in front of it)
        ids = []
        for piece in re.split("([" + "".join(guard) + "])", text):
            if piece in guard:
                ids += self.tokenizer(guard[piece], add_special_tokens=False, split_special_tokens=True)["input_ids"]
            elif piece:
                ids += self.encode_text(piece)
        return [int(i) for i in ids]

    # ------------------------------------------------------------------ rendering
    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.stop_token_ids[0])

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def _messages(self, prompt: str, system: str | None = None) -> list[dict[str, str]]:
        """[system?, user]: a task's own system message (a dataset's) wins over the run's system_prompt."""
        sys = system or self.options.system_prompt
        if sys and not self._system_role:  # the template has no system role: the text leads the user's turn
            return [{"role": "user", "content": f"{sys}\n\n{prompt}"}]
        return ([{"role": "system", "content": sys}] if sys else []) + [{"role": "user", "content": prompt}]

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **self._template_kwargs)

    def encode_text(self, text: str) -> list[int]:
        """Ids of rendered text (special tokens written in it are parsed as such, no bos/eos added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_prompt(self, prompt: str, system: str | None = None) -> str:
        """The chat-rendered prompt text (what `prompt_ids` encodes)."""
        return self._render(self._messages(prompt, system), True)

    def prompt_ids(self, prompt: str, system: str | None = None) -> list[int]:
        """The prompt rendered as a conversation, ending where the model's turn starts."""
        msgs = self._messages(prompt, system)
        guard = self._guard([m["content"] for m in msgs])
        marked = [{**m, "content": self._mark(m["content"], guard)} for m in msgs]
        return self._encode_guarded(self._render(marked, True), guard)

    def sft_ids(self, prompt: str, response: str, system: str | None = None) -> tuple[list[int], list[bool]]:
        """(ids, mask) of a prompt and its assistant response; mask marks the assistant's tokens.

        The assistant's tokens are what the template adds after the generation prompt, up to and
        including the first stop id (the end of the turn): the model learns to stop. Text the
        template puts after the end of the turn (a newline) is not trained on.
        """
        if self.options.thinking is False and self._think_open and response.lstrip().startswith(self._think_open):
            raise ValueError(
                f"{self.source}: an SFT response starts with a {self._think_open} block, but `chat.thinking: false` "
                "makes the template write an empty one before every response (two think blocks would be "
                f"trained); set `chat.thinking: true` (or null) for reasoning data, or strip the reasoning: {response[:80]!r}")
        msgs = self._messages(prompt, system)
        guard = self._guard([m["content"] for m in msgs] + [response])
        msgs = [{**m, "content": self._mark(m["content"], guard)} for m in msgs]
        response = self._mark(response, guard)
        head = self._render(msgs, True)
        full = self._render([*msgs, {"role": "assistant", "content": response}], False)
        if full.startswith(head):
            tail = full[len(head):]
        else:  # e.g. thinking off: the generation prompt holds an empty think block that history omits
            at = full.rfind(response) if response else -1
            if at < 0:
                raise ValueError(
                    f"{self.source}: the chat template renders the assistant turn neither after the generation "
                    "prompt nor with its content verbatim, so assistant tokens cannot be located; use a template "
                    "whose history rendering extends its generation prompt"
                )
            tail = full[at:]
        # The prompt is encoded alone, exactly as rollouts encode it; the model's tokens follow it.
        p = self._encode_guarded(head, guard)
        r = self._encode_guarded(tail, guard)
        end = next((i + 1 for i, t in enumerate(r) if t in self.stop_token_ids), None)
        if end is None:  # the template closed the turn with no stop id: close it ourselves
            r, end = [*r, self.stop_token_ids[0]], len(r) + 1
        r = r[:end]
        return p + r, [False] * len(p) + [True] * len(r)

    def pretrain_ids(self, text: str) -> list[int]:
        """Plain text for language modelling: [bos] text [eos]."""
        bos = self.tokenizer.bos_token_id
        return ([int(bos)] if bos is not None else []) + self.encode_text(text) + [self.stop_token_ids[0]]

    @functools.cached_property
    def observation_role(self) -> str:
        """'tool' where the template renders tool messages, else 'user' (found at the first multi-turn use)."""
        for role in ("tool", "user"):
            try:
                text = self._observation_text(_PROBE_TOOL, role)
            except Exception:  # noqa: BLE001 - a template that refuses the role
                continue
            if _PROBE_TOOL in text:
                return role
        raise ValueError(f"{self.source}: the chat template renders neither tool nor user messages after an "
                         "assistant turn; multi-turn environments need one of them")

    def _observation_text(self, text: str, role: str) -> str:
        """What follows a model turn's end-of-turn token: the glue after it (a newline), the observation as a
        `role` message and the next generation prompt. Read from one rendering of [..., assistant, observation],
        cut just past the stop token that closes the assistant's content: templates that render earlier
        turns differently once another message follows (Qwen3 drops a past turn's empty think block) agree
        from there on."""
        msgs = [*self._messages(_PROBE), {"role": "assistant", "content": _PROBE_REPLY}]
        after = self._render([*msgs, {"role": role, "content": text}], True)
        at = after.rfind(_PROBE_REPLY)
        end = self._end_of_turn_offset(after, at + len(_PROBE_REPLY)) if at >= 0 else -1
        if end < 0:
            raise ValueError("no end of turn after the assistant's content")
        return after[end:]

    def _end_of_turn_offset(self, rendered: str, start: int) -> int:
        """Offset just past the first stop token's text in `rendered` from `start` (-1 if none)."""
        best = -1
        for t in self.stop_token_ids:
            s = self.tokenizer.convert_ids_to_tokens(int(t))
            if isinstance(s, str) and s:
                at = rendered.find(s, start)
                if at >= 0 and (best < 0 or at + len(s) < best):
                    best = at + len(s)
        return best

    def observation_ids(self, text: str) -> list[int]:
        """An environment turn, rendered as a tool (or user) message plus the next generation prompt.

        Appended after a model turn's sampled ids, which end in a stop id: these ids never carry loss.
        """
        guard = self._guard([text])  # a tool's output is the model's doing: its control text stays text
        return self._encode_guarded(self._observation_text(self._mark(text, guard), self.observation_role), guard)

    # ------------------------------------------------------------------ decoding
    def strip_stop(self, ids: Sequence[int]) -> list[int]:
        """`ids` up to (not including) the first stop id."""
        out = []
        for t in ids:
            if t in self.stop_token_ids:
                break
            out.append(int(t))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a model turn as the reward sees it: cut at the first stop id, without it."""
        return self.tokenizer.decode(self.strip_stop(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)


def stop_ids_of(path: str | Path, tokenizer: Any) -> list[int]:
    """Stop ids: `eos_token_id` of generation_config.json (int or list), else the tokenizer's eos."""
    ids: list[int] = []
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise ValueError(f"{gen}: not valid JSON ({exc})") from None
        if isinstance(eos, int):
            ids = [eos]
        elif isinstance(eos, list):
            ids = [int(i) for i in eos]
    if not ids and tokenizer.eos_token_id is not None:
        ids = [int(tokenizer.eos_token_id)]
    return ids


def write_generation_config(path: str | Path, tokenizer: Any, stop_tokens: Sequence[str] = ()) -> list[int]:
    """Write generation_config.json with the stop ids (the tokenizer's eos plus `stop_tokens`)."""
    ids = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    ids += [int(tokenizer.convert_tokens_to_ids(t)) for t in stop_tokens]
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise ValueError("the tokenizer has no eos token and no stop tokens were named: set its eos_token "
                         "(tokenizer_config.json) or pass the end-of-turn token as a stop token")
    cfg: dict[str, Any] = {"eos_token_id": ids if len(ids) > 1 else ids[0]}
    for name in ("bos_token_id", "pad_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            cfg[name] = int(v)
    (Path(path) / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return ids
