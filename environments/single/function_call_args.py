"""Choose a tool among generated JSON schemas and fill its arguments from a request.

D sets how many tool schemas are offered and how many optional arguments the
request mentions. The answer is a JSON object {"name": ..., "arguments": {...}};
it must name the right tool, be valid against that tool's schema (types,
enums, required keys, no extra keys) and equal the true arguments.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Quito", "Perth", "Dublin", "Seoul"]
PEOPLE = ["Ana", "Ben", "Chen", "Dana", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo"]
WORDS = ["budget", "launch", "review", "picnic", "invoice", "roadmap", "backup", "hiring", "audit", "demo"]
FOODS = ["pizza", "salad", "soup", "tacos", "noodles", "curry", "bread", "rice"]
PLACES = ["Blue Door", "Casa Rosa", "Golden Wok", "Little Fig", "The Anchor"]
ARTISTS = ["Nina Simone", "Miles Davis", "Fela Kuti", "Bjork", "Ali Farka Toure"]
CURRENCIES = ["USD", "EUR", "JPY", "GBP", "INR"]
LANGS = ["French", "Spanish", "German", "Japanese", "Swahili"]


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


@dataclass(frozen=True)
class Param:
    """One tool argument: JSON type (or enum values), a value generator and how a request says it."""

    name: str
    type: str  # string | integer | number | boolean | array | enum
    required: bool
    make: Callable[[random.Random], Any]
    phrase: str | tuple[str, str]  # "{v}" template, or (if true, if false) for booleans
    choices: tuple[str, ...] = ()


def str_p(name: str, pool: list[str], phrase: str, req: bool = True) -> Param:
    return Param(name, "string", req, lambda r: r.choice(pool), phrase)


def enum_p(name: str, choices: list[str], phrase: str, req: bool = False) -> Param:
    return Param(name, "enum", req, lambda r: r.choice(choices), phrase, tuple(choices))


def int_p(name: str, lo: int, hi: int, phrase: str, req: bool = False) -> Param:
    return Param(name, "integer", req, lambda r: r.randint(lo, hi), phrase)


def num_p(name: str, lo: int, hi: int, phrase: str, req: bool = False) -> Param:
    return Param(name, "number", req, lambda r: r.randint(lo * 4, hi * 4) / 4, phrase)


def bool_p(name: str, yes: str, no: str, req: bool = False) -> Param:
    return Param(name, "boolean", req, lambda r: r.random() < 0.5, (yes, no))


def list_p(name: str, pool: list[str], phrase: str, req: bool = False) -> Param:
    return Param(name, "array", req, lambda r: r.sample(pool, r.randint(1, 3)), phrase)


TOOLS: list[tuple[str, str, str, list[Param]]] = [
    (
        "get_weather",
        "Current weather for a city.",
        "Check the weather",
        [str_p("city", CITIES, "in {v}"), enum_p("unit", ["celsius", "fahrenheit"], "in {v}")],
    ),
    (
        "get_forecast",
        "Multi-day weather forecast.",
        "Get the weather forecast",
        [
            str_p("city", CITIES, "for {v}"),
            int_p("days", 1, 10, "for the next {v} days", True),
            enum_p("unit", ["celsius", "fahrenheit"], "in {v}"),
        ],
    ),
    (
        "send_email",
        "Send an email.",
        "Send an email",
        [
            str_p("to", [p.lower() + "@example.com" for p in PEOPLE], "to {v}"),
            str_p("subject", WORDS, "with the subject '{v}'"),
            list_p("cc", [p.lower() + "@example.com" for p in PEOPLE], "copying {v}"),
        ],
    ),
    (
        "create_event",
        "Create a calendar event.",
        "Create a calendar event",
        [
            str_p("title", WORDS, "called '{v}'"),
            Param("date", "string", True, _date, "on {v}"),
            int_p("duration_minutes", 15, 180, "lasting {v} minutes"),
            list_p("attendees", PEOPLE, "with {v}"),
        ],
    ),
    (
        "book_flight",
        "Book a flight.",
        "Book a flight",
        [
            str_p("origin", CITIES, "from {v}"),
            str_p("destination", CITIES, "to {v}"),
            Param("date", "string", True, _date, "on {v}"),
            int_p("passengers", 1, 6, "for {v} passengers"),
            enum_p("cabin", ["economy", "business", "first"], "in {v} class"),
        ],
    ),
    (
        "convert_currency",
        "Convert money between currencies.",
        "Convert",
        [
            num_p("amount", 1, 500, "{v}", True),
            enum_p("from_currency", CURRENCIES, "from {v}", True),
            enum_p("to_currency", CURRENCIES, "to {v}", True),
        ],
    ),
    (
        "set_timer",
        "Start a countdown timer.",
        "Set a timer",
        [int_p("minutes", 1, 90, "for {v} minutes", True), str_p("label", WORDS, "labelled '{v}'", False)],
    ),
    (
        "search_products",
        "Search the shop catalogue.",
        "Search the shop",
        [
            str_p("query", FOODS + WORDS, "for '{v}'"),
            num_p("max_price", 5, 200, "under {v} dollars"),
            bool_p("in_stock", "showing only items in stock", "including out-of-stock items"),
        ],
    ),
    (
        "translate_text",
        "Translate text.",
        "Translate",
        [
            str_p("text", WORDS, "the word '{v}'"),
            enum_p("target_language", LANGS, "into {v}", True),
            bool_p("formal", "formally", "informally"),
        ],
    ),
    (
        "order_food",
        "Order food from a restaurant.",
        "Order food",
        [
            str_p("restaurant", PLACES, "from {v}"),
            list_p("items", FOODS, "consisting of {v}", True),
            bool_p("delivery", "for delivery", "for pickup"),
            num_p("tip", 1, 20, "with a tip of {v} dollars"),
        ],
    ),
    (
        "reserve_table",
        "Reserve a restaurant table.",
        "Reserve a table",
        [
            str_p("restaurant", PLACES, "at {v}"),
            int_p("party_size", 1, 12, "for {v} people", True),
            Param(
                "time", "string", True, lambda r: f"{r.randint(11, 22)}:{r.choice(['00', '15', '30', '45'])}", "at {v}"
            ),
            bool_p("outdoor", "outdoors", "indoors"),
        ],
    ),
    (
        "play_music",
        "Play music.",
        "Play music",
        [
            str_p("artist", ARTISTS, "by {v}"),
            bool_p("shuffle", "shuffled", "in order"),
            int_p("volume", 1, 100, "at volume {v}"),
        ],
    ),
    (
        "create_ticket",
        "Open a support ticket.",
        "Open a support ticket",
        [
            str_p("title", WORDS, "titled '{v}'"),
            enum_p("priority", ["low", "medium", "high", "urgent"], "with {v} priority", True),
            str_p("assignee", PEOPLE, "assigned to {v}", False),
            list_p("tags", WORDS, "tagged {v}"),
        ],
    ),
    (
        "set_thermostat",
        "Set a thermostat.",
        "Set the thermostat",
        [
            num_p("temperature", 15, 28, "to {v} degrees", True),
            enum_p("room", ["kitchen", "bedroom", "office"], "in the {v}"),
            enum_p("mode", ["heat", "cool", "auto"], "in {v} mode"),
        ],
    ),
    (
        "get_directions",
        "Route between two places.",
        "Get directions",
        [
            str_p("origin", CITIES, "from {v}"),
            str_p("destination", CITIES, "to {v}"),
            enum_p("mode", ["driving", "walking", "transit", "cycling"], "by {v}"),
            bool_p("avoid_tolls", "avoiding tolls", "allowing tolls"),
        ],
    ),
    (
        "get_stock_price",
        "Latest stock price.",
        "Look up the stock price",
        [
            str_p("symbol", ["ACME", "GLOBX", "INITECH", "UMBR"], "of {v}"),
            enum_p("exchange", ["NYSE", "NASDAQ", "LSE"], "on {v}"),
        ],
    ),
]


def schema(name: str, desc: str, params: list[Param]) -> dict:
    props = {}
    for p in params:
        if p.type == "enum":
            props[p.name] = {"type": "string", "enum": list(p.choices)}
        elif p.type == "array":
            props[p.name] = {"type": "array", "items": {"type": "string"}}
        else:
            props[p.name] = {"type": p.type}
    req = [p.name for p in params if p.required]
    return {
        "name": name,
        "description": desc,
        "parameters": {"type": "object", "properties": props, "required": req, "additionalProperties": False},
    }


def _say(p: Param, v: Any) -> str:
    if p.type == "boolean":
        return p.phrase[0] if v else p.phrase[1]
    if p.type == "array":
        v = v[0] if len(v) == 1 else ", ".join(v[:-1]) + " and " + v[-1]
    elif p.type == "number":
        v = f"{v:g}"
    return p.phrase.format(v=v)


def valid_value(prop: dict, v: Any) -> bool:
    t = prop["type"]
    if t == "string":
        return isinstance(v, str) and ("enum" not in prop or v in prop["enum"])
    if t == "integer":
        return type(v) is int
    if t == "number":
        return type(v) in (int, float)
    if t == "boolean":
        return type(v) is bool
    if t == "array":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return False


def valid_against(params_schema: dict, args: Any) -> bool:
    """JSON-Schema check for our flat objects: required present, no extra keys, every value typed."""
    props = params_schema["properties"]
    if not isinstance(args, dict) or set(args) - set(props):
        return False
    return all(k in args for k in params_schema["required"]) and all(valid_value(props[k], v) for k, v in args.items())


class FunctionCallArgs(SingleTurnEnv):
    name = "function_call_args"
    domain = "agentic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        n_tools = min(1 + difficulty, len(TOOLS))
        offered = rng.sample(TOOLS, n_tools)
        name, desc, action, params = rng.choice(offered)
        p_optional = 0.1 * difficulty
        args: dict[str, Any] = {}
        while True:
            for p in params:
                if p.required or rng.random() < p_optional:
                    args[p.name] = p.make(rng)
            if name not in ("book_flight", "get_directions") or args["origin"] != args["destination"]:
                break
            args = {}
        request = action + " " + " ".join(_say(p, args[p.name]) for p in params if p.name in args) + "."
        tools = [schema(n, d, ps) for n, d, _, ps in offered]
        prompt = (
            "You can call these tools:\n"
            + "\n".join(json.dumps(t, separators=(",", ":")) for t in tools)
            + f"\nUser request: {request}\n"
            'Answer with one JSON object {"name": <tool name>, "arguments": {...}} that includes only the '
            f"arguments the request specifies.\n{ANSWER_INSTRUCTION}"
        )
        answer = {"name": name, "arguments": args}
        stats = {"tools": n_tools, "optional_rate": p_optional}
        hidden = {"schema": schema(name, desc, params)["parameters"], "action": action}
        return Task(self.name, seed, difficulty, prompt, answer, hidden, stats)

    def check(self, task: Task, span: str) -> bool:
        got = json.loads(span)
        if not isinstance(got, dict) or set(got) != {"name", "arguments"} or got["name"] != task.answer["name"]:
            return False
        return valid_against(task.hidden["schema"], got["arguments"]) and got["arguments"] == task.answer["arguments"]

    def answer_text(self, task: Task) -> str:
        return json.dumps(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        name, args = task.answer["name"], task.answer["arguments"]
        props = task.hidden["schema"]["properties"]
        wrong = [
            json.dumps({"name": name + "_v2", "arguments": args}),
            json.dumps({"name": name, "arguments": {**args, "note": "x"}}),
        ]
        k = next(iter(args))
        v = args[k]
        bad = (
            v + 1
            if type(v) in (int, float)
            else (not v)
            if type(v) is bool
            else ["zzz"]
            if isinstance(v, list)
            else v + "x"
        )
        wrong.append(json.dumps({"name": name, "arguments": {**args, k: bad}}))
        missing = [p for p in props if p not in args]
        if missing:  # an optional argument the request did not mention
            extra = props[missing[0]]
            val = (
                extra.get("enum", ["x"])[0]
                if extra["type"] == "string"
                else {"integer": 1, "number": 1.5, "boolean": True}.get(extra["type"], ["x"])
            )
            wrong.append(json.dumps({"name": name, "arguments": {**args, missing[0]: val}}))
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        args = task.answer["arguments"]
        return [f"The request is to {task.hidden['action'].lower()}, so the tool is {task.answer['name']}."] + [
            f"{k} = {json.dumps(v)}" for k, v in args.items()
        ]
