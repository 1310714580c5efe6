"""A byte-level tokenizer built locally (nothing downloaded).

Token ids 0..255 are the bytes; 256.. are special tokens. Saved as
`tokenizer.json` (+ `tokenizer_config.json`, with a chat template of its own, and
`generation_config.json` with the stop id) so `transformers.AutoTokenizer` and
`elr_rl.text.TextCodec` load it from a checkpoint folder like any other tokenizer.
Any byte string round-trips, including UTF-8 sequences split across tokens. Only this
module and the codec know token ids.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|sep|>")
PAD_ID, BOS_ID, EOS_ID, SEP_ID = 256, 257, 258, 259
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (what ByteLevel pre-tokenisation emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def build_tokenizer():
    """A `PreTrainedTokenizerFast` over bytes (vocab 260)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        sep_token="<|sep|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The byte tokenizer's chat template: `<|bos|>`, then each message; the model's turn starts after a
# `<|sep|>` and ends with `<|eos|>`. A one-turn prompt renders as `<|bos|> prompt <|sep|>`.
CHAT_TEMPLATE = (
    "<|bos|>"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] }}<|eos|>"
    "{% else %}{% if m['role'] != 'user' %}{{ m['role'] }}: {% endif %}{{ m['content'] }}<|sep|>{% endif %}"
    "{% endfor %}"
)


def save_tokenizer(path: str | Path):
    """Save the byte tokenizer, its chat template and generation_config.json (stop id <|eos|>)."""
    from elr_rl.text import write_generation_config

    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    write_generation_config(path, tok)
    return tok


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
