import random

from elr_rl.model import VOCAB_SIZE, build_tokenizer, load_tokenizer, save_tokenizer
from elr_rl.model.tokenizer import BOS_ID, EOS_ID


def test_round_trips_arbitrary_utf8(tmp_path):
    save_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)  # through transformers' AutoTokenizer, from tokenizer.json
    rng = random.Random(0)
    samples = ["", "plain ascii", "héllo wörld", "日本語のテキスト", "emoji \U0001F600\U0001F680", "\x00\x01\t\n\r"]
    for _ in range(50):
        samples.append("".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x2FFF), rng.randrange(0x10000, 0x10FFFF)])) for _ in range(rng.randrange(1, 30))))
    for s in samples:
        ids = tok.encode(s, add_special_tokens=False)
        assert ids == list(s.encode("utf-8")), s  # one token per byte
        assert tok.decode(ids) == s


def test_multibyte_chars_split_across_tokens_reassemble():
    tok = build_tokenizer()
    s = "ü世\U0001F600"
    ids = tok.encode(s, add_special_tokens=False)
    assert len(ids) == 2 + 3 + 4  # each byte is its own token, none valid UTF-8 alone
    # A prefix that cuts a character in half does not decode to the character...
    assert tok.decode(ids[:1]) != "ü"
    # ...but the whole byte sequence does, and so does decoding token by token as bytes.
    assert tok.decode(ids) == s
    assert tok.convert_tokens_to_string(tok.convert_ids_to_tokens(ids)) == s


def test_special_tokens_and_vocab():
    tok = build_tokenizer()
    assert len(tok) == VOCAB_SIZE == 260
    assert tok.bos_token_id == BOS_ID and tok.eos_token_id == EOS_ID
    assert tok.decode([BOS_ID, 104, 105, EOS_ID], skip_special_tokens=True) == "hi"
