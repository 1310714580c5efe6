"""Extract a record from generated prose into a JSON Schema.

The prose describes one entity field by field, interleaved with facts about a
second, similar entity (distractors). D sets the number of fields (nested
objects from D = 6) and of distractor facts. The answer must be JSON that is
valid against the schema (exact key set at every level, typed values) and
equal to the true record.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

Field = tuple[str, Any, Callable[[random.Random], Any], Callable[[str, Any], str]]  # key, schema, make, say


def _and(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _num(r: random.Random, lo: int, hi: int) -> float:
    return r.randint(lo * 2, hi * 2) / 2


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
ARR = {"type": "array", "items": {"type": "string"}}


def obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


STREETS = ["Elm Street", "Harbour Road", "Mill Lane", "Station Avenue", "Kings Way"]
LANGS = ["English", "French", "Hindi", "Yoruba", "Spanish", "Korean"]
COLORS = ["red", "black", "white", "green", "blue"]
TAGS = ["music", "food", "tech", "family", "outdoor", "art"]

RECORDS: dict[str, tuple[list[str], str, list[Field]]] = {
    "person": (
        ["Maria Lopez", "Tom Okafor", "Yuki Sato", "Priya Nair", "Lars Berg", "Amina Diallo"],
        "person",
        [
            ("age", INT, lambda r: r.randint(18, 80), lambda s, v: f"{s} is {v} years old."),
            (
                "city",
                STR,
                lambda r: r.choice(["Lima", "Oslo", "Accra", "Pune", "Kyoto"]),
                lambda s, v: f"{s} lives in {v}.",
            ),
            ("email", STR, lambda r: f"user{r.randint(10, 999)}@mail.test", lambda s, v: f"{s} can be reached at {v}."),
            (
                "employed",
                BOOL,
                lambda r: r.random() < 0.5,
                lambda s, v: f"{s} currently has a job." if v else f"{s} is currently not employed.",
            ),
            ("height_cm", NUM, lambda r: _num(r, 150, 200), lambda s, v: f"{s} is {v:g} cm tall."),
            ("languages", ARR, lambda r: r.sample(LANGS, r.randint(1, 3)), lambda s, v: f"{s} speaks {_and(v)}."),
            (
                "role",
                {"type": "string", "enum": ["engineer", "teacher", "nurse", "designer", "chef"]},
                lambda r: r.choice(["engineer", "teacher", "nurse", "designer", "chef"]),
                lambda s, v: f"{s} trained as a {v}.",
            ),
            ("pets", INT, lambda r: r.randint(0, 5), lambda s, v: f"{s} has {v} pets."),
            (
                "address",
                obj({"street": STR, "zip": STR}),
                lambda r: {"street": f"{r.randint(1, 99)} {r.choice(STREETS)}", "zip": str(r.randint(10000, 99999))},
                lambda s, v: f"{s}'s address is {v['street']}, postcode {v['zip']}.",
            ),
        ],
    ),
    "product": (
        ["the Zephyr kettle", "the Nimbus kettle", "the Atlas lamp", "the Orion lamp", "the Vega chair"],
        "product",
        [
            ("price", NUM, lambda r: _num(r, 5, 300), lambda s, v: f"{_cap(s)} costs {v:g} dollars."),
            (
                "in_stock",
                BOOL,
                lambda r: r.random() < 0.5,
                lambda s, v: f"{_cap(s)} is in stock." if v else f"{_cap(s)} is out of stock.",
            ),
            (
                "category",
                {"type": "string", "enum": ["kitchen", "garden", "office", "toys"]},
                lambda r: r.choice(["kitchen", "garden", "office", "toys"]),
                lambda s, v: f"{_cap(s)} is listed under {v}.",
            ),
            ("sku", STR, lambda r: f"SKU-{r.randint(1000, 9999)}", lambda s, v: f"The code of {s} is {v}."),
            ("weight_kg", NUM, lambda r: _num(r, 1, 30), lambda s, v: f"{_cap(s)} weighs {v:g} kg."),
            ("colors", ARR, lambda r: r.sample(COLORS, r.randint(1, 3)), lambda s, v: f"{_cap(s)} comes in {_and(v)}."),
            ("rating", INT, lambda r: r.randint(1, 5), lambda s, v: f"{_cap(s)} has a rating of {v} stars."),
            ("warranty_years", INT, lambda r: r.randint(1, 5), lambda s, v: f"{_cap(s)} has a {v}-year warranty."),
            (
                "dimensions",
                obj({"width_cm": INT, "height_cm": INT}),
                lambda r: {"width_cm": r.randint(10, 90), "height_cm": r.randint(10, 90)},
                lambda s, v: f"{_cap(s)} measures {v['width_cm']} cm wide and {v['height_cm']} cm high.",
            ),
        ],
    ),
    "event": (
        ["the Spring Gala", "the Autumn Fair", "the River Run", "the Night Market", "the Book Week"],
        "event",
        [
            (
                "date",
                STR,
                lambda r: f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                lambda s, v: f"{_cap(s)} takes place on {v}.",
            ),
            ("attendees", INT, lambda r: r.randint(20, 900), lambda s, v: f"{_cap(s)} expects {v} attendees."),
            (
                "venue",
                STR,
                lambda r: r.choice(["Hall A", "City Park", "Pier 4", "The Dome"]),
                lambda s, v: f"{_cap(s)} is held at {v}.",
            ),
            (
                "online",
                BOOL,
                lambda r: r.random() < 0.5,
                lambda s, v: f"{_cap(s)} is streamed online." if v else f"{_cap(s)} is in person only.",
            ),
            ("ticket_price", NUM, lambda r: _num(r, 0, 80), lambda s, v: f"A ticket for {s} costs {v:g} dollars."),
            ("tags", ARR, lambda r: r.sample(TAGS, r.randint(1, 3)), lambda s, v: f"{_cap(s)} is tagged {_and(v)}."),
            (
                "status",
                {"type": "string", "enum": ["planned", "confirmed", "cancelled"]},
                lambda r: r.choice(["planned", "confirmed", "cancelled"]),
                lambda s, v: f"The status of {s} is {v}.",
            ),
            ("capacity", INT, lambda r: r.randint(50, 2000), lambda s, v: f"The venue of {s} holds {v} people."),
            (
                "organizer",
                obj({"name": STR, "email": STR}),
                lambda r: {
                    "name": r.choice(["Ada", "Kemi", "Raj", "Sofia"]),
                    "email": f"org{r.randint(1, 99)}@events.test",
                },
                lambda s, v: f"{_cap(s)} is organised by {v['name']} ({v['email']}).",
            ),
        ],
    ),
}


def valid(schema: dict, v: Any) -> bool:
    """JSON-Schema subset: object (exact keys, all required), string array, string/enum, integer, number, boolean."""
    t = schema["type"]
    if t == "object":
        props = schema["properties"]
        return isinstance(v, dict) and set(v) == set(props) and all(valid(props[k], v[k]) for k in props)
    if t == "array":
        return isinstance(v, list) and all(valid(schema["items"], x) for x in v)
    if t == "string":
        return isinstance(v, str) and ("enum" not in schema or v in schema["enum"])
    if t == "integer":
        return type(v) is int
    if t == "number":
        return type(v) in (int, float)
    return t == "boolean" and type(v) is bool


class SchemaExtraction(SingleTurnEnv):
    name = "schema_extraction"
    domain = "structured_output"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = sorted(RECORDS)[seed % len(RECORDS)]
        names, label, fields = RECORDS[kind]
        n_fields = 1 + (difficulty * 8 + 9) // 10  # 2..9 fields besides the name
        usable = [f for f in fields if difficulty >= 6 or f[1]["type"] != "object"]
        chosen = rng.sample(usable, min(n_fields - 1, len(usable)))
        main, other = rng.sample(names, 2)
        record: dict[str, Any] = {"name": main}
        sentences = []
        for key, _, make, say in chosen:
            record[key] = make(rng)
            sentences.append(say(main, record[key]))
        n_distract = difficulty - 1
        for _, _, make, say in rng.sample(fields, n_distract):
            sentences.insert(rng.randint(0, len(sentences)), say(other, make(rng)))
        schema = obj({"name": STR, **{k: s for k, s, _, _ in chosen}})
        prompt = (
            " ".join(sentences) + f"\nExtract the record of the {label} {main} as JSON matching this schema "
            f"(every listed key, no other keys):\n{json.dumps(schema, separators=(',', ':'))}\n{ANSWER_INSTRUCTION}"
        )
        stats = {"fields": len(record), "distractor_facts": n_distract}
        return Task(self.name, seed, difficulty, prompt, record, {"schema": schema}, stats)

    def check(self, task: Task, span: str) -> bool:
        got = json.loads(span)
        return valid(task.hidden["schema"], got) and got == task.answer

    def answer_text(self, task: Task) -> str:
        return json.dumps(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        rec = task.answer
        key = list(rec)[-1]
        v = rec[key]
        if type(v) is bool:
            bad = not v
        elif type(v) in (int, float):
            bad = v + 1
        elif isinstance(v, list):
            bad = v + ["extra"]
        elif isinstance(v, dict):
            bad = {**v, "extra": 1}
        else:
            bad = v + "x"
        return [
            json.dumps({**rec, key: bad}),
            json.dumps({**rec, "notes": ""}),
            json.dumps({"name": rec["name"]}) if len(rec) > 1 else "{}",
        ]

    def solution_steps(self, task: Task) -> list[str]:
        return [f"{k}: {json.dumps(v)}" for k, v in task.answer.items()]
