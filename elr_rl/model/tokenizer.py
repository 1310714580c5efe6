"""A byte-level tokenizer built locally (nothing downloaded).

Token ids 0..255 are the bytes; 256.. are special tokens. Saved as
`tokenizer.json` (+ `tokenizer_config.json`) so `transformers.AutoTokenizer`
and vLLM both load it from a checkpoint folder. Any byte string round-trips,
including UTF-8 sequences split across tokens.
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
    return fast


def save_tokenizer(path: str | Path):
    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    return tok


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# ------------------------------------------------------------------------------------------
# The prompt/response format shared by SFT, rollouts and evaluation:
#     <|bos|> prompt-bytes <|sep|> response-bytes <|eos|>
# The model learns to answer after <|sep|> and to stop with <|eos|>.


def encode_prompt(prompt: str) -> list[int]:
    """Token ids of a prompt, ending in <|sep|>: the model's turn starts right after."""
    return [BOS_ID, *prompt.encode("utf-8"), SEP_ID]


def encode_response(response: str, eos: bool = True) -> list[int]:
    """Token ids of a response (bytes), closed by <|eos|> unless `eos=False`."""
    return [*response.encode("utf-8"), *([EOS_ID] if eos else [])]


def decode_bytes(ids: list[int]) -> str:
    """Text of the byte tokens in `ids` (special tokens dropped; invalid UTF-8 replaced)."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
