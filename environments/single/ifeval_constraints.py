"""Instruction following: write about a topic under k checkable constraints; all must hold.

Constraints: required keywords (and counts), forbidden words, all-lowercase or
all-uppercase, exactly n bullets or n sentences, word-count bounds, a fixed
opening or closing phrase, no commas, a JSON wrapper. D sets k = D + 1 (the
topic keyword is always one of them). The reference answer is built to satisfy
them; the reward is 1 only if every constraint holds (the fraction that holds
is logged).
"""

from __future__ import annotations

import json
import math
import random
import re
import unicodedata

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

TOPICS = {
    "ocean": ["waves", "salt", "tides", "fish", "coral", "storms", "ships", "whales"],
    "garden": ["roots", "seeds", "soil", "flowers", "bees", "rain", "weeds", "sunlight"],
    "city": ["streets", "trains", "markets", "towers", "parks", "noise", "lights", "bridges"],
    "mountain": ["snow", "rocks", "trails", "wind", "valleys", "goats", "clouds", "ice"],
    "library": ["books", "shelves", "silence", "maps", "readers", "pages", "stories", "lamps"],
    "kitchen": ["bread", "knives", "spices", "ovens", "soup", "pans", "recipes", "steam"],
}
FORBIDDEN = ["very", "really", "thing", "stuff", "nice", "basically", "just", "actually"]
STARTS = ["In short", "Here is my view", "Let me explain", "To begin"]
ENDS = ["That is all.", "Thank you for reading.", "The end."]
TEMPLATES = [
    "The {t} is full of {a} and {b}.",
    "People think of {a} when they picture the {t}.",
    "In the {t} you can find {a} next to {b}.",
    "Every {t} needs {a} as much as {b}.",
    "Some say the {t} is defined by its {a}.",
    "We remember the {t} for {a} and {b}.",
]
SLOTS = [
    "kw",
    "kw",
    "forbid",
    "forbid",
    "case",
    "format",
    "min_words",
    "max_words",
    "start",
    "end",
    "no_commas",
    "json",
    "kw_count",
]
# A word: letters or digits of any script, with inner apostrophes (words in Cyrillic count too).
_WORD_RE = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
# Letters of other scripts that a reader takes for Latin ones (Cyrillic, Greek, Armenian, IPA look-alikes).
_CONFUSABLES = str.maketrans(
    dict(p.split(":") for p in (
        "А:A В:B Е:E З:3 К:K М:M Н:H О:O Р:P С:C Т:T У:Y Х:X Ѕ:S І:I Ј:J "
        "а:a е:e о:o р:p с:c у:y х:x ѕ:s і:i ј:j һ:h ӏ:l ԁ:d ԛ:q ԝ:w ɡ:g ɑ:a ı:i "
        "Α:A Β:B Ε:E Ζ:Z Η:H Ι:I Κ:K Μ:M Ν:N Ο:O Ρ:P Τ:T Υ:Y Χ:X "
        "ο:o α:a ρ:p ν:v υ:u ι:i κ:k χ:x τ:t օ:o ս:u հ:h ո:n զ:q ց:g"
    ).split())
)


def reader_view(text: str) -> str:
    """The text as a reader sees it: NFKC (full-width, ligatures, math letters), invisible format
    characters (zero-width spaces and joiners, soft hyphens) removed, look-alike letters folded to Latin."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return text.translate(_CONFUSABLES)


def words(text: str) -> list[str]:
    return _WORD_RE.findall(reader_view(text))


def count_word(text: str, w: str) -> int:
    return sum(1 for x in words(text.lower()) if x == w.lower())


def n_sentences(text: str) -> int:
    return len([s for s in re.split(r"[.!?]+(?:\s+|$)", text.strip()) if s.strip()])


def n_bullets(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("- "))


def holds(c: dict, text: str) -> bool:
    """Whether one constraint holds for the response text."""
    k = c["kind"]
    if k == "kw":
        return count_word(text, c["word"]) >= 1
    if k == "kw_count":
        return count_word(text, c["word"]) >= c["n"]
    if k == "forbid":
        return count_word(text, c["word"]) == 0
    if k == "lower":
        return text == text.lower()
    if k == "upper":
        return text == text.upper()
    if k == "bullets":
        return n_bullets(text) == c["n"]
    if k == "sentences":
        return n_sentences(text) == c["n"]
    if k == "min_words":
        return len(words(text)) >= c["n"]
    if k == "max_words":
        return len(words(text)) <= c["n"]
    if k == "start":
        return text.lower().startswith(c["phrase"].lower())
    if k == "end":
        return text.rstrip().lower().endswith(c["phrase"].lower())
    if k == "no_commas":
        return "," not in text
    return True  # "json" is checked on the span itself


DESCRIBE = {
    "kw": 'Include the word "{word}".',
    "kw_count": 'Use the word "{word}" at least {n} times.',
    "forbid": 'Do not use the word "{word}".',
    "lower": "Write everything in lowercase letters.",
    "upper": "Write everything in capital letters.",
    "bullets": 'Use exactly {n} bullet points, each a line starting with "- ".',
    "sentences": "Write exactly {n} sentences.",
    "min_words": "Use at least {n} words.",
    "max_words": "Use at most {n} words.",
    "start": 'Start your response with "{phrase}".',
    "end": 'End your response with "{phrase}"',
    "no_commas": "Do not use any commas.",
    "json": 'Wrap the whole response in JSON as {{"response": "<your text>"}} with no other keys.',
}


PLAN = {
    "kw": 'use "{word}"',
    "kw_count": 'use "{word}" {n} times',
    "forbid": 'avoid "{word}"',
    "lower": "all lowercase",
    "upper": "all capitals",
    "bullets": "{n} bullet lines",
    "sentences": "{n} sentences",
    "min_words": "at least {n} words",
    "max_words": "at most {n} words",
    "start": 'open with "{phrase}"',
    "end": 'close with "{phrase}"',
    "no_commas": "no commas",
    "json": "wrap it in JSON",
}


def describe(c: dict) -> str:
    return DESCRIBE[c["kind"]].format(**c)


def _choose(rng: random.Random, topic: str, k: int) -> list[dict]:
    vocab = list(TOPICS[topic])
    rng.shuffle(vocab)
    cons = [{"kind": "kw", "word": topic}]
    for slot in rng.sample(SLOTS, k - 1):
        if slot == "kw":
            cons.append({"kind": "kw", "word": vocab.pop()})
        elif slot == "kw_count":
            cons.append({"kind": "kw_count", "word": vocab.pop(), "n": rng.randint(2, 3)})
        elif slot == "forbid":
            cons.append({"kind": "forbid", "word": rng.choice([w for w in FORBIDDEN if w not in str(cons)])})
        elif slot == "case":
            cons.append({"kind": rng.choice(["lower", "upper"])})
        elif slot == "format":
            cons.append({"kind": rng.choice(["bullets", "sentences"]), "n": rng.randint(2, 5)})
        elif slot == "start":
            cons.append({"kind": "start", "phrase": rng.choice(STARTS)})
        elif slot == "end":
            cons.append({"kind": "end", "phrase": rng.choice(ENDS)})
        else:
            cons.append({"kind": slot})
    return cons


def _compose(rng: random.Random, topic: str, cons: list[dict]) -> str:
    """A response satisfying every constraint (word-count bounds are set from it afterwards)."""
    kinds = {c["kind"]: c for c in cons}
    need = [c["word"] for c in cons if c["kind"] == "kw" and c["word"] != topic]
    if "kw_count" in kinds:
        need += [kinds["kw_count"]["word"]] * kinds["kw_count"]["n"]
    fmt = "bullets" if "bullets" in kinds else "sentences" if "sentences" in kinds else None
    n = kinds[fmt]["n"] if fmt else 2 + len(cons) // 3
    n_body = n - (1 if fmt == "sentences" and "end" in kinds else 0)
    vocab = [w for w in TOPICS[topic] if w not in need]
    body = []
    for _ in range(n_body):
        template = rng.choice(TEMPLATES)
        a = need.pop() if need else rng.choice(vocab)
        b = need.pop() if need and "{b}" in template and need[-1] != a else rng.choice([w for w in vocab if w != a])
        body.append(template.format(t=topic, a=a, b=b))
    if need:  # keywords left over: one more sentence carries them
        body[-1] = body[-1][:-1] + " with " + " and ".join(need) + "."
    if fmt == "bullets":
        lines = [f"- {s}" for s in body]
        if "start" in kinds:
            lines.insert(0, kinds["start"]["phrase"] + ":")
        if "end" in kinds:
            lines.append(kinds["end"]["phrase"])
        text = "\n".join(lines)
    else:
        if "start" in kinds:
            body[0] = f"{kinds['start']['phrase']}: {body[0][0].lower()}{body[0][1:]}"
        if "end" in kinds:
            body.append(kinds["end"]["phrase"])
        text = " ".join(body)
    if "lower" in kinds:
        text = text.lower()
    if "upper" in kinds:
        text = text.upper()
    return text


def _violations(c: dict, text: str, topic: str) -> str:
    """The text changed so that constraint c fails."""
    k = c["kind"]
    if k in ("kw", "kw_count"):
        return re.sub(rf"\b{c['word']}\b", "xyzzy", text, flags=re.IGNORECASE)
    if k == "forbid":
        return f"{text} {c['word']}"
    if k == "lower":
        return text.upper()
    if k == "upper":
        return text.lower()
    if k == "bullets":
        return f"{text}\n- one more {topic}"
    if k == "sentences":
        return f"{text} One more {topic}."
    if k == "min_words":
        return " ".join(words(text)[: max(1, c["n"] - 1)])
    if k == "max_words":
        return text + " and more" * (c["n"] // 2 + 1)
    if k == "start":
        return f"Well. {text}"
    if k == "end":
        return f"{text} Bye"
    if k == "no_commas":
        return text.replace(" ", ", ", 1)
    return text


class IfevalConstraints(SingleTurnEnv):
    name = "ifeval_constraints"
    domain = "instruction_following"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        topic = rng.choice(sorted(TOPICS))
        k = 1 + difficulty
        cons = _choose(rng, topic, k)
        text = _compose(rng, topic, cons)
        n_words = len(words(text))
        for c in cons:
            if c["kind"] == "min_words":
                c["n"] = max(3, math.floor(n_words * 0.8))
            elif c["kind"] == "max_words":
                c["n"] = math.ceil(n_words * 1.25) + 2
        rules = "\n".join(f"{i + 1}. {describe(c)}" for i, c in enumerate(cons))
        prompt = f"Write a short piece about the {topic}. Follow every rule:\n{rules}\n{ANSWER_INSTRUCTION}"
        hidden = {"constraints": cons, "topic": topic, "text": text}
        return Task(self.name, seed, difficulty, prompt, self._wrap(cons, text), hidden, {"constraints": k})

    @staticmethod
    def _wrap(cons: list[dict], text: str) -> str:
        return json.dumps({"response": text}) if any(c["kind"] == "json" for c in cons) else text

    def check(self, task: Task, span: str) -> tuple[bool, dict[str, float]]:
        cons = task.hidden["constraints"]
        text = span
        ok_json = True
        if any(c["kind"] == "json" for c in cons):
            try:
                obj = json.loads(span)
            except ValueError:  # untrusted text: not JSON means the wrapper rule fails
                obj = None
            ok_json = isinstance(obj, dict) and set(obj) == {"response"} and isinstance(obj["response"], str)
            text = obj["response"] if ok_json else span
        results = [ok_json if c["kind"] == "json" else holds(c, text) for c in cons]
        return all(results), {"constraints_frac": sum(results) / len(results)}

    def answer_text(self, task: Task) -> str:
        return task.answer

    def wrong_texts(self, task: Task) -> list[str]:
        cons, text, topic = task.hidden["constraints"], task.hidden["text"], task.hidden["topic"]
        out = []
        for c in cons:
            bad = text if c["kind"] == "json" else _violations(c, text, topic)
            out.append(bad if c["kind"] == "json" else self._wrap(cons, bad))
        return [t for t in out if not self.check(task, t)[0]]

    def solution_steps(self, task: Task) -> list[str]:
        return ["Plan: " + "; ".join(PLAN[c["kind"]].format(**c) for c in task.hidden["constraints"]) + "."]
