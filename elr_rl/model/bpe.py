"""A byte-level BPE tokenizer with a ChatML-style chat template, trained locally (nothing downloaded).

Real checkpoints (Dory1.0-4B: a ~131k BPE vocabulary, thinking and non-thinking
responses) bring their own tokenizer; this builder makes one of the same kind from
text at hand, so every stage can be exercised with ids that are NOT the bytes:

    <|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n
    [<think>\\n...\\n</think>\\n\\n] answer <|im_end|>

`enable_thinking=False` renders an empty think block after the generation prompt, as
thinking-capable templates do. The end of a turn (`<|im_end|>`) and `<|endoftext|>` are
the stop ids written to generation_config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|pad|>")

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def train_bpe(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 4096):
    """Train a byte-level BPE on `texts` and save it (tokenizer files, chat template, stop ids) to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from elr_rl.text import write_generation_config

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    write_generation_config(out, fast, stop_tokens=("<|im_end|>",))
    return fast
