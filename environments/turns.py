"""Parse one model turn of a multi-turn environment into a single action.

A turn must hold exactly one action tag (`<bash>...</bash>`, `<answer>...</answer>`,
`<tool>...</tool>`, `<edit path="...">...</edit>` ...). Zero or several actions,
or an unknown tag, is not an action: the environment answers with a format
message and the turn still counts against the budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An opening tag at a given position; bounded pieces keep each attempt O(1) in the text's length.
_OPEN_RE = re.compile(r"<(?P<tag>[a-z_]{1,32})(?P<attrs>(?:\s{1,8}[a-z_]{1,32}=\"[^\"]{0,4096}\"){0,8})\s{0,8}>")
_ATTR_RE = re.compile(r"([a-z_]+)=\"([^\"]*)\"")


@dataclass(frozen=True)
class Action:
    """One parsed action: the tag, its attributes and its body (not stripped)."""

    tag: str
    attrs: dict[str, str]
    body: str


def scan_actions(turn: str, allowed: tuple[str, ...]) -> list[Action]:
    """Every `<tag attrs>body</tag>` with tag in `allowed`, left to right, not nested.

    Linear in len(turn): an opening tag that is never closed is remembered, so its
    later copies are not searched again (a lazy regex rescans the rest of the text
    from every one of them)."""
    found: list[Action] = []
    unclosed: set[str] = set()
    pos = 0
    while True:
        lt = turn.find("<", pos)
        if lt < 0:
            return found
        m = _OPEN_RE.match(turn, lt)
        if m is None or m.group("tag") not in allowed or m.group("tag") in unclosed:
            pos = lt + 1
            continue
        tag = m.group("tag")
        end = turn.find(f"</{tag}>", m.end())
        if end < 0:
            unclosed.add(tag)
            pos = lt + 1
            continue
        found.append(Action(tag, dict(_ATTR_RE.findall(m.group("attrs") or "")), turn[m.end() : end]))
        pos = end + len(tag) + 3


def parse_action(turn: str, allowed: tuple[str, ...]) -> Action | None:
    """The single action among `allowed` tags in `turn`, or None if there is not exactly one."""
    if not isinstance(turn, str):
        return None
    found = scan_actions(turn, allowed)
    return found[0] if len(found) == 1 else None


def format_help(allowed: tuple[str, ...]) -> str:
    tags = ", ".join(f"<{t}>...</{t}>" for t in allowed)
    return f"Format error: write exactly one action per turn, one of {tags}."
